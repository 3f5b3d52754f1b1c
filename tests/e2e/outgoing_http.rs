//! Outgoing HTTP under the real `vvm-host serve` (SPEC §10): the `test/http-client` guest
//! sends requests to local servers (`testkit::http`) as its `[service.client]` grants say;
//! the servers show what reached them: the host's fencing token, nothing that was denied,
//! nothing past a timeout.

use std::path::Path;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::http::{Behaviour, Server};

use crate::BIN;

/// A directory with `services/client.wasm` and a `vvm.toml` granting it `grants` (the body
/// of its `[service.client]` table, after its `env` line made from `env`).
fn client_dir(env: &[String], grants: &str) -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(
        guests::guest("test/http-client"),
        services.join("client.wasm"),
    )
    .unwrap();
    let env: Vec<String> = env.iter().map(|e| format!("{e:?}")).collect();
    let toml = format!("[service.client]\nenv = [{}]\n{grants}\n", env.join(", "));
    std::fs::write(dir.path().join("vvm.toml"), toml).unwrap();
    dir
}

fn serve(dir: &Path) -> Host {
    testkit::host::serve_with(BIN, "a", dir, ["vvm.redb", "5s", "1s"], "info")
}

/// The guest's line for its request: `http ok ...` or `http error ...`.
fn outcome(host: &Host) -> String {
    let line = host.wait_for(&["\"service\":\"client\"", "\"message\":\"http "]);
    line.text
}

fn stop(mut host: Host) {
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// An allowed request reaches the server with the host's `vvm-fencing-token` (the term) and
/// `vvm-lease`; the guest cannot set either.
#[test]
fn an_allowed_request_carries_the_hosts_fencing_token_which_a_guest_cannot_forge() {
    let server = Server::start(Behaviour::default());
    let url = format!("http://127.0.0.1:{}/hook", server.port());
    let dir = client_dir(
        &[
            format!("URL={url}"),
            "METHOD=POST".into(),
            "BODY=hello".into(),
            "HEADER=vvm-fencing-token:999999".into(),
        ],
        &format!("http = [\"http://127.0.0.1:{}\"]", server.port()),
    );
    let a = serve(dir.path());
    a.wait_for(&["header refused: vvm-fencing-token"]);
    let line = outcome(&a);
    assert!(line.contains("http ok 200 ok"), "{line}");
    let got = server.wait_for_requests(1);
    assert_eq!(got[0].method, "POST");
    assert_eq!(got[0].path, "/hook");
    assert_eq!(got[0].body, b"hello");
    assert_eq!(got[0].header_values("vvm-fencing-token"), ["1"]);
    assert_eq!(got[0].header_values("vvm-lease"), ["slot/1"]);
    stop(a);
}

/// A host the allow-list does not name is denied before any connection, with one log line
/// naming the service and the host; so is a name that resolves to loopback through a
/// wildcard entry.
#[test]
fn an_unlisted_host_is_denied_and_the_server_sees_no_connection() {
    let server = Server::start(Behaviour::default());
    let port = server.port();
    let cases = [
        (
            format!("http://127.0.0.1:{port}/"),
            format!("http://127.0.0.1:{}", port + 1),
            "HttpRequestDenied",
        ),
        (
            format!("http://localhost:{port}/"),
            format!("http://*:{port}"),
            "DestinationIpProhibited",
        ),
    ];
    for (url, entry, error) in cases {
        let dir = client_dir(&[format!("URL={url}")], &format!("http = [\"{entry}\"]"));
        let a = serve(dir.path());
        let line = outcome(&a);
        assert!(
            line.contains("http error") && line.contains(error),
            "{line}"
        );
        if error == "HttpRequestDenied" {
            let denied = a.wait_for(&["outgoing HTTP request denied"]);
            assert!(
                denied.text.contains("\"service\":\"client\"") && denied.text.contains("127.0.0.1"),
                "{}",
                denied.text
            );
        }
        stop(a);
    }
    assert_eq!(server.connections(), 0);
}

/// Each timeout fires at the service's setting: connect (a server that never answers TLS),
/// first byte (a server that never answers), between bytes (one that stalls mid-body).
#[test]
fn each_outgoing_timeout_fires() {
    let silent = Server::start(Behaviour {
        silent: true,
        ..Behaviour::default()
    });
    let slow = Server::start(Behaviour {
        head_delay: std::time::Duration::from_hours(1),
        ..Behaviour::default()
    });
    let stalling = Server::start(Behaviour {
        body: b"0123456789".to_vec(),
        stall_body_after: Some(3),
        ..Behaviour::default()
    });
    let cases = [
        (
            "https",
            silent.port(),
            "connect-timeout",
            "ConnectionTimeout",
        ),
        (
            "http",
            slow.port(),
            "first-byte-timeout",
            "ConnectionReadTimeout",
        ),
        (
            "http",
            stalling.port(),
            "between-bytes-timeout",
            "connection read timeout", // read from the body stream: its error
        ),
    ];
    for (scheme, port, setting, error) in cases {
        let origin = format!("{scheme}://127.0.0.1:{port}");
        let dir = client_dir(
            &[format!("URL={origin}/")],
            &format!(
                "http = [\"{origin}\"]\n[service.client.outgoing-http]\n{setting} = \"300ms\""
            ),
        );
        let a = serve(dir.path());
        let line = outcome(&a);
        assert!(
            line.contains("http error") && line.contains(error),
            "{setting}: {line}"
        );
        stop(a);
    }
}

/// HTTPS to a server whose certificate comes from the service's own CA (`http-ca`).
#[test]
fn https_to_an_internal_server_trusts_the_services_ca() {
    let certs = testkit::scratch::scratch_dir();
    let (server, ca) = Server::start_tls(Behaviour::default(), certs.path());
    let origin = format!("https://localhost:{}", server.port());
    let dir = client_dir(
        &[format!("URL={origin}/tls")],
        &format!(
            "http = [\"{origin}\"]\nhttp-ca = {:?}",
            ca.display().to_string()
        ),
    );
    let a = serve(dir.path());
    let line = outcome(&a);
    assert!(line.contains("http ok 200 ok"), "{line}");
    assert_eq!(server.wait_for_requests(1)[0].path, "/tls");
    stop(a);
}

/// A bad allow-list entry or CA file is one clear line at start, naming the service and the
/// entry, and a non-zero exit.
#[test]
fn a_bad_http_grant_is_refused_at_start() {
    for (grants, says) in [
        (
            "http = [\"api.example.com\"]",
            "\"api.example.com\" has no scheme",
        ),
        (
            "http = [\"https://*.example.com\"]\nhttp-ca = \"/nonexistent/ca.pem\"",
            "/nonexistent/ca.pem",
        ),
    ] {
        let dir = client_dir(&["URL=http://127.0.0.1:1/".into()], grants);
        let mut a = serve(dir.path());
        let status = a.wait_exit();
        assert!(!status.success());
        let text: Vec<String> = a.lines().into_iter().map(|l| l.text).collect();
        assert!(
            text.iter()
                .any(|l| l.contains("service client") && l.contains(says)),
            "{text:?}"
        );
    }
}

/// Outgoing connections are kept alive (issue 52): 1 000 requests one after the other from a
/// guest to a keep-alive server reach it on a handful of connections, each request with its
/// own fencing token; after a takeover the new term's requests go on connections of its own,
/// never one the old term used.
#[test]
fn outgoing_requests_reuse_kept_alive_connections_and_a_new_term_opens_its_own() {
    const COUNT: usize = 1000;
    let server = Server::start(Behaviour::default());
    let url = format!("http://127.0.0.1:{}/bench", server.port());
    let dir = client_dir(
        &[
            format!("URL={url}"),
            "MODE=bench".into(),
            format!("COUNT={COUNT}"),
        ],
        &format!("http = [\"http://127.0.0.1:{}\"]", server.port()),
    );
    let a = testkit::host::serve_with(BIN, "a", dir.path(), ["vvm.redb", "5s", "1s"], "info");
    let first = server.wait_for_requests(COUNT);
    let b = testkit::host::serve_with(BIN, "b", dir.path(), ["vvm.redb", "5s", "1s"], "info");
    b.wait_for(&["campaigning"]);
    let term_of = |r: &testkit::http::Request| r.header("vvm-fencing-token").map(str::to_owned);
    let connections: std::collections::BTreeSet<usize> =
        first.iter().map(|r| r.connection).collect();
    eprintln!(
        "{COUNT} requests on {} connections: {connections:?}",
        connections.len()
    );
    assert!(connections.len() <= 4, "{connections:?}");
    assert!(first.iter().all(|r| term_of(r).as_deref() == Some("1")));
    stop(a);
    let all = server.wait_for_requests(2 * COUNT);
    let second: Vec<_> = all
        .iter()
        .filter(|r| term_of(r).as_deref() == Some("2"))
        .collect();
    assert_eq!(second.len(), COUNT, "term 2 ran its requests");
    let reused: Vec<usize> = second
        .iter()
        .map(|r| r.connection)
        .filter(|c| connections.contains(c))
        .collect();
    assert!(
        reused.is_empty(),
        "term 2 sent on term 1's connections {reused:?}"
    );
    let theirs: std::collections::BTreeSet<usize> = second.iter().map(|r| r.connection).collect();
    assert!(theirs.len() <= 4, "{theirs:?}");
    stop(b);
}
