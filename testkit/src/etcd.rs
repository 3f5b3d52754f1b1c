//! Throw-away etcd for tests and benchmarks: a real `etcd` child process, or a 3-member
//! cluster of them.

use std::ffi::OsString;
use std::fmt::Write as _;
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
        let dir = crate::scratch::scratch_dir();
        let [client_port, health_port, peer_port] = free_ports();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut client = format!("{scheme}://127.0.0.1:{client_port}");
        if tls.is_some() {
            let _ = write!(client, ",http://127.0.0.1:{health_port}");
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
    fn log(&self) -> String {
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

    fn healthy(&self) -> bool {
        healthy(self.health_port)
    }
}

/// Asks the `/health` endpoint of the etcd serving plain HTTP on loopback `port`.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut response = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && response.contains("\"health\":\"true\"")
}

/// A 3-member etcd cluster: each member serves clients on loopback and on the extra
/// addresses given (the root-namespace ends of test veth links), and peers on loopback.
pub struct EtcdCluster {
    members: Vec<Child>,
    client_ports: Vec<u16>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts three members and waits until each reports healthy; `None` (printed) without
    /// an `etcd` binary, unless `CI` is set.
    pub fn start(extra_addresses: &[&str]) -> Option<Self> {
        let Some(binary) = find_on_path("etcd") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "etcd is not on PATH, and CI is set"
            );
            let _ = writeln!(std::io::stderr(), "SKIPPED: etcd is not on PATH");
            return None;
        };
        let dir = crate::scratch::scratch_dir();
        let ports: [u16; 6] = free_ports();
        let (client_ports, peer_ports) = (ports[..3].to_vec(), ports[3..].to_vec());
        let initial = (0..3)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", peer_ports[i]))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for i in 0..3 {
            let member_dir = dir.path().join(format!("m{i}"));
            std::fs::create_dir_all(&member_dir).expect("member dir");
            let mut client = format!("http://127.0.0.1:{}", client_ports[i]);
            for address in extra_addresses {
                let _ = write!(client, ",http://{address}:{}", client_ports[i]);
            }
            let peer = format!("http://127.0.0.1:{}", peer_ports[i]);
            let args: Vec<OsString> = [
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &member_dir.join("data").display().to_string(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                "new",
                "--heartbeat-interval",
                "10",
                "--election-timeout",
                "100",
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ]
            .map(OsString::from)
            .to_vec();
            members.push(spawn(&binary, &args, &member_dir));
        }
        let cluster = Self {
            members,
            client_ports,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.client_ports.iter().all(|p| healthy(*p)) {
            assert!(
                Instant::now() < deadline,
                "etcd cluster not healthy within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    /// The client endpoints at `address`, as `address:port,...`.
    pub fn endpoints_at(&self, address: &str) -> String {
        self.client_ports
            .iter()
            .map(|p| format!("{address}:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        let _ = self.members[i].kill();
        let _ = self.members[i].wait();
    }

    /// The members' logs, for failure messages.
    pub fn log(&self) -> String {
        (0..3)
            .map(|i| {
                std::fs::read_to_string(self.dir.path().join(format!("m{i}/etcd.log")))
                    .unwrap_or_default()
            })
            .collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            let _ = member.kill();
            let _ = member.wait();
        }
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

/// `N` distinct loopback ports nobody listened on a moment ago, for a server a test starts
/// (etcd, a registry, a host).
///
/// Not the OS's pick for port 0: that comes from the ephemeral range, where every outgoing
/// connection of the machine also takes its local port, so one could take the port between
/// this check and the server's bind (etcd then exits with `address already in use`, as it
/// did once in CI). These come from below that range, each call of this process taking the
/// next ones from a place picked at random once, and are checked by binding them.
pub fn free_ports<const N: usize>() -> [u16; N] {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU32> = std::sync::OnceLock::new();
    const LOWEST: u32 = 10_000;
    let below = ephemeral_low().max(LOWEST + 1_000);
    let span = below - LOWEST;
    let next = NEXT.get_or_init(|| {
        use std::hash::{BuildHasher as _, Hasher as _};
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u32(std::process::id());
        std::sync::atomic::AtomicU32::new(
            u32::try_from(random.finish() % u64::from(span)).unwrap_or(0),
        )
    });
    let mut held = Vec::with_capacity(N);
    for _ in 0..span {
        if held.len() == N {
            break;
        }
        let offset = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span;
        let port = u16::try_from(LOWEST + offset).expect("below the ephemeral range");
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            held.push(listener);
        }
    }
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().expect("bound address").port())
        .collect();
    ports
        .try_into()
        .expect("enough free loopback ports below the ephemeral range")
}

/// The lowest port of the machine's ephemeral range (Linux's
/// `net.ipv4.ip_local_port_range`), 32 768 where it cannot be read.
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod port_tests {
    use super::*;

    /// Ports for servers come from below the ephemeral range (an outgoing connection never
    /// takes one), differ from each other and from the last call's, and can be bound.
    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let first: [u16; 3] = free_ports();
        let second: [u16; 3] = free_ports();
        let all: std::collections::BTreeSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 6, "{first:?} {second:?}");
        for port in all {
            assert!(u32::from(port) < ephemeral_low(), "{port}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("bindable");
        }
    }
}
