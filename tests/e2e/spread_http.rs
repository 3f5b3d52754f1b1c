//! HTTP under spread placement (SPEC §6 "Placement", §10 "Incoming HTTP", §13 forwarding,
//! issues 46 and 50): a host's listener belongs to its membership of the group, not to one of
//! its claims. Every request that reaches a live member is answered, never silence: by the
//! service's claim while the host holds it; for a service another host holds, by that host
//! (forwarded, one hop), or, with `forward` off, 503 with `Retry-After`.

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
    member_with(name, dir, addr, &[])
}

/// [`member`], with `more` arguments.
fn member_with(name: &'static str, dir: &Path, addr: SocketAddr, more: &[&str]) -> Host {
    let lease = format!("{}s", LEASE.as_secs());
    let mut args = vec!["--lease", &lease];
    args.extend_from_slice(more);
    serve_with(name, dir, addr, &args)
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
/// those another host holds (forwarding off: the host's own answers are the subject). Before, its listener stopped accepting about 0.8 L after the
/// handover (`http accepting stopped: the lease deadline passed`) and every request to it
/// went unanswered until the client gave up.
#[test]
fn a_host_whose_first_claim_moves_away_answers_every_request() {
    let _heavy = crate::one_heavy_test_at_a_time();
    // `z` alone first: it is the first claim of host A. Then `a`, `b`, `c`: A holds all four.
    let dir = hello_dir(&["z"], "placement = \"spread\"\n");
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let off = ["--forward", "false"];
    let a = member_with("a", dir.path(), addr_a, &off);
    wait_for_rest(&[&a], &names(&["z"]), &[1]);
    for name in ["a", "b", "c"] {
        add_hello(dir.path(), name);
    }
    let all = names(&["a", "b", "c", "z"]);
    wait_for_rest(&[&a], &all, &[4]);
    // B joins: A hands its surplus over, the last ones by name, `z` among them.
    let mut b = member_with("b", dir.path(), addr_b, &off);
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
/// three hosts that stay: claims move each time, and every request is answered 200, by the
/// host holding its service or through it (issue 50: planned moves cost no request; before
/// forwarding, two in three were 503).
#[test]
fn joins_and_graceful_leaves_under_steady_requests_answer_every_request_200() {
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
    let bad: Vec<_> = answers
        .iter()
        .filter(|(_, _, a)| !matches!(a, Answer::Ok(_)))
        .collect();
    eprintln!(
        "{} requests: {} answered 200, {} otherwise",
        answers.len(),
        answers.len() - bad.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} requests not answered 200: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    for addr in addrs {
        assert!(
            answers.iter().any(|(to, _, _)| *to == addr),
            "{addr} was asked nothing"
        );
    }
}

/// Three hosts share six services: each service asked through each host is answered 200 by
/// its holder, under the holder's term (the fencing token it answers with directly).
#[test]
fn every_service_asked_through_every_host_is_answered_by_its_holder() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let all = names(&["s1", "s2", "s3", "s4", "s5", "s6"]);
    let list: Vec<&str> = all.iter().map(String::as_str).collect();
    let dir = hello_dir(&list, "placement = \"spread\"\n");
    let addrs = [free_addr(), free_addr(), free_addr()];
    let hosts = [
        member("a", dir.path(), addrs[0]),
        member("b", dir.path(), addrs[1]),
        member("c", dir.path(), addrs[2]),
    ];
    let refs: Vec<&Host> = hosts.iter().collect();
    wait_for_rest(&refs, &all, &[2, 2, 2]);
    for service in &all {
        let holder = (hosts.iter().zip(addrs))
            .find(|(h, _)| running(h).contains(service))
            .map(|(_, addr)| addr)
            .unwrap();
        let path = format!("/{service}/x");
        let Answer::Ok(term) = ask(holder, &path) else {
            panic!("{service}'s holder did not answer 200");
        };
        for addr in addrs {
            assert_eq!(
                ask(addr, &path),
                Answer::Ok(term),
                "/{service}/x through {addr}, held at {holder}"
            );
        }
    }
}

/// A request is forwarded one hop at most: a client's own forwarding header keeps it where it
/// landed (503 with `Retry-After` from a host that does not hold its service), and two hosts
/// whose records point at each other answer 503 rather than pass a request round.
#[test]
fn a_request_is_forwarded_one_hop_at_most() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let all = names(&["s1", "s2"]);
    let dir = hello_dir(&["s1", "s2"], "placement = \"spread\"\n");
    let (addr_a, addr_b) = (free_addr(), free_addr());
    // Each advertises the other's address: a forward from A lands on A again, and from B on B.
    let (to_b, to_a) = (addr_b.to_string(), addr_a.to_string());
    let a = member_with("a", dir.path(), addr_a, &["--advertise-addr", &to_b]);
    let b = member_with("b", dir.path(), addr_b, &["--advertise-addr", &to_a]);
    wait_for_rest(&[&a, &b], &all, &[1, 1]);
    let not_a = all.iter().find(|s| !running(&a).contains(*s)).unwrap();
    let answer = ask(addr_a, &format!("/{not_a}/x"));
    assert_eq!(
        answer,
        Answer::Unavailable,
        "records pointing at each other"
    );
    let header = format!(
        "GET /{not_a}/x HTTP/1.1\r\nhost: x\r\nvvm-forwarded-by: 10.9.9.9:1\r\nconnection: close\r\n\r\n"
    );
    let text = testkit::http::exchange(addr_a, header.as_bytes());
    assert!(
        text.starts_with("HTTP/1.1 503") && text.to_ascii_lowercase().contains("retry-after:"),
        "a client's own forwarding header: {text}"
    );
}

/// The holder of a service is killed: a request for it through another host is answered 503
/// with `Retry-After` (the holder cannot be reached) only until its claim is taken over, then
/// 200 again; never left unanswered.
#[test]
fn a_killed_holder_costs_503_until_its_claim_is_taken_over() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let all = names(&["s1", "s2"]);
    let dir = hello_dir(&["s1", "s2"], "placement = \"spread\"\n");
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let a = member("a", dir.path(), addr_a);
    let mut b = member("b", dir.path(), addr_b);
    wait_for_rest(&[&a, &b], &all, &[1, 1]);
    let on_b = all.iter().find(|s| running(&b).contains(*s)).unwrap();
    let path = format!("/{on_b}/x");
    assert!(
        matches!(ask(addr_a, &path), Answer::Ok(_)),
        "through A first"
    );
    b.signal(Signal::KILL);
    b.wait_exit();
    let mut answers = Vec::new();
    let end = Instant::now() + 30 * LEASE;
    loop {
        let answer = ask(addr_a, &path);
        let ok = matches!(answer, Answer::Ok(_));
        answers.push(answer);
        if ok {
            break;
        }
        assert!(Instant::now() < end, "no takeover: {answers:?}");
    }
    let bad: Vec<&Answer> = answers
        .iter()
        .filter(|a| !matches!(a, Answer::Ok(_) | Answer::Unavailable))
        .collect();
    assert!(bad.is_empty(), "answers while the holder was dead: {bad:?}");
    wait_for_rest(&[&a], &all, &[2]);
    assert!(
        matches!(ask(addr_a, &path), Answer::Ok(_)),
        "after the takeover"
    );
}
