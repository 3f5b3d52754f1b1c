//! Spin's components (issue 41, SPEC §10): an HTTP app made with Spin's Rust SDK (5.2.0) and
//! one made with its Python SDK (3.4.1), as their templates make them, run unchanged: their
//! routes, `fermyon:spin/key-value@2.0.0` over the service's fenced buckets,
//! `fermyon:spin/variables@2.0.0` over its `[service.NAME.config]`, and, once a standby takes
//! over, the count they keep goes on under the new term.

use std::net::SocketAddr;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;

use crate::incoming_http::{free_addr, get, serve_with, stop};

/// A directory serving `guest` as the service `app`: every path is its, one shared bucket
/// granted, two variables (one a secret read from a file).
fn app_dir(guest: &str) -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(guests::guest(guest), services.join("app.wasm")).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-from-a-file").unwrap();
    let settings = format!(
        "[service.app]\nroute = \"/...\"\nkv-buckets = [\"shared\"]\n\
         [service.app.config]\ngreeting = \"hello from vvm.toml\"\n\
         api_token = {{ file = {:?} }}\n",
        token.display().to_string()
    );
    std::fs::write(dir.path().join("vvm.toml"), settings).unwrap();
    dir
}

/// `method` `path` on `addr` with `body`: the status, the headers as `name: value` lines,
/// and the body.
fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Vec<String>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(20)))
        .build()
        .into();
    let url = format!("http://{addr}{path}");
    let mut response = match method {
        "POST" => agent.post(&url).send(body),
        _ => agent.get(&url).call(),
    }
    .unwrap();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("?")))
        .collect();
    let status = response.status().as_u16();
    (
        status,
        headers,
        response.body_mut().read_to_string().unwrap(),
    )
}

/// What the app answers to the routes both SDKs' apps share (see the test guests' docs).
fn answers_as_spin_would(addr: SocketAddr) {
    let (status, _, body) = request(addr, "POST", "/items/42", "v1");
    assert_eq!((status, body.as_str()), (200, "stored 42"));
    let (status, headers, body) = request(addr, "GET", "/items/42", "");
    assert_eq!((status, body.as_str()), (200, "v1"));
    assert!(headers.iter().any(|h| h == "item-id: 42"), "{headers:?}");
    let (status, _, body) = get(addr, "/items/7");
    assert_eq!((status, body.as_str()), (404, "no item 7"));

    let (status, _, body) = get(addr, "/var/greeting");
    assert_eq!((status, body.as_str()), (200, "hello from vvm.toml"));
    let (status, _, body) = get(addr, "/var/api_token");
    assert_eq!((status, body.as_str()), (200, "s3cret-from-a-file"));
    let (status, _, body) = get(addr, "/var/missing");
    assert_eq!(status, 404, "{body}");
    // Spin's text, as each SDK shows it (Rust's Debug escapes the quotes).
    let spins = body.replace('\\', "");
    assert!(
        spins.contains("Undefined") && spins.contains(r#"no variable for "app"."missing""#),
        "{body}"
    );
    // Spin's names: lower case, digits and single underscores, a letter first.
    for bad in ["Greeting", "4th", "a__b"] {
        let (status, _, body) = get(addr, &format!("/var/{bad}"));
        assert_eq!(status, 500, "{bad}: {body}");
        assert!(body.contains("InvalidName"), "{bad}: {body}");
    }

    for (label, answer) in [
        ("default", "ok"),
        ("shared", "ok"),
        ("other", "access-denied"),
    ] {
        let (status, _, body) = get(addr, &format!("/open/{label}"));
        assert_eq!((status, body.as_str()), (200, answer), "{label}");
    }
}

/// A Spin app made with spin-sdk 5.2.0 (`#[http_component]`, its `Router` with `:id`,
/// `Store::open_default`, `variables::get`) is served unchanged; its count, kept in the
/// default store, goes on when a standby takes over, under the standby's term.
#[test]
fn a_spin_sdk_app_runs_unchanged_and_its_count_goes_on_across_a_takeover() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = app_dir("test/spin-sdk-app");
    let addr = free_addr();
    let a = serve("a", dir.path(), addr);
    a.wait_for(&["services started"]);
    answers_as_spin_would(addr);
    for hits in 1..=2 {
        let (status, tokens, body) = get(addr, "/count");
        assert_eq!((status, body), (200, format!("hits {hits}")));
        assert_eq!(tokens, ["1"]);
    }
    let b = serve("b", dir.path(), addr);
    b.wait_for(&["campaigning"]);
    let mark = b.mark();
    let a_lines = a.lines();
    stop(a);
    b.wait_for_from(mark, &["services started"]);
    let (status, tokens, body) = get(addr, "/count");
    assert_eq!((status, body.as_str()), (200, "hits 3"));
    assert_eq!(tokens, ["2"]);
    let lines = b.lines();
    assert!(
        a_lines
            .iter()
            .chain(&lines)
            .all(|l| !l.text.contains("s3cret")),
        "a secret reached the log"
    );
    stop(b);
}

/// `vvm-host serve` on the app in `dir`, HTTP on `addr`.
fn serve(name: &'static str, dir: &std::path::Path, addr: SocketAddr) -> Host {
    serve_with(name, dir, addr, &["--lease", "3s"])
}

/// Spin's Python SDK (3.4.1, componentize-py 0.17.2) imports its whole world: besides
/// key-value and variables, Spin's outbound databases, brokers and models.
/// `check` names those with what to do instead, and the app is served: a call to one of them
/// would trap, the rest answers as Spin would.
#[test]
fn a_spin_python_app_is_served_and_check_names_the_outbound_imports_it_cannot_call() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = app_dir("test/spin-python-app");
    let check = std::process::Command::new(crate::BIN)
        .args(["check", "services"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{report}");
    assert!(report.contains("ok    app (wasi:http/proxy)\n"), "{report}");
    for outbound in ["fermyon:spin/redis@2.0.0", "fermyon:spin/postgres@2.0.0"] {
        assert!(report.contains(outbound), "{outbound}: {report}");
    }
    assert!(report.contains("which vvm-host does not offer"), "{report}");

    let addr = free_addr();
    let mut a = serve("a", dir.path(), addr);
    a.wait_for(&["services started"]);
    answers_as_spin_would(addr);
    for hits in 1..=2 {
        let (status, _, body) = get(addr, "/count");
        assert_eq!((status, body), (200, format!("hits {hits}")));
    }
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}
