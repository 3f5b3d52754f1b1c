//! The limits on incoming HTTP under the real `vvm-host serve` (SPEC §10, "Incoming HTTP"):
//! no client can hold the host's descriptors or a service's handlers, and each refusal is
//! the status a client expects. Requests are written by hand, to send exactly what a bad
//! client sends.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use testkit::http::exchange;

use crate::incoming_http::{free_addr, get, hello_dir, serve_with, stop};
use crate::ops::{metrics_until, value};

/// The longest a read waits for the host: far more than any limit set here, so a test that
/// hits it fails on its assertion (a host that did not answer), not on a race.
const BOUND: Duration = Duration::from_secs(20);

/// A connection to `addr` that gives up reading after [`BOUND`].
fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(BOUND)).unwrap();
    stream
}

/// A body longer than `max-body-bytes` is refused (413) by its length, before a byte of it is
/// sent; a head over `max-header-bytes` is refused (431); a connection idle for
/// `idle-timeout`, before its first request or between two, is closed; a handler that spins
/// is stopped at `request-timeout` (504), and its place in the service's concurrency (one,
/// here) is free again.
#[test]
fn oversized_requests_idle_connections_and_spinning_handlers_are_cut_off() {
    let addr = free_addr();
    let dir = hello_dir(
        &["hello"],
        "[incoming-http]\nmax-body-bytes = 1000\nmax-header-bytes = 8192\n\
         idle-timeout = \"300ms\"\nrequest-timeout = \"1s\"\nmax-concurrent = 1\n",
    );
    let host = serve_with("a", dir.path(), addr, &["--lease", "5s"]);
    host.wait_for(&["http listening"]);

    // The host answers before the client sends the body it announced.
    let answer = exchange(
        addr,
        b"POST /hello/x HTTP/1.1\r\nhost: a\r\ncontent-length: 1000000\r\n\r\n0123456789",
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let big = "x".repeat(10_000);
    let answer = exchange(
        addr,
        format!("GET /hello/x HTTP/1.1\r\nhost: a\r\nbig: {big}\r\n\r\n").as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    // Idle before a first request: closed, with nothing sent.
    let mut idle = connect(addr);
    let mut buf = [0u8; 256];
    assert_eq!(
        idle.read(&mut buf).unwrap(),
        0,
        "an idle connection stays open"
    );
    // Idle after one: answered, then closed.
    let mut kept = connect(addr);
    kept.write_all(b"GET /hello/one HTTP/1.1\r\nhost: a\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    kept.read_to_end(&mut out).unwrap();
    let out = String::from_utf8_lossy(&out);
    // The body comes in chunks (the guest writes it in two pieces); the last one ends it.
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("/hello/one") && out.ends_with("0\r\n\r\n"),
        "{out}"
    );

    let answer = exchange(
        addr,
        b"GET /hello/spin HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    host.wait_for(&["request handler cut short", "request timeout", "hello"]);
    let (status, tokens, body) = get(addr, "/hello/after");
    assert_eq!((status, body.as_str()), (200, "hello from /hello/after"));
    assert_eq!(tokens, ["1"]);
    stop(host);
}

/// Past `max-concurrent` requests of one service in flight, the next is answered 503 with
/// `Retry-After`, at once; the metrics count requests by status class and show those in
/// flight.
#[test]
fn past_the_concurrency_limit_a_request_is_503_with_retry_after_and_counted() {
    let addr = free_addr();
    let metrics_addr = free_addr().to_string();
    let dir = hello_dir(&["hello"], "[incoming-http]\nmax-concurrent = 1\n");
    let host = serve_with(
        "a",
        dir.path(),
        addr,
        &["--lease", "5s", "--metrics-addr", &metrics_addr],
    );
    host.wait_for(&["http listening"]);
    let base = format!("http://{metrics_addr}");
    let ok = "vvm_http_incoming_requests_total{class=2xx,service=hello}";
    // The series exist from the load, at 0 (so that `increase()` sees the first request).
    metrics_until(&base, |m| m.get(ok) == Some(&0.0));
    let (status, _, _) = get(addr, "/hello/first");
    assert_eq!(status, 200);
    let in_flight = "vvm_http_incoming_in_flight{service=hello}";
    // A handler may run on after its response: its place is free once it has returned.
    metrics_until(&base, |m| m.get(in_flight) == Some(&0.0));

    // A request that holds the one place for a minute.
    let mut waiting = connect(addr);
    waiting
        .write_all(b"GET /hello/wait HTTP/1.1\r\nhost: a\r\n\r\n")
        .unwrap();
    metrics_until(&base, |m| m.get(in_flight) == Some(&1.0));

    let answer = exchange(
        addr,
        b"GET /hello/second HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 1\r\n"),
        "{answer}"
    );
    host.wait_for(&["request refused: too many in flight", "hello"]);
    let m = metrics_until(&base, |m| {
        m.get("vvm_http_incoming_requests_total{class=5xx,service=hello}") == Some(&1.0)
    });
    assert_eq!(
        value(
            &m,
            "vvm_http_incoming_requests_total{class=2xx,service=hello}"
        ),
        1.0
    );
    assert_eq!(value(&m, in_flight), 1.0);
    drop(waiting);
    stop(host);
}
