//! A fleet that agrees (SPEC §13, issue 49): two hosts on one store, each with its own services
//! directory (as two machines have), host B holding other bits for `hello` than host A.

use std::path::Path;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;

use crate::incoming_http::free_addr;

/// A directory with `a/hello.wasm` (the WASI 0.2 hello) and `b/hello.wasm` (another
/// component: the WASI 0.3 hello), one store for both.
fn two_directories() -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    for (host, guest) in [("a", "test/http-hello"), ("b", "test/p3-http")] {
        std::fs::create_dir(dir.path().join(host)).unwrap();
        std::fs::copy(
            guests::guest(guest),
            dir.path().join(host).join("hello.wasm"),
        )
        .unwrap();
    }
    dir
}

/// `vvm-host serve` on the shared store with the services of `dir/NAME`, L = 2 s, and `more`.
fn serve(name: &'static str, dir: &Path, more: &[&str]) -> Host {
    let (cache, http) = (format!("cache-{name}"), free_addr().to_string());
    let mut args = vec!["serve", "--store", "vvm.redb", "--services", name];
    args.extend(["--cache-dir", &cache, "--http-addr", &http]);
    args.extend(["--lease", "2s", "--grace-period", "1s"]);
    args.extend_from_slice(more);
    Host::start(crate::BIN, name, dir, &args, "info")
}

/// `status --json` in `dir` once `ready` holds of it.
fn status_until(dir: &Path, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let end = std::time::Instant::now() + testkit::host::PATIENCE;
    loop {
        let out = crate::tools::tool(dir, &["status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if ready(&status) {
            return status;
        }
        assert!(std::time::Instant::now() < end, "never ready: {status}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Before any takeover `status` lists both hosts with their versions of `hello` and flags the
/// difference (the table too), the standby warns and its `/metrics` says so; when the leader
/// stops, the standby takes over and logs what it runs now against what term 1 ran.
#[test]
fn other_bits_on_a_standby_show_before_a_takeover_and_the_takeover_says_what_changed() {
    let dir = two_directories();
    let metrics = free_addr().to_string();
    let mut a = serve("a", dir.path(), &[]);
    a.wait_for(&["services started"]);
    let b = serve("b", dir.path(), &["--metrics-addr", &metrics]);
    b.wait_for(&["this host's services differ from the leader's", "hello"]);
    let status = status_until(dir.path(), |s| {
        s["differences"].as_array().is_some_and(|d| !d.is_empty())
    });
    let hosts = status["hosts"].as_array().unwrap();
    let roles: Vec<&str> = hosts.iter().map(|h| h["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["leader", "standby"], "{status}");
    let (ours, theirs) = (
        &hosts[0]["services"]["hello"],
        &hosts[1]["services"]["hello"],
    );
    assert!(
        ours.is_string() && theirs.is_string() && ours != theirs,
        "{status}"
    );
    let difference = &status["differences"][0];
    assert_eq!(difference["service"], "hello", "{status}");
    assert_eq!(
        difference["versions"].as_object().unwrap().len(),
        2,
        "{status}"
    );
    let table = crate::tools::tool(dir.path(), &["status"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("DIFFERS  hello:"), "{table}");
    let m = crate::ops::metrics(&format!("http://{metrics}"));
    assert_eq!(
        m.get("vvm_service_differs_from_leader{service=hello}"),
        Some(&1.0),
        "{m:?}"
    );

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    let line = b.wait_for(&["under term 1", "now"]);
    let (ours, theirs) = (ours.as_str().unwrap(), theirs.as_str().unwrap());
    assert!(
        line.text.contains(ours) && line.text.contains(theirs),
        "{}",
        line.text
    );
    b.wait_for(&["services started"]);
    crate::incoming_http::stop(b);
}

/// With `require-same-services`, a standby whose `hello` differs from the leader's does not
/// campaign and its `/healthz` is 503 with the reason; the leader's graceful stop leaves the
/// slot to no one (a handover to it is given back). Once its file is the leader's, it
/// campaigns again and leads, and then says nothing differs.
#[test]
fn with_require_same_services_a_standby_with_other_bits_leads_only_once_it_has_the_leaders() {
    let dir = two_directories();
    let metrics = free_addr().to_string();
    let mut a = serve("a", dir.path(), &[]);
    a.wait_for(&["services started"]);
    let b = serve(
        "b",
        dir.path(),
        &["--require-same-services", "--metrics-addr", &metrics],
    );
    b.wait_for(&["not campaigning (require-same-services)"]);
    let (status, body) = crate::ops::get(&format!("http://{metrics}/healthz"));
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("not campaigning") && body.contains("hello"),
        "{body}"
    );

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    let before = b.mark();
    std::fs::copy(
        dir.path().join("a").join("hello.wasm"),
        dir.path().join("b").join("hello.wasm"),
    )
    .unwrap();
    let (again, _) = b.wait_for_from(before, &["campaigning again (require-same-services)"]);
    let (led, _) = b.wait_for_from(before, &[r#""message":"leading""#]);
    assert!(again < led, "led before its services were the leader's");
    let early: Vec<_> = b.lines()[..before]
        .iter()
        .filter(|l| l.text.contains(r#""message":"leading""#))
        .map(|l| l.text.clone())
        .collect();
    assert!(early.is_empty(), "led with other bits: {early:?}");
    let (status, body) = crate::ops::get(&format!("http://{metrics}/healthz"));
    assert_eq!(status, 200, "{body}");
    assert!(
        !b.lines().iter().any(|l| l.text.contains("under term 1")),
        "nothing differs from term 1 now"
    );
    crate::incoming_http::stop(b);
}

/// A service whose file a host refused shows in `status` with the reason (issue 49), for the
/// leader under its slot and for a standby among the hosts, in `--json` and in the table,
/// while the others serve; once the file is fixed, it loads and is gone from both.
#[test]
fn a_refused_service_shows_in_status_for_the_leader_and_a_standby_until_its_file_loads() {
    let dir = testkit::scratch::scratch_dir();
    for host in ["a", "b"] {
        let at = dir.path().join(host);
        std::fs::create_dir(&at).unwrap();
        std::fs::copy(guests::guest("test/http-hello"), at.join("hello.wasm")).unwrap();
        std::fs::write(at.join("broken.wasm"), format!("not a component, {host}")).unwrap();
    }
    let mut a = serve("a", dir.path(), &[]);
    a.wait_for(&["services started"]);
    let mut b = serve("b", dir.path(), &[]);
    b.wait_for(&["services loaded"]);
    let refused = |h: &serde_json::Value| h["rejected"]["broken"].is_string();
    let status = status_until(dir.path(), |s| {
        s["hosts"]
            .as_array()
            .is_some_and(|h| h.len() == 2 && h.iter().all(refused))
    });
    let reason = status["slots"][0]["rejected"]["broken"].as_str().unwrap();
    assert!(reason.contains("broken.wasm"), "names the file: {status}");
    assert_eq!(
        status["slots"][0]["services"][0]["name"], "hello",
        "{status}"
    );
    assert!(
        status["differences"].as_array().unwrap().is_empty(),
        "{status}"
    );
    let table = crate::tools::tool(dir.path(), &["status"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("service broken rejected: "), "{table}");
    assert_eq!(table.matches("REJECTED broken on ").count(), 2, "{table}");

    for (host, log) in [("a", &mut a), ("b", &mut b)] {
        let at = dir.path().join(host);
        std::fs::copy(guests::guest("test/http-hello"), at.join(".broken.tmp")).unwrap();
        std::fs::rename(at.join(".broken.tmp"), at.join("broken.wasm")).unwrap();
        log.wait_for(&["service added", "broken"]);
    }
    let status = status_until(dir.path(), |s| {
        s["hosts"].as_array().is_some_and(|h| {
            h.len() == 2
                && h.iter().all(|h| {
                    h["rejected"]
                        .as_object()
                        .is_some_and(serde_json::Map::is_empty)
                        && h["services"]["broken"].is_string()
                })
        })
    });
    assert_eq!(
        status["slots"][0]["rejected"],
        serde_json::json!({}),
        "{status}"
    );
    let table = crate::tools::tool(dir.path(), &["status"]);
    assert!(!String::from_utf8_lossy(&table.stdout).contains("rejected"));
    crate::incoming_http::stop(b);
    crate::incoming_http::stop(a);
}

/// Under spread placement each member's record says what it has loaded and refused: `status`
/// lists both members with their versions, flags the service they differ in and the one a
/// member refused, and each member's `/metrics` flags the service; once the member's files
/// are the other's, its record says so at once, and the flag goes.
#[test]
fn spread_members_publish_their_versions_and_refusals_and_status_compares_them() {
    let dir = two_directories();
    std::fs::write(dir.path().join("b/broken.wasm"), "not a component").unwrap();
    let metrics = free_addr().to_string();
    let spread = ["--placement", "spread"];
    let mut a = serve("a", dir.path(), &spread);
    let with_metrics = [&spread[..], &["--metrics-addr", &metrics]].concat();
    let mut b = serve("b", dir.path(), &with_metrics);
    for host in [&mut a, &mut b] {
        host.wait_for(&["joined"]);
    }
    let members = |s: &serde_json::Value| -> Vec<serde_json::Value> {
        let hosts = s["hosts"].as_array().cloned().unwrap_or_default();
        hosts
            .into_iter()
            .filter(|h| h["role"] == "member")
            .collect()
    };
    let status = status_until(dir.path(), |s| {
        let m = members(s);
        m.len() == 2 && m.iter().all(|h| h["services"]["hello"].is_string())
    });
    let m = members(&status);
    assert_ne!(
        m[0]["services"]["hello"], m[1]["services"]["hello"],
        "{status}"
    );
    assert_eq!(status["differences"][0]["service"], "hello", "{status}");
    let refused: Vec<_> = m
        .iter()
        .filter(|h| h["rejected"]["broken"].is_string())
        .collect();
    assert_eq!(refused.len(), 1, "b refused broken: {status}");
    let table = crate::tools::tool(dir.path(), &["status"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("DIFFERS  hello:"), "{table}");
    assert!(table.contains("REJECTED broken on "), "{table}");
    b.wait_for(&["this host's services differ from another member's", "hello"]);
    let differs = "vvm_service_differs_from_leader{service=hello}";
    let m = crate::ops::metrics(&format!("http://{metrics}"));
    assert_eq!(m.get(differs), Some(&1.0), "{m:?}");

    let b_dir = dir.path().join("b");
    std::fs::copy(dir.path().join("a/hello.wasm"), b_dir.join(".hello.tmp")).unwrap();
    std::fs::rename(b_dir.join(".hello.tmp"), b_dir.join("hello.wasm")).unwrap();
    std::fs::remove_file(b_dir.join("broken.wasm")).unwrap();
    let status = status_until(dir.path(), |s| {
        let m = members(s);
        m.len() == 2
            && m.iter().all(|h| {
                h["rejected"]
                    .as_object()
                    .is_some_and(serde_json::Map::is_empty)
            })
            && s["differences"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(
        members(&status)[0]["services"],
        members(&status)[1]["services"]
    );
    b.wait_for(&["this host's services are the other members' again"]);
    let m = crate::ops::metrics(&format!("http://{metrics}"));
    assert_eq!(m.get(differs), Some(&0.0), "{m:?}");
    crate::incoming_http::stop(b);
    crate::incoming_http::stop(a);
}
