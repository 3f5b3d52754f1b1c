//! End-to-end tests on etcd: two real `vvm-host serve --store etcd://...` processes on one
//! real etcd (SPEC §3, §5, issue 9). Skipped with a visible message when `etcd` is not on
//! PATH, and failing instead when the environment variable `CI` is set.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rustix::process::{Pid, Signal};
use testkit::etcd::EtcdServer;
use testkit::host::{Host, Line, PATIENCE, cluster_dir};

use super::{assert_disjoint, serve_on, ticks};

/// The lease of these tests: etcd leases last whole seconds, and 2 s is the smallest TTL a
/// cluster with etcd's default election timeout grants.
const LEASE: Duration = Duration::from_secs(2);
const LEASE_ARG: &str = "2s";

/// How far a log timestamp may trail the event it records (the line is formatted after it).
const LOG_SLACK: Duration = Duration::from_millis(50);

pub(crate) fn store_url(etcd: &EtcdServer) -> String {
    format!("etcd://{}", etcd.endpoint())
}

/// The log timestamp of a line, as wall-clock time.
fn at(line: &Line) -> SystemTime {
    let v: serde_json::Value = serde_json::from_str(&line.text).unwrap();
    humantime::parse_rfc3339(v["timestamp"].as_str().unwrap()).unwrap()
}

/// `later - earlier`, zero if `later` is not later.
fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// The term a ticker line (`tick N: term T`) was written under.
fn term(line: &Line) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&line.text).unwrap();
    let message = v["fields"]["message"].as_str().unwrap();
    let (_, term) = message.rsplit_once("term ").unwrap();
    term.parse().unwrap()
}

/// Guest output of one lease: which host wrote it and the first and last line's timestamps.
#[derive(Debug)]
struct Span {
    host: &'static str,
    first: SystemTime,
    last: SystemTime,
}

/// Every term's span of guest output across `hosts`.
fn spans(hosts: &[&Host]) -> BTreeMap<u64, Span> {
    let mut spans = BTreeMap::<u64, Span>::new();
    for host in hosts {
        for line in ticks(host) {
            let (t, when) = (term(&line), at(&line));
            let span = spans.entry(t).or_insert(Span {
                host: host.name,
                first: when,
                last: when,
            });
            assert_eq!(span.host, host.name, "term {t} ran on two hosts");
            span.first = span.first.min(when);
            span.last = span.last.max(when);
        }
    }
    spans
}

/// At no moment do two leases have guest output: the spans of all terms are disjoint.
fn assert_never_together(hosts: &[&Host]) {
    let spans: Vec<(u64, Span)> = spans(hosts).into_iter().collect();
    for (i, (t1, s1)) in spans.iter().enumerate() {
        for (t2, s2) in &spans[i + 1..] {
            assert!(
                s1.last < s2.first || s2.last < s1.first,
                "services ran on two hosts at once: term {t1} {s1:?} and term {t2} {s2:?}"
            );
        }
    }
}

/// Waits for the first guest output under a term other than `old` on any of `hosts`.
fn wait_for_new_term(hosts: &[&Host], old: u64) -> (&'static str, Line) {
    let end = std::time::Instant::now() + PATIENCE;
    loop {
        for host in hosts {
            if let Some(line) = ticks(host).into_iter().find(|l| term(l) != old) {
                return (host.name, line);
            }
        }
        assert!(
            std::time::Instant::now() < end,
            "no host led again within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn etcd_standby_takes_over_at_once_after_a_graceful_stop() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let store = store_url(&etcd);
    let dir = cluster_dir();
    let mut a = serve_on("a", dir.path(), LEASE_ARG, &store);
    a.wait_for(&["tick 1:"]);
    let mut b = serve_on("b", dir.path(), LEASE_ARG, &store);
    b.wait_for(&["campaigning"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(ticks(&b).is_empty(), "B must wait while A leads");

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    let released = a.wait_for(&["released", "\"deleted\":true"]);
    assert!(
        released.text.contains(&format!("/{}/", b.pid())),
        "A handed its slot to B in its release: {}",
        released.text
    );
    let first = b.wait_for(&["tick 1:"]);
    // Waiting for the record's time left would take up to the whole lease: the watch must
    // wake B on the delete itself.
    let gap = since(at(&first), at(&released));
    assert!(
        gap < Duration::from_millis(500),
        "B's first guest output came {gap:?} after A's release: it did not wake on the delete"
    );
    assert_disjoint(&a, &b);

    // And back: A joins again as the standby, B stops, A leads.
    let mut a2 = serve_on("a2", dir.path(), LEASE_ARG, &store);
    a2.wait_for(&["campaigning"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(ticks(&a2).is_empty(), "A must wait while B leads");
    b.signal(Signal::INT);
    assert!(b.wait_exit().success());
    a2.wait_for(&["tick 1:"]);
    assert_never_together(&[&a, &b, &a2]);
    a2.signal(Signal::TERM);
    assert!(a2.wait_exit().success());
}

/// Hosts on one machine that share a crash lock directory (`--lock-dir`) take over from a
/// killed leader at once on etcd too: B deletes A's live record (compare-and-delete on its
/// exact value) as soon as the kernel frees A's lock, long before A's 20 s lease could expire.
#[test]
fn etcd_hosts_sharing_a_lock_dir_take_over_from_a_killed_leader_at_once() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let store = store_url(&etcd);
    let dir = cluster_dir();
    let start = |name: &'static str| {
        let cache = format!("cache-{name}");
        let args = [
            "serve",
            "--store",
            &store,
            "--lease",
            "20s",
            "--cache-dir",
            &cache,
            "--lock-dir",
            "locks",
        ];
        Host::start(crate::BIN, name, dir.path(), &args, "info")
    };
    let mut a = start("a");
    a.wait_for(&["tick 1:"]);
    let b = start("b");
    b.wait_for(&["waiting on the holder's lock"]);
    a.signal(Signal::KILL);
    a.wait_exit();
    b.wait_for(&[
        "deleting the record of a holder that is gone",
        "\"deleted\":true",
    ]);
    b.wait_for(&["tick 1:"]);
    assert_disjoint(&a, &b);
}

#[test]
fn etcd_standby_takes_over_after_a_killed_leader_lease_expires_not_before() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let store = store_url(&etcd);
    let dir = cluster_dir();
    let mut a = serve_on("a", dir.path(), LEASE_ARG, &store);
    a.wait_for(&["tick 1:"]);
    let b = serve_on("b", dir.path(), LEASE_ARG, &store);
    b.wait_for(&["campaigning"]);
    // Kill A some way into a renewal period, after at least one renewal.
    a.wait_for(&["renewed"]);
    std::thread::sleep(Duration::from_millis(200));
    a.signal(Signal::KILL);
    a.wait_exit();
    let last_write = a
        .lines()
        .into_iter()
        .rfind(|l| l.text.contains("renewed"))
        .unwrap();
    let first = b.wait_for(&["tick 1:"]);
    // A's last renewal granted its etcd lease just before logging `renewed` (within a few
    // ms on loopback), and etcd keeps a record for its whole TTL: B may only lead after that.
    let waited = since(at(&first), at(&last_write));
    assert!(
        waited + Duration::from_millis(100) >= LEASE,
        "B led {waited:?} after A's last renewal: before the {LEASE:?} lease could expire"
    );
    // Expiry is a delete B watches for: it leads soon after (etcd sweeps every 500 ms).
    assert!(
        waited <= LEASE + Duration::from_secs(2),
        "B led only {waited:?} after A's last renewal ({LEASE:?} lease)"
    );
    assert_never_together(&[&a, &b]);
}

/// How etcd goes away under the leader.
#[derive(Clone, Copy, Debug)]
enum Away {
    /// SIGSTOP, then SIGCONT: requests hang, the cluster's clock stops.
    Paused,
    /// SIGKILL, then a restart on the same data: requests fail at once.
    Killed,
}

/// etcd away for longer than the lease under a leader: the leader's guests stop by its local
/// deadline (the killer ends it, or it loses the lease and stands by), nobody leads while etcd
/// is away, and after etcd returns exactly one host leads, never two at once.
fn leader_loses_the_lease_while_etcd_is_away(away: Away) {
    let Some(mut etcd) = EtcdServer::start() else {
        return;
    };
    let store = store_url(&etcd);
    let dir = cluster_dir();
    let mut a = serve_on("a", dir.path(), LEASE_ARG, &store);
    let term_a = term(&a.wait_for(&["tick 1:"]));
    let b = serve_on("b", dir.path(), LEASE_ARG, &store);
    b.wait_for(&["campaigning"]);
    a.wait_for(&["renewed"]);

    let etcd_pid = Pid::from_raw(i32::try_from(etcd.pid()).unwrap()).unwrap();
    let gone_at = SystemTime::now();
    match away {
        Away::Paused => rustix::process::kill_process(etcd_pid, Signal::STOP).unwrap(),
        Away::Killed => etcd.kill(),
    }
    std::thread::sleep(LEASE + Duration::from_secs(1));
    let returning_at = SystemTime::now();
    match away {
        Away::Paused => rustix::process::kill_process(etcd_pid, Signal::CONT).unwrap(),
        Away::Killed => etcd.restart(),
    }

    let (leader, first) = wait_for_new_term(&[&a, &b], term_a);
    // A's last successful write started before etcd went away, so its local deadline was at
    // most 0.8 L later: no guest output of A's term after that.
    let last_a = ticks(&a)
        .into_iter()
        .filter(|l| term(l) == term_a)
        .map(|l| at(&l))
        .max()
        .unwrap();
    let deadline = gone_at + LEASE.mul_f64(0.8) + LOG_SLACK;
    assert!(
        last_a <= deadline,
        "{away:?}: A's guest wrote {:?} after etcd went away, past its 0.8 L deadline",
        since(last_a, gone_at)
    );
    assert!(
        at(&first) >= returning_at,
        "{away:?}: {leader} led while etcd was away"
    );
    // A either was ended by the killer or noticed the loss and stood by.
    let killed = a.lines().iter().any(|l| l.text.contains("killer fired"));
    let lost = a.lines().iter().any(|l| l.text.contains("lost"));
    assert!(
        killed || lost,
        "{away:?}: A neither lost the lease nor was killed"
    );
    if let Some(status) = a.wait_exit_or(Duration::ZERO) {
        assert_eq!(
            status.code(),
            Some(vvm_host::killer::KILLER_EXIT_CODE),
            "{away:?}: A exited, but not by the killer"
        );
    }
    // Let the new leader run a little, then compare every lease's guest output.
    std::thread::sleep(Duration::from_millis(500));
    assert_never_together(&[&a, &b]);
}

#[test]
fn etcd_paused_longer_than_the_lease_ends_the_leaders_services() {
    leader_loses_the_lease_while_etcd_is_away(Away::Paused);
}

#[test]
fn etcd_killed_and_restarted_under_a_leader_never_lets_two_hosts_lead() {
    leader_loses_the_lease_while_etcd_is_away(Away::Killed);
}
