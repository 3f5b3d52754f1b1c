//! The hooks against real local servers (`testkit::http`): what reaches the wire, what is
//! denied before it, what the deadline and the timeouts cut.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use testkit::http::{Behaviour, Server};
use tokio::sync::watch;

use super::*;
use crate::clock::{Clock, SystemClock, Timestamp};

/// An instance's hooks with `allow` and `limits`, under term 7 of `slot/1`, and the sender
/// that moves its deadline (an hour ahead).
fn hooks(
    allow: &[String],
    ca: Option<&Path>,
    limits: OutgoingLimits,
) -> (OutgoingHttp, watch::Sender<Timestamp>, Ops) {
    let clock = Arc::new(SystemClock::local());
    let (move_deadline, deadline) =
        LeaseDeadline::manual(clock.clone(), clock.now().after(Duration::from_hours(1)));
    let lease = LeaseInfo {
        slot: 1,
        key: "slot/1".into(),
        holder: "me".into(),
        term: 7,
        lease: Duration::from_secs(20),
    };
    let ops = Ops::new(clock);
    let policy = Arc::new(HttpPolicy::new(allow, ca, limits).unwrap());
    let hooks = OutgoingHttp::new(
        &Arc::from("svc"),
        &lease,
        deadline,
        ops.clone(),
        Arc::clone(&policy),
        OutgoingShared::new(&policy),
    );
    (hooks, move_deadline, ops)
}

fn request(url: &str, body: WasiBody) -> Request<WasiBody> {
    Request::builder()
        .method("POST")
        .uri(url)
        // What the guest tried: the host's values replace them.
        .header(TOKEN_HEADER, "999")
        .header(LEASE_HEADER, "forged")
        .body(body)
        .unwrap()
}

fn full(text: &'static str) -> WasiBody {
    Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed_unsync()
}

async fn send(hooks: &mut OutgoingHttp, request: Request<WasiBody>) -> Result<Sent, Error> {
    std::pin::Pin::from(hooks.send_request(request, None, Box::new(async { Ok(()) }))).await
}

/// The response body, read to its end, with the connection driven beside it.
async fn read(sent: Sent) -> Result<Bytes, Error> {
    let (response, driver) = sent;
    let driver = tokio::spawn(std::pin::Pin::from(driver));
    let body = response
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes);
    driver.abort();
    body
}

fn allow(server: &Server) -> Vec<String> {
    vec![format!("http://127.0.0.1:{}", server.port())]
}

/// An allowed request reaches the server with the host's token and lease headers, whatever
/// the guest set; the metrics count it.
#[tokio::test]
async fn an_allowed_request_carries_the_hosts_fencing_token() {
    let server = Server::start(Behaviour::default());
    let (mut hooks, _deadline, ops) = hooks(&allow(&server), None, OutgoingLimits::default());
    let url = format!("http://127.0.0.1:{}/hook?x=1", server.port());
    let sent = send(&mut hooks, request(&url, full("hello")))
        .await
        .unwrap();
    assert_eq!(sent.0.status(), 200);
    assert_eq!(read(sent).await.unwrap(), "ok");
    let got = server.wait_for_requests(1);
    assert_eq!(got[0].path, "/hook?x=1");
    assert_eq!(got[0].body, b"hello");
    assert_eq!(got[0].header_values("vvm-fencing-token"), ["7"]);
    assert_eq!(got[0].header_values("vvm-lease"), ["slot/1"]);
    let metrics = ops.render();
    assert!(
        metrics.contains(r#"vvm_http_outgoing_requests_total{service="svc",outcome="ok"} 1"#),
        "{metrics}"
    );
    // A guest cannot even name the headers.
    let forbidden = hooks.forbidden_header_filter();
    assert!(forbidden(&TOKEN_HEADER) && forbidden(&LEASE_HEADER));
}

/// Anything the allow-list does not name is denied before any connection: another port,
/// another scheme, another host; a name a wildcard let through may not resolve to loopback.
#[tokio::test]
async fn what_the_list_does_not_name_is_denied_before_connecting() {
    let server = Server::start(Behaviour::default());
    let port = server.port();
    let (mut hooks, _deadline, ops) = hooks(&allow(&server), None, OutgoingLimits::default());
    for url in [
        format!("http://127.0.0.1:{}/", port + 1),
        format!("https://127.0.0.1:{port}/"),
        format!("http://localhost:{port}/"),
    ] {
        let denied = send(&mut hooks, request(&url, full(""))).await;
        assert!(matches!(denied, Err(Error::HttpRequestDenied)), "{url}");
    }
    let (mut wildcard, _deadline, _) = self::hooks(
        &[format!("http://*:{port}")],
        None,
        OutgoingLimits::default(),
    );
    let url = format!("http://localhost:{port}/");
    let guarded = send(&mut wildcard, request(&url, full(""))).await;
    assert!(matches!(guarded, Err(Error::DestinationIpProhibited)));
    assert_eq!(server.connections(), 0);
    let metrics = ops.render();
    assert!(
        metrics.contains(r#"vvm_http_outgoing_requests_total{service="svc",outcome="denied"} 3"#),
        "{metrics}"
    );
}

/// A response still pending when the deadline passes is dropped, and its connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_drops_a_pending_response() {
    let server = Server::start(Behaviour {
        head_delay: Duration::from_hours(1),
        ..Behaviour::default()
    });
    let (mut hooks, deadline, ops) = hooks(&allow(&server), None, OutgoingLimits::default());
    let url = format!("http://127.0.0.1:{}/", server.port());
    let pending = hooks.send_request(request(&url, full("x")), None, Box::new(async { Ok(()) }));
    let pending = tokio::spawn(std::pin::Pin::from(pending));
    // Blocks this worker only: the request goes on on the other.
    server.wait_for_requests(1);
    deadline.send(SystemClock::local().now()).unwrap();
    let result = pending.await.unwrap();
    assert!(matches!(result, Err(Error::InternalError(Some(m))) if m.contains("lease deadline")));
    server.wait_for_closed_early(1);
    assert!(ops.render().contains(r#"outcome="fenced"} 1"#));
}

/// A body frame the guest wrote in time, but that would go out after the deadline, never
/// reaches the server.
#[tokio::test]
async fn a_body_frame_sent_after_the_deadline_never_reaches_the_server() {
    let server = Server::start(Behaviour::default());
    let (mut hooks, deadline, _ops) = hooks(&allow(&server), None, OutgoingLimits::default());
    let (mut tx, body) = http_body_util::Channel::<Bytes, Error>::new(1);
    let url = format!("http://127.0.0.1:{}/", server.port());
    let sending = send(&mut hooks, request(&url, body.boxed_unsync()));
    let writer = async {
        tx.send_data(Bytes::from_static(b"early")).await.unwrap();
        while server.body_bytes_received() < 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        deadline.send(SystemClock::local().now()).unwrap();
        // Taken by the channel; the fenced body must not hand it on.
        let _ = tx.send_data(Bytes::from_static(b"late")).await;
    };
    let (result, ()) = tokio::join!(sending, writer);
    assert!(result.is_err());
    server.wait_until_idle();
    assert_eq!(server.body_bytes_received(), 5);
}

/// Each timeout fires: connect (a server that never answers TLS), first byte, between bytes.
#[tokio::test]
async fn each_timeout_fires() {
    let short = OutgoingLimits {
        connect_timeout: Duration::from_millis(200),
        first_byte_timeout: Duration::from_millis(200),
        between_bytes_timeout: Duration::from_millis(200),
        ..OutgoingLimits::default()
    };
    let silent = Server::start(Behaviour {
        silent: true,
        ..Behaviour::default()
    });
    let entry = vec![format!("https://127.0.0.1:{}", silent.port())];
    let (mut hooks, _d, ops) = hooks(&entry, None, short);
    let url = format!("https://127.0.0.1:{}/", silent.port());
    let r = send(&mut hooks, request(&url, full(""))).await;
    assert!(matches!(r, Err(Error::ConnectionTimeout)), "{:?}", r.err());

    let slow = Server::start(Behaviour {
        head_delay: Duration::from_hours(1),
        ..Behaviour::default()
    });
    let (mut hooks, _d, _) = self::hooks(&allow(&slow), None, short);
    let url = format!("http://127.0.0.1:{}/", slow.port());
    let r = send(&mut hooks, request(&url, full(""))).await;
    assert!(
        matches!(r, Err(Error::ConnectionReadTimeout)),
        "{:?}",
        r.err()
    );

    let stalling = Server::start(Behaviour {
        body: b"0123456789".to_vec(),
        stall_body_after: Some(3),
        ..Behaviour::default()
    });
    let (mut hooks, _d, _) = self::hooks(&allow(&stalling), None, short);
    let url = format!("http://127.0.0.1:{}/", stalling.port());
    let sent = send(&mut hooks, request(&url, full(""))).await.unwrap();
    assert!(matches!(
        read(sent).await,
        Err(Error::ConnectionReadTimeout)
    ));
    assert!(ops.render().contains(r#"outcome="timeout"} 1"#));
}

/// HTTPS to a server whose CA is the service's `http-ca` works; without it the certificate
/// is refused.
#[tokio::test]
async fn https_trusts_the_services_own_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = Server::start_tls(Behaviour::default(), dir.path());
    let entry = vec![format!("https://localhost:{}", server.port())];
    let url = format!("https://localhost:{}/", server.port());
    let (mut hooks, _d, _) = hooks(&entry, Some(&ca), OutgoingLimits::default());
    let sent = send(&mut hooks, request(&url, full(""))).await.unwrap();
    assert_eq!(read(sent).await.unwrap(), "ok");
    let (mut without, _d, _) = self::hooks(&entry, None, OutgoingLimits::default());
    let refused = send(&mut without, request(&url, full(""))).await;
    assert!(matches!(refused, Err(Error::Tls(_))), "{:?}", refused.err());
}

/// Past `max-concurrent` requests in flight, the next waits for one to end: it is sent only
/// once the first's response has been read, on the first's connection, kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_concurrency_limit_wait_their_turn() {
    let server = Server::start(Behaviour {
        head_delay: Duration::from_millis(300),
        ..Behaviour::default()
    });
    let one = OutgoingLimits {
        max_concurrent: 1,
        ..OutgoingLimits::default()
    };
    let (mut hooks, _deadline, ops) = hooks(&allow(&server), None, one);
    let url = format!("http://127.0.0.1:{}/", server.port());
    let first = tokio::spawn(std::pin::Pin::from(hooks.send_request(
        request(&url, full("1")),
        None,
        Box::new(async { Ok(()) }),
    )));
    server.wait_for_connections(1);
    let second = tokio::spawn(std::pin::Pin::from(hooks.send_request(
        request(&url, full("2")),
        None,
        Box::new(async { Ok(()) }),
    )));
    let first = first.await.unwrap().unwrap();
    // The first is still in flight (its body unread): the second has not been sent.
    assert_eq!(server.requests().len(), 1);
    assert_eq!(read(first).await.unwrap(), "ok");
    assert_eq!(read(second.await.unwrap().unwrap()).await.unwrap(), "ok");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(server.connections(), 1, "kept alive");
    let metrics = ops.render();
    assert!(
        metrics.contains(r#"vvm_http_outgoing_request_duration_seconds_count{service="svc"} 2"#),
        "{metrics}"
    );
    for line in [
        r#"vvm_http_outgoing_connections_total{service="svc",reused="false"} 1"#,
        r#"vvm_http_outgoing_connections_total{service="svc",reused="true"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}
