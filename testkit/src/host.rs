//! Real `vvm-host` processes and their log lines.
//!
//! `bin` is always the caller's `env!("CARGO_BIN_EXE_vvm-host")`: cargo builds the binary for
//! the test or bench target that asks for it, in that target's profile.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long any single wait may take before the test fails; generous, never hit when green.
pub const PATIENCE: Duration = Duration::from_mins(1);

/// One stderr line of a host, with when it was read.
#[derive(Clone, Debug)]
pub struct Line {
    /// When the line was read from the host's stderr.
    pub at: Instant,
    /// The line, without its newline.
    pub text: String,
}

#[derive(Default)]
struct Log {
    lines: Vec<Line>,
    closed: bool,
}

/// A running `vvm-host` child process.
pub struct Host {
    /// The host's name in failure messages.
    pub name: &'static str,
    child: Child,
    log: Arc<(Mutex<Log>, Condvar)>,
}

impl Host {
    /// Starts `bin <args>` in `dir` with JSON logs filtered by `rust_log` (`RUST_LOG`).
    pub fn start(bin: &str, name: &'static str, dir: &Path, args: &[&str], rust_log: &str) -> Host {
        Self::start_in(bin, None, name, dir, args, rust_log)
    }

    /// Like [`Host::start`], running `command` (the binary, with whatever environment of its
    /// own the test set on it, e.g. `DOCKER_CONFIG`).
    pub fn start_command(
        command: Command,
        name: &'static str,
        dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> Host {
        Self::launch(command, name, dir, args, rust_log)
    }

    /// Like [`Host::start`], inside the network namespace `netns` if one is given (through
    /// `ip netns exec`, which execs: the pid is vvm-host's).
    pub fn start_in(
        bin: &str,
        netns: Option<&str>,
        name: &'static str,
        dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> Host {
        let command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        Self::launch(command, name, dir, args, rust_log)
    }

    /// Like [`Host::start`], with `socket` passed as systemd's socket activation passes
    /// one (`sd_listen_fds(3)`): as descriptor 3, with `LISTEN_FDS=1` and `LISTEN_PID` the
    /// host's own (a shell sets both and execs the host, keeping its pid). `socket` must not
    /// be close-on-exec.
    pub fn start_socket_activated(
        bin: &str,
        socket: std::os::fd::BorrowedFd<'_>,
        name: &'static str,
        dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> Host {
        use std::os::fd::AsRawFd as _;
        let mut command = Command::new("sh");
        let script = format!(
            "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\" 3<&{}",
            socket.as_raw_fd()
        );
        command.args(["-c", &script, bin]);
        Self::launch(command, name, dir, args, rust_log)
    }

    /// Runs `command` with `args` in `dir`, its log collected under `name`.
    fn launch(
        mut command: Command,
        name: &'static str,
        dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> Host {
        let mut child = command
            .args(args)
            .current_dir(dir)
            .env("RUST_LOG", rust_log)
            .env("VVM_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vvm-host");
        let log: Arc<(Mutex<Log>, Condvar)> = Arc::default();
        for stream in [
            Box::new(child.stderr.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stdout.take().unwrap()),
        ] {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for text in BufReader::new(stream).lines().map_while(Result::ok) {
                    if std::env::var_os("E2E_ECHO").is_some() {
                        eprintln!("[{name}] {text}");
                    }
                    let (lock, cv) = &*log;
                    lock.lock().unwrap().lines.push(Line {
                        at: Instant::now(),
                        text,
                    });
                    cv.notify_all();
                }
                let (lock, cv) = &*log;
                lock.lock().unwrap().closed = true;
                cv.notify_all();
            });
        }
        Host { name, child, log }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// All lines so far.
    pub fn lines(&self) -> Vec<Line> {
        self.log.0.lock().unwrap().lines.clone()
    }

    /// Waits for the first line at index >= `from` containing every needle.
    pub fn wait_for_from(&self, from: usize, needles: &[&str]) -> (usize, Line) {
        let (i, _, line) = self.wait_for_any_from(from, &[needles]);
        (i, line)
    }

    /// Waits for the first line at index >= `from` containing every needle of one of
    /// `choices`; returns its index, the index of the choice it meets, and the line.
    pub fn wait_for_any_from(&self, from: usize, choices: &[&[&str]]) -> (usize, usize, Line) {
        let (lock, cv) = &*self.log;
        let end = Instant::now() + PATIENCE;
        let mut log = lock.lock().unwrap();
        loop {
            let found = log.lines.iter().enumerate().skip(from).find_map(|(i, l)| {
                let choice = choices
                    .iter()
                    .position(|needles| needles.iter().all(|n| l.text.contains(n)))?;
                Some((i, choice, l.clone()))
            });
            if let Some(found) = found {
                return found;
            }
            let now = Instant::now();
            assert!(
                now < end,
                "{}: no line with {choices:?} within {PATIENCE:?}; log:\n{}",
                self.name,
                tail(&log.lines)
            );
            log = cv.wait_timeout(log, end - now).unwrap().0;
        }
    }

    /// Waits for a line (from the start of the log) containing every needle.
    pub fn wait_for(&self, needles: &[&str]) -> Line {
        self.wait_for_from(0, needles).1
    }

    /// Number of lines so far.
    pub fn mark(&self) -> usize {
        self.log.0.lock().unwrap().lines.len()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Sends SIGSTOP and waits until the kernel shows the process stopped (or gone): state
    /// `T` in `/proc/PID/stat`, which is what a leader reads to pass a stopped standby by.
    pub fn stop(&self) {
        self.signal(rustix::process::Signal::STOP);
        let end = Instant::now() + PATIENCE;
        loop {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            if matches!(state, None | Some("T" | "t" | "Z" | "X")) {
                return;
            }
            assert!(Instant::now() < end, "{} did not stop", self.name);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether this host holds a transaction's lock on a file named `file` (the redb store's
    /// `vvm.redb`), as `/proc/PID/fdinfo` of its descriptors of it lists them (redb's locks
    /// are open-file-description locks). Every open redb file holds some for its life, which
    /// no writer waits for: a shared `flock` of the whole file and shared locks on its
    /// registration bytes (from 2^62). A transaction adds the header bytes (from 0) or an
    /// exclusive lock. Asked while the host is stopped, it says whether it was stopped inside
    /// a transaction of its own.
    pub fn holds_lock_on(&self, file: &str) -> bool {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", self.pid())) else {
            return false;
        };
        let in_transaction = |line: &str| {
            // `lock: 1: OFDLCK ADVISORY WRITE -1 fe:00:123 START END`
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2) == Some(&"OFDLCK")
                && (fields.get(4) == Some(&"WRITE")
                    || fields.get(7).and_then(|s| s.parse::<u64>().ok()) < Some(1 << 62))
        };
        fds.flatten().any(|fd| {
            let of_file = std::fs::read_link(fd.path()).is_ok_and(|target| target.ends_with(file));
            of_file
                && std::fs::read_to_string(format!(
                    "/proc/{}/fdinfo/{}",
                    self.pid(),
                    fd.file_name().to_string_lossy()
                ))
                .is_ok_and(|info| {
                    info.lines()
                        .any(|l| l.starts_with("lock:") && in_transaction(l))
                })
        })
    }

    /// Keeps this host stopped (SIGSTOP) until `other` logs a line with every needle, and
    /// returns that line; the caller sends SIGCONT.
    ///
    /// A host stopped inside a write to the redb store holds a lock on the file, and no
    /// other process can write it until the host runs again (docs/guarantees.md, "No
    /// process stalls another"). So when `other` reports a lock held past its patience, this
    /// host is let run for a moment to finish its write, then stopped again. Whatever it
    /// does while it runs, it does before `other` could take anything over.
    pub fn stop_until(&self, other: &Host, needles: &[&str]) -> Line {
        const LOCK_HELD: &[&str] = &["another process has held"];
        loop {
            let from = other.mark();
            self.signal(rustix::process::Signal::STOP);
            let (_, choice, line) = other.wait_for_any_from(from, &[needles, LOCK_HELD]);
            if choice == 0 {
                return line;
            }
            eprintln!(
                "{}: stopped inside a store write; resumed for a moment",
                self.name
            );
            self.signal(rustix::process::Signal::CONT);
            // Any length will do: a write still unfinished is reported again.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the process to exit and for its output to be read.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.wait_exit_or(PATIENCE)
            .unwrap_or_else(|| panic!("{} did not exit", self.name))
    }

    /// Like [`Host::wait_exit`], but `None` if the process still runs after `patience`.
    pub fn wait_exit_or(&mut self, patience: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + patience;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let (lock, cv) = &*self.log;
                let mut log = lock.lock().unwrap();
                while !log.closed && Instant::now() < end {
                    log = cv.wait_timeout(log, Duration::from_millis(50)).unwrap().0;
                }
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A directory with `services/rust-ticker.wasm`, shared by the hosts of a test.
pub fn cluster_dir() -> tempfile::TempDir {
    let dir = crate::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).expect("services dir");
    std::fs::copy(
        crate::guests::guest("rust-ticker"),
        services.join("rust-ticker.wasm"),
    )
    .expect("copy the ticker");
    dir
}

/// `bin serve` in `dir` on `store` with the given lease, a grace period of 2 s and its own
/// compile cache (`cache-<name>` in `dir`: warm when a later host reuses the name). Renewals
/// are logged (`renewed`, at debug level), so a test can tell when a lease was last written.
pub fn serve(bin: &str, name: &'static str, dir: &Path, store: &str, lease: &str) -> Host {
    serve_with(
        bin,
        name,
        dir,
        [store, lease, "2s"],
        "info,vvm_host::elections=debug",
    )
}

/// `bin serve` in `dir` with `[store, lease, grace period]`, its own compile cache
/// (`cache-<name>` in `dir`) and `rust_log` as `RUST_LOG`.
pub fn serve_with(
    bin: &str,
    name: &'static str,
    dir: &Path,
    [store, lease, grace]: [&str; 3],
    rust_log: &str,
) -> Host {
    let cache = format!("cache-{name}");
    let args = [
        "serve",
        "--store",
        store,
        "--lease",
        lease,
        "--cache-dir",
        &cache,
        "--grace-period",
        grace,
    ];
    Host::start(bin, name, dir, &args, rust_log)
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(lines: &[Line]) -> String {
    let start = lines.len().saturating_sub(40);
    lines[start..]
        .iter()
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
