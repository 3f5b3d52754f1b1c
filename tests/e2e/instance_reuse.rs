//! Instances that serve many requests (SPEC §12, issue 47) under the real `vvm-host serve`:
//! the `test/http-hello` guest's `count` path answers `count N instance X`, N the requests its
//! instance has begun (a global), X a number the instance drew at its first.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use rustix::process::Signal;

use crate::incoming_http::{free_addr, get, hello_dir, serve_with, stop};

/// One `count` answer: the term it came under, N and X.
#[derive(Debug, PartialEq, Eq)]
struct Count {
    term: u64,
    n: u32,
    instance: String,
}

/// GET `/NAME/count` on `addr`, which must be a 200.
fn count(addr: SocketAddr, service: &str) -> Count {
    let (status, tokens, body) = get(addr, &format!("/{service}/count"));
    assert_eq!(status, 200, "{body}");
    let mut words = body.split_whitespace();
    let (Some("count"), Some(n), Some("instance"), Some(instance)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        panic!("not a count: {body:?}");
    };
    Count {
        term: tokens[0].parse().unwrap(),
        n: n.parse().unwrap(),
        instance: instance.to_owned(),
    }
}

/// GET `/NAME/count` on `addr` as [`count`], then, unless `last` (its instance has served its
/// share), waits until the instance waits idle again in the pool (`/metrics` at `metrics`): an
/// instance is given back once its call has returned, which may be a moment after the client
/// has the whole response.
fn count_then_idle(addr: SocketAddr, metrics: &str, service: &str, last: bool) -> Count {
    let answer = count(addr, service);
    if !last {
        let idle = format!("vvm_http_instances_idle{{service={service}}}");
        crate::ops::metrics_until(&format!("http://{metrics}"), |m| {
            m.get(&idle).copied().unwrap_or_default() >= 1.0
        });
    }
    answer
}

fn ns(counts: &[Count]) -> Vec<u32> {
    counts.iter().map(|c| c.n).collect()
}

/// With `max-instance-reuse-count = 3` an instance serves three requests, then a fresh one
/// does: the counts go 1, 2, 3, 1, 2, 3, 1, each three from one instance. A service with the
/// default (1, as `wasmtime serve` for a WASI 0.2 component) gets a fresh instance for every
/// request. `/metrics` counts instances made and reused.
#[test]
fn an_instance_serves_its_reuse_count_of_requests_and_the_default_is_one() {
    let addr = free_addr();
    let metrics_addr = free_addr().to_string();
    let dir = hello_dir(
        &["hello", "fresh"],
        "[service.hello]\nmax-instance-reuse-count = 3\nidle-instance-timeout = \"1h\"\n",
    );
    let host = serve_with(
        "a",
        dir.path(),
        addr,
        &["--lease", "5s", "--metrics-addr", &metrics_addr],
    );
    host.wait_for(&["services started"]);
    let reused: Vec<Count> = (0..7)
        .map(|i| count_then_idle(addr, &metrics_addr, "hello", i % 3 == 2))
        .collect();
    assert_eq!(ns(&reused), [1, 2, 3, 1, 2, 3, 1]);
    for group in reused.chunks(3) {
        assert!(
            group.iter().all(|c| c.instance == group[0].instance),
            "{reused:?}"
        );
    }
    assert_ne!(reused[0].instance, reused[3].instance);
    let fresh: Vec<Count> = (0..3).map(|_| count(addr, "fresh")).collect();
    assert_eq!(ns(&fresh), [1, 1, 1]);
    let m = crate::ops::metrics(&format!("http://{metrics_addr}"));
    let value = |key: &str| crate::ops::value(&m, key);
    assert_eq!(
        value("vvm_http_instances_created_total{service=hello}"),
        3.0
    );
    assert_eq!(value("vvm_http_instance_reuses_total{service=hello}"), 4.0);
    assert_eq!(
        value("vvm_http_instances_created_total{service=fresh}"),
        3.0
    );
    assert_eq!(value("vvm_http_instance_reuses_total{service=fresh}"), 0.0);
    // `status` shows each HTTP service's reuse (from the leader's next renewal on); `check`
    // notes the one that keeps state.
    let end = std::time::Instant::now() + testkit::host::PATIENCE;
    let (status, services) = loop {
        let out = crate::tools::tool(dir.path(), &["status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let services = status["slots"][0]["services"].as_array().cloned();
        if let Some(services) = services.filter(|s| s.len() == 2) {
            break (status, services);
        }
        assert!(std::time::Instant::now() < end, "no services in {status}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let reuse_of = |name: &str| {
        let service = services.iter().find(|s| s["name"] == name).unwrap();
        service["reuse"]["max_requests"].as_u64()
    };
    assert_eq!(
        (reuse_of("hello"), reuse_of("fresh")),
        (Some(3), Some(1)),
        "{status}"
    );
    let text = crate::tools::tool(dir.path(), &["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("instances: 3 requests each, 1 at once"),
        "{text}"
    );
    let out = crate::tools::tool(dir.path(), &["check"]);
    let notes =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(notes.contains("keeps state between requests"), "{notes}");
    assert_eq!(
        notes.matches("keeps state between requests").count(),
        1,
        "{notes}"
    );
    stop(host);
}

/// An instance that traps, hits its memory cap, or runs past the request timeout is dropped,
/// never reused: the next request gets a fresh instance (its count starts at 1 again). One
/// idle past `idle-instance-timeout` is dropped too.
#[test]
fn a_trap_a_memory_cap_hit_and_a_timeout_each_leave_the_next_request_a_fresh_instance() {
    let addr = free_addr();
    let metrics_addr = free_addr().to_string();
    let dir = hello_dir(
        &["hello"],
        "[incoming-http]\nrequest-timeout = \"1s\"\n\
         [service.hello]\nmax-instance-reuse-count = 1000\nidle-instance-timeout = \"300ms\"\n",
    );
    let host = serve_with(
        "a",
        dir.path(),
        addr,
        &["--lease", "5s", "--metrics-addr", &metrics_addr],
    );
    host.wait_for(&["services started"]);
    let idle_then = |last| count_then_idle(addr, &metrics_addr, "hello", last);
    for (path, status) in [("trap", 500), ("grow", 500), ("spin", 504)] {
        let before = [idle_then(false), idle_then(false)];
        assert_eq!(before[1].n, before[0].n + 1, "reused");
        let (answered, _, body) = get(addr, &format!("/hello/{path}"));
        assert_eq!(answered, status, "/hello/{path}: {body}");
        // Waited for in the pool, as the others: else the next round's first request may find
        // it still busy and make an instance of its own, which the pool keeps beside it.
        let after = idle_then(false);
        assert_eq!(after.n, 1, "after /hello/{path}: a fresh instance");
        assert_ne!(after.instance, before[1].instance);
    }
    // Idle past its timeout: dropped, then a fresh one. The pool holds only the instance that
    // served `last` (the ones above were dropped, not pooled), so its idle gauge going back to
    // 0 is that instance's drop; the count of retired instances is no signal here, as the
    // timed-out instance may be counted only after its 504 was answered.
    let base = format!("http://{metrics_addr}");
    let last = idle_then(false);
    crate::ops::metrics_until(&base, |m| {
        m.get("vvm_http_instances_idle{service=hello}").copied() == Some(0.0)
    });
    let next = count(addr, "hello");
    assert_eq!(next.n, 1, "the idle instance was dropped");
    assert_ne!(next.instance, last.instance);
    stop(host);
}

/// An instance belongs to the leadership it was made under: after a takeover, graceful
/// (SIGTERM) and then a crash (SIGKILL), each new term's counts start at 1 on instances of its
/// own, and no instance answers under two terms.
#[test]
fn after_a_takeover_the_new_term_never_answers_from_an_old_terms_instance() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let addr = free_addr();
    let dir = hello_dir(
        &["hello"],
        "[service.hello]\nmax-instance-reuse-count = 1000\n",
    );
    let start = |name: &'static str| serve_with(name, dir.path(), addr, &["--lease", "2s"]);
    let mut a = start("a");
    a.wait_for(&["services started"]);
    let b = start("b");
    b.wait_for(&["campaigning"]);
    let mut counts: Vec<Count> = (0..3).map(|_| count(addr, "hello")).collect();
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    b.wait_for(&["services started"]);
    counts.extend((0..3).map(|_| count(addr, "hello")));
    let c = start("c");
    c.wait_for(&["campaigning"]);
    let mut b = b;
    b.signal(Signal::KILL);
    b.wait_exit();
    c.wait_for(&["services started"]);
    counts.extend((0..3).map(|_| count(addr, "hello")));
    let by_term: BTreeMap<u64, Vec<u32>> = counts.iter().fold(BTreeMap::new(), |mut m, c| {
        m.entry(c.term).or_insert_with(Vec::new).push(c.n);
        m
    });
    assert_eq!(
        by_term,
        BTreeMap::from([(1, vec![1, 2, 3]), (2, vec![1, 2, 3]), (3, vec![1, 2, 3])]),
        "{counts:?}"
    );
    let mut terms_of: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for c in &counts {
        terms_of.entry(&c.instance).or_default().insert(c.term);
    }
    assert!(terms_of.values().all(|t| t.len() == 1), "{terms_of:?}");
    stop(c);
}
