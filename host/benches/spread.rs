//! Spread placement (SPEC §6 "Placement"): how long a group of real `vvm-host serve
//! --placement spread` processes takes to rebalance seven services after a host joins and
//! after a host leaves gracefully, on redb and on etcd.
//!
//! Run: `cargo bench -p vvm-host --bench spread` (the etcd rows need `etcd` on PATH).
//! Every host runs copies of the rust-ticker guest with a warm compile cache; times are taken
//! when the test process reads the hosts' log lines:
//! - join: from the new host's `joined` line to the `spread: running` line that completes the
//!   rest at 2/2/2/1. The join wakes the others, who hand over (stop signal, grace period,
//!   drop, delete), and the newcomer claims at once;
//! - leave: from sending SIGTERM to the host with three services to the `spread: running`
//!   line that completes the rest at 3/2/2 on the other three (its claims are deleted as its
//!   services stop; the others hear each delete).

// A benchmark: a failed unwrap is a failed run.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use testkit::etcd::EtcdServer;
use testkit::host::Host;
use testkit::spread::{last_running_line, running, wait_for_rest};

const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");
/// Measured runs per store, after one warm-up.
const RUNS: usize = 5;
const SERVICES: usize = 7;
const LEASE: &str = "4s";

fn names() -> Vec<String> {
    (0..SERVICES).map(|i| format!("t{i}")).collect()
}

fn serve(name: &'static str, dir: &Path, store: &str) -> Host {
    let cache = format!("cache-{name}");
    let args = [
        "serve",
        "--placement",
        "spread",
        "--store",
        store,
        "--lease",
        LEASE,
        "--cache-dir",
        &cache,
        "--grace-period",
        "1s",
    ];
    Host::start(BIN, name, dir, &args, "info")
}

/// When the last of `hosts` logged the placement it runs now.
fn settled_at(hosts: &[&Host]) -> Instant {
    hosts
        .iter()
        .filter_map(|h| last_running_line(h).map(|l| l.at))
        .max()
        .unwrap()
}

/// One group's life: returns (join, leave).
fn run_once(dir: &Path, store: &str) -> (Duration, Duration) {
    let names = names();
    let mut hosts = vec![
        serve("a", dir, store),
        serve("b", dir, store),
        serve("c", dir, store),
    ];
    wait_for_rest(&hosts.iter().collect::<Vec<_>>(), &names, &[3, 2, 2]);
    hosts.push(serve("d", dir, store));
    let joined = hosts[3].wait_for(&["joined"]).at;
    let all: Vec<&Host> = hosts.iter().collect();
    wait_for_rest(&all, &names, &[2, 2, 2, 1]);
    let join = settled_at(&all).saturating_duration_since(joined);

    // Leave: the host with the most services.
    let leaver = (0..hosts.len())
        .max_by_key(|&i| running(&hosts[i]).len())
        .unwrap();
    let mut leaving = hosts.remove(leaver);
    let sent = Instant::now();
    leaving.signal(Signal::TERM);
    let rest: Vec<&Host> = hosts.iter().collect();
    wait_for_rest(&rest, &names, &[3, 2, 2]);
    let leave = settled_at(&rest).saturating_duration_since(sent);
    leaving.wait_exit();
    for h in &mut hosts {
        h.signal(Signal::TERM);
        h.wait_exit();
    }
    (join, leave)
}

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:>9.1} {:>9.1} {:>9.1}",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1])
    )
}

fn bench(label: &str, store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    let guests: Vec<(&str, String)> = names().into_iter().map(|n| ("rust-ticker", n)).collect();
    let guests: Vec<(&str, &str)> = guests.iter().map(|(g, n)| (*g, n.as_str())).collect();
    testkit::guests::install(&services, &guests);
    // Warm-up: fills every host's compile cache.
    run_once(dir.path(), store);
    let (mut joins, mut leaves) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (join, leave) = run_once(dir.path(), store);
        joins.push(join);
        leaves.push(leave);
    }
    println!("{label:<6} join  {}", stats(joins));
    println!("{label:<6} leave {}", stats(leaves));
}

fn main() {
    println!("spread placement, {SERVICES} services, L = {LEASE}, {RUNS} runs: time to rest (ms)");
    println!(
        "{:<6} {:<5} {:>9} {:>9} {:>9}",
        "store", "", "median", "min", "max"
    );
    bench("redb", "vvm.redb");
    match EtcdServer::start() {
        Some(etcd) => bench("etcd", &format!("etcd://{}", etcd.endpoint())),
        None => println!("etcd  (skipped: no etcd on PATH)"),
    }
}
