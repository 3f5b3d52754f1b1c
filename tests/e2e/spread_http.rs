//! HTTP under spread placement (SPEC §6 "Placement", §10 "Incoming HTTP", issue 46): a host's
//! listener belongs to its membership of the group, not to one of its claims. Every request
//! that reaches a live member is answered: 200 by the service's claim while the host holds
//! it, 503 with `Retry-After` for a service another host holds, never silence.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::spread::{running, wait_for_rest};

use crate::incoming_http::{free_addr, hello_dir, serve_with};
use crate::shared_listener::{Answer, StopOnDrop, ask};

/// The lease: a claim handed over stops being renewed, and its local deadline passes 0.8 s
/// later.
const LEASE: Duration = Duration::from_secs(1);

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// `vvm-host serve` in `dir` (spread placement, set in its `vvm.toml`) on HTTP address `addr`.
fn member(name: &'static str, dir: &Path, addr: SocketAddr) -> Host {
    let lease = format!("{}s", LEASE.as_secs());
    serve_with(name, dir, addr, &["--lease", &lease])
}

/// Adds the hello guest as service `name` to `dir`'s services, renamed into place.
fn add_hello(dir: &Path, name: &str) {
    let services = dir.join("services");
    let part = services.join(format!("{name}.part"));
    std::fs::copy(guests::guest("test/http-hello"), &part).unwrap();
    std::fs::rename(&part, services.join(format!("{name}.wasm"))).unwrap();
}

/// Stops `host` gracefully.
fn leave(host: &mut Host) {
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success(), "{} left cleanly", host.name);
}

/// What a request for `service` on a host that holds `held` may be answered: 200 when the
/// host holds it, else 503 with `Retry-After`.
fn expected(answer: &Answer, service: &str, held: &BTreeSet<String>) -> bool {
    match answer {
        Answer::Ok(_) => held.contains(service),
        Answer::Unavailable => !held.contains(service),
        _ => false,
    }
}

/// A host whose first claim (the one its listener followed before) is handed over goes on
/// answering every request: 200 for the services it still holds, 503 with `Retry-After` for
/// those another host holds. Before, its listener stopped accepting about 0.8 L after the
/// handover (`http accepting stopped: the lease deadline passed`) and every request to it
/// went unanswered until the client gave up.
#[test]
fn a_host_whose_first_claim_moves_away_answers_every_request() {
    let _heavy = crate::one_heavy_test_at_a_time();
    // `z` alone first: it is the first claim of host A. Then `a`, `b`, `c`: A holds all four.
    let dir = hello_dir(&["z"], "placement = \"spread\"\n");
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let a = member("a", dir.path(), addr_a);
    wait_for_rest(&[&a], &names(&["z"]), &[1]);
    for name in ["a", "b", "c"] {
        add_hello(dir.path(), name);
    }
    let all = names(&["a", "b", "c", "z"]);
    wait_for_rest(&[&a], &all, &[4]);
    // B joins: A hands its surplus over, the last ones by name, `z` among them.
    let mut b = member("b", dir.path(), addr_b);
    wait_for_rest(&[&a, &b], &all, &[2, 2]);
    let held = running(&a);
    assert_eq!(held, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    // Every service asked of A for four leases from the handover: the claim of `z` is no
    // longer renewed by A, and its deadline passes within the first.
    let until = Instant::now() + 4 * LEASE;
    let mut asked = 0;
    while Instant::now() < until {
        for service in &all {
            let answer = ask(addr_a, &format!("/{service}/x"));
            assert!(
                expected(&answer, service, &held),
                "A answered /{service}/x with {answer:?} while holding {held:?}"
            );
            asked += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("A answered all {asked} requests");
    assert!(
        !a.lines()
            .iter()
            .any(|l| l.text.contains("http accepting stopped")),
        "A stopped accepting while a member"
    );
    leave(&mut b);
}

/// Hosts join and leave gracefully, again and again, while clients ask every service of the
/// three hosts that stay: claims move each time, and each request is answered at once, 200
/// by the host holding its service or 503 with `Retry-After` by another; none waits past its
/// timeout, none is refused.
#[test]
fn joins_and_graceful_leaves_under_steady_requests_leave_no_request_unanswered() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let all = names(&["s1", "s2", "s3", "s4"]);
    let list: Vec<&str> = all.iter().map(String::as_str).collect();
    let dir = hello_dir(&list, "placement = \"spread\"\n");
    let addrs = [free_addr(), free_addr(), free_addr()];
    let a = member("a", dir.path(), addrs[0]);
    let b = member("b", dir.path(), addrs[1]);
    let c = member("c", dir.path(), addrs[2]);
    wait_for_rest(&[&a, &b, &c], &all, &[2, 1, 1]);
    let done = AtomicBool::new(false);
    let answers: Mutex<Vec<(SocketAddr, String, Answer)>> = Mutex::default();
    std::thread::scope(|s| {
        for addr in addrs {
            let (done, answers, all) = (&done, &answers, &all);
            s.spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    for service in all {
                        let answer = ask(addr, &format!("/{service}/x"));
                        answers
                            .lock()
                            .unwrap()
                            .push((addr, service.clone(), answer));
                    }
                }
            });
        }
        let _done = StopOnDrop(&done);
        for round in 0..2 {
            let mut d = member(["d1", "d2"][round], dir.path(), free_addr());
            wait_for_rest(&[&a, &b, &c, &d], &all, &[1, 1, 1, 1]);
            leave(&mut d);
            wait_for_rest(&[&a, &b, &c], &all, &[2, 1, 1]);
        }
    });
    let answers = answers.into_inner().unwrap();
    let ok = answers
        .iter()
        .filter(|(_, _, a)| matches!(a, Answer::Ok(_)))
        .count();
    let bad: Vec<_> = answers
        .iter()
        .filter(|(_, _, a)| !matches!(a, Answer::Ok(_) | Answer::Unavailable))
        .collect();
    eprintln!(
        "{} requests: {ok} answered 200, {} 503, {} otherwise",
        answers.len(),
        answers.len() - ok - bad.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} requests not answered 200 or 503: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    for addr in addrs {
        assert!(
            answers
                .iter()
                .any(|(to, _, a)| *to == addr && matches!(a, Answer::Ok(_))),
            "{addr} answered no request 200"
        );
    }
}
