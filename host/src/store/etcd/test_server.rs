//! A throw-away single-member etcd for tests and benchmarks: a real `etcd` child process.
//!
//! Self-contained (std + tempfile) so benches and the end-to-end test crate can include it
//! with `#[path = ".../test_server.rs"] mod test_server;`.

#![allow(dead_code)]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `etcd` on free loopback ports with its data in a temp dir; killed on drop.
pub struct EtcdServer {
    child: Child,
    /// How to start it again on the same ports and data ([`EtcdServer::restart`]).
    binary: PathBuf,
    args: Vec<OsString>,
    /// Where clients connect (`https` when started with TLS).
    client_port: u16,
    /// Plain `http` listener for the health check.
    health_port: u16,
    dir: tempfile::TempDir,
}

/// PEM files for an etcd that serves TLS and requires client certificates signed by `ca`.
pub struct ServerTls<'a> {
    /// CA that signed the server certificate and must have signed client certificates.
    pub ca: &'a Path,
    /// The server certificate (valid for 127.0.0.1).
    pub cert: &'a Path,
    /// The server certificate's key.
    pub key: &'a Path,
}

impl EtcdServer {
    /// Starts etcd and waits until it reports healthy.
    ///
    /// Returns `None` (after printing why) when no `etcd` binary is on PATH, unless the
    /// environment variable `CI` is set: then a missing etcd is a failure, never a skip.
    pub fn start() -> Option<Self> {
        Self::start_with(None)
    }

    /// Like [`Self::start`], but clients must talk TLS with a certificate signed by `tls.ca`.
    pub fn start_tls(tls: &ServerTls<'_>) -> Option<Self> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&ServerTls<'_>>) -> Option<Self> {
        let Some(binary) = find_on_path("etcd") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "etcd is not on PATH, and CI is set: install the etcd-server package"
            );
            // Straight to stderr, past the test harness's output capture, so a skip is seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: etcd is not on PATH (install etcd-server to run the etcd tests)"
            );
            return None;
        };
        Some(Self::start_binary(&binary, tls))
    }

    /// Starts the given etcd binary; panics if it does not become healthy within 20 s.
    fn start_binary(binary: &Path, tls: Option<&ServerTls<'_>>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for etcd");
        let [client_port, health_port, peer_port] = free_ports();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut client = format!("{scheme}://127.0.0.1:{client_port}");
        if tls.is_some() {
            client.push_str(&format!(",http://127.0.0.1:{health_port}"));
        }
        let peer = format!("http://127.0.0.1:{peer_port}");
        let initial_cluster = format!("--initial-cluster=test={peer}");
        let mut args: Vec<OsString> = Vec::new();
        if let Some(tls) = tls {
            args.push("--client-cert-auth".into());
            for (flag, file) in [
                ("--trusted-ca-file", tls.ca),
                ("--cert-file", tls.cert),
                ("--key-file", tls.key),
            ] {
                args.push(flag.into());
                args.push(file.into());
            }
        }
        args.extend(["--name", "test", "--data-dir"].map(OsString::from));
        args.push(dir.path().join("data").into_os_string());
        args.extend(
            [
                "--listen-client-urls",
                client.as_str(),
                "--advertise-client-urls",
                client.as_str(),
                "--listen-peer-urls",
                peer.as_str(),
                "--initial-advertise-peer-urls",
                peer.as_str(),
                initial_cluster.as_str(),
                // Fast elections make the cluster's minimum lease TTL 1 s (it is
                // 1.5 x election timeout, rounded up to whole seconds).
                "--heartbeat-interval",
                "10",
                "--election-timeout",
                "100",
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ]
            .map(OsString::from),
        );
        let child = spawn(binary, &args, dir.path());
        let mut server = Self {
            child,
            binary: binary.to_owned(),
            args,
            client_port,
            health_port: if tls.is_some() {
                health_port
            } else {
                client_port
            },
            dir,
        };
        server.wait_healthy(Duration::from_secs(20));
        server
    }

    /// The client endpoint as `127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The etcd process id (to pause it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills etcd (SIGKILL) and waits for it to exit; its data stays for [`Self::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts etcd again on the same ports and data directory (after [`Self::kill`]) and
    /// waits until it reports healthy.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.binary, &self.args, self.dir.path());
        self.wait_healthy(Duration::from_secs(20));
    }

    /// The etcd log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    fn wait_healthy(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("etcd exited with {status} while starting:\n{}", self.log());
            }
            if self.healthy() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asks etcd's `/health` endpoint (served on a plain client port next to gRPC).
    fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, self.health_port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        let mut response = String::new();
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut response).is_ok()
            && response.contains("\"health\":\"true\"")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `binary args`, appending its output to `etcd.log` in `dir`.
fn spawn(binary: &Path, args: &[OsString], dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("etcd.log"))
        .expect("etcd log file");
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("etcd log file"))
        .stderr(log)
        .spawn()
        .expect("spawn etcd")
}

/// `N` distinct loopback ports nobody listened on a moment ago (the OS picks them for port 0;
/// all are held open together so they differ).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners = [(); N]
        .map(|()| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free loopback port"));
    listeners.map(|l| l.local_addr().expect("bound address").port())
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}
