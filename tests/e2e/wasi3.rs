//! WASI 0.3 components (SPEC §12, issue 48) under the real `vvm-host serve`: an app made with
//! Spin's current Rust SDK (7.0.0) and one made with its current Python SDK (5.0.0), served
//! unchanged; a `wasip3` HTTP service taking many requests at once in one instance, fenced by
//! the lease; its outgoing requests under the allow-list and the token header; a WASI 0.3
//! command run on a schedule.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::http::{Behaviour, Server};

use crate::incoming_http::{free_addr, get, serve_with, stop};

/// A directory serving `guest` as the service `name`, with `settings` as its `vvm.toml`.
fn dir_with(guest: &str, name: &str, settings: &str) -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(guests::guest(guest), services.join(format!("{name}.wasm"))).unwrap();
    std::fs::write(dir.path().join("vvm.toml"), settings).unwrap();
    dir
}

fn serve(name: &'static str, dir: &Path, addr: SocketAddr, lease: &str) -> Host {
    serve_with(name, dir, addr, &["--lease", lease])
}

/// `vvm-host check` in `dir`: its report.
fn check(dir: &Path) -> String {
    let out = std::process::Command::new(crate::BIN)
        .args(["check", "services"])
        .current_dir(dir)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{report}");
    report
}

/// An app made with spin-sdk 7.0.0 (`#[http_service]`, `spin:key-value@3.0.0`,
/// `spin:variables@3.0.0`, WASI 0.3), routed at a `vvm.toml` route with `:id`, reads Spin's
/// `spin-path-match-id`, its greeting from `[service.NAME.config]`, and counts in its default
/// store; after a takeover its count goes on under the new term. Before, the host refused it:
/// "`stream` requires the component model async feature".
#[test]
fn a_spin_sdk_7_app_runs_unchanged_and_its_count_goes_on_across_a_takeover() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = dir_with(
        "test/spin7-app",
        "app",
        "[service.app]\nroute = \"/items/:id\"\n[service.app.config]\ngreeting = \"hi\"\n",
    );
    let report = check(dir.path());
    assert!(
        report.contains("ok    app (wasi:http@0.3.0 service"),
        "{report}"
    );
    let addr = free_addr();
    let a = serve("a", dir.path(), addr, "3s");
    a.wait_for(&["services started"]);
    for count in 1..=2 {
        let (status, tokens, body) = get(addr, "/items/42");
        assert_eq!((status, body), (200, format!("hi item 42 count {count}\n")));
        assert_eq!(tokens, ["1"]);
    }
    let b = serve("b", dir.path(), addr, "3s");
    b.wait_for(&["campaigning"]);
    let mark = b.mark();
    stop(a);
    b.wait_for_from(mark, &["services started"]);
    let (status, tokens, body) = get(addr, "/items/7");
    assert_eq!((status, body.as_str()), (200, "hi item 7 count 3\n"));
    assert_eq!(tokens, ["2"]);
    stop(b);
}

/// An app made with Spin's Python SDK 5.0.0 (componentize-py 0.25.1) imports Spin's whole
/// platform, WASI 0.3 and its release candidate: it is served, and `check` says which of its
/// imports are stubs (Spin's outbound interfaces, WASI 0.3's files and sockets) and that the
/// release candidate is served by the 0.3.0 implementation.
#[test]
fn a_spin_python_sdk_5_app_is_served_and_check_says_what_it_imports() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = dir_with(
        "test/spin5-python-app",
        "app",
        "[service.app]\nroute = \"/...\"\n[service.app.config]\ngreeting = \"hello\"\n",
    );
    let report = check(dir.path());
    for says in [
        "ok    app (wasi:http@0.3.0 service",
        "spin:postgres/postgres@4.2.0",
        "which vvm-host does not offer",
        "wasi:http/client@0.3.0-rc-2026-03-15",
        "served by the WASI 0.3.0 implementation",
        "wasi:sockets/types@0.3.0",
    ] {
        assert!(report.contains(says), "{says}: {report}");
    }
    let addr = free_addr();
    let mut a = serve("a", dir.path(), addr, "5s");
    a.wait_for(&["services started"]);
    for n in 1..=2 {
        let (status, tokens, body) = get(addr, "/x");
        assert_eq!((status, body), (200, format!("hello /x #{n}\n")));
        assert_eq!(tokens, ["1"]);
    }
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// 16 requests at once to a WASI 0.3 service whose handler waits 3 s, then prints an effect
/// and answers: they share instances (sent one after another, each once the one before it
/// waits). The leader is stopped (SIGSTOP) in the middle, until its standby has taken over,
/// then resumed: none of its 16 calls has an effect after its deadline (no `effect` line of it
/// after the stop), none is answered 200, and the standby serves under term 2.
#[test]
fn sixteen_requests_sharing_instances_have_no_effect_past_the_lease_deadline() {
    const AT_ONCE: usize = 16;
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = dir_with("test/p3-http", "p3", "");
    let addr = free_addr();
    let metrics = free_addr().to_string();
    let a = serve_with(
        "a",
        dir.path(),
        addr,
        &["--lease", "1s", "--metrics-addr", &metrics],
    );
    a.wait_for(&["services started"]);
    let b = serve("b", dir.path(), addr, "1s");
    b.wait_for(&["campaigning"]);
    let answers = std::thread::scope(|s| {
        // One after another, each sent once the one before waits in the instance (which then
        // has room for the next: it takes a request only while the others wait).
        let asked: Vec<_> = (0..AT_ONCE)
            .map(|id| {
                let mark = a.mark();
                let path = format!("/p3/delay?ms=3000&id={id}");
                let asked = s.spawn(move || crate::shared_listener::ask(addr, &path));
                a.wait_for_from(mark, &[&format!("\"begin {id}\"")]);
                asked
            })
            .collect();
        // An instance takes a request only while all its calls wait (`wasmtime serve`'s rule):
        // one that arrives in the moment an instance runs guest code (here, between its
        // `begin` line and its wait) goes to a new instance. So not always one instance, but
        // never one per request.
        let created = crate::ops::metrics(&format!("http://{metrics}"))["vvm_http_instances_created_total{service=p3}"];
        #[allow(clippy::cast_precision_loss)]
        let each_its_own = AT_ONCE as f64;
        assert!(
            created < each_its_own,
            "{created} instances for {AT_ONCE} requests"
        );
        a.stop();
        let stopped_at = Instant::now();
        let mark = b.mark();
        b.wait_for_from(mark, &["services started"]);
        // Past the calls' 3 s wait: had the stopped leader's calls run on, they would have
        // printed their effects by now.
        std::thread::sleep(Duration::from_secs(3).saturating_sub(stopped_at.elapsed()));
        a.signal(Signal::CONT);
        asked
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let ok: Vec<_> = answers
        .iter()
        .filter(|a| matches!(a, crate::shared_listener::Answer::Ok(1)))
        .collect();
    assert!(
        ok.is_empty(),
        "the stopped leader answered 200: {answers:?}"
    );
    let effects: Vec<String> = a
        .lines()
        .into_iter()
        // The guest's own lines, `effect N` (not the host's `effect refused`).
        .filter(|l| {
            l.text
                .split("\"effect ")
                .nth(1)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(|l| l.text)
        .collect();
    assert!(
        effects.is_empty(),
        "effects after the deadline: {effects:?}"
    );
    let (status, tokens, body) = get(addr, "/p3/delay?ms=0&id=after");
    assert_eq!(
        (status, body.as_str(), tokens),
        (200, "done after", vec!["2".to_owned()])
    );
    drop(a);
    stop(b);
}

/// A WASI 0.3 service's outgoing request (`wasi:http/client@0.3.0`) goes through the same
/// allow-list and carries the same fencing token as WASI 0.2's: to a listed server it arrives
/// with `vvm-fencing-token: 1`; to an unlisted one it is denied before any connection.
#[test]
fn a_wasi3_outgoing_request_is_allowed_by_the_list_and_carries_the_token() {
    let listed = Server::start(Behaviour::default());
    let unlisted = Server::start(Behaviour::default());
    let settings = format!(
        "[service.p3]\nhttp = [\"http://127.0.0.1:{}\"]\nenv = [\"URL=http://127.0.0.1:{}/hello\"]\n",
        listed.port(),
        listed.port()
    );
    let dir = dir_with("test/p3-http", "p3", &settings);
    let addr = free_addr();
    let a = serve("a", dir.path(), addr, "5s");
    a.wait_for(&["services started"]);
    let (status, _, body) = get(addr, "/p3/out");
    assert_eq!((status, body.as_str()), (200, "upstream 200"));
    let sent = listed.wait_for_requests(1);
    assert_eq!(sent[0].header("vvm-fencing-token"), Some("1"));
    assert_eq!(sent[0].header("vvm-lease"), Some("slot/1"));
    stop(a);
    let settings = format!(
        "[service.p3]\nhttp = [\"http://127.0.0.1:{}\"]\nenv = [\"URL=http://127.0.0.1:{}/x\"]\n",
        listed.port(),
        unlisted.port()
    );
    std::fs::write(dir.path().join("vvm.toml"), settings).unwrap();
    let a = serve("a2", dir.path(), addr, "5s");
    a.wait_for(&["services started"]);
    let (status, _, body) = get(addr, "/p3/out");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("HttpRequestDenied"), "{body}");
    assert_eq!(unlisted.connections(), 0, "denied before any connection");
    stop(a);
}

/// A WASI 0.3 command (`wasi:cli/run@0.3.0`) is a service that runs, and runs on a schedule:
/// once per fire time, with the fire time in `VVM_FIRE_TIME`. `check` names its world.
#[test]
fn a_wasi3_command_runs_on_a_schedule() {
    let dir = dir_with(
        "test/p3-command",
        "tick",
        "[service.tick]\nschedule = \"* * * * * *\"\n",
    );
    let report = check(dir.path());
    assert!(report.contains("ok    tick (WASI 0.3 command"), "{report}");
    let addr = free_addr();
    let a = serve("a", dir.path(), addr, "5s");
    let fires: BTreeSet<String> = (0..2)
        .map(|i| {
            let (_, line) = a.wait_for_from(if i == 0 { 0 } else { a.mark() }, &["p3 fire "]);
            line.text
        })
        .collect();
    assert_eq!(fires.len(), 2, "{fires:?}");
    assert!(
        fires.iter().all(|l| !l.contains("p3 fire none")),
        "{fires:?}"
    );
    stop(a);
}
