//! From a changed source to the new version serving (issue 49): a Python HTTP service
//! (`python-http`, ~18 MB) on a real host, its `[service.NAME] source` repinned and SIGHUP
//! sent, against a real registry on loopback (Debian's `docker-registry`); beside it the same
//! bytes renamed into the services directory.
//!
//! Run: `cargo bench -p vvm-host --bench oci` (needs `docker-registry` on PATH). Each run is a
//! new version (the component with a custom section of its own), measured from the SIGHUP (or
//! the rename) to the first 200 from the host after its `service replaced` line:
//! - registry, cold: the digest never pulled and never compiled: pull, verify, cache, compile;
//! - registry, warm: a digest pulled and compiled before (two versions taken in turn): read
//!   from the content cache and hashed, the compiled component from the compile cache;
//! - file, cold and warm: the same bytes renamed into the services directory.
//!
//! Prints a table of median, min and max per kind.

// A benchmark: a failed unwrap is a failed run.
#![allow(clippy::unwrap_used, missing_docs)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::registry::{self, Registry};

const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");
/// Measured runs of each kind.
const RUNS: usize = 3;

fn main() {
    let Some(registry) = Registry::start() else {
        return;
    };
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    let addr = registry.addr();
    let python = std::fs::read(guests::guest("python-http")).unwrap();
    let mut version = 0;
    let mut next = || {
        version += 1;
        variant(&python, version)
    };
    // Two versions for the warm runs, pulled (and compiled) before they are measured.
    let warm: Vec<(Vec<u8>, String)> = (0..2)
        .map(|_| {
            let bytes = next();
            let pinned = push(&bytes, dir.path(), &addr, "py:warm");
            (bytes, pinned)
        })
        .collect();
    write_config(dir.path(), &addr, &warm[0].1);
    std::fs::write(services.join("file.wasm"), &warm[0].0).unwrap();
    let http = free_addr();
    let args = [
        "serve",
        "--store",
        "vvm.redb",
        "--cache-dir",
        "cache",
        "--http-addr",
        &http.to_string(),
    ];
    let host = Host::start(BIN, "a", dir.path(), &args, "info");
    host.wait_for(&["service running", "\"service\":\"py\""]);
    host.wait_for(&["service running", "\"service\":\"file\""]);
    // The second warm version through once, unmeasured.
    swap_source(&host, dir.path(), &addr, &warm[1].1, http);
    swap_file(&host, &services, &warm[1].0, http);

    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();
    let mut cold_registry = Vec::new();
    let mut cold_file = Vec::new();
    let mut warm_registry = Vec::new();
    let mut warm_file = Vec::new();
    for run in 0..RUNS {
        let bytes = next();
        let pinned = push(&bytes, dir.path(), &addr, &format!("py:cold{run}"));
        cold_registry.push(swap_source(&host, dir.path(), &addr, &pinned, http));
        cold_file.push(swap_file(&host, &services, &next(), http));
        let (bytes, pinned) = &warm[run % 2];
        warm_registry.push(swap_source(&host, dir.path(), &addr, pinned, http));
        warm_file.push(swap_file(&host, &services, bytes, http));
    }
    rows.push(("registry, cold (pull + compile)", cold_registry));
    rows.push(("file, cold (compile)", cold_file));
    rows.push((
        "registry, warm (content cache + compile cache)",
        warm_registry,
    ));
    rows.push(("file, warm (compile cache)", warm_file));
    println!(
        "python-http ({:.1} MB), changed source or file to the new version serving, {RUNS} runs",
        python.len() as f64 / 1e6
    );
    println!("| kind | median | min | max |");
    println!("|---|---|---|---|");
    for (kind, mut times) in rows {
        times.sort();
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
        println!(
            "| {kind} | {} | {} | {} |",
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() - 1])
        );
    }
}

/// `python` with a custom section carrying `n`: a valid component, a version of its own.
fn variant(python: &[u8], n: u32) -> Vec<u8> {
    let name = b"bench";
    let payload = n.to_le_bytes();
    let mut bytes = python.to_vec();
    bytes.push(0);
    bytes.push(u8::try_from(1 + name.len() + payload.len()).unwrap());
    bytes.push(u8::try_from(name.len()).unwrap());
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(&payload);
    bytes
}

/// Pushes `bytes` as `repo_tag` with `vvm-host push`: the pinned reference.
fn push(bytes: &[u8], dir: &Path, addr: &str, repo_tag: &str) -> String {
    let file = dir.join("push.wasm");
    std::fs::write(&file, bytes).unwrap();
    let reference = format!("oci://{addr}/bench/{repo_tag}");
    registry::pinned(registry::push(BIN, &file, &reference).args(["--insecure-registries", addr]))
}

fn write_config(dir: &Path, addr: &str, pinned: &str) {
    let text = format!("insecure-registries = [\"{addr}\"]\n[service.py]\nsource = \"{pinned}\"\n");
    std::fs::write(dir.join("vvm.toml"), text).unwrap();
}

/// Repins `py` to `pinned`, sends SIGHUP: the time to the new version's first 200.
fn swap_source(host: &Host, dir: &Path, addr: &str, pinned: &str, http: SocketAddr) -> Duration {
    write_config(dir, addr, pinned);
    let mark = host.mark();
    let start = Instant::now();
    host.signal(Signal::HUP);
    host.wait_for_from(mark, &["service replaced", "\"service\":\"py\""]);
    until_ok(http, "/py/");
    start.elapsed()
}

/// Renames `bytes` into place as `file.wasm`: the time to the new version's first 200.
fn swap_file(host: &Host, services: &Path, bytes: &[u8], http: SocketAddr) -> Duration {
    let tmp = services.join(".file.wasm.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    let mark = host.mark();
    let start = Instant::now();
    std::fs::rename(&tmp, services.join("file.wasm")).unwrap();
    host.wait_for_from(mark, &["service replaced", "\"service\":\"file\""]);
    until_ok(http, "/file/");
    start.elapsed()
}

/// Asks `path` until it answers 200 (the new version is routed when it starts).
fn until_ok(http: SocketAddr, path: &str) {
    let end = Instant::now() + Duration::from_mins(1);
    loop {
        if status(http, path) == Some(200) {
            return;
        }
        assert!(Instant::now() < end, "{path} never answered 200");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn status(http: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(http).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}
