//! Throw-away OCI registry for tests: Debian's `docker-registry` (CNCF distribution 2.8) as a
//! child process on a loopback port, with a configuration of its own (Debian's stock one turns
//! on htpasswd auth and listens on every interface) and its storage in a temp dir; killed on
//! drop.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `bin push FILE REFERENCE` (`vvm-host push`), for the caller to add flags and environment
/// to; [`pinned`] reads what it printed.
pub fn push(bin: &str, file: &Path, reference: &str) -> Command {
    let mut command = Command::new(bin);
    command.arg("push").arg(file).arg(reference);
    command
}

/// The pinned reference a [`push`] that must succeed printed.
///
/// # Panics
/// When the push failed, with what it said.
pub fn pinned(push: &mut Command) -> String {
    let out = push.output().expect("vvm-host push runs");
    assert!(
        out.status.success(),
        "{push:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A running registry; anonymous unless started with [`Registry::start_htpasswd`].
pub struct Registry {
    child: Option<Child>,
    /// Whether it serves HTTPS (then with `dir/ca.pem`'s CA).
    tls: bool,
    binary: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry anyone may push to and pull from, and waits until it answers.
    ///
    /// Returns `None` (after printing why) when no `docker-registry` binary is on PATH,
    /// unless the environment variable `CI` is set: then a missing registry is a failure.
    pub fn start() -> Option<Self> {
        Self::start_with(false, false)
    }

    /// Starts a registry anyone may use over HTTPS only, with a certificate (for 127.0.0.1)
    /// that a fresh CA signed; [`Registry::ca`] is that CA's PEM file.
    pub fn start_tls() -> Option<Self> {
        Self::start_with(false, true)
    }

    /// The CA (PEM) that signed the certificate of a registry started with
    /// [`Registry::start_tls`].
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Starts a registry that wants HTTP basic credentials (htpasswd, a user nobody was told
    /// the password of): every request without them is 401.
    pub fn start_htpasswd() -> Option<Self> {
        Self::start_with(true, false)
    }

    fn start_with(htpasswd: bool, tls: bool) -> Option<Self> {
        let Some(binary) = crate::etcd::find_on_path("docker-registry") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "docker-registry is not on PATH, and CI is set: install the docker-registry package"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: docker-registry is not on PATH (install docker-registry to run the OCI tests)"
            );
            return None;
        };
        let dir = crate::scratch::scratch_dir();
        let [port] = crate::etcd::free_ports();
        let data = dir.path().join("data");
        let mut config = format!(
            "version: 0.1\nlog: {{level: info}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  \
             delete: {{enabled: true}}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            data.display()
        );
        if tls {
            let (_, cert, key) = crate::http::server_files(dir.path());
            let _ = writeln!(
                config,
                "  tls: {{certificate: {}, key: {}}}",
                cert.display(),
                key.display()
            );
        }
        if htpasswd {
            // A missing file is made with user `docker` and a random password (logged).
            let file = dir.path().join("htpasswd");
            let _ = writeln!(
                config,
                "auth:\n  htpasswd: {{realm: test, path: {}}}",
                file.display()
            );
        }
        std::fs::write(dir.path().join("config.yml"), config).expect("registry config");
        let mut registry = Self {
            child: None,
            tls,
            binary,
            port,
            dir,
        };
        registry.restart();
        Some(registry)
    }

    /// `127.0.0.1:PORT`, as a reference names it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the registry keeps blob `digest` (`sha256:<hex>`): a test may change its bytes.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Kills the registry (SIGKILL) and waits for it to exit; its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the registry (again) on the same port and data, and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("registry.log"))
            .expect("registry log file");
        let child = Command::new(&self.binary)
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("registry log file"))
            .stderr(log)
            .spawn()
            .expect("spawn docker-registry");
        self.child = Some(child);
        self.wait_answering(Duration::from_secs(20));
    }

    /// The registry's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    fn wait_answering(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "docker-registry exited with {status} while starting:\n{}",
                    self.log()
                );
            }
            // Over TLS, a listening port is enough: the check below speaks plain HTTP.
            let up = if self.tls {
                TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok()
            } else {
                answers(self.port)
            };
            if up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry not answering within {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The password of user `docker` on a registry started with
    /// [`Registry::start_htpasswd`] (made by the registry and logged at its first start).
    pub fn password(&self) -> Option<String> {
        let log = self.log();
        let at = log.find(" password=")? + " password=".len();
        let password: String = log[at..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect();
        (!password.is_empty()).then_some(password)
    }

    /// The data directory (for a test that wants to look).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether the registry on loopback `port` answers `GET /v2/` (200, or 401 with auth on).
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let request = "GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut response = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut response).is_ok()
        && (response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.0 401"))
}
