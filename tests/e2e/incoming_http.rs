//! Incoming HTTP under the real `vvm-host serve` (SPEC §10, "Incoming HTTP"): the
//! `test/http-hello` guest (a plain `wasi:http/proxy` component) served on `--http-addr` by
//! route, with the host's fencing token on every response, only by the leader.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;

use crate::BIN;

/// A loopback address with a port that was free a moment ago.
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A directory with `services/NAME.wasm` (the hello guest) for each of `names`, and
/// `vvm.toml` as `toml`.
fn hello_dir(names: &[&str], toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
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
    let cache = format!("cache-{name}");
    let addr = addr.to_string();
    let args = [
        "serve",
        "--store",
        "vvm.redb",
        "--lease",
        "5s",
        "--grace-period",
        "1s",
        "--cache-dir",
        &cache,
        "--http-addr",
        &addr,
    ];
    Host::start(BIN, name, dir, &args, "info")
}

/// GET `path` on `addr`: the status, the `vvm-fencing-token` values, and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, Vec<String>, String) {
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

fn stop(mut host: Host) {
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// A request is served by the guest with exactly one fencing token, the term; each service
/// answers its route (`/NAME/...` by default, or its `route`), the most specific first, and a
/// path no route matches is the host's 404.
#[test]
fn a_request_is_served_by_route_with_the_fencing_token_and_no_route_is_404() {
    let addr = free_addr();
    let dir = hello_dir(
        &["hello", "api"],
        "[service.api]\nroute = \"/api/v1/...\"\n",
    );
    let a = serve("a", dir.path(), addr);
    a.wait_for(&["http listening"]);

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

/// A standby does not listen: another standby's own address refuses connections, and one on
/// the leader's address never binds it while the leader leads (only the leader answers,
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

    let refused = TcpStream::connect(own).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
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
