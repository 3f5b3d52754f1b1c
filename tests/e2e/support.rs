//! Spawning real `vvm-host` processes and reading their log lines.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");

/// How long any single wait may take before the test fails; generous, never hit when green.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// One stderr line of a host, with when it was read.
#[derive(Clone, Debug)]
pub struct Line {
    pub at: Instant,
    pub text: String,
}

#[derive(Default)]
struct Log {
    lines: Vec<Line>,
    closed: bool,
}

/// A running `vvm-host` child process.
pub struct Host {
    pub name: &'static str,
    child: Child,
    log: Arc<(Mutex<Log>, Condvar)>,
}

impl Host {
    /// Starts `vvm-host <args>` in `dir` with JSON logs filtered by `rust_log` (`RUST_LOG`).
    pub fn start(name: &'static str, dir: &Path, args: &[&str], rust_log: &str) -> Host {
        Self::start_in(None, name, dir, args, rust_log)
    }

    /// Like [`Host::start`], inside the network namespace `netns` if one is given (through
    /// `ip netns exec`, which execs: the pid is vvm-host's).
    pub fn start_in(
        netns: Option<&str>,
        name: &'static str,
        dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> Host {
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, BIN]);
                c
            }
            None => Command::new(BIN),
        };
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

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// All lines so far.
    pub fn lines(&self) -> Vec<Line> {
        self.log.0.lock().unwrap().lines.clone()
    }

    /// Waits for the first line at index >= `from` containing every needle.
    pub fn wait_for_from(&self, from: usize, needles: &[&str]) -> (usize, Line) {
        let (lock, cv) = &*self.log;
        let end = Instant::now() + PATIENCE;
        let mut log = lock.lock().unwrap();
        loop {
            if let Some((i, line)) = log
                .lines
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, l)| needles.iter().all(|n| l.text.contains(n)))
            {
                return (i, line.clone());
            }
            let now = Instant::now();
            assert!(
                now < end,
                "{}: no line with {needles:?} within {PATIENCE:?}; log:\n{}",
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

    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
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
