//! Incoming HTTP under the real `vvm-host serve` (SPEC §10, "Incoming HTTP"): the
//! `test/http-hello` guest (a plain `wasi:http/proxy` component) served on `--http-addr` by
//! route, with the host's fencing token on every response, only by the leader.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::http::raw_get;

use crate::BIN;

/// A loopback address with a port that was free a moment ago.
pub(crate) fn free_addr() -> SocketAddr {
    let [port] = testkit::etcd::free_ports();
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A directory with `services/NAME.wasm` (the hello guest) for each of `names`, and
/// `vvm.toml` as `toml`.
pub(crate) fn hello_dir(names: &[&str], toml: &str) -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    for name in names {
        std::fs::copy(
            guests::guest("test/http-hello"),
            services.join(format!("{name}.wasm")),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("vvm.toml"), toml).unwrap();
    dir
}

fn serve(name: &'static str, dir: &Path, addr: SocketAddr) -> Host {
    serve_with(name, dir, addr, &["--lease", "5s"])
}

/// `vvm-host serve` on `vvm.redb` in `dir` with a grace period of 1 s, its own cache, HTTP on
/// `addr`, and `more` arguments.
pub(crate) fn serve_with(name: &'static str, dir: &Path, addr: SocketAddr, more: &[&str]) -> Host {
    let cache = format!("cache-{name}");
    let addr = addr.to_string();
    let mut args = vec![
        "serve",
        "--store",
        "vvm.redb",
        "--grace-period",
        "1s",
        "--cache-dir",
        &cache,
        "--http-addr",
        &addr,
    ];
    args.extend_from_slice(more);
    Host::start(BIN, name, dir, &args, "info")
}

/// GET `path` on `addr`: the status, the `vvm-fencing-token` values, and the body.
pub(crate) fn get(addr: SocketAddr, path: &str) -> (u16, Vec<String>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let mut response = agent.get(&format!("http://{addr}{path}")).call().unwrap();
    let tokens = response
        .headers()
        .get_all("vvm-fencing-token")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let status = response.status().as_u16();
    (
        status,
        tokens,
        response.body_mut().read_to_string().unwrap(),
    )
}

pub(crate) fn stop(mut host: Host) {
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// A request is served by the guest with exactly one fencing token, the term; each service
/// answers its route (`/NAME/...` by default, or its `route`), the most specific first, and a
/// path no route matches is the host's 404. Of two services with one route, the first by name
/// is served.
#[test]
fn a_request_is_served_by_route_with_the_fencing_token_and_no_route_is_404() {
    let addr = free_addr();
    let dir = hello_dir(
        &["hello", "api", "late"],
        "[service.api]\nroute = \"/api/v1/...\"\n[service.late]\nroute = \"/hello/...\"\n",
    );
    let a = serve("a", dir.path(), addr);
    // Every HTTP service of the leadership is routed before this line (the listener opens
    // at the first one's).
    a.wait_for(&["services started"]);
    // `late` asks for the default route of `hello`, which has no table: the first by name
    // keeps it, and the other is not served, with a line that says why.
    let line = a.wait_for(&["HTTP service not served: its route is another service's"]);
    assert!(
        line.text.contains("\"late\"") && line.text.contains("\"hello\""),
        "{}",
        line.text
    );

    let (status, tokens, body) = get(addr, "/hello/world?x=1");
    assert_eq!(
        (status, body.as_str()),
        (200, "hello from /hello/world?x=1")
    );
    assert_eq!(tokens, ["1"]);
    let (status, tokens, body) = get(addr, "/api/v1/users");
    assert_eq!((status, body.as_str()), (200, "hello from /api/v1/users"));
    assert_eq!(tokens, ["1"]);
    for path in ["/", "/api/users", "/nothing/here", "/hellos"] {
        let (status, tokens, _) = get(addr, path);
        assert_eq!(status, 404, "{path}");
        assert!(tokens.is_empty(), "{path}: {tokens:?}");
    }
    stop(a);
}

/// Routes in Spin's syntax are served as Spin serves them, and the guest gets Spin's request
/// headers: `:NAME` segments match one segment each (a literal beats a name, a name beats the
/// wildcard), `spin-path-match-NAME` carries what each matched, `spin-path-info` what the
/// wildcard did; a client's own `spin-*` headers never reach the guest. Before, the route
/// `/users/:id/...` matched the text `:id` only: `/users/42/headers` was the host's 404.
#[test]
fn spin_routes_and_headers_reach_the_guest_as_spin_gives_them() {
    let addr = free_addr();
    let dir = hello_dir(
        &["user", "admin", "all"],
        "[service.user]\nroute = \"/users/:id/...\"\n[service.admin]\nroute = \"/users/admin/...\"\n\
         [service.all]\nroute = \"/...\"\n",
    );
    let a = serve("a", dir.path(), addr);
    a.wait_for(&["services started"]);
    let forged = "GET /users/42/x/headers?q=1 HTTP/1.1\r\nhost: example.test\r\n\
                  spin-path-match-id: 0\r\nspin-path-info: /forged\r\nspin-evil: 1\r\n\
                  connection: close\r\n\r\n";
    let answer = testkit::http::exchange(addr, forged.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let lines: Vec<&str> = body.lines().filter(|l| l.starts_with("spin-")).collect();
    let want = [
        "spin-base-path: /",
        "spin-client-addr: 127.0.0.1:",
        "spin-component-route: /users/:id",
        "spin-full-url: http://example.test/users/42/x/headers?q=1",
        "spin-matched-route: /users/:id/...",
        "spin-path-info: /x/headers",
        "spin-path-match-id: 42",
        "spin-raw-component-route: /users/:id/...",
    ];
    assert_eq!(lines.len(), want.len(), "{body}");
    for (line, want) in lines.iter().zip(want) {
        // The client's port is the one value not known here.
        let whole = *line == want || want.ends_with(':') && line.starts_with(want);
        assert!(whole, "{line:?} is not {want:?}: {body}");
    }
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("forged") && !l.starts_with("spin-evil")),
        "{body}"
    );
    // The literal beats the name, the name beats the wildcard.
    let (status, _, body) = get(addr, "/users/admin/headers");
    assert_eq!(status, 200);
    assert!(
        body.contains("spin-matched-route: /users/admin/...\n"),
        "{body}"
    );
    let (status, _, body) = get(addr, "/users/7");
    assert_eq!(status, 200);
    assert_eq!(body, "hello from /users/7");
    let (status, _, body) = get(addr, "/other/headers");
    assert_eq!(status, 200);
    assert!(body.contains("spin-matched-route: /...\n"), "{body}");
    assert!(body.contains("spin-component-route: \n"), "{body}");
    stop(a);
}

/// A standby does not accept: another standby's own address holds the connection it is
/// given unanswered (the standby holds the socket for when it leads, and accepts nothing), and
/// one on the leader's address never listens while the leader leads (only the leader answers,
/// term 1). Once the leader is stopped (SIGTERM: it stops accepting, then releases), the
/// standby sharing the address takes over and serves it under its own term.
#[test]
fn a_standby_does_not_accept_and_serves_once_the_leader_stops() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let shared = free_addr();
    let own = free_addr();
    let dir = hello_dir(&["hello"], "");
    let a = serve("a", dir.path(), shared);
    a.wait_for(&["http listening"]);
    let b = serve("b", dir.path(), shared);
    let c = serve("c", dir.path(), own);
    b.wait_for(&["campaigning"]);
    c.wait_for(&["campaigning"]);

    let mut queued = TcpStream::connect(own).unwrap();
    queued
        .write_all(b"GET /hello/ HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    queued
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let unanswered = queued.read(&mut [0; 64]).unwrap_err();
    assert_eq!(unanswered.kind(), std::io::ErrorKind::WouldBlock);
    let (status, tokens, _) = get(shared, "/hello/");
    assert_eq!((status, tokens), (200, vec!["1".to_owned()]));
    for standby in [&b, &c] {
        let tried = standby
            .lines()
            .iter()
            .any(|l| l.text.contains("http listening") || l.text.contains("http-addr taken"));
        assert!(!tried, "standby {} tried to listen", standby.name);
    }
    stop(c);

    let mark = b.mark();
    stop(a);
    b.wait_for_from(mark, &["http listening"]);
    let (status, tokens, body) = get(shared, "/hello/again");
    assert_eq!((status, body.as_str()), (200, "hello from /hello/again"));
    assert_eq!(tokens, ["2"]);
    stop(b);
}

/// A replaced HTTP service keeps answering its route while the new version takes over: a
/// client asking all along never meets a 404, a 503 or a closed port. The new version is
/// one component that is a service and an HTTP service at once: its `run` runs (and counts
/// its runs in its store), and its handler answers beside it, under the same term.
#[test]
fn a_replaced_http_service_answers_throughout_and_a_handler_serves_beside_run() {
    // Its client asks without a pause: a load that must not run beside short-lease tests.
    let _heavy = crate::one_heavy_test_at_a_time();
    let addr = free_addr();
    let dir = hello_dir(&["hello"], "");
    let a = serve("a", dir.path(), addr);
    a.wait_for(&["http listening"]);
    let stop_asking = std::sync::atomic::AtomicBool::new(false);
    let answers = std::thread::scope(|s| {
        let asker = s.spawn(|| {
            let mut answers = Vec::new();
            while !stop_asking.load(std::sync::atomic::Ordering::SeqCst) {
                let (status, tokens, body) = get(addr, "/hello/x");
                answers.push((status, tokens, body));
            }
            answers
        });
        let staged = dir.path().join("services/.hello.wasm.new");
        std::fs::copy(guests::guest("test/http-both"), &staged).unwrap();
        std::fs::rename(&staged, dir.path().join("services/hello.wasm")).unwrap();
        a.wait_for(&["both running term 1"]);
        loop {
            let (_, _, body) = get(addr, "/hello/x");
            if body.starts_with("both:") {
                break;
            }
        }
        stop_asking.store(true, std::sync::atomic::Ordering::SeqCst);
        asker.join().unwrap()
    });
    assert!(answers.len() > 1, "{answers:?}");
    for (status, tokens, body) in &answers {
        assert_eq!(
            (*status, tokens.as_slice()),
            (200, ["1".to_owned()].as_slice()),
            "{body}"
        );
        // The new version answers from its start, maybe before its `run` counted.
        assert!(
            [
                "hello from /hello/x",
                "both: term 1, runs 0",
                "both: term 1, runs 1"
            ]
            .contains(&body.as_str()),
            "{body}"
        );
    }
    let (_, _, body) = get(addr, "/hello/x");
    assert_eq!(body, "both: term 1, runs 1");
    stop(a);
}

/// Under spread placement with forwarding off each host serves the HTTP services it holds, and
/// answers a route of one held by another host 503 with `Retry-After` (the client or balancer
/// tries the other host), never 404. (With it on, the other host answers through this one:
/// `spread_http`.)
#[test]
fn under_spread_placement_a_host_answers_503_for_a_service_held_elsewhere() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let names = ["ha".to_owned(), "hb".to_owned()];
    let dir = hello_dir(&["ha", "hb"], "placement = \"spread\"\n");
    let (addr_1, addr_2) = (free_addr(), free_addr());
    let args = ["--lease", "3s", "--forward", "false"];
    let one = serve_with("one", dir.path(), addr_1, &args);
    let two = serve_with("two", dir.path(), addr_2, &args);
    testkit::spread::wait_for_rest(&[&one, &two], &names, &[1, 1]);
    for (host, addr) in [(&one, addr_1), (&two, addr_2)] {
        let held = testkit::spread::running(host);
        let mine = held.first().unwrap().clone();
        let other = names.iter().find(|n| **n != mine).unwrap();
        host.wait_for(&["HTTP service routed", &mine]);
        let (status, tokens, body) = get(addr, &format!("/{mine}/x"));
        assert_eq!((status, tokens.len()), (200, 1), "{}: {body}", host.name);
        let answer = raw_get(addr, &format!("/{other}/x"));
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "{}: {answer}",
            host.name
        );
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("\r\nretry-after: 1\r\n"),
            "{answer}"
        );
        let (status, _, _) = get(addr, "/nothing/x");
        assert_eq!(status, 404);
    }
    stop(one);
    stop(two);
}

/// A response in progress when its host's lease deadline passes is never completed: the
/// leader is stopped (SIGSTOP) mid-response until a standby has taken over, and once it
/// runs again (SIGCONT) the connection is cut, without the body's last chunk, so the client
/// cannot take a truncated body for a whole one.
#[test]
fn a_response_in_progress_is_never_completed_once_its_lease_deadline_passed() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = hello_dir(&["hello"], "");
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let a = serve_with("a", dir.path(), addr_a, &["--lease", "2s"]);
    a.wait_for(&["http listening"]);
    let b = serve_with("b", dir.path(), addr_b, &["--lease", "2s"]);
    b.wait_for(&["campaigning"]);

    let mut stream = TcpStream::connect(addr_a).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET /hello/slow HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("chunk 1\n") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the first chunk");
        got.extend_from_slice(&buf[..n]);
    }
    a.stop_until(&b, &["http listening"]);
    a.signal(Signal::CONT);
    // Until the host cuts the connection (a reset ends it as well as a close).
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(!got.contains("chunk 500\n"), "the whole body came: {got}");
    assert!(
        !got.ends_with("\r\n0\r\n\r\n"),
        "the body looks complete: {got}"
    );
    let (status, tokens, _) = get(addr_b, "/hello/x");
    assert_eq!((status, tokens), (200, vec!["2".to_owned()]));
    stop(b);
}

/// Off-the-shelf proxy components (SPEC §10): one made with `wstd` as its README makes an
/// HTTP server (a binary, so it also exports `wasi:cli/run`, whose `main` panics) and one made
/// with the `wasi` crate. `check` calls both `wasi:http/proxy` and says that the `wstd` one's
/// `run` is not called; `serve` answers both with the token and never runs that `main` (it
/// crash-looped before: restarted with backoff, a failing service in `status`).
#[test]
fn off_the_shelf_proxy_components_are_served_and_a_run_beside_the_handler_never_called() {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    for (guest, name) in [("test/wstd-hello", "wstd"), ("test/wasi-hello", "wasi")] {
        std::fs::copy(guests::guest(guest), services.join(format!("{name}.wasm"))).unwrap();
    }
    let check = std::process::Command::new(BIN)
        .args(["check", "services"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{report}");
    assert!(
        report.contains("ok    wasi (wasi:http/proxy)\n"),
        "{report}"
    );
    assert!(
        report.contains("ok    wstd (wasi:http/proxy)\n  note: it exports wasi:cli/run"),
        "{report}"
    );

    let addr = free_addr();
    let host = serve("a", dir.path(), addr);
    // Both are routed before this line (the listener opens at the first one's).
    host.wait_for(&["services started"]);
    for (path, body) in [
        ("/wstd/x", "hello from wstd /wstd/x\n"),
        ("/wasi/y?z=1", "hello from wasi /wasi/y?z=1\n"),
    ] {
        let (status, tokens, got) = get(addr, path);
        assert_eq!(
            (status, tokens, got.as_str()),
            (200, vec!["1".to_owned()], body)
        );
    }
    let lines = host.lines();
    let ran: Vec<&str> = lines
        .iter()
        .map(|l| l.text.as_str())
        .filter(|t| {
            t.contains("panicked") || t.contains("service failed") || t.contains("\"command\"")
        })
        .collect();
    assert!(ran.is_empty(), "the wstd server's main ran: {ran:#?}");
    stop(host);
}
