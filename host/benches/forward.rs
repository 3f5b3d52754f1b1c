//! Forwarding (SPEC §13, issue 50): the hello asked directly of the spread member that holds
//! it, and through another member that forwards it there, in turn, in one run: requests per
//! second and p50/p99, and the ratios (the goal: forwarded at least 0.8× direct throughput,
//! p50 no more than 0.5 ms higher on loopback).
//!
//! Set-up (once, not in CI): `wrk` (Debian's package). Run: `cargo bench -p vvm-host --bench
//! forward`. Load: `wrk -t2 -c32 -d10s --latency`, direct and forwarded in turn, [`ROUNDS`]
//! times each, after a warm-up of each. Two members on one redb store, each on its own
//! `--http-addr`; the hello is one service, so one member holds it and the other forwards.

// A benchmark: a failed unwrap is a failed run.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;

use testkit::guests;
use testkit::host::Host;
use testkit::load::{Load, which, wrk};
use testkit::spread::{running, wait_for_rest};

const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");
/// Load rounds per way, after one warm-up each.
const ROUNDS: usize = 3;

fn main() {
    if which("wrk").is_none() {
        println!("wrk not found (apt-get install wrk): nothing to measure");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(
        guests::guest("test/http-hello"),
        services.join("hello.wasm"),
    )
    .unwrap();
    std::fs::write(dir.path().join("vvm.toml"), "placement = \"spread\"\n").unwrap();
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let a = member("a", dir.path(), addr_a);
    let b = member("b", dir.path(), addr_b);
    wait_for_rest(&[&a, &b], &["hello".to_owned()], &[1, 0]);
    let (holder, other) = if running(&a).is_empty() {
        (addr_b, addr_a)
    } else {
        (addr_a, addr_b)
    };
    let ways = [
        ("direct", format!("http://{holder}/hello/")),
        ("forwarded", format!("http://{other}/hello/")),
    ];
    for (_, url) in &ways {
        wrk(url, "3s");
    }
    println!("\nwrk -t2 -c32 -d10s, {ROUNDS} rounds each, in turn:\n");
    println!("| round | way | requests/s | p50 | p99 |");
    println!("|---|---|---|---|---|");
    let mut rounds: Vec<(Load, Load)> = Vec::new();
    for round in 1..=ROUNDS {
        let loads: Vec<Option<Load>> = ways.iter().map(|(_, url)| wrk(url, "10s")).collect();
        for ((way, _), load) in ways.iter().zip(&loads) {
            match load {
                Some(l) => println!(
                    "| {round} | {way} | {:.0} | {:.2} ms | {:.2} ms |",
                    l.rps, l.p50_ms, l.p99_ms
                ),
                None => println!("| {round} | {way} | wrk failed | | |"),
            }
        }
        if let [Some(direct), Some(forwarded)] = loads.as_slice() {
            rounds.push((*direct, *forwarded));
        }
    }
    println!("\n| round | forwarded / direct requests/s | forwarded − direct p50 | p99 ratio |");
    println!("|---|---|---|---|");
    for (round, (d, f)) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.2}× | {:+.2} ms | {:.2}× |",
            round + 1,
            f.rps / d.rps,
            f.p50_ms - d.p50_ms,
            f.p99_ms / d.p99_ms
        );
    }
}

/// A spread member in `dir` on HTTP address `addr`.
fn member(name: &'static str, dir: &Path, addr: SocketAddr) -> Host {
    let cache = format!("cache-{name}");
    let addr = addr.to_string();
    let args = [
        "serve",
        "--store",
        "vvm.redb",
        "--lease",
        "2s",
        "--cache-dir",
        &cache,
        "--http-addr",
        &addr,
    ];
    Host::start(BIN, name, dir, &args, "info")
}

/// A loopback address with a port that was free a moment ago.
fn free_addr() -> SocketAddr {
    let [port] = testkit::etcd::free_ports();
    SocketAddr::from(([127, 0, 0, 1], port))
}
