//! Latency of the redb store: insert / CAS / delete, median and p99, with the file used by this
//! process alone and with a second process writing the same file; then how soon a waiter
//! learns of a release committed by another process; then the guests' fenced key-value writes
//! (`kv_apply` set / increment / swap) per second on redb and on a loopback etcd (if `etcd` is
//! on PATH), each beside its store's raw write of one key in the same run, and the same calls
//! made by a guest through `wasi:keyvalue` (get, set, increment, cas), timed in the guest.
//!
//! Run with `cargo bench -p vvm-host --bench store`. The file lives in `$VVM_BENCH_DIR`, else
//! the system temp directory: its filesystem decides the cost of `fsync`.
//!
//! The benchmark runs itself again as the second process (`VVM_BENCH_ROLE`).

// Percentile ranks of non-negative sample counts.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use vvm_host::clock::{Clock, SystemClock};
use vvm_host::lease::LeaseDeadline;
use vvm_host::ops::Ops;
use vvm_host::problem::ProblemReporter;
use vvm_host::runtime::{Grants, RuntimeConfig, WasmServices};
use vvm_host::services::{LeaseInfo, ServiceContext, Services};
use vvm_host::store::{
    EtcdOptions, EtcdStore, Fence, KvDone, KvOp, KvQuota, KvWrite, RedbStore, Store, TtlStore,
};

const OPS: usize = 1000;
const WAKES: usize = 100;
/// Writes per row of the key-value table.
const KV_OPS: u32 = 500;
const TTL: Duration = Duration::from_hours(1);
const ROLE_ENV: &str = "VVM_BENCH_ROLE";
const PATH_ENV: &str = "VVM_BENCH_PATH";

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("writer") => rt.block_on(writer(path_from_env())),
        Ok("releaser") => rt.block_on(releaser(path_from_env())),
        _ => rt.block_on(bench()),
    }
}

fn path_from_env() -> PathBuf {
    PathBuf::from(std::env::var_os(PATH_ENV).expect("store path in the environment"))
}

async fn bench() {
    let base = std::env::var_os("VVM_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let path = dir.path().join("bench.redb");
    let store = Arc::new(RedbStore::open(&path).await.expect("open store"));

    println!(
        "redb store latency, {OPS} operations each, file in {}",
        base.display()
    );
    println!("{:<15} {:<8} {:>10} {:>10}", "mode", "op", "median", "p99");
    run_ops(&store, "single-process", "a").await;
    let mut other = spawn("writer", &path, Stdio::null());
    // Let the other process get going.
    tokio::time::sleep(Duration::from_millis(200)).await;
    run_ops(&store, "multi-process", "b").await;
    other.kill().expect("stop the writer");
    other.wait().expect("reap the writer");

    wakes(&store, &path).await;

    println!();
    println!("fenced key-value writes, {KV_OPS} each, one writer; ratio: to the raw write");
    println!(
        "{:<6} {:<22} {:>10} {:>7}",
        "store", "write", "ops/s", "ratio"
    );
    let raw = raw_redb_writes(&dir.path().join("raw.redb"));
    kv_rows("redb", store.clone(), raw).await;
    if let Some(server) = testkit::etcd::EtcdServer::start() {
        let options = EtcdOptions {
            endpoints: vec![server.endpoint()],
            ..EtcdOptions::default()
        };
        let etcd = EtcdStore::connect(options).await.expect("connect to etcd");
        let raw = raw_etcd_puts(&server.endpoint()).await;
        kv_rows("etcd", Arc::new(etcd), raw).await;
    }
}

/// Prints the fenced writes' rows of `store`, after its raw write's (`raw` per second), then
/// the guest's.
async fn kv_rows(name: &str, shared: Arc<dyn Store>, raw: f64) {
    let store = &*shared;
    let term = store
        .insert_if_absent("kv-bench", "me", TTL.min(Duration::from_mins(10)))
        .await
        .expect("insert")
        .expect("the lease is free");
    let fence = Fence {
        writer: "svc",
        lease_key: "kv-bench",
        term,
    };
    let print = |write: &str, per_second: f64| {
        println!(
            "{name:<6} {write:<22} {per_second:>10.0} {:>7.2}",
            per_second / raw
        );
    };
    print("raw write", raw);
    let mut value = 0u32;
    let set = per_second(|| {
        value += 1;
        let text = value.to_string();
        async move {
            let writes = [KvWrite::Set {
                key: "set",
                value: text.as_bytes(),
            }];
            fenced(store, &fence, &KvOp::Batch(&writes)).await;
        }
    })
    .await;
    print("kv_apply set", set);
    let increment = per_second(|| async {
        let op = KvOp::Increment {
            key: "count",
            delta: 1,
        };
        fenced(store, &fence, &op).await;
    })
    .await;
    print("kv_apply increment", increment);
    let mut swaps = 0u32;
    let swap = per_second(|| {
        // From absent to "1", then from each number to the next.
        let expected = (swaps > 0).then(|| swaps.to_string());
        swaps += 1;
        let new = swaps.to_string();
        async move {
            let op = KvOp::Swap {
                key: "swap",
                expected: expected.as_deref().map(str::as_bytes),
                new: new.as_bytes(),
            };
            assert_eq!(fenced(store, &fence, &op).await, KvDone::Swapped(true));
        }
    })
    .await;
    print("kv_apply swap", swap);
    for (op, per_second) in guest_calls(Arc::clone(&shared), term).await {
        print(&format!("guest {op}"), per_second);
    }
}

/// Runs the `kv-bench` guest on `store` under the lease `kv-bench` at `term`: its calls per
/// second of get, set, increment and cas, as it timed them.
async fn guest_calls(store: Arc<dyn Store>, term: u64) -> Vec<(&'static str, f64)> {
    let services = tempfile::tempdir().expect("services dir");
    testkit::guests::install(services.path(), &[("test/kv-bench", "kv-bench")]);
    let mut config = RuntimeConfig::new(services.path());
    let grants = Grants {
        env: vec![("KV_OPS".to_owned(), KV_OPS.to_string())],
        ..Grants::default()
    };
    config.grants.insert("kv-bench".to_owned(), grants);
    let clock = Arc::new(SystemClock::local());
    let (wasm, errors) = WasmServices::load(config, Ops::new(clock.clone())).expect("load");
    assert!(errors.is_empty(), "{errors:?}");
    let at = clock.now().after(Duration::from_mins(10));
    let context = ServiceContext {
        lease: LeaseInfo {
            slot: 1,
            key: "kv-bench".into(),
            holder: "me".into(),
            term,
            lease: Duration::from_mins(10),
        },
        deadline: LeaseDeadline::fixed(clock, at),
        stopping: CancellationToken::new(),
        problems: ProblemReporter::default(),
        store: Arc::clone(&store),
        running: vvm_host::lease_value::RunningReport::detached(),
    };
    let running = wasm.start(context).await.expect("start");
    let mut rows = Vec::new();
    for op in ["get", "set", "increment", "cas"] {
        let key = format!("result/{op}");
        // The guest writes its results last: wait for each (a benchmark may poll).
        let nanos = loop {
            if let Some(v) = store.kv_get("kv-bench", &key).await.expect("kv_get") {
                break String::from_utf8(v)
                    .expect("text")
                    .parse::<f64>()
                    .expect("ns");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        rows.push((op, f64::from(KV_OPS) / (nanos / 1e9)));
    }
    running.stop().await;
    rows
}

/// One fenced write, which must land.
async fn fenced(store: &dyn Store, fence: &Fence<'_>, op: &KvOp<'_>) -> KvDone {
    store
        .kv_apply(fence, "bench", op, &KvQuota::UNLIMITED)
        .await
        .expect("kv_apply")
        .expect("not refused")
}

/// How many of `write` run per second, one after the other, over [`KV_OPS`] of them.
async fn per_second<F: Future<Output = ()>>(mut write: impl FnMut() -> F) -> f64 {
    let start = Instant::now();
    for _ in 0..KV_OPS {
        write().await;
    }
    f64::from(KV_OPS) / start.elapsed().as_secs_f64()
}

/// Plain redb write transactions of one key each, durable (`Durability::Immediate`), on a
/// file of their own: per second.
fn raw_redb_writes(path: &Path) -> f64 {
    let table: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("raw");
    let db = redb::Database::create(path).expect("raw redb file");
    let start = Instant::now();
    for i in 0..KV_OPS {
        let mut txn = db.begin_write().expect("write transaction");
        txn.set_durability(redb::Durability::Immediate)
            .expect("durability");
        {
            let mut t = txn.open_table(table).expect("table");
            t.insert("key", i.to_string().as_bytes()).expect("insert");
        }
        txn.commit().expect("commit");
    }
    f64::from(KV_OPS) / start.elapsed().as_secs_f64()
}

/// Plain etcd puts of one key each, on a client of their own: per second.
async fn raw_etcd_puts(endpoint: &str) -> f64 {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect to etcd");
    let start = Instant::now();
    for i in 0..KV_OPS {
        client
            .put("raw/key", i.to_string(), None)
            .await
            .expect("put");
    }
    f64::from(KV_OPS) / start.elapsed().as_secs_f64()
}

/// Times `OPS` inserts of new keys, then a CAS on each, then a delete of each.
async fn run_ops(store: &RedbStore, mode: &str, prefix: &str) {
    let keys: Vec<String> = (0..OPS).map(|i| format!("{prefix}{i}")).collect();
    let mut times = Vec::with_capacity(OPS);
    for key in &keys {
        let t = Instant::now();
        let term = store
            .insert_if_absent(key, "v1", TTL)
            .await
            .expect("insert");
        times.push(t.elapsed());
        assert!(term.is_some());
    }
    row(mode, "insert", &mut times);
    for key in &keys {
        let t = Instant::now();
        let swapped = store
            .compare_and_swap(key, "v1", "v2", TTL)
            .await
            .expect("cas");
        times.push(t.elapsed());
        assert!(swapped);
    }
    row(mode, "cas", &mut times);
    for key in &keys {
        let t = Instant::now();
        let deleted = store.compare_and_delete(key, "v2").await.expect("delete");
        times.push(t.elapsed());
        assert!(deleted);
    }
    row(mode, "delete", &mut times);
    for key in &keys {
        let t = Instant::now();
        let record = store.get(key).await.expect("get");
        times.push(t.elapsed());
        assert!(record.is_none());
    }
    row(mode, "get", &mut times);
}

/// Another process deletes a record; we time from its commit to our `wait_released`
/// returning, and to our `insert_if_absent` of the key having succeeded (a standby's
/// takeover). Both processes read `CLOCK_BOOTTIME`, so their readings compare.
async fn wakes(store: &RedbStore, path: &Path) {
    let mut child = spawn("releaser", path, Stdio::piped());
    let mut to_child = child.stdin.take().expect("releaser stdin");
    let mut from_child = BufReader::new(child.stdout.take().expect("releaser stdout"));
    let (mut wake, mut takeover) = (Vec::new(), Vec::new());
    for i in 0..WAKES {
        let key = format!("w{i}");
        store
            .insert_if_absent(&key, "other", TTL)
            .await
            .expect("insert");
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                store.wait_released(Duration::from_secs(5)).await;
                let woke = boot_nanos();
                let acquired = store
                    .insert_if_absent(&key, "me", TTL)
                    .await
                    .expect("insert");
                (woke, boot_nanos(), acquired.is_some())
            })
        };
        // Let the waiter start waiting.
        tokio::time::sleep(Duration::from_millis(5)).await;
        writeln!(to_child, "w{i}").expect("ask the releaser");
        let mut line = String::new();
        from_child.read_line(&mut line).expect("releaser reply");
        let committed: u64 = line.trim().parse().expect("commit time");
        let (woke, acquired_at, acquired) = waiter.await.expect("waiter");
        assert!(acquired, "the standby took the released key");
        wake.push(Duration::from_nanos(woke.saturating_sub(committed)));
        takeover.push(Duration::from_nanos(acquired_at.saturating_sub(committed)));
    }
    drop(to_child);
    child.wait().expect("reap the releaser");
    println!();
    println!("release in another process -> standby, {WAKES} times");
    println!(
        "{:<15} {:<8} {:>10} {:>10}",
        "mode", "step", "median", "p99"
    );
    row("multi-process", "wake", &mut wake);
    row("multi-process", "acquire", &mut takeover);
}

/// Prints one table row and empties `times`.
fn row(mode: &str, op: &str, times: &mut Vec<Duration>) {
    times.sort();
    let at = |q: f64| {
        // Nearest rank: ceil(q·n) - 1.
        let rank = (q * times.len() as f64).ceil() as usize;
        times[rank.clamp(1, times.len()) - 1]
    };
    println!(
        "{mode:<15} {op:<8} {:>10} {:>10}",
        fmt(at(0.5)),
        fmt(at(0.99))
    );
    times.clear();
}

fn fmt(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn boot_nanos() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

fn spawn(role: &str, path: &Path, stdio: Stdio) -> Child {
    let stdin = if matches!(role, "releaser") {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    Command::new(std::env::current_exe().expect("own executable"))
        .env(ROLE_ENV, role)
        .env(PATH_ENV, path)
        .stdin(stdin)
        .stdout(stdio)
        .spawn()
        .expect("spawn the second process")
}

/// The second process of the multi-process mode: swaps its own record as fast as it can.
async fn writer(path: PathBuf) {
    let store = RedbStore::open(&path).await.expect("open store");
    store
        .insert_if_absent("bg", "0", TTL)
        .await
        .expect("insert");
    for n in 0_u64.. {
        let (old, new) = (n.to_string(), (n + 1).to_string());
        assert!(
            store
                .compare_and_swap("bg", &old, &new, TTL)
                .await
                .expect("cas")
        );
    }
}

/// Deletes each key named on stdin, printing `CLOCK_BOOTTIME` right after the commit.
async fn releaser(path: PathBuf) {
    let store = RedbStore::open(&path).await.expect("open store");
    let mut out = std::io::stdout();
    for line in std::io::stdin().lines() {
        let key = line.expect("stdin");
        assert!(
            store
                .compare_and_delete(&key, "other")
                .await
                .expect("delete")
        );
        writeln!(out, "{}", boot_nanos()).expect("stdout");
        out.flush().expect("stdout");
    }
}
