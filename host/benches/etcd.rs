//! Latency of the etcd backend's lease operations on a loopback etcd this benchmark starts.
//!
//! Run: `cargo bench -p vvm-host --bench etcd` (needs `etcd` on PATH). Prints one table row per
//! operation: acquire (`insert_if_absent`), renew (`compare_and_swap`), release
//! (`compare_and_delete`) and `get`.

// Percentile ranks of non-negative sample counts.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::time::{Duration, Instant};

use vvm_host::store::{EtcdOptions, EtcdStore, TtlStore};

const ROUNDS: usize = 500;
const TTL: Duration = Duration::from_secs(10);

fn main() {
    let Some(server) = testkit::etcd::EtcdServer::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(&server));
}

async fn run(server: &testkit::etcd::EtcdServer) {
    let store = EtcdStore::connect(EtcdOptions {
        endpoints: vec![server.endpoint()],
        ..EtcdOptions::default()
    })
    .await
    .expect("connect to the benchmark etcd");
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for round in 0..ROUNDS + ROUNDS / 10 {
        let value = format!("host-{round}");
        let timings = [
            timed(store.insert_if_absent("slot", &value, TTL)).await,
            timed(store.compare_and_swap("slot", &value, &value, TTL)).await,
            timed(store.get("slot")).await,
            timed(store.compare_and_delete("slot", &value)).await,
        ];
        // The first tenth warms up connections and etcd's caches.
        if round >= ROUNDS / 10 {
            for (all, t) in samples.iter_mut().zip(timings) {
                all.push(t);
            }
        }
    }
    println!(
        "etcd 3.4 on loopback, data dir {}, {ROUNDS} rounds",
        std::env::temp_dir().display()
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "operation", "median", "p99", "max"
    );
    let names = [
        "acquire (insert_if_absent)",
        "renew (compare_and_swap)",
        "get (record + lease TTL)",
        "release (compare_and_delete)",
    ];
    for (name, mut all) in names.into_iter().zip(samples) {
        all.sort();
        let at = |q: f64| all[((all.len() - 1) as f64 * q).round() as usize];
        println!(
            "{name:<34} {:>10.3?} {:>10.3?} {:>10.3?}",
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}

/// Runs one store operation, panicking on an error (a benchmark on a local etcd should not
/// see any), and returns how long it took.
async fn timed<T>(op: impl Future<Output = Result<T, vvm_host::store::StoreError>>) -> Duration {
    let start = Instant::now();
    op.await.expect("store operation on the benchmark etcd");
    start.elapsed()
}
