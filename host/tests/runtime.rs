//! The Wasm services (SPEC §6, §7) end to end: real components from `guest-examples/` (built
//! by its `build.sh` on first use) run by [`WasmServices`] under a lease in a [`MemStore`].

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use testkit::{guests, logs};
use tokio_util::sync::CancellationToken;
use vvm_host::clock::{Clock, ManualClock, SystemClock};
use vvm_host::config::OnFailure;
use vvm_host::lease::LeaseDeadline;
use vvm_host::lease_value::{RunningReport, ServiceState, ServiceStatus};
use vvm_host::ops::Ops;
use vvm_host::problem::{Problem, ProblemReporter};
use vvm_host::runtime::{
    DirGrant, Grants, LoadErrorKind, RestartPolicy, RuntimeConfig, ServiceKind, WasmServices,
};
use vvm_host::services::{LeaseInfo, ServiceContext, Services};
use vvm_host::store::{FencedKv, MemStore, TtlStore};

const LEASE_KEY: &str = "vvm/slot/1";

/// A services directory holding `guests` as `(guest, service name)`, with a config whose
/// cache lives beside it.
/// A set of metrics of the test's own.
fn ops() -> Ops {
    Ops::new(Arc::new(SystemClock::local()))
}

fn setup(guests: &[(&str, &str)]) -> (TempDir, RuntimeConfig) {
    logs::init();
    let dir = TempDir::new().unwrap();
    guests::install(dir.path(), guests);
    let mut config = RuntimeConfig::new(dir.path());
    config.cache_dir = dir.path().join("cache");
    config.grace_period = Duration::from_secs(5);
    (dir, config)
}

fn tick_env(ms: u64) -> Grants {
    Grants {
        env: vec![("TICK_MS".into(), ms.to_string())],
        ..Grants::default()
    }
}

/// A store holding the lease `LEASE_KEY`, and a context for its term.
struct Lease {
    store: MemStore,
    ctx: ServiceContext,
}

async fn lease(deadline: LeaseDeadline) -> Lease {
    let store = MemStore::new(Arc::new(ManualClock::default()));
    let ttl = Duration::from_secs(20);
    let term = store
        .insert_if_absent(LEASE_KEY, "host-a", ttl)
        .await
        .unwrap()
        .unwrap();
    let ctx = ServiceContext {
        lease: LeaseInfo {
            slot: 1,
            key: LEASE_KEY.into(),
            holder: "host-a".into(),
            term,
            lease: ttl,
        },
        deadline,
        stopping: CancellationToken::new(),
        problems: ProblemReporter::default(),
        store: Arc::new(store.clone()),
        running: RunningReport::detached(),
    };
    Lease { store, ctx }
}

/// Waits (10 s at most) until service `name` has failed `times` times (and backs off after
/// the last of them): its status then.
async fn failed(l: &Lease, name: &str, times: u32) -> ServiceStatus {
    let mut report = l.ctx.running.subscribe();
    let wait = report.wait_for(|report| {
        report.services.iter().any(|s| {
            s.name == name
                && matches!(s.state, ServiceState::BackingOff { .. })
                && s.restarts + 1 >= times
        })
    });
    let services = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{name} did not fail {times} times"))
        .unwrap();
    let found = services.services.iter().find(|s| s.name == name);
    found.unwrap().clone()
}

fn far_deadline() -> LeaseDeadline {
    let clock = Arc::new(SystemClock::local());
    let at = clock.now().after(Duration::from_hours(1));
    LeaseDeadline::fixed(clock, at)
}

/// Waits up to 10 s for `cond`.
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn kv(store: &MemStore, service: &str, key: &str) -> Option<String> {
    store
        .kv_get(service, key)
        .await
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_run_under_a_lease_and_stop_on_stop() {
    let (_dir, mut config) = setup(&[
        ("rust-ticker", "ex-ticker"),
        ("rust-counter", "ex-counter"),
        ("rust-command", "ex-command"),
    ]);
    config.grants.insert("ex-ticker".into(), tick_env(20));
    config.grants.insert("ex-counter".into(), tick_env(20));
    config.grants.insert("ex-command".into(), tick_env(20));
    let (services, errors) = WasmServices::load(config, ops()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        services.services(),
        vec![
            ("ex-command".into(), ServiceKind::Command),
            ("ex-counter".into(), ServiceKind::Service),
            ("ex-ticker".into(), ServiceKind::Service),
        ]
    );
    let l = lease(far_deadline()).await;
    let term = l.ctx.lease.term;
    let running = services.start(l.ctx.clone()).await.unwrap();

    until("ticker logs its term", async || {
        logs::count("ex-ticker", &format!("tick 3: term {term}")) > 0
    })
    .await;
    until("counter counts in the kv", async || {
        kv(&l.store, "ex-counter", "count")
            .await
            .is_some_and(|c| c.parse::<u64>().unwrap() >= 3)
    })
    .await;
    until("command prints lines", async || {
        logs::of("ex-command")
            .iter()
            .any(|l| l.stream.as_deref() == Some("stdout") && l.message == "rust-command line 3")
    })
    .await;
    assert!(
        logs::of("ex-command")
            .iter()
            .any(|l| l.stream.as_deref() == Some("stderr")),
        "stderr is logged too"
    );

    // All three hear (or, the command, are dropped at) the stop well within the 5 s grace.
    let started = std::time::Instant::now();
    running.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(logs::count("ex-ticker", "ticker stopping"), 1);
    assert_eq!(logs::count("ex-command", "command dropped at once"), 1);
    let count = kv(&l.store, "ex-counter", "count").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        kv(&l.store, "ex-counter", "count").await,
        count,
        "nothing runs after stop"
    );
    assert_eq!(l.ctx.problems.get(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_are_rejected_by_name_while_a_good_one_runs() {
    let (_dir, mut config) = setup(&[
        ("test/empty", "bad-empty"),
        ("test/truncated", "bad-truncated"),
        ("test/core-module", "bad-core"),
        ("test/other-world", "bad-world"),
        ("rust-ticker", "good-ticker"),
    ]);
    config.grants.insert("good-ticker".into(), tick_env(20));
    let (services, errors) = WasmServices::load(config, ops()).unwrap();
    let rejected: Vec<(String, String)> = errors
        .iter()
        .map(|e| {
            let file = e.path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(e.to_string().contains(&file), "message names the file: {e}");
            (file, e.kind.to_string())
        })
        .collect();
    assert_eq!(rejected.len(), 4, "{rejected:#?}");
    let reason = |file: &str| &rejected.iter().find(|(f, _)| f == file).unwrap().1;
    assert!(reason("bad-empty.wasm").contains("empty file"));
    assert!(reason("bad-core.wasm").contains("core WebAssembly module"));
    assert!(reason("bad-truncated.wasm").starts_with("not a valid component"));
    assert!(reason("bad-world.wasm").contains("exports none of `run`"));
    assert!(reason("bad-world.wasm").contains("greet"));
    assert!(matches!(
        errors
            .iter()
            .find(|e| e.path.ends_with("bad-world.wasm"))
            .unwrap()
            .kind,
        LoadErrorKind::World(_)
    ));
    assert_eq!(
        services.services(),
        vec![("good-ticker".into(), ServiceKind::Service)]
    );

    let l = lease(far_deadline()).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    until("the good service ticks", async || {
        logs::count("good-ticker", "tick 3:") > 0
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_guest_is_dropped_after_the_grace_period() {
    let (_dir, mut config) = setup(&[("test/spin", "spinner"), ("rust-ticker", "spin-ticker")]);
    config.grants.insert("spin-ticker".into(), tick_env(10));
    config.grace_period = Duration::from_millis(300);
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let l = lease(far_deadline()).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    until("the spinner spins", async || {
        logs::count("spinner", "spinning") > 0
    })
    .await;
    // Epoch preemption: the other service keeps running beside the spinning one.
    let ticks = logs::count("spin-ticker", "tick ");
    until("the ticker ticks beside it", async || {
        logs::count("spin-ticker", "tick ") >= ticks + 5
    })
    .await;

    let started = std::time::Instant::now();
    running.stop().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "waited the grace period: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1300),
        "then dropped it: {took:?}"
    );
    assert_eq!(logs::count("spinner", "grace period over"), 1);
    assert_eq!(logs::count("spin-ticker", "grace period over"), 0);
}

/// Runs the one service `name` of `config` until it has failed twice (10 ms apart); returns
/// the reason of its last failure. No failure is a problem of the lease.
async fn reason_after_failing_twice(mut config: RuntimeConfig, name: &str) -> String {
    config.restart.initial_backoff = Duration::from_millis(10);
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let l = lease(far_deadline()).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    let status = failed(&l, name, 2).await;
    running.stop().await;
    assert_eq!(
        l.ctx.problems.get(),
        None,
        "a failure stays with its service"
    );
    status.reason.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_stopped_at_the_cap() {
    let (_dir, mut config) = setup(&[("test/hog", "hog")]);
    config.memory_cap = 32 << 20;
    let reason = reason_after_failing_twice(config, "hog").await;
    assert!(reason.contains("memory"), "{reason}");
    assert_eq!(logs::count("hog", "hogging memory"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_never_gives_a_handle_back_is_stopped_at_its_limit() {
    // Timers: host memory, no descriptors, so only the setting bounds them.
    let (_dir, mut config) = setup(&[("test/leak", "leak")]);
    config.handle_limit = 64;
    let reason = reason_after_failing_twice(config, "leak").await;
    assert!(
        reason.contains("more than its 64 handles") && reason.contains("handle-limit"),
        "{reason}"
    );
    assert_eq!(logs::count("leak", "leaking timers"), 2);
}

/// Issue 28: a failing service is restarted on its own with a wait that doubles up to its
/// cap, its reason is said once and then counted, and its neighbour never notices: never
/// restarted, never a problem of the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_guest_is_restarted_with_backoff_and_its_neighbour_never_notices() {
    let (_dir, mut config) = setup(&[("test/trap", "trapper"), ("rust-ticker", "neighbour")]);
    config.grants.insert("neighbour".into(), tick_env(20));
    config.restart = RestartPolicy {
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(10),
        ..RestartPolicy::default()
    };
    // The trapper's own cap: 400 ms.
    config.grants.insert(
        "trapper".into(),
        Grants {
            restart_backoff_max: Some(Duration::from_millis(400)),
            ..Grants::default()
        },
    );
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let l = lease(far_deadline()).await;
    let started = std::time::Instant::now();
    let running = services.start(l.ctx.clone()).await.unwrap();
    let status = failed(&l, "trapper", 5).await;
    // Five runs, with 100, 200, 400 and 400 ms between them.
    assert!(
        started.elapsed() >= Duration::from_millis(1100),
        "{:?}",
        started.elapsed()
    );
    assert!(
        status.reason.as_deref().unwrap().contains("trapped"),
        "{status:?}"
    );
    assert!(
        logs::count_with("trapper", "backing off", "wait=400ms") >= 2,
        "capped at its own 400 ms"
    );
    assert_eq!(logs::count_with("trapper", "backing off", "wait=800ms"), 0);
    assert_eq!(logs::count("trapper", "service failed; backing off"), 1);
    assert!(logs::count("trapper", "service failed again, as before") >= 4);
    assert!(
        logs::count("trapper", "failing on purpose") >= 1,
        "the panic reached the log"
    );
    assert_eq!(l.ctx.problems.get(), None, "never a problem of the lease");
    assert_eq!(
        logs::count("neighbour", "service running"),
        1,
        "never restarted"
    );
    let ticks = logs::count("neighbour", "tick");
    until("the neighbour ticks on", async || {
        logs::count("neighbour", "tick") > ticks + 5
    })
    .await;
    running.stop().await;
}

/// Issue 28: `on-failure = "hand-over"` hands the lease over at the first failure, and
/// records it; a host that took over and sees the same service fail keeps it in backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_is_recorded_and_not_made_again_by_the_next_host() {
    let (_dir, mut config) = setup(&[("test/trap", "handed")]);
    config.grants.insert(
        "handed".into(),
        Grants {
            on_failure: OnFailure::HandOver,
            ..Grants::default()
        },
    );
    config.restart.initial_backoff = Duration::from_millis(10);
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let a = lease(far_deadline()).await;
    let running = services.start(a.ctx.clone()).await.unwrap();
    let problem = tokio::time::timeout(Duration::from_secs(10), a.ctx.problems.wait())
        .await
        .expect("handed over");
    running.stop().await;
    let Problem::Service { name, reason } = problem else {
        panic!("{problem:?}")
    };
    assert_eq!(name, "handed");
    assert!(
        reason.contains("hand-over") && reason.contains("trapped"),
        "{reason}"
    );
    let record = a.store.get("handover/handed").await.unwrap().unwrap();
    let record: serde_json::Value = serde_json::from_str(&record.value).unwrap();
    assert_eq!(record["holder"], "host-a");
    assert_eq!(record["term"], a.ctx.lease.term);

    // Host B takes the slot over (same store) and the service fails there too.
    let b_term = a
        .store
        .insert_if_absent("vvm/slot/2", "host-b", Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    let b = Lease {
        store: a.store.clone(),
        ctx: ServiceContext {
            lease: LeaseInfo {
                holder: "host-b".into(),
                term: b_term,
                key: "vvm/slot/2".into(),
                ..a.ctx.lease.clone()
            },
            problems: ProblemReporter::default(),
            stopping: CancellationToken::new(),
            running: RunningReport::detached(),
            ..a.ctx.clone()
        },
    };
    let running = services.start(b.ctx.clone()).await.unwrap();
    failed(&b, "handed", 3).await;
    running.stop().await;
    assert_eq!(b.ctx.problems.get(), None, "not handed over again");
    assert!(logs::count("handed", "kept here in backoff") >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_sockets_are_denied_unless_granted() {
    let (dir, mut config) = setup(&[("test/nosy", "nosy-denied"), ("test/nosy", "nosy-granted")]);
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("secret.txt"), "hello").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // The denied guest is pointed at the same file and address through granted env only.
    let env = vec![
        ("NOSY_FILE".to_owned(), "/data/secret.txt".to_owned()),
        ("NOSY_ADDR".to_owned(), addr.to_string()),
    ];
    config.grants.insert(
        "nosy-denied".into(),
        Grants {
            env: env.clone(),
            ..Grants::default()
        },
    );
    config.grants.insert(
        "nosy-granted".into(),
        Grants {
            env,
            dirs: vec![DirGrant {
                host: data,
                guest: "/data".into(),
                read_only: true,
            }],
            network: true,
            ..Grants::default()
        },
    );
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let l = lease(far_deadline()).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    for service in ["nosy-denied", "nosy-granted"] {
        until("the guest records its attempts", async || {
            kv(&l.store, service, "socket").await.is_some()
        })
        .await;
    }
    let denied_file = kv(&l.store, "nosy-denied", "file").await.unwrap();
    let denied_socket = kv(&l.store, "nosy-denied", "socket").await.unwrap();
    assert!(denied_file.starts_with("denied"), "{denied_file}");
    assert!(denied_socket.starts_with("denied"), "{denied_socket}");
    assert_eq!(
        kv(&l.store, "nosy-granted", "file").await.unwrap(),
        "allowed: read 5 bytes"
    );
    assert_eq!(
        kv(&l.store, "nosy-granted", "socket").await.unwrap(),
        "allowed: connected"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_effect_after_the_lease_deadline() {
    let (_dir, mut config) = setup(&[("rust-counter", "fenced-counter")]);
    config.grants.insert("fenced-counter".into(), tick_env(10));
    config.restart.initial_backoff = Duration::from_millis(20);
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let clock = Arc::new(SystemClock::local());
    let (move_deadline, deadline) =
        LeaseDeadline::manual(clock.clone(), clock.now().after(Duration::from_hours(1)));
    let l = lease(deadline).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    let count = async || {
        kv(&l.store, "fenced-counter", "count")
            .await
            .map_or(0, |c| c.parse::<u64>().unwrap())
    };
    until("the counter counts", async || count().await >= 3).await;

    // The lease deadline passes (the host stalled; the store still says we lead). The guest
    // makes one call at a time, so at most the one whose check passed just before the deadline
    // completes after it (one write or one line); the instance ends at its next call, and
    // nothing happens after that. What the guest did is sampled right after the deadline.
    let runs = logs::count("fenced-counter", "service running");
    move_deadline.send(clock.now()).unwrap();
    let effects = async || count().await + logs::count("fenced-counter", "count ") as u64;
    let at_deadline = effects().await;
    until("the service is interrupted", async || {
        logs::count(
            "fenced-counter",
            "service interrupted: lease deadline passed",
        ) >= 1
    })
    .await;
    let ended = effects().await;
    assert!(
        ended <= at_deadline + 1,
        "{} effects after the deadline",
        ended - at_deadline
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(effects().await, ended, "no effect after the instance ended");
    assert_eq!(
        logs::count("fenced-counter", "service running"),
        runs,
        "not restarted"
    );
    assert_eq!(
        l.ctx.problems.get(),
        None,
        "fencing is not the guest's failure"
    );

    // A renewal moves the deadline: the service runs again and counts on.
    let frozen = count().await;
    move_deadline
        .send(clock.now().after(Duration::from_hours(1)))
        .unwrap();
    until("counting resumes", async || count().await > frozen).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_under_an_older_term_is_rejected() {
    let (_dir, config) = setup(&[("rust-counter", "stale-counter")]);
    let (services, _) = WasmServices::load(config, ops()).unwrap();
    let l = lease(far_deadline()).await;
    // Another host acquires the slot after ours expired: the store's term moves on.
    assert!(
        l.store
            .compare_and_delete(LEASE_KEY, "host-a")
            .await
            .unwrap()
    );
    let newer = l
        .store
        .insert_if_absent(LEASE_KEY, "host-b", Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    assert!(newer > l.ctx.lease.term);
    let running = services.start(l.ctx.clone()).await.unwrap();
    let reason = failed(&l, "stale-counter", 1).await.reason.unwrap();
    assert!(reason.contains("stale term"), "{reason}");
    assert_eq!(kv(&l.store, "stale-counter", "count").await, None);
    assert_eq!(
        logs::count("stale-counter", "increment failed: stale term"),
        1
    );
    running.stop().await;
}

#[test]
fn a_compile_cache_hit_skips_compilation() {
    let (dir, config) = setup(&[("rust-ticker", "cached-a"), ("rust-command", "cached-b")]);
    let (first, _) = WasmServices::load(config.clone(), ops()).unwrap();
    assert_eq!((first.stats().compiled, first.stats().cache_hits), (2, 0));
    let (second, _) = WasmServices::load(config.clone(), ops()).unwrap();
    assert_eq!((second.stats().compiled, second.stats().cache_hits), (0, 2));
    assert_eq!(first.services(), second.services());

    // A damaged cache entry is compiled again, not trusted. (Replaced, not rewritten in
    // place: the loaded components map their cache files.)
    for entry in std::fs::read_dir(dir.path().join("cache")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"garbage").unwrap();
    }
    let (third, errors) = WasmServices::load(config, ops()).unwrap();
    assert!(errors.is_empty());
    assert_eq!((third.stats().compiled, third.stats().cache_hits), (2, 0));
}

/// The compile cache keeps what is used and drops what no host has used for a week: entries
/// of old versions and old engines, and temporary files of writes that died. Files it did not
/// write stay, and so does an old entry that is used again.
#[test]
fn the_compile_cache_drops_entries_unused_for_a_week() {
    let (_dir, config, cache, ticker) = ticker_cached_once();
    let hex = |c: char| c.to_string().repeat(64);
    let files = [
        (format!("{}.cwasm", hex('a')), 8),      // an old version: dropped
        (format!("{}.cwasm", hex('b')), 6),      // used within the week: kept
        (format!("{}.tmp4242", hex('c')), 8),    // a write that died: dropped
        (format!("{}.tmp4243", hex('d')), 0),    // a write under way: kept
        ("notes.txt".to_owned(), 30),            // not the cache's: kept
        (format!("{}.cwasm.bak", hex('e')), 30), // not a name it writes: kept
    ];
    for (name, _) in &files {
        std::fs::write(cache.join(name), b"x").unwrap();
    }
    for (name, days) in files
        .iter()
        .map(|(n, d)| (n.as_str(), *d))
        .chain([(ticker.as_str(), 8)])
    {
        let then = std::time::SystemTime::now() - Duration::from_hours(24 * days);
        std::fs::File::options()
            .write(true)
            .open(cache.join(name))
            .unwrap()
            .set_modified(then)
            .unwrap();
    }
    let (again, _) = WasmServices::load(config, ops()).unwrap();
    assert_eq!(
        again.stats().cache_hits,
        1,
        "the old entry in use is loaded"
    );
    let mut kept = vec![
        ticker.clone(),
        format!("{}.cwasm", hex('b')),
        format!("{}.tmp4243", hex('d')),
        "notes.txt".to_owned(),
        format!("{}.cwasm.bak", hex('e')),
    ];
    kept.sort();
    assert_eq!(names(&cache), kept);
}

/// A services directory with the ticker, loaded once: its configuration, its cache directory
/// and the one entry the load wrote there.
fn ticker_cached_once() -> (TempDir, RuntimeConfig, std::path::PathBuf, String) {
    let (dir, config) = setup(&[("rust-ticker", "ticker")]);
    let cache = dir.path().join("cache");
    WasmServices::load(config.clone(), ops()).unwrap();
    let Ok([entry]) = <[String; 1]>::try_from(names(&cache)) else {
        panic!("{:?}", names(&cache))
    };
    (dir, config, cache, entry)
}

/// The names of the files in `dir`, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A cache write that fails (here: its name is taken by a directory) leaves no temporary
/// file behind; the service loads all the same.
#[test]
fn a_failed_cache_write_leaves_nothing_behind() {
    let (_dir, config, cache, entry) = ticker_cached_once();
    std::fs::remove_file(cache.join(&entry)).unwrap();
    std::fs::create_dir(cache.join(&entry)).unwrap();
    std::fs::write(cache.join(&entry).join("in-the-way"), b"").unwrap();
    let (again, errors) = WasmServices::load(config, ops()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(again.stats().compiled, 1);
    assert_eq!(names(&cache), [entry]);
}

#[test]
fn check_reports_every_file() {
    let (_dir, config) = setup(&[("rust-ticker", "ok-ticker"), ("test/empty", "broken")]);
    let report = vvm_host::runtime::check(config, None).unwrap();
    assert!(!report.is_ok());
    assert_eq!(
        report.services,
        vec![("ok-ticker".into(), ServiceKind::Service)]
    );
    assert_eq!(report.errors.len(), 1);
    assert!(
        report.errors[0]
            .to_string()
            .contains("broken.wasm: not a valid component: empty file")
    );
}

/// `check FILE` checks that one file of the directory, and refuses a file that no services
/// directory would take for a service, naming it.
#[test]
fn check_of_one_file_reports_that_file_alone() {
    let (dir, config) = setup(&[("rust-ticker", "ok-ticker"), ("test/empty", "broken")]);
    let services = dir.path();
    let report =
        vvm_host::runtime::check(config.clone(), Some(services.join("ok-ticker.wasm"))).unwrap();
    assert!(report.is_ok(), "{:?}", report.errors);
    assert_eq!(
        report.services,
        vec![("ok-ticker".into(), ServiceKind::Service)]
    );
    let report =
        vvm_host::runtime::check(config.clone(), Some(services.join("broken.wasm"))).unwrap();
    assert_eq!((report.services.len(), report.errors.len()), (0, 1));

    let stray = services.join("ok-ticker.wasm~");
    std::fs::copy(services.join("ok-ticker.wasm"), &stray).unwrap();
    let e = vvm_host::runtime::check(config, Some(stray)).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("ok-ticker.wasm~: not a service file: a service is a file named NAME.wasm"),
        "{e}"
    );
}

// ---- every granted effect is fenced per call ----------------------------------------------

/// The granted WASI effects the `test/effects` guest can perform, one per trial.
const EFFECTS: &[&str] = &[
    "write",
    "set-size",
    "create",
    "truncate",
    "rename",
    "unlink",
    "mkdir",
    "rmdir",
    "link",
    "symlink",
    "set-times",
    "set-times-at",
    "stream-write",
    "stream-append",
    "stream-flush",
    "udp-send",
    "tcp-connect",
    "tcp-bind",
    "tcp-listen",
    "tcp-accept",
    "tcp-write",
    "http-handle",
    "http-body-write",
    "http-pending",
];

/// What one trial of an effect saw.
#[derive(Debug)]
struct Trial {
    /// The guest's `run` returned: the effect call came back.
    returned: bool,
    /// The host refused a call past the deadline.
    refused: bool,
    /// The effect is visible from outside (files, bytes, connections); `None` where an effect
    /// leaves nothing to see once the guest is gone (bind, listen, a flush).
    seen: Option<bool>,
}

/// The granted directory's state: every name with its kind, content and modification time.
fn snapshot(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let what = if meta.is_symlink() {
                "symlink".to_owned()
            } else if meta.is_dir() {
                "dir".to_owned()
            } else {
                format!(
                    "{:?} {:?} nlink {}",
                    std::fs::read(e.path()).unwrap(),
                    meta.modified().unwrap(),
                    std::os::unix::fs::MetadataExt::nlink(&meta)
                )
            };
            (e.file_name().to_string_lossy().into_owned(), what)
        })
        .collect();
    entries.sort();
    entries
}

/// What the `test/effects` guest is granted for `effect`: `data` as `/data`, its network,
/// and outgoing HTTP to `addr`.
fn effect_grants(effect: &str, data: &std::path::Path, addr: std::net::SocketAddr) -> Grants {
    let origin = format!("http://{addr}");
    let limits = vvm_host::interfaces::OutgoingLimits::default();
    Grants {
        dirs: vec![DirGrant {
            host: data.to_owned(),
            guest: "/data".into(),
            read_only: false,
        }],
        env: vec![
            ("EFFECT".into(), effect.into()),
            ("EFFECT_ADDR".into(), addr.to_string()),
        ],
        network: true,
        http: Arc::new(vvm_host::interfaces::HttpPolicy::new(&[origin], None, limits).unwrap()),
        ..Grants::default()
    }
}

/// The server of an `http-` effect. Past the deadline it never answers: what the guest waits
/// for can only be dropped. With a valid lease it answers at once.
fn http_server(fenced: bool) -> testkit::http::Server {
    testkit::http::Server::start(testkit::http::Behaviour {
        head_delay: if fenced {
            Duration::from_hours(1)
        } else {
            Duration::ZERO
        },
        ..testkit::http::Behaviour::default()
    })
}

/// Whether an `http-` effect reached `server`: a connection (`handle`), a body byte (a body
/// write), an answer taken (a pending response: the request arrived whole and its
/// connection stayed until the answer; past the deadline it was either never sent or
/// dropped unanswered, and no connection is left open once the guest is gone).
fn http_seen(effect: &str, server: &testkit::http::Server) -> bool {
    match effect {
        "http-handle" => server.connections() > 0,
        "http-body-write" => server.body_bytes_received() > 0,
        _ => {
            server.wait_until_idle();
            !server.requests().is_empty() && server.closed_early() == 0
        }
    }
}

/// Runs `effect` in the `test/effects` guest: prepared under a valid lease, performed after
/// the stop; with `fenced`, the lease deadline passes just before the stop.
async fn trial(effect: &str, fenced: bool, cache: &std::path::Path) -> Trial {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream, UdpSocket};

    let name = format!("fx-{effect}-{}", if fenced { "fenced" } else { "allowed" });
    let (_dir, mut config) = setup(&[("test/effects", &name)]);
    config.cache_dir = cache.to_owned();
    // No epoch interruption during the trial: only the per-call check may stop the effect
    // (an epoch trap right after the stop would hide a missing check).
    config.epoch_tick = Duration::from_hours(1);
    let data = TempDir::new().unwrap();
    std::fs::write(data.path().join("existing"), "orig").unwrap();
    std::fs::create_dir(data.path().join("emptydir")).unwrap();

    let free_port = || {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let udp = (effect == "udp-send").then(|| UdpSocket::bind("127.0.0.1:0").unwrap());
    let listener = matches!(effect, "tcp-connect" | "tcp-write")
        .then(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let http = effect.starts_with("http-").then(|| http_server(fenced));
    let addr = match (&udp, &listener, &http) {
        (Some(u), _, _) => u.local_addr().unwrap(),
        (_, Some(l), _) => l.local_addr().unwrap(),
        (_, _, Some(h)) => h.addr(),
        _ => free_port(),
    };
    config
        .grants
        .insert(name.clone(), effect_grants(effect, data.path(), addr));
    let (services, errors) = WasmServices::load(config, ops()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    let clock = Arc::new(SystemClock::local());
    let (move_deadline, deadline) =
        LeaseDeadline::manual(clock.clone(), clock.now().after(Duration::from_hours(1)));
    let l = lease(deadline).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    until(&format!("{name} is ready"), async || {
        kv(&l.store, &name, "ready").await.is_some()
    })
    .await;
    let before = snapshot(data.path());
    // The guest connected before the stop: take its connection off the queue.
    let server = (effect == "tcp-write").then(|| listener.as_ref().unwrap().accept().unwrap().0);
    let client = (effect == "tcp-accept").then(|| TcpStream::connect(addr).unwrap());

    if fenced {
        move_deadline.send(clock.now()).unwrap();
    }
    l.ctx.stopping.cancel();
    // Returns once the guest is gone: the effect was performed or refused by then.
    running.stop().await;

    // `run` came back, before or after the supervisor saw the stop.
    let returned = logs::count(&name, "service returned") > 0
        || logs::count_with(&name, "stopped within grace", "outcome=Returned") > 0;
    let refused = logs::count(&name, "lease deadline passed") > 0;
    let read_one = |mut s: TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 8];
        s.read(&mut buf)
    };
    let seen = match effect {
        "tcp-bind" | "tcp-listen" | "stream-flush" => None,
        "udp-send" => {
            let udp = udp.unwrap();
            udp.set_nonblocking(true).unwrap();
            Some(udp.recv(&mut [0u8; 8]).is_ok())
        }
        "tcp-connect" => {
            let listener = listener.unwrap();
            listener.set_nonblocking(true).unwrap();
            Some(listener.accept().is_ok())
        }
        // Bytes arrived, or the guest's socket closed with nothing sent.
        "tcp-write" => Some(read_one(server.unwrap()).unwrap() > 0),
        // An accepted connection is closed with the guest (end of stream); one never
        // accepted is reset with the guest's listener.
        "tcp-accept" => Some(read_one(client.unwrap()).is_ok()),
        _ if effect.starts_with("http-") => Some(http_seen(effect, &http.unwrap())),
        _ => Some(snapshot(data.path()) != before),
    };
    Trial {
        returned,
        refused,
        seen,
    }
}

/// SPEC §6: every effect a grant allows is checked against the lease deadline per call. Each
/// effect runs twice: with a valid lease it happens (so the trial can see it), past the
/// deadline it is refused at the call and nothing is written, sent, or connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_granted_effect_is_refused_at_the_call_past_the_deadline() {
    let cache = TempDir::new().unwrap();
    let mut failures = Vec::new();
    for effect in EFFECTS {
        let allowed = trial(effect, false, cache.path()).await;
        if !allowed.returned || allowed.refused || allowed.seen == Some(false) {
            failures.push(format!("{effect} with a valid lease: {allowed:?}"));
        }
        let fenced = trial(effect, true, cache.path()).await;
        if fenced.returned || !fenced.refused || fenced.seen == Some(true) {
            failures.push(format!("{effect} past the deadline: {fenced:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The running services of a leadership follow the directory (SPEC §6): a file added while
/// running starts; once the stop is signalled nothing starts any more, even a file added
/// then; and the stop returns with every instance gone. Grants set while running apply to the
/// next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_services_follow_the_directory_until_the_stop() {
    let (dir, mut config) = setup(&[("rust-ticker", "live-a")]);
    config.grants.insert("live-a".into(), tick_env(20));
    let (services, errors) = WasmServices::load(config, ops()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    services.follow_dir().unwrap();
    let l = lease(far_deadline()).await;
    let running = services.start(l.ctx.clone()).await.unwrap();
    until("live-a ticks", async || {
        logs::count("live-a", "tick 1:") > 0
    })
    .await;

    // Granted only now: the new service's first start gets it (it ticks every 20 ms).
    let mut grants = std::collections::HashMap::new();
    grants.insert("live-b".to_owned(), tick_env(20));
    services.set_grants(grants);
    guests::install(dir.path(), &[("rust-ticker", "live-b")]);
    // 20 ticks within `until`'s 10 s: only at the granted 20 ms, not the default 1 s.
    until("live-b ticks fast", async || {
        logs::count("live-b", "tick 20:") > 0
    })
    .await;

    l.ctx.stopping.cancel();
    guests::install(dir.path(), &[("rust-ticker", "live-c")]);
    until("live-c is loaded", async || {
        services.services().iter().any(|(name, _)| name == "live-c")
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), running.stop())
        .await
        .expect("the stop returns within the grace period");
    assert_eq!(
        logs::count("live-c", "service running"),
        0,
        "started after the stop"
    );
    for service in ["live-a", "live-b"] {
        let ticks = logs::count(service, "tick ");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(logs::count(service, "tick "), ticks, "{service} still runs");
    }
    drop(services);
}

/// A component that spins while it is being instantiated (its core module's start function
/// never returns) holds up neither the other services' start nor the stop: it is dropped at
/// the stop without a grace period, as it cannot have heard the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_spinning_while_instantiated_holds_up_neither_start_nor_stop() {
    let (dir, mut config) = setup(&[("rust-ticker", "ticker")]);
    std::fs::write(
        dir.path().join("spin-start.wasm"),
        guests::spinning_at_instantiation(),
    )
    .unwrap();
    config.grants.insert("ticker".into(), tick_env(10));
    config.grace_period = Duration::from_mins(1);
    let (services, errors) = WasmServices::load(config, ops()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    let l = lease(far_deadline()).await;
    let running = tokio::time::timeout(Duration::from_secs(10), services.start(l.ctx.clone()))
        .await
        .expect("the start is not held up")
        .unwrap();
    until("the ticker ticks", async || {
        logs::count("ticker", "tick 3:") > 0
    })
    .await;
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), running.stop())
        .await
        .expect("the stop is not held up");
    assert!(
        started.elapsed() < Duration::from_mins(1),
        "no grace period for a guest still being instantiated"
    );
}

/// Issue 28: a loaded service has every per-service series at 0 from its load (before any
/// leadership), so `increase()` sees its first restart.
#[test]
fn a_loaded_service_has_its_series_at_zero() {
    let (_dir, config) = setup(&[("rust-ticker", "zero-series")]);
    let ops = ops();
    let (_services, _) = WasmServices::load(config, ops.clone()).unwrap();
    let text = ops.render();
    for line in [
        "vvm_service_restarts_total{service=\"zero-series\"} 0",
        "vvm_service_failures_total{service=\"zero-series\"} 0",
        "vvm_guest_effects_refused_total{service=\"zero-series\"} 0",
        "vvm_kv_writes_total{service=\"zero-series\",outcome=\"stale\"} 0",
        "vvm_service_state{service=\"zero-series\",state=\"stopped\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing in:\n{text}"
        );
    }
}
