//! Benchmark of the Wasm services (SPEC §9): 100 Rust services started from the compile
//! cache (several times: the median start), their memory, stopping a spinning guest, and
//! shutting all of them down. Prints a table. Run with `cargo bench -p vvm-host --bench runtime`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::guests;
use tokio_util::sync::CancellationToken;
use vvm_host::clock::{Clock, ManualClock, SystemClock};
use vvm_host::lease::LeaseDeadline;
use vvm_host::ops::Ops;
use vvm_host::problem::ProblemReporter;
use vvm_host::runtime::{RuntimeConfig, WasmServices};
use vvm_host::services::{LeaseInfo, ServiceContext, Services};
use vvm_host::store::{MemStore, TtlStore};

const SERVICES: usize = 100;
const SPIN_ROUNDS: usize = 20;
/// Starts (and stops) of the 100 services per allocator: the table shows the median and the
/// first (cold) one, and the most memory per idle service seen in any round (measured from
/// before the first start, so memory an allocator keeps after a stop counts too).
const ROUNDS: usize = 7;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

async fn context() -> ServiceContext {
    let store = MemStore::new(Arc::new(ManualClock::default()));
    let ttl = Duration::from_secs(20);
    let term = store
        .insert_if_absent("slot/1", "bench", ttl)
        .await
        .unwrap()
        .unwrap();
    ServiceContext {
        lease: LeaseInfo {
            slot: 1,
            key: "slot/1".into(),
            holder: "bench".into(),
            term,
            lease: ttl,
        },
        deadline: {
            let clock = Arc::new(SystemClock::local());
            let at = clock.now().after(Duration::from_hours(1));
            LeaseDeadline::fixed(clock, at)
        },
        stopping: CancellationToken::new(),
        problems: ProblemReporter::default(),
        store: Arc::new(store),
        running: vvm_host::lease_value::RunningReport::detached(),
    }
}

struct Row {
    allocator: &'static str,
    load_ms: f64,
    start_ms: f64,
    first_ms: f64,
    rss_per_service_kib: f64,
    stop_spin_ms: f64,
    shutdown_ms: f64,
}

async fn measure(allocator: &'static str, pooling: bool) -> Row {
    // 100 idle tickers (1 s tick), compiled once, then loaded from the cache.
    let dir = tempfile::TempDir::new().unwrap();
    let names: Vec<String> = (0..SERVICES).map(|i| format!("ticker-{i:03}")).collect();
    let pairs: Vec<(&str, &str)> = names.iter().map(|n| ("rust-ticker", n.as_str())).collect();
    guests::install(dir.path(), &pairs);
    let config = RuntimeConfig {
        pooling,
        ..RuntimeConfig::new(dir.path())
    };
    drop(WasmServices::load(config.clone(), Ops::new(Arc::new(SystemClock::local()))).unwrap());
    let loading = Instant::now();
    let (services, errors) =
        WasmServices::load(config, Ops::new(Arc::new(SystemClock::local()))).unwrap();
    let load_ms = loading.elapsed().as_secs_f64() * 1e3;
    assert!(errors.is_empty());
    assert_eq!(services.stats().cache_hits, SERVICES);

    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before = rss_bytes();
    let mut starts = Vec::new();
    let mut rss_per_service_kib: f64 = 0.0;
    let mut shutdown_ms = 0.0;
    for _ in 0..ROUNDS {
        let starting = Instant::now();
        let running = services.start(context().await).await.unwrap();
        starts.push(starting.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss = rss_bytes().saturating_sub(rss_before) as f64 / 1024.0 / SERVICES as f64;
        rss_per_service_kib = rss_per_service_kib.max(rss);
        let stopping = Instant::now();
        running.stop().await;
        shutdown_ms = stopping.elapsed().as_secs_f64() * 1e3;
    }
    let first_ms = starts[0];
    starts.sort_by(f64::total_cmp);
    let start_ms = starts[starts.len() / 2];

    // A guest spinning in a loop, stopped with no grace period: the epoch tick interrupts it.
    let spin_dir = tempfile::TempDir::new().unwrap();
    guests::install(spin_dir.path(), &[("test/spin", "spin")]);
    let config = RuntimeConfig {
        pooling,
        grace_period: Duration::ZERO,
        ..RuntimeConfig::new(spin_dir.path())
    };
    let (spin, _) = WasmServices::load(config, Ops::new(Arc::new(SystemClock::local()))).unwrap();
    let mut stops = Vec::new();
    for _ in 0..SPIN_ROUNDS {
        let running = spin.start(context().await).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stopping = Instant::now();
        running.stop().await;
        stops.push(stopping.elapsed().as_secs_f64() * 1e3);
    }
    stops.sort_by(f64::total_cmp);
    Row {
        allocator,
        load_ms,
        start_ms,
        first_ms,
        rss_per_service_kib,
        stop_spin_ms: stops[stops.len() / 2],
        shutdown_ms,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    guests::out_dir();
    // The process's first run grows its heap: measured and dropped, so that neither
    // allocator's memory per service includes it.
    measure("warm-up", false).await;
    let mut rows = Vec::new();
    for (name, pooling) in [("pooling", true), ("on-demand", false)] {
        rows.push(measure(name, pooling).await);
    }
    println!();
    println!(
        "{SERVICES} rust-ticker services ({} KiB component), epoch tick 1 ms",
        std::fs::metadata(guests::guest("rust-ticker"))
            .unwrap()
            .len()
            / 1024
    );
    println!(
        "| allocator | load {SERVICES} from cache \
         | start -> all running (median of {ROUNDS}; first) | per instance \
         | RSS per idle service (most in {ROUNDS} rounds) \
         | stop spinning guest (median of {SPIN_ROUNDS}) | shut down all {SERVICES} |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.1} ms | {:.2} ms ({:.2} ms) | {:.1} µs | {:.0} KiB | {:.2} ms | {:.2} ms |",
            r.allocator,
            r.load_ms,
            r.start_ms,
            r.first_ms,
            r.start_ms * 1e3 / SERVICES as f64,
            r.rss_per_service_kib,
            r.stop_spin_ms,
            r.shutdown_ms,
        );
    }
}
