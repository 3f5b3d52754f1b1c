//! Incoming HTTP (SPEC §10, §12): requests per second and p50/p99 latency of hello-world
//! HTTP components (WASI 0.2 and 0.3) served by `vvm-host serve` (fencing on, as always) beside
//! `wasmtime serve` on the same component under the same load, in one run: the Rust hello
//! (`test/http-hello`) with a fresh instance per request and with instance reuse
//! (`max-instance-reuse-count` 128 on both), and the Python hello (`test/python-hello`,
//! componentize-py) with reuse and without, a WASI 0.3 Rust hello (`test/p3-http`, `wasip3`)
//! with the defaults for it (128 requests, 16 at once); the counter example beside the hello,
//! with reuse;
//! then the time from a graceful stop (SIGTERM) of the leader, and from its freezing
//! (SIGSTOP), to the first 200 from its successor, with the requests refused or unanswered.
//!
//! Set-up (once, not in CI): `cargo install --locked wasmtime-cli@48.0.8` and `wrk` (Debian's
//! package). Run: `cargo bench -p vvm-host --bench incoming_http`. `WASMTIME=PATH` picks the
//! wasmtime binary (default: `wasmtime` on PATH, then `~/.cargo/bin/wasmtime`); without it
//! the wasmtime rows are skipped with a message, and without `wrk` the load rows are.
//!
//! Load: `wrk -t2 -c32 -d10s --latency`, the two servers in turn, [`ROUNDS`] times each, after
//! a warm-up of each. Takeover: two hosts share one `--http-addr`; clients ask without a
//! pause, each request on a new connection; the gap is from SIGTERM (or SIGSTOP) to the
//! leader to the first 200 carrying the successor's term, on the bench's own clock.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::load::{Load, which, wrk};

const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");

/// Load rounds per server, after one warm-up each.
const ROUNDS: usize = 3;
/// Graceful takeovers measured, after one warm-up.
const TAKEOVERS: usize = 10;
/// Takeovers from a stopped (SIGSTOP) leader measured, after one warm-up: each waits out a
/// lease.
const FROZEN_TAKEOVERS: usize = 3;
/// Clients asking during a takeover.
const CLIENTS: usize = 4;

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let services = dir.path().join("services");
    std::fs::create_dir(&services).expect("services dir");
    let hello = services.join("hello.wasm");
    std::fs::copy(guests::guest("test/http-hello"), &hello).expect("copy the guest");
    if which("wrk").is_none() {
        println!("wrk not found (apt-get install wrk): no load rows");
    } else {
        let python = dir.path().join("python-hello.wasm");
        std::fs::copy(guests::guest("test/python-hello"), &python).expect("copy the guest");
        let p3 = dir.path().join("p3-hello.wasm");
        std::fs::copy(guests::guest("test/p3-http"), &p3).expect("copy the guest");
        let rust = dir.path().join("rust-hello.wasm");
        std::fs::copy(&hello, &rust).expect("copy the guest");
        for (what, component, reuse) in [
            ("Rust hello, a fresh instance per request", &rust, None),
            ("Rust hello, instance reuse 128", &rust, Some(128)),
            ("Python hello, instance reuse 128", &python, Some(128)),
            ("Python hello, a fresh instance per request", &python, None),
            (
                "WASI 0.3 Rust hello, the defaults (128, 16 at once)",
                &p3,
                None,
            ),
        ] {
            println!("\n## {what}");
            std::fs::copy(component, &hello).expect("copy the guest");
            load_side_by_side(dir.path(), &hello, reuse);
        }
        std::fs::copy(guests::guest("test/http-hello"), &hello).expect("copy the guest");
        let counter = services.join("rust-http.wasm");
        std::fs::copy(guests::guest("rust-http"), &counter).expect("copy the counter");
        stateful_beside_stateless(dir.path(), None);
        stateful_beside_stateless(dir.path(), Some(128));
        std::fs::remove_file(counter).expect("remove the counter");
    }
    takeovers(dir.path(), Stop::Graceful, TAKEOVERS);
    takeovers(dir.path(), Stop::Frozen, FROZEN_TAKEOVERS);
}

/// The `rust-http` example (every GET an increment in the store, group-committed) beside the
/// stateless hello on the same host and store, in turn, and their ratio (issue 38); with
/// `reuse`, every instance serves that many requests.
fn stateful_beside_stateless(dir: &Path, reuse: Option<u32>) {
    let addr = free_addr();
    let host = serve("stateful", dir, addr, reuse);
    host.wait_for(&["http listening"]);
    let urls = [
        (
            "rust-http (a store write)",
            format!("http://{addr}/rust-http/"),
        ),
        ("hello (stateless)", format!("http://{addr}/hello/")),
    ];
    for (_, url) in &urls {
        wrk(url, "3s");
    }
    let reused = reuse.map_or_else(
        || "a fresh instance per request".to_owned(),
        |n| format!("instance reuse {n}"),
    );
    println!(
        "\nthe counter beside the hello, {reused}, wrk -t2 -c32 -d10s, {ROUNDS} rounds, in \
         turn:\n"
    );
    println!("| round | service | requests/s | p50 | p99 |");
    println!("|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for round in 1..=ROUNDS {
        let loads: Vec<Option<Load>> = urls.iter().map(|(_, url)| wrk(url, "10s")).collect();
        for ((name, _), load) in urls.iter().zip(&loads) {
            match load {
                Some(l) => println!(
                    "| {round} | {name} | {:.0} | {:.2} ms | {:.2} ms |",
                    l.rps, l.p50_ms, l.p99_ms
                ),
                None => println!("| {round} | {name} | wrk failed (or non-2xx) | | |"),
            }
        }
        if let [Some(counter), Some(hello)] = loads.as_slice() {
            ratios.push(counter.rps / hello.rps);
        }
    }
    let ratios: Vec<String> = ratios.iter().map(|r| format!("{r:.2}×")).collect();
    println!(
        "\ncounter / hello requests/s by round: {}",
        ratios.join(", ")
    );
    drop(host);
}

/// A loopback address with a port that was free a moment ago.
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The wasmtime CLI to compare with, and its version line.
fn wasmtime() -> Option<(PathBuf, String)> {
    let bin = std::env::var_os("WASMTIME")
        .map(PathBuf::from)
        .or_else(|| which("wasmtime"))
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(Path::new(&home).join(".cargo/bin/wasmtime")).filter(|p| p.is_file())
        })?;
    let out = Command::new(&bin).arg("--version").output().ok()?;
    Some((bin, String::from_utf8_lossy(&out.stdout).trim().to_owned()))
}

/// Waits until `addr` accepts connections (the server is up).
fn wait_listening(addr: SocketAddr) {
    let end = Instant::now() + testkit::host::PATIENCE;
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "{addr} never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `vvm-host serve` in `dir` with HTTP on `addr`.
/// `vvm-host serve` in `dir` on `addr`; with `reuse`, `--max-instance-reuse-count` so.
fn serve(name: &'static str, dir: &Path, addr: SocketAddr, reuse: Option<u32>) -> Host {
    let addr = addr.to_string();
    let cache = format!("cache-{name}");
    let mut args = vec![
        "serve".to_owned(),
        "--store".to_owned(),
        "vvm.redb".to_owned(),
        "--lease".to_owned(),
        "2s".to_owned(),
        "--grace-period".to_owned(),
        "1s".to_owned(),
        "--cache-dir".to_owned(),
        cache,
        "--http-addr".to_owned(),
        addr,
    ];
    if let Some(n) = reuse {
        args.extend(["--max-instance-reuse-count".to_owned(), n.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Host::start(BIN, name, dir, &args, "info")
}

/// Kills the child when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The load on vvm-host and on `wasmtime serve`, in turn, and their ratios; with `reuse`,
/// each instance serves that many requests on both.
fn load_side_by_side(dir: &Path, hello: &Path, reuse: Option<u32>) {
    let vvm_addr = free_addr();
    let host = serve("load", dir, vvm_addr, reuse);
    host.wait_for(&["http listening"]);
    let vvm_url = format!("http://{vvm_addr}/hello/");
    let wasmtime_server = wasmtime().map(|(bin, version)| {
        let addr = free_addr();
        let reuse = reuse.map(|n| format!("--max-instance-reuse-count={n}"));
        let child = Command::new(bin)
            // `-Scli`: the guest's std imports wasi:cli (its environment), as vvm-host links it;
            // `-Sp3 -Wcomponent-model-async`: WASI 0.3, which vvm-host always offers.
            .args(["serve", "-Scli", "-Sp3", "-Wcomponent-model-async"])
            .args(["--addr", &addr.to_string()])
            .args(reuse)
            .arg(hello)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wasmtime serve");
        wait_listening(addr);
        (Killed(child), format!("http://{addr}/hello/"), version)
    });
    if wasmtime_server.is_none() {
        println!(
            "wasmtime not found (cargo install --locked wasmtime-cli@48.0.8): no wasmtime rows"
        );
    }
    let servers: Vec<(String, String)> = std::iter::once(("vvm-host".to_owned(), vvm_url))
        .chain(
            wasmtime_server
                .iter()
                .map(|(_, url, v)| (v.clone(), url.clone())),
        )
        .collect();
    for (_, url) in &servers {
        wrk(url, "3s");
    }
    println!("\nwrk -t2 -c32 -d10s, {ROUNDS} rounds each, in turn:\n");
    println!("| round | server | requests/s | p50 | p99 |");
    println!("|---|---|---|---|---|");
    let mut all: Vec<Vec<Load>> = vec![Vec::new(); servers.len()];
    for round in 1..=ROUNDS {
        for (i, (name, url)) in servers.iter().enumerate() {
            let Some(load) = wrk(url, "10s") else {
                println!("| {round} | {name} | wrk failed | | |");
                continue;
            };
            println!(
                "| {round} | {name} | {:.0} | {:.2} ms | {:.2} ms |",
                load.rps, load.p50_ms, load.p99_ms
            );
            all[i].push(load);
        }
    }
    if let [vvm, wasmtime] = all.as_slice() {
        println!("\n| round | vvm-host / wasmtime requests/s | vvm-host / wasmtime p99 |");
        println!("|---|---|---|");
        for (round, (v, w)) in vvm.iter().zip(wasmtime).enumerate() {
            println!(
                "| {} | {:.2}× | {:.2}× |",
                round + 1,
                v.rps / w.rps,
                v.p99_ms / w.p99_ms
            );
        }
    }
    drop(host);
}

/// How one request of a takeover's clients ended.
enum Asked {
    /// 200 under this term.
    Ok(u64),
    /// The connection was refused: no host held the address.
    Refused,
    /// No answer within the client's 10 s.
    Hung,
    /// Anything else (a 503, a cut response).
    Other,
}

/// One GET on a new connection.
fn ask(addr: SocketAddr) -> Asked {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return Asked::Refused;
    };
    if stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .is_err()
        || stream
            .write_all(b"GET /hello/n HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .is_err()
    {
        return Asked::Other;
    }
    let mut out = Vec::new();
    match stream.read_to_end(&mut out) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Asked::Hung;
        }
        Err(_) => return Asked::Other,
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&out);
    if !text.starts_with("HTTP/1.1 200") {
        return Asked::Other;
    }
    text.lines()
        .find_map(|l| l.strip_prefix("vvm-fencing-token: "))
        .and_then(|t| t.trim().parse().ok())
        .map_or(Asked::Other, Asked::Ok)
}

/// Sets its flag when dropped: on the way out of a scope, panicking or not.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// How the leader is stopped in [`takeovers`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM: it stops accepting, answers what it holds and releases the lease.
    Graceful,
    /// SIGSTOP: it keeps its lease until the lease runs out (L = 2 s), and holds what it had
    /// accepted; killed (SIGKILL) once its successor answers.
    Frozen,
}

/// Takeovers under clients asking without a pause: from the signal to the leader to the
/// first 200 of the new term, and the requests refused, hung (no answer in 10 s) or answered
/// otherwise (a 503, or a response cut) over all the rounds.
fn takeovers(dir: &Path, how: Stop, rounds: usize) {
    let addr = free_addr();
    let mut leader = serve("t0", dir, addr, None);
    leader.wait_for(&["http listening"]);
    let mut standby = serve("t1", dir, addr, None);
    standby.wait_for(&["campaigning"]);
    let newest = Mutex::new((0u64, Instant::now()));
    let (refused, hung, other) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let done = AtomicBool::new(false);
    let mut gaps = Vec::new();
    std::thread::scope(|s| {
        // The clients end with the rounds, and also when a round fails: the scope joins
        // them before the panic goes on, and they would ask forever.
        let _done = Done(&done);
        for _ in 0..CLIENTS {
            s.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    let count = match ask(addr) {
                        Asked::Ok(term) => {
                            let mut newest = newest.lock().expect("lock");
                            if term > newest.0 {
                                *newest = (term, Instant::now());
                            }
                            continue;
                        }
                        Asked::Refused => &refused,
                        Asked::Hung => &hung,
                        Asked::Other => &other,
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        for round in 0..=rounds {
            let (term, _) = wait_for_term(&newest, |t| t > 0);
            let stopped = Instant::now();
            leader.signal(match how {
                Stop::Graceful => Signal::TERM,
                Stop::Frozen => Signal::STOP,
            });
            let (_, at) = wait_for_term(&newest, |t| t > term);
            if round > 0 {
                gaps.push(at.duration_since(stopped));
            }
            if how == Stop::Frozen {
                leader.signal(Signal::KILL);
                leader.wait_exit();
            } else {
                assert!(leader.wait_exit().success(), "leader exit");
            }
            let name: &'static str = Box::leak(format!("t{}", round + 2).into_boxed_str());
            leader = std::mem::replace(&mut standby, serve(name, dir, addr, None));
            standby.wait_for(&["campaigning"]);
        }
    });
    gaps.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let what = match how {
        Stop::Graceful => "SIGTERM",
        Stop::Frozen => "SIGSTOP",
    };
    println!(
        "\n{what} to the leader to the first 200 of the new leader, {rounds} takeovers (after a \
         warm-up) under {CLIENTS} clients (new connection per request):\n"
    );
    println!("| median | p90 | min | max | refused | hung | 503 or cut |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {} | {} | {} |",
        ms(gaps[gaps.len() / 2]),
        ms(gaps[gaps.len() * 9 / 10]),
        ms(gaps[0]),
        ms(gaps[gaps.len() - 1]),
        refused.load(Ordering::SeqCst),
        hung.load(Ordering::SeqCst),
        other.load(Ordering::SeqCst),
    );
}

/// Waits until the newest term answered satisfies `ok`: that term, and when it was first
/// answered.
fn wait_for_term(newest: &Mutex<(u64, Instant)>, ok: impl Fn(u64) -> bool) -> (u64, Instant) {
    let end = Instant::now() + testkit::host::PATIENCE;
    loop {
        let (term, at) = *newest.lock().expect("lock");
        if ok(term) {
            return (term, at);
        }
        assert!(Instant::now() < end, "no new term answered");
        std::thread::sleep(Duration::from_millis(1));
    }
}
