//! End-to-end tests: real `vvm-host` processes sharing one store (SPEC §5, §8).

// Test code throughout (helpers too, which clippy's allow-unwrap-in-tests does not cover):
// a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]
// Percentile ranks and millisecond figures of non-negative samples.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod cli;
mod docs;
mod etcd;
mod fencing;
mod fleet;
mod incoming_http;
mod incoming_limits;
mod incoming_takeover;
mod instance_reuse;
mod isolation;
mod keyvalue;
mod languages;
mod live_dir;
mod netns;
mod new;
mod oci;
mod ops;
mod outgoing_http;
mod schedule;
mod shared_listener;
mod spin;
mod spread;
mod spread_http;
mod stateful_http;
mod systemd;
mod tools;
mod wasi3;

use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::{Host, Line, cluster_dir};

/// Tests that hold short leases through storms of SIGSTOP and SIGKILL, or load the machine
/// with many hosts, take this lock so that they run one at a time. On the 2-core machines two
/// of them at once (beside the other tests) can starve a renewal past L = 1 s: a failure of
/// the machine's capacity, not of the host. The other tests still run beside them.
pub(crate) fn one_heavy_test_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");

/// `vvm-host serve` in `dir` with its own compile cache and the given lease, on the default
/// store (`vvm.redb` in `dir`).
pub(crate) fn serve(name: &'static str, dir: &Path, lease: &str) -> Host {
    serve_on(name, dir, lease, "vvm.redb")
}

/// Like [`serve`], on the given `--store`.
fn serve_on(name: &'static str, dir: &Path, lease: &str, store: &str) -> Host {
    testkit::host::serve(BIN, name, dir, store, lease)
}

/// The log timestamp of a line (RFC 3339 UTC with a fixed number of digits: sorts as text).
fn stamp(line: &Line) -> String {
    let v: serde_json::Value = serde_json::from_str(&line.text).unwrap();
    v["timestamp"].as_str().unwrap().to_owned()
}

/// Guest output lines of the ticker in `host`'s log.
fn ticks(host: &Host) -> Vec<Line> {
    host.lines()
        .into_iter()
        .filter(|l| l.text.contains("rust-ticker") && l.text.contains("tick "))
        .collect()
}

/// The span [first, last] of guest output of a host, by log timestamps.
fn span(host: &Host) -> Option<(String, String)> {
    let t = ticks(host);
    Some((stamp(t.first()?), stamp(t.last()?)))
}

fn assert_disjoint(a: &Host, b: &Host) {
    if let (Some((a0, a1)), Some((b0, b1))) = (span(a), span(b)) {
        assert!(
            a1 < b0 || b1 < a0,
            "{} ran services {a0}..{a1} and {} ran {b0}..{b1}: both at once",
            a.name,
            b.name
        );
    }
}

#[test]
fn hosts_take_over_from_each_other_and_never_run_services_together() {
    let dir = cluster_dir();
    // Seed 001's manual scenario: A leads, B waits; stop A -> B leads; start A again -> A
    // waits; stop B -> A leads.
    let mut a = serve("a1", dir.path(), "20s");
    a.wait_for(&["tick 1:"]);
    let b = serve("b", dir.path(), "20s");
    b.wait_for(&["campaigning"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(ticks(&b).is_empty(), "B must wait while A leads");

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    b.wait_for(&["tick 1:"]);
    assert_disjoint(&a, &b);

    let mut a2 = serve("a2", dir.path(), "20s");
    a2.wait_for(&["campaigning"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(ticks(&a2).is_empty(), "A must wait while B leads");

    let mut b = b;
    b.signal(Signal::INT);
    assert!(b.wait_exit().success());
    a2.wait_for(&["tick 1:"]);
    assert_disjoint(&b, &a2);
    a2.signal(Signal::TERM);
    assert!(a2.wait_exit().success());
}

/// The number `field` of a JSON log line.
fn number(line: &Line, field: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&line.text).unwrap();
    v["fields"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {}", line.text))
}

/// A graceful leader hands its slot to a waiting standby in its one release write (the
/// standby writes nothing to take it), and passes over a stopped standby (SIGSTOP: it would
/// leave the slot idle) for one that runs. The stopped one stays a standby once it runs
/// again, and is handed the slot at the next graceful stop.
#[test]
fn a_graceful_leader_hands_its_slot_over_passing_a_stopped_standby_by() {
    let _heavy = one_heavy_test_at_a_time();
    let dir = cluster_dir();
    let mut a = serve("a", dir.path(), "2s");
    a.wait_for(&["tick 1:"]);
    // C stands first, B last: B's candidacy is the freshest, so only its stopped process
    // tells A to pass it over.
    let mut c = serve("c", dir.path(), "2s");
    c.wait_for(&["campaigning"]);
    std::thread::sleep(Duration::from_millis(50));
    let b = serve("b", dir.path(), "2s");
    b.wait_for(&["campaigning"]);
    std::thread::sleep(Duration::from_millis(50));
    // Stopped for sure (A reads B's state from /proc as it releases).
    b.stop();
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    let released = a.wait_for(&["released"]);
    assert!(
        released.text.contains(&format!("/{}/", c.pid())),
        "A handed its slot to C (pid {}): {}",
        c.pid(),
        released.text
    );
    let acquired = c.wait_for(&["\"acquired\""]);
    assert_eq!(number(&acquired, "term"), number(&released, "term"));
    c.wait_for(&["tick 1:"]);
    b.signal(Signal::CONT);
    std::thread::sleep(Duration::from_millis(500));
    assert!(ticks(&b).is_empty(), "B stays a standby while C leads");

    c.signal(Signal::TERM);
    assert!(c.wait_exit().success());
    let released = c.wait_for_from(0, &["released", "\"to\""]).1;
    assert!(
        released.text.contains(&format!("/{}/", b.pid())),
        "{}",
        released.text
    );
    b.wait_for(&["tick 1:"]);
    assert_disjoint(&a, &c);
    assert_disjoint(&c, &b);
    assert_disjoint(&a, &b);
}

/// The crash lock: a standby on the same machine takes over from a killed leader while the
/// leader's record is still live (L = 20 s), but never from a stopped one, which still holds
/// its lock (and runs again after SIGCONT, until its deadline).
#[test]
fn a_killed_leader_is_taken_over_at_once_a_stopped_one_is_not() {
    let dir = cluster_dir();
    let mut a = serve("a", dir.path(), "20s");
    a.wait_for(&["tick 1:"]);
    let b = serve("b", dir.path(), "20s");
    b.wait_for(&["waiting on the holder's lock"]);
    a.signal(Signal::STOP);
    std::thread::sleep(Duration::from_secs(2));
    let count = |needle: &str| b.lines().iter().filter(|l| l.text.contains(needle)).count();
    assert_eq!(
        count("\"acquired\""),
        0,
        "B took over from a stopped leader"
    );
    assert_eq!(count("gone"), 0, "a stopped leader's lock was taken");
    a.signal(Signal::KILL);
    a.wait_exit();
    // Deleted by compare-and-delete, which only deletes a live record: B did not wait for
    // A's record to expire.
    b.wait_for(&[
        "deleting the record of a holder that is gone",
        "\"deleted\":true",
    ]);
    b.wait_for(&["tick 1:"]);
    assert_disjoint(&a, &b);
    let lock_files = std::fs::read_dir(dir.path().join("vvm.redb.holders"))
        .unwrap()
        .count();
    assert_eq!(lock_files, 1, "A's lock file is removed, B's remains");
}

/// Without the crash lock (its directory cannot be made) a standby knows nothing of a killed
/// leader and waits out its lease.
#[test]
fn standby_takes_over_after_a_killed_leader_lease_expires_not_before() {
    let dir = cluster_dir();
    std::fs::write(dir.path().join("vvm.redb.holders"), "not a directory").unwrap();
    let lease = Duration::from_millis(1500);
    let mut a = serve("a", dir.path(), "1500ms");
    let acquired = a.wait_for(&["acquired"]);
    let b = serve("b", dir.path(), "1500ms");
    b.wait_for(&["campaigning"]);
    // The last renewal A made before dying bounds when its record can expire.
    std::thread::sleep(Duration::from_millis(500));
    let last_write = a
        .lines()
        .into_iter()
        .rfind(|l| l.text.contains("renewed") || l.text.contains("acquired"))
        .unwrap_or(acquired);
    a.signal(Signal::KILL);
    a.wait_exit();
    let first = b.wait_for(&["tick 1:"]);
    // A's record expires L after its last write started, and that write started `took_us`
    // (renewals log it; a loaded machine makes it tens of ms) before A logged it: B's first
    // output comes at least L − took after A's last logged write, by the log timestamps of
    // both (one wall clock). 5 ms covers the clock readings.
    let took_ms =
        serde_json::from_str::<serde_json::Value>(&last_write.text).unwrap()["fields"]["took_us"]
            .as_i64()
            .map_or(0, |us| us / 1000 + 1);
    let gap = millis_between(&last_write, &first);
    assert!(
        gap + took_ms + 5 >= i64::try_from(lease.as_millis()).unwrap(),
        "B took over {gap} ms after A's last write: before the record could expire"
    );
}

/// Milliseconds from `a` to `b` by their log timestamps.
fn millis_between(a: &Line, b: &Line) -> i64 {
    let ms = |l: &Line| {
        let v: serde_json::Value = serde_json::from_str(&l.text).unwrap();
        let t = v["timestamp"].as_str().unwrap().to_owned();
        // RFC 3339 UTC, e.g. 2026-11-23T19:26:56.991212Z: same day in a test, seconds of day.
        let (h, rest) = t.split_once('T').unwrap().1.split_at(2);
        let (m, rest) = rest[1..].split_at(2);
        let secs: f64 = rest[1..].trim_end_matches('Z').parse().unwrap();
        let total = h.parse::<f64>().unwrap() * 3600.0 + m.parse::<f64>().unwrap() * 60.0 + secs;
        (total * 1000.0) as i64
    };
    ms(b) - ms(a)
}

#[test]
fn a_stopped_leader_has_no_effect_after_its_deadline_and_rejoins_as_standby() {
    let dir = cluster_dir();
    let mut a = serve("a", dir.path(), "1s");
    a.wait_for(&["tick 1:"]);
    let b = serve("b", dir.path(), "1s");
    b.wait_for(&["campaigning"]);
    let first_b = a.stop_until(&b, &["tick 1:"]);
    std::thread::sleep(Duration::from_millis(500));
    let mark = a.mark();
    a.signal(Signal::CONT);
    // A wakes past its local deadline: the killer ends it (or fencing drops its output and it
    // loses the lease). Either way no guest output of A may be logged after B's start.
    let status = a.wait_exit_or(Duration::from_secs(10));
    let late: Vec<Line> = ticks(&a)
        .into_iter()
        .filter(|l| stamp(l) > stamp(&first_b))
        .collect();
    assert!(
        late.is_empty(),
        "A's guest acted after B took over: {late:?}"
    );
    match status {
        Some(status) => assert_eq!(
            status.code(),
            Some(vvm_host::killer::KILLER_EXIT_CODE),
            "A must be ended by the killer"
        ),
        None => {
            // Still alive: it must have rejoined as a standby.
            a.wait_for_from(mark, &["campaigning"]);
        }
    }
}

#[test]
fn bad_configuration_is_one_clear_line_and_a_non_zero_exit() {
    let bad_file = testkit::scratch::scratch_dir();
    std::fs::write(bad_file.path().join("vvm.toml"), "leese = \"2s\"\n").unwrap();
    let clean = testkit::scratch::scratch_dir();
    std::fs::write(clean.path().join("not-a-dir"), "").unwrap();
    let cases: &[(&Path, &[&str], &str)] = &[
        (bad_file.path(), &["serve"], "unknown field `leese`"),
        (clean.path(), &["serve", "--lease", "-5s"], "negative"),
        (clean.path(), &["serve", "--lease", "0s"], "zero"),
        (
            clean.path(),
            &["serve", "--cluster-size", "0"],
            "cluster-size",
        ),
        (
            clean.path(),
            &["serve", "--store", "missing/dir/vvm.redb"],
            "missing/dir/vvm.redb",
        ),
        (
            clean.path(),
            &["serve", "--services", "not-a-dir"],
            "not-a-dir",
        ),
        (clean.path(), &["serve", "--services", "absent"], "absent"),
    ];
    for (dir, args, needle) in cases {
        let out = std::process::Command::new(BIN)
            .args(*args)
            .current_dir(dir)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    }
}

/// A service that fails only on host A (a local problem, and the operator said so with
/// `on-failure = "hand-over"`): A shuts down and backs off before campaigning again, so the
/// healthy standby B takes the slot, and keeps it: no flapping.
#[test]
fn a_service_failing_on_one_host_hands_the_slot_to_a_healthy_standby_for_good() {
    let dir = cluster_dir();
    let a_services = dir.path().join("services-a");
    std::fs::create_dir(&a_services).unwrap();
    std::fs::copy(
        guests::guest("rust-ticker"),
        a_services.join("rust-ticker.wasm"),
    )
    .unwrap();
    std::fs::copy(guests::guest("test/trap"), a_services.join("trap.wasm")).unwrap();
    std::fs::write(
        dir.path().join("a.toml"),
        "[service.trap]\non-failure = \"hand-over\"\n",
    )
    .unwrap();
    let args = [
        "serve",
        "--config",
        "a.toml",
        "--services",
        "services-a",
        "--lease",
        "1s",
        "--cache-dir",
        "cache-a",
        "--grace-period",
        "1s",
    ];
    let mut a = Host::start(BIN, "a", dir.path(), &args, "info");
    a.wait_for(&["leading"]);
    let mut b = serve("b", dir.path(), "1s");
    b.wait_for(&["campaigning"]);
    let problem = a.wait_for(&["handing the lease over"]);
    let b_leads = b.wait_for(&["leading"]);
    assert!(
        stamp(&b_leads) > stamp(&problem),
        "B led only after A's problem"
    );
    // A stood aside, then campaigns again, as a standby now.
    let (backed_off, _) = a.wait_for_from(0, &["backing off"]);
    a.wait_for_from(backed_off, &["campaigning"]);
    // Observe a while: B keeps the slot, A never leads again.
    std::thread::sleep(Duration::from_secs(6));
    let count =
        |h: &Host, needle: &str| h.lines().iter().filter(|l| l.text.contains(needle)).count();
    assert_eq!(
        count(&a, "\"leading\""),
        1,
        "A led again: leadership flapped"
    );
    assert_eq!(
        count(&b, "\"acquired\""),
        1,
        "B lost the slot and won it again"
    );
    a.signal(Signal::TERM);
    b.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    assert!(b.wait_exit().success());
}

/// A guest calling `kv.set` as fast as it can for 10·L (L = 1 s) does not starve the lease
/// renewals that share the store: the leader keeps its lease. Prints the renewal latency.
#[test]
fn a_guest_writing_kv_at_full_speed_does_not_starve_the_renewals() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(guests::guest("test/kv-flood"), services.join("flood.wasm")).unwrap();
    let mut a = serve("a", dir.path(), "1s");
    a.wait_for(&["flood: "]);
    std::thread::sleep(Duration::from_secs(10));
    let lines = a.lines();
    assert!(
        !lines.iter().any(|l| l.text.contains("lost")),
        "the leader lost its lease under kv load"
    );
    let mut took: Vec<u64> = lines
        .iter()
        .filter(|l| l.text.contains("\"renewed\""))
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
            v["fields"]["took_us"].as_u64()
        })
        .collect();
    took.sort_unstable();
    assert!(took.len() >= 30, "{} renewals in 10 s", took.len());
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    let flood = lines.iter().rfind(|l| l.text.contains("flood: ")).unwrap();
    println!(
        "renewal latency under full-speed kv writes (L = 1 s, 10 s): {} renewals, \
         p50 {} µs, p99 {} µs, max {} µs; last guest report: {}",
        took.len(),
        at(0.5),
        at(0.99),
        at(1.0),
        flood.text
    );
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// A granted guest that opens files and never closes them cannot take the descriptors the
/// host needs. With an open file limit of 1024 the guest traps at its share (1024 less the
/// 256 the host keeps), naming the handle limit; meanwhile the host re-reads its
/// configuration on SIGHUP and answers `/healthz`, which both need a new descriptor.
#[test]
fn a_guest_that_leaks_descriptors_cannot_take_the_hosts() {
    const LIMIT: usize = 1024;
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    guests::install(&services, &[("test/leak", "leak")]);
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let config = format!("[service.leak]\ndirs = [\"{}:/data\"]\n", data.display());
    std::fs::write(dir.path().join("vvm.toml"), config).unwrap();
    let nofile = format!("--nofile={LIMIT}:{LIMIT}");
    let args = [
        nofile.as_str(),
        BIN,
        "serve",
        "--lease",
        "2s",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    // `prlimit` sets the limit and execs the host: the pid is the host's.
    let mut host = Host::start("prlimit", "a", dir.path(), &args, "info");
    let health = format!("{}/healthz", crate::ops::endpoint(&host));
    host.wait_for(&["leaking files"]);
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", host.pid()))
            .unwrap()
            .count()
    };
    let mut most = 0;
    for _ in 0..20 {
        most = most.max(fds());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        most < LIMIT - 128,
        "the host had {most} of its {LIMIT} descriptors open"
    );
    let failed = host.wait_for(&["service failed"]);
    assert!(failed.text.contains("handle-limit"), "{}", failed.text);
    let from = host.mark();
    host.signal(Signal::HUP);
    let (_, reloaded) = host.wait_for_from(from, &["reloaded"]);
    assert!(!reloaded.text.contains("not reloaded"), "{}", reloaded.text);
    assert_eq!(crate::ops::get(&health).0, 200);
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}
