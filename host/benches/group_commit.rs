//! Group commit (issue 38, SPEC §10): fenced key-value writes per second with 1, 8 and 64
//! concurrent writers (each its own service, incrementing keys of its own) through the
//! store's [`GroupCommit`], beside the same store's writes made one at a time without it (each
//! its own transaction, as every write was before) and beside the store's raw write of one
//! key, in one run; on redb and, if `etcd` is on PATH, on a loopback etcd. Then, on etcd, how
//! the cluster's database grows under sustained writes before compaction.
//!
//! Run with `cargo bench -p vvm-host --bench group_commit`. The redb file lives in
//! `$VVM_BENCH_DIR`, else the system temp directory: its filesystem decides the cost of
//! `fsync`, and so what sharing it is worth.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vvm_host::store::{
    EtcdOptions, EtcdStore, Fence, GroupCommit, KvDone, KvOp, KvQuota, RedbStore, Store, TtlStore,
};

/// How long each row writes.
const SPELL: Duration = Duration::from_secs(3);
/// The concurrent writers of each row.
const WRITERS: [usize; 3] = [1, 8, 64];
const TTL: Duration = Duration::from_mins(10);

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench());
}

async fn bench() {
    let base = std::env::var_os("VVM_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    println!(
        "fenced key-value increments per second, {} s a row; redb file in {}",
        SPELL.as_secs(),
        base.display()
    );
    println!("ratio: to the store's raw write of one key, one at a time\n");
    println!("| store | writers | how | writes/s | ratio | writes per commit |");
    println!("|---|---|---|---|---|---|");
    let raw = raw_redb_writes(&dir.path().join("raw.redb"));
    let redb = RedbStore::open(dir.path().join("bench.redb"))
        .await
        .expect("open store");
    rows("redb", Arc::new(redb), raw).await;
    let Some(server) = testkit::etcd::EtcdServer::start() else {
        println!("\netcd not found: no etcd rows");
        return;
    };
    let options = EtcdOptions {
        endpoints: vec![server.endpoint()],
        ..EtcdOptions::default()
    };
    let etcd = Arc::new(EtcdStore::connect(options).await.expect("connect to etcd"));
    let raw = raw_etcd_puts(&server.endpoint()).await;
    rows("etcd", Arc::clone(&etcd) as Arc<dyn Store>, raw).await;
    growth(&server.endpoint(), etcd).await;
}

/// The rows of one store: its raw write, then each writer count without and with the group.
async fn rows(name: &str, store: Arc<dyn Store>, raw: f64) {
    let term = store
        .insert_if_absent("bench", "me", TTL)
        .await
        .expect("insert")
        .expect("the lease is free");
    println!("| {name} | 1 | raw write | {raw:.0} | 1.00 | 1 |");
    for writers in WRITERS {
        let alone = writes_per_second(Arc::clone(&store), writers, term).await;
        println!(
            "| {name} | {writers} | one commit each | {alone:.0} | {:.2} | 1 |",
            alone / raw
        );
        let commits = Arc::new(AtomicUsize::new(0));
        let group = GroupCommit::observed(Arc::clone(&store), {
            let commits = Arc::clone(&commits);
            move |_| {
                commits.fetch_add(1, Ordering::Relaxed);
            }
        });
        let written = Arc::new(group) as Arc<dyn Store>;
        let grouped = writes_per_second(written, writers, term).await;
        let per_commit = grouped * SPELL.as_secs_f64() / commits.load(Ordering::Relaxed) as f64;
        println!(
            "| {name} | {writers} | group commit | {grouped:.0} | {:.2} | {per_commit:.1} |",
            grouped / raw
        );
    }
}

/// `writers` tasks, each a service of its own incrementing its own key as fast as it can
/// for [`SPELL`], through `store`: their writes per second together.
async fn writes_per_second(store: Arc<dyn Store>, writers: usize, term: u64) -> f64 {
    let done = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + SPELL;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            tokio::spawn(async move {
                let writer = format!("service-{w}");
                let key = format!("count-{w}");
                let fence = Fence {
                    writer: &writer,
                    lease_key: "bench",
                    term,
                };
                let op = KvOp::Increment {
                    key: &key,
                    delta: 1,
                };
                while Instant::now() < end {
                    let answer = store
                        .kv_apply(&fence, "bench", &op, &KvQuota::UNLIMITED)
                        .await
                        .expect("kv_apply");
                    assert!(matches!(answer, Ok(KvDone::Number(_))), "{answer:?}");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    for task in tasks {
        task.await.expect("writer");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// How etcd's database grows under sustained writes (64 writers through the group commit for
/// [`SPELL`]), with no compaction: revisions and bytes per write.
async fn growth(endpoint: &str, etcd: Arc<EtcdStore>) {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect to etcd");
    let before = client.status().await.expect("status");
    let term = etcd.get("bench").await.expect("get").expect("held").term;
    let store = Arc::new(GroupCommit::new(etcd)) as Arc<dyn Store>;
    let per_second = writes_per_second(store, 64, term).await;
    let after = client.status().await.expect("status");
    let writes = per_second * SPELL.as_secs_f64();
    let revision = |s: &etcd_client::StatusResponse| {
        s.header().map_or(0, etcd_client::ResponseHeader::revision)
    };
    let revisions = revision(&after) - revision(&before);
    let bytes = after.db_size() - before.db_size();
    println!(
        "\netcd without compaction, {writes:.0} increments by 64 writers: {revisions} revisions \
         ({:.3} per write), database +{:.1} MiB ({:.0} bytes per write)",
        revisions as f64 / writes,
        bytes as f64 / f64::from(1 << 20),
        bytes as f64 / writes
    );
}

/// Plain redb write transactions of one key each, durable (`Durability::Immediate`), on a
/// file of their own, for [`SPELL`]: per second.
fn raw_redb_writes(path: &Path) -> f64 {
    let table: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("raw");
    let db = redb::Database::create(path).expect("raw redb file");
    let start = Instant::now();
    let mut n = 0_u64;
    while start.elapsed() < SPELL {
        let mut txn = db.begin_write().expect("write transaction");
        txn.set_durability(redb::Durability::Immediate)
            .expect("durability");
        {
            let mut t = txn.open_table(table).expect("table");
            t.insert("key", n.to_string().as_bytes()).expect("insert");
        }
        txn.commit().expect("commit");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Plain etcd puts of one key each, on a client of their own, for [`SPELL`]: per second.
async fn raw_etcd_puts(endpoint: &str) -> f64 {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect to etcd");
    let start = Instant::now();
    let mut n = 0_u64;
    while start.elapsed() < SPELL {
        client
            .put("raw/key", n.to_string(), None)
            .await
            .expect("put");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}
