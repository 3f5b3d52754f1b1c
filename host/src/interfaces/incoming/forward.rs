//! Forwarding (SPEC §13, "Any host answers any route"): a request for a service another host
//! of the group holds is sent on, one hop, to the address that host advertises, and its answer
//! comes back unchanged (status, headers, the holder's fencing token, the body streamed).
//!
//! - **Where to.** Only to a holder the store's records name ([`Directory`]: placement reads
//!   the claims and the members' advertised addresses each round); nothing in a request
//!   chooses the target.
//! - **One hop.** A forwarded request carries [`FORWARDED_BY`], naming the forwarding host; a
//!   host never forwards a request that carries it (whoever set it, a client too), and
//!   answers it 503 with `Retry-After` when it does not hold the service ([`UNSERVED`]).
//! - **Planned moves cost no request.** A host's own 503 for a service it does not hold (or
//!   no longer leads) carries [`UNSERVED`]: no guest code ran. A forwarding host that gets it,
//!   or cannot connect to the holder at all (nothing was sent), asks placement to look again
//!   ([`Directory::ask`]), waits for the holder of record and sends the request there again
//!   (the same holder a moment later, if it has only just claimed the service; at most
//!   `serve::MOST_SENDS` sends in all).
//!   The request must be whole to be sent twice: a body of a known length up to
//!   [`REPLAY_BYTES`] is read before the first send; a longer or chunked body is streamed,
//!   and sent once.
//! - **Bounded.** Keep-alive connections to each holder are pooled (hyper-util's client); a
//!   connection must be made within `L/5`; the response, head and body, must come within the
//!   request timeout, from the request's arrival; a holder that cannot be reached is 503 with
//!   `Retry-After` (nothing was sent), one that fails after the request went out 502.
//! - **The client.** `Forwarded` and `X-Forwarded-For` name the original client; the holder
//!   takes its address for Spin's `spin-client-addr` from [`CLIENT_ADDR`], but only from a
//!   peer whose address a member of the group advertises.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::sync::watch;
use tokio::time::Instant;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use super::limits::Forwarding;
use crate::ops::Ops;
use crate::services::{Directory, Peer, Peers};

/// Names the host that forwarded a request (its advertised address, or its `http-addr`): a
/// request that carries it is never forwarded again.
pub(super) const FORWARDED_BY: HeaderName = HeaderName::from_static("vvm-forwarded-by");

/// The original client's address, set by the forwarding host.
pub(super) const CLIENT_ADDR: HeaderName = HeaderName::from_static("vvm-client-addr");

/// On a host's own 503 for a service it does not serve now: no guest code ran for the
/// request, so another holder may be asked.
pub(super) const UNSERVED: HeaderName = HeaderName::from_static("vvm-unserved");

/// The largest request body read whole before it is forwarded, so that it can be sent again
/// to another holder.
pub(super) const REPLAY_BYTES: u64 = 64 << 10;

/// How long a connection to a holder waits idle for its next request: under the holder's
/// `keep-alive-timeout` by default (30 s), so that it is seldom the holder that closes it as a
/// request goes out on it (a request that may be repeated is then sent again; another is 502).
const POOL_IDLE: Duration = Duration::from_secs(20);

/// A request body as a service here reads it: the client's, or one read whole to be forwarded
/// (the service came here meanwhile).
pub(super) type Inbound = http_body_util::Either<Incoming, Full<Bytes>>;

/// The body of a forwarded request: read whole, or streamed from the client.
type ForwardBody = http_body_util::combinators::UnsyncBoxBody<Bytes, hyper::Error>;

/// How forwarded requests reach the holders.
pub(super) struct Forwarder {
    directory: Arc<Directory>,
    client: Client<HttpConnector, ForwardBody>,
    /// This host, as [`FORWARDED_BY`] names it.
    by: HeaderValue,
    /// How long to wait for a holder to be known, at most.
    patience: Duration,
}

/// A request on its way to a holder: its head, and its body if it was read whole.
pub(super) struct Outbound {
    head: hyper::http::request::Parts,
    body: Outgoing,
}

enum Outgoing {
    /// Read whole: it can be sent again.
    Whole(Bytes),
    /// Not read yet, or streamed to a holder already (`None`).
    Streamed(Option<Incoming>),
}

/// What became of a forwarded request.
pub(super) enum Forwarded {
    /// The holder's answer, to pass on.
    Answered(Response<HyperOutgoingBody>),
    /// Nothing ran on the holder (it does not hold the service now, or could not be reached),
    /// or the request may be repeated (idempotent, and the connection failed before an
    /// answer): it may be sent again; `answer` is what to say if it is not.
    Unserved {
        request: Box<Outbound>,
        answer: Response<HyperOutgoingBody>,
    },
}

impl Forwarder {
    /// Forwards through `directory`'s holders, as `forwarding` says.
    pub(super) fn new(directory: Arc<Directory>, forwarding: Forwarding) -> Self {
        let Forwarding {
            by,
            connect_timeout,
            patience,
        } = forwarding;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        let by = HeaderValue::from_str(&by.to_string()).unwrap_or(HeaderValue::from_static("-"));
        Self {
            directory,
            client,
            by,
            patience,
        }
    }

    /// The holders as placement last published them.
    pub(super) fn peers(&self) -> watch::Receiver<Peers> {
        self.directory.subscribe()
    }

    /// Asks placement to look at the store again.
    pub(super) fn ask(&self) {
        self.directory.ask();
    }

    /// How long to wait for a holder to be known, at most.
    pub(super) fn patience(&self) -> Duration {
        self.patience
    }

    /// `req` (from `client`) made ready to forward: its hop-by-hop headers gone, the client
    /// named, and its body read whole if it is short enough (by `until`).
    pub(super) async fn prepare(
        &self,
        req: Request<Incoming>,
        client: Option<SocketAddr>,
        until: Instant,
    ) -> Result<Outbound, Response<HyperOutgoingBody>> {
        let (mut head, body) = req.into_parts();
        remove_hop_by_hop(&mut head.headers);
        name_client(&mut head.headers, client);
        head.headers.insert(FORWARDED_BY, self.by.clone());
        let body = match body.size_hint().exact() {
            Some(n) if n <= REPLAY_BYTES => {
                match tokio::time::timeout_at(until, body.collect()).await {
                    Ok(Ok(whole)) => Outgoing::Whole(whole.to_bytes()),
                    Ok(Err(_)) => return Err(plain(StatusCode::BAD_REQUEST, "bad request\n")),
                    Err(_) => return Err(plain(StatusCode::GATEWAY_TIMEOUT, "request timeout\n")),
                }
            }
            _ => Outgoing::Streamed(Some(body)),
        };
        Ok(Outbound { head, body })
    }

    /// `request` (not sent, or sent and not served), to be served here after all: `None` when
    /// its body was streamed away.
    pub(super) fn here(request: Outbound) -> Option<Request<Inbound>> {
        let Outgoing::Whole(body) = request.body else {
            return None;
        };
        let mut head = request.head;
        head.headers.remove(FORWARDED_BY);
        Some(Request::from_parts(head, Inbound::Right(Full::new(body))))
    }

    /// Sends `request` to `peer`, whose answer's head must come by `until`.
    pub(super) async fn send(
        &self,
        peer: &Peer,
        mut request: Outbound,
        until: Instant,
        ops: &Ops,
    ) -> Forwarded {
        let started = Instant::now();
        let target = peer.addr.to_string();
        let body: ForwardBody = match &mut request.body {
            Outgoing::Whole(bytes) => Full::new(bytes.clone())
                .map_err(|never| match never {})
                .boxed_unsync(),
            Outgoing::Streamed(body) => match body.take() {
                Some(body) => body.boxed_unsync(),
                None => Full::new(Bytes::new())
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            },
        };
        let mut head = request.head.clone();
        head.uri = match uri(peer.addr, &head.uri) {
            Some(uri) => uri,
            None => return Forwarded::Answered(plain(StatusCode::BAD_REQUEST, "bad request\n")),
        };
        head.version = hyper::Version::HTTP_11;
        let sent =
            tokio::time::timeout_at(until, self.client.request(Request::from_parts(head, body)))
                .await;
        let replayable = matches!(request.body, Outgoing::Whole(_));
        let answer = match sent {
            Err(_) => {
                ops.http_forwarded(&target, "timeout", started.elapsed());
                return Forwarded::Answered(plain(
                    StatusCode::GATEWAY_TIMEOUT,
                    "request timeout\n",
                ));
            }
            Ok(Err(e)) if e.is_connect() => {
                tracing::warn!(holder = peer.holder, target, error = %e, "forwarding: the holder cannot be reached");
                ops.http_forwarded(&target, "unreachable", started.elapsed());
                let answer = unserved("the service's host cannot be reached\n");
                if replayable {
                    return Forwarded::Unserved {
                        request: Box::new(request),
                        answer,
                    };
                }
                return Forwarded::Answered(answer);
            }
            Ok(Err(e)) => {
                tracing::warn!(holder = peer.holder, target, error = %e, "forwarding: the holder failed");
                ops.http_forwarded(&target, "failed", started.elapsed());
                let answer = plain(StatusCode::BAD_GATEWAY, "bad gateway\n");
                // The connection failed before any answer (a holder closing its door, say):
                // a request that may be repeated (RFC 9110 §9.2.2) is, as proxies do.
                if replayable && request.head.method.is_idempotent() {
                    return Forwarded::Unserved {
                        request: Box::new(request),
                        answer,
                    };
                }
                return Forwarded::Answered(answer);
            }
            Ok(Ok(answer)) => answer,
        };
        let (mut parts, body) = answer.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        let unserved_there = parts.headers.contains_key(UNSERVED);
        ops.http_forwarded(
            &target,
            if unserved_there {
                "unserved"
            } else {
                "answered"
            },
            started.elapsed(),
        );
        let body = Until {
            body,
            at: Box::pin(tokio::time::sleep_until(until)),
        };
        let answer = Response::from_parts(parts, body.boxed_unsync());
        if unserved_there && replayable {
            Forwarded::Unserved {
                request: Box::new(request),
                answer,
            }
        } else {
            Forwarded::Answered(answer)
        }
    }
}

/// A forwarded response's body, ended in an error at the request's deadline: the holder's own
/// request timeout ends it first, unless the way to the holder is cut (a partition, a holder
/// stopped), which no byte tells.
struct Until {
    body: Incoming,
    at: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for Until {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(wasmtime_wasi_http::Error::Hyper)));
        }
        match self.at.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Poll::Ready(Some(Err(wasmtime_wasi_http::Error::ConnectionReadTimeout)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// `uri`'s path and query, at `addr`.
fn uri(addr: SocketAddr, uri: &hyper::Uri) -> Option<hyper::Uri> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    format!("http://{addr}{path}").parse().ok()
}

/// Removes the headers that belong to one connection (RFC 9110 §7.6.1): those `Connection`
/// names, and the ones that always do.
pub(super) fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}

/// Names `client` as the request's origin: `X-Forwarded-For` (appended to the client's own),
/// `Forwarded`, and [`CLIENT_ADDR`] (replaced: only this host's word counts).
fn name_client(headers: &mut HeaderMap, client: Option<SocketAddr>) {
    headers.remove(CLIENT_ADDR);
    let Some(client) = client else {
        return;
    };
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(before) => format!("{before}, {}", client.ip()),
        None => client.ip().to_string(),
    };
    let forwarded = match client.ip() {
        IpAddr::V4(ip) => format!("for=\"{ip}:{}\";proto=http", client.port()),
        IpAddr::V6(ip) => format!("for=\"[{ip}]:{}\";proto=http", client.port()),
    };
    for (name, value) in [
        (HeaderName::from_static("x-forwarded-for"), xff),
        (header::FORWARDED, forwarded),
        (CLIENT_ADDR, client.to_string()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            if name == header::FORWARDED {
                headers.append(name, value);
            } else {
                headers.insert(name, value);
            }
        }
    }
}

/// The client of a request `peer` sent: the original client it names, when it was forwarded
/// by a host whose address a member of the group advertises (`peers`); else `peer`.
pub(super) fn client_of(
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    peers: &Peers,
) -> Option<SocketAddr> {
    let named = headers
        .get(CLIENT_ADDR)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    match (peer, named) {
        (Some(peer), Some(named))
            if headers.contains_key(FORWARDED_BY)
                && peers.members.iter().any(|m| m.ip() == peer.ip()) =>
        {
            Some(named)
        }
        _ => peer,
    }
}

/// A response of the host's own, with a short text body.
pub(super) fn plain(status: StatusCode, text: &'static str) -> Response<HyperOutgoingBody> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
}

/// 503 with `Retry-After: 1`: try again (this host in a moment).
pub(super) fn unavailable(text: &'static str) -> Response<HyperOutgoingBody> {
    let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, text);
    (response.headers_mut()).insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// [`unavailable`], with [`UNSERVED`]: this host does not serve the service now, and no guest
/// code ran.
pub(super) fn unserved(text: &'static str) -> Response<HyperOutgoingBody> {
    let mut response = unavailable(text);
    (response.headers_mut()).insert(UNSERVED, HeaderValue::from_static("1"));
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    /// A holder that sent the head and part of the body, then nothing (a cut way, a stopped
    /// host): the forwarded body ends in an error at the request's deadline, not never.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_holder_s_body_ends_at_the_deadline() {
        let (client, mut server) = tokio::io::duplex(1024);
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
                .await
                .unwrap();
        tokio::spawn(conn);
        let request = Request::new(Full::new(Bytes::new()));
        let response = tokio::spawn(async move {
            sender.ready().await?;
            sender.send_request(request).await
        });
        let mut head = [0; 64];
        let _ = tokio::io::AsyncReadExt::read(&mut server, &mut head)
            .await
            .unwrap();
        server
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab")
            .await
            .unwrap();
        let head = response.await.unwrap().unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        let mut body = Until {
            body: head.into_body(),
            at: Box::pin(tokio::time::sleep_until(until)),
        };
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "ab");
        let end = body.frame().await.unwrap();
        assert!(
            matches!(end, Err(wasmtime_wasi_http::Error::ConnectionReadTimeout)),
            "{end:?}"
        );
        assert!(Instant::now() >= until);
        drop(server);
    }

    /// The connection's own headers go, the ones `Connection` names too; the rest stay.
    #[test]
    fn hop_by_hop_headers_are_removed_and_the_rest_kept() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("content-type", "text/plain"),
            ("vvm-fencing-token", "7"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        remove_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type", "vvm-fencing-token"]);
    }

    /// The original client is named in every form, replacing a client's own
    /// `vvm-client-addr`; a holder believes it only from a member's address and with
    /// [`FORWARDED_BY`].
    #[test]
    fn the_client_is_named_and_believed_only_from_a_member() {
        let client: SocketAddr = "192.0.2.9:4711".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(CLIENT_ADDR, HeaderValue::from_static("203.0.113.1:1"));
        headers.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.3"));
        name_client(&mut headers, Some(client));
        headers.insert(FORWARDED_BY, HeaderValue::from_static("10.0.0.1:8080"));
        assert_eq!(headers[CLIENT_ADDR], "192.0.2.9:4711");
        assert_eq!(headers["x-forwarded-for"], "198.51.100.3, 192.0.2.9");
        assert_eq!(
            headers[header::FORWARDED],
            "for=\"192.0.2.9:4711\";proto=http"
        );
        let member: SocketAddr = "10.0.0.1:8080".parse().unwrap();
        let peers = Peers {
            members: [member].into(),
            ..Peers::default()
        };
        let from_member: SocketAddr = "10.0.0.1:50000".parse().unwrap();
        assert_eq!(client_of(&headers, Some(from_member), &peers), Some(client));
        let stranger: SocketAddr = "10.0.0.66:50000".parse().unwrap();
        assert_eq!(client_of(&headers, Some(stranger), &peers), Some(stranger));
        headers.remove(FORWARDED_BY);
        assert_eq!(
            client_of(&headers, Some(from_member), &peers),
            Some(from_member)
        );
    }
}
