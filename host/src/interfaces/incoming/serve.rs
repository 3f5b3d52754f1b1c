//! One served request (SPEC §10, "Incoming HTTP"): admitted (a route, the lease, the
//! service's concurrency), a fresh store and instance of the service's pre-instantiated
//! component, the handler's call on a task of its own, and the response under the lease.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Limited};
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::HeaderValue;
use hyper::{Request, Response, StatusCode};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::oneshot::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmtime::Store;
use wasmtime::component::Resource;
use wasmtime_wasi_http::handler::InstantiationError;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, Scheme};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::p2::types::{HostIncomingRequest, HostResponseOutparam};
use wasmtime_wasi_http::{Error, WasiBody, WasiHttpView as _};

use super::body;
use super::concurrent::Concurrent;
use super::forward::{
    self, FORWARDED_BY, Forwarded, Forwarder, Inbound, plain, unavailable, unserved,
};
use super::pool::{Instance, Pool};
use super::routes::{Entry, Handler, Routed, Shared};
use super::sandboxes::Sandboxes;
use super::spin;
use crate::interfaces::env::Fenced;
use crate::interfaces::outgoing::TOKEN_HEADER;
use crate::ops::RunningGuard;

/// Why a connection is aborted instead of answered: the lease deadline passed before the
/// response head (another host may lead by now).
#[derive(Debug, thiserror::Error)]
#[error("lease deadline passed before the response: connection aborted")]
pub(super) struct Aborted;

/// 504: the request timeout passed before the handler's response head.
fn timed_out() -> Response<HyperOutgoingBody> {
    plain(StatusCode::GATEWAY_TIMEOUT, "request timeout\n")
}

/// Serves `req` from `peer`: the route's service's handler, or its holder's answer (forwarded),
/// or the host's 404 or 503.
pub(super) async fn serve<S: Sandboxes>(
    shared: Arc<Shared<S>>,
    req: Request<Incoming>,
    peer: Option<SocketAddr>,
) -> Result<Response<HyperOutgoingBody>, Aborted> {
    let forwarded = req.headers().contains_key(FORWARDED_BY);
    let client = match &shared.forwarder {
        Some(forwarder) if forwarded => {
            forward::client_of(req.headers(), peer, &forwarder.peers().borrow())
        }
        _ => peer,
    };
    let (entry, mut req) = match shared.route(req.uri().path()) {
        Routed::Here(entry) => (entry, req.map(Inbound::Left)),
        Routed::Nowhere => return Ok(plain(StatusCode::NOT_FOUND, "no route\n")),
        Routed::Elsewhere(_) if forwarded => {
            // One hop: whoever sent it, it goes no further.
            return Ok(unserved("not served by this host now\n"));
        }
        Routed::Elsewhere(_) => match &shared.forwarder {
            None => return Ok(unserved("not served by this host now\n")),
            Some(forwarder) => match elsewhere(&shared, forwarder, req, client).await {
                Step::Here(entry, req) => (entry, req),
                Step::Answer(response) => return Ok(response),
            },
        },
    };
    let uri = req.uri().clone();
    spin::set_headers(req.headers_mut(), &entry.route, &uri, client);
    let admitted = Instant::now();
    let answer = handle(&shared, entry.clone(), req).await;
    let status = answer.as_ref().ok().map(|r| r.status().as_u16());
    entry.metrics.request(status, admitted.elapsed());
    answer
}

/// Where a request for a service not served here ends up.
enum Step<S: Sandboxes> {
    /// Served here after all: the service came here while it waited for a holder.
    Here(Arc<Entry<S>>, Request<Inbound>),
    /// The holder's answer, or the host's own.
    Answer(Response<HyperOutgoingBody>),
}

/// How many times a request is sent on at most. A holder that no longer serves the service
/// answers 503 until its claim is deleted (and the directory names the next holder), and one
/// that has just claimed it until the service has started: a moment each. Between two sends
/// to the same holder the request waits 10 ms, then 20, 40, 80 (150 ms in all), or until the
/// directory changes.
const MOST_SENDS: u32 = 5;

/// Forwards `req` (from `client`) to the holder of its route's service; if that holder does
/// not serve it (no guest code ran there) or cannot be reached, to the holder then (the same
/// one a moment later, or the next), up to [`MOST_SENDS`] times, when the request can be sent
/// again. A request whose service has no known holder waits for one (or for this host to
/// serve it) within the forwarder's patience.
async fn elsewhere<S: Sandboxes>(
    shared: &Shared<S>,
    forwarder: &Forwarder,
    req: Request<Incoming>,
    client: Option<SocketAddr>,
) -> Step<S> {
    let arrived = Instant::now();
    let until = arrived + shared.sandboxes.limits().request_timeout;
    let patience = (arrived + forwarder.patience()).min(until);
    let path = req.uri().path().to_owned();
    let mut peers = forwarder.peers();
    let (mut req, mut outbound) = (Some(req), None);
    // What the last holder asked answered: passed on if no holder serves the request.
    let mut refused: Option<Response<HyperOutgoingBody>> = None;
    let mut sends = 0;
    loop {
        let registered = shared.registered.notified();
        tokio::pin!(registered);
        registered.as_mut().enable();
        let name = match shared.route(&path) {
            Routed::Elsewhere(name) => name,
            Routed::Here(entry) => {
                let req = match (req.take(), outbound.take()) {
                    (Some(req), _) => Some(req.map(Inbound::Left)),
                    (None, Some(request)) => Forwarder::here(request),
                    (None, None) => None,
                };
                return match req {
                    Some(req) => Step::Here(entry, req),
                    None => Step::Answer(unserved("moved to this host: try again\n")),
                };
            }
            Routed::Nowhere => return Step::Answer(plain(StatusCode::NOT_FOUND, "no route\n")),
        };
        let holder = {
            let peers = peers.borrow_and_update();
            if peers.unreachable.contains(&name) {
                // Held by a host this one cannot forward to: the client may find it.
                let answer = refused.take();
                return Step::Answer(
                    answer.unwrap_or_else(|| unserved("not served by this host now\n")),
                );
            }
            peers.holders.get(&name).cloned()
        };
        let mut backoff = None;
        if let Some(peer) = holder {
            let request = match (outbound.take(), req.take()) {
                (Some(request), _) => request,
                (None, Some(req)) => match forwarder.prepare(req, client, until).await {
                    Ok(request) => request,
                    Err(response) => return Step::Answer(response),
                },
                (None, None) => break,
            };
            sends += 1;
            match forwarder
                .send(&peer, request, until, shared.sandboxes.ops())
                .await
            {
                Forwarded::Answered(response) => return Step::Answer(response),
                Forwarded::Unserved { answer, .. } if sends >= MOST_SENDS => {
                    return Step::Answer(answer);
                }
                Forwarded::Unserved { request, answer } => {
                    outbound = Some(*request);
                    refused = Some(answer);
                    backoff = Some(Duration::from_millis(5 << sends));
                }
            }
        }
        // Placement looks again; the request waits for a holder, or a moment to ask again.
        forwarder.ask();
        tokio::select! {
            changed = peers.changed() => if changed.is_err() { break },
            () = registered => {}
            () = tokio::time::sleep(backoff.unwrap_or_default()), if backoff.is_some() => {}
            () = tokio::time::sleep_until(patience) => break,
        }
    }
    Step::Answer(refused.unwrap_or_else(|| unserved("not served by this host now\n")))
}

/// Handles `req` for the service of `entry`: its handler's response, or the host's 413 or
/// 503 (or 504, or 500 when the handler gave no response).
async fn handle<S: Sandboxes>(
    shared: &Shared<S>,
    entry: Arc<Entry<S>>,
    req: Request<Inbound>,
) -> Result<Response<HyperOutgoingBody>, Aborted> {
    // Admitted only under the lease: the term is the environment's, pinned from here on.
    if entry.env.deadline.has_passed() {
        return Ok(unserved("not leading\n"));
    }
    let limits = shared.sandboxes.limits();
    let max_body = limits.max_body_bytes;
    if req.body().size_hint().lower() > max_body {
        // Refused unread: hyper sends no `100 Continue` for a body nobody polls, and closes
        // the connection rather than read the rest.
        return Ok(plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large\n",
        ));
    }
    let Ok(permit) = Arc::clone(&entry.permits).try_acquire_owned() else {
        tracing::warn!(
            service = &*entry.env.name,
            "request refused: too many in flight"
        );
        return Ok(unavailable("busy\n"));
    };
    let timeout_at = Instant::now() + limits.request_timeout;
    let (pre, pool) = match &entry.handler {
        Handler::P2 { pre, pool } => (pre, pool),
        Handler::P3(instances) => {
            let req = req.map(|body| limited(body, max_body).boxed_unsync());
            return concurrent(&entry, instances, req, timeout_at, permit).await;
        }
    };
    // A reused instance, if one waits (every request's calls are fenced per call all the
    // same), else a fresh store.
    let ready = match pool.take() {
        Some(instance) => Ready::Reused(instance),
        None => match shared.sandboxes.store(pre.engine(), &entry.env) {
            Ok(store) => Ready::Fresh(store),
            Err(e) => {
                let service = &*entry.env.name;
                tracing::error!(service, error = %format!("{e:#}"), "request: no sandbox");
                return Ok(plain(StatusCode::INTERNAL_SERVER_ERROR, "no sandbox\n"));
            }
        },
    };
    let mut ready = ready;
    let store = ready.store();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let resources = store
        .data_mut()
        .http()
        .new_incoming_request(Scheme::Http, req.map(|body| limited(body, max_body)))
        .and_then(|request| Ok((request, store.data_mut().http().new_response_outparam(tx)?)));
    let Ok((request, out)) = resources else {
        return Ok(plain(StatusCode::BAD_REQUEST, "bad request\n"));
    };
    let broken = CancellationToken::new();
    let unstarted = CancellationToken::new();
    let call = Call {
        entry: Arc::clone(&entry),
        pre: pre.clone(),
        pool: Arc::clone(pool),
        broken: broken.clone(),
        unstarted: unstarted.clone(),
        timeout_at,
        grace: shared.sandboxes.grace_period(),
        _permit: permit,
        _in_flight: entry.metrics.in_flight(),
    };
    entry.requests.spawn(call.run(ready, request, out));
    let head = tokio::select! {
        head = rx => head,
        () = entry.env.deadline.passed() => return Err(Aborted),
        () = tokio::time::sleep_until(timeout_at) => {
            return Ok(timed_out());
        }
    };
    if head.is_err() && unstarted.is_cancelled() {
        // No instance to be had (the pool is full, say): the client may try again.
        return Ok(unavailable("no instance available\n"));
    }
    answer(&entry, head, timeout_at, broken)
}

/// Handles `req` for the WASI 0.3 service of `entry` on one of its `instances` (which takes
/// it beside others): its response, cut if its instance fails before it ends; or the host's
/// 503 (no instance to be had), 504 (the request timeout), or 500 (the handler's error).
async fn concurrent<S: Sandboxes>(
    entry: &Entry<S>,
    instances: &Concurrent<S>,
    req: Request<WasiBody>,
    timeout_at: Instant,
    permit: OwnedSemaphorePermit,
) -> Result<Response<HyperOutgoingBody>, Aborted> {
    let _in_flight = entry.metrics.in_flight();
    let broken = CancellationToken::new();
    let head = tokio::select! {
        head = instances.handle(broken.clone(), req) => head,
        () = entry.env.deadline.passed() => return Err(Aborted),
        () = tokio::time::sleep_until(timeout_at) => {
            return Ok(timed_out());
        }
    };
    let head = match head {
        Ok(response) => Ok(Ok(response)),
        Err(e) if e.is::<InstantiationError<CancellationToken>>() => {
            let service = &*entry.env.name;
            tracing::error!(service, error = %format!("{e:#}"), "request: no instance");
            return Ok(unavailable("no instance available\n"));
        }
        Err(e) => {
            tracing::warn!(service = &*entry.env.name, error = %format!("{e:#}"), "request: the handler failed");
            Ok(Err(ErrorCode::InternalError(Some(e.to_string()))))
        }
    };
    // The place in the service's concurrency is held until the response ends.
    answer(entry, head, timeout_at, broken).map(|response| {
        response.map(|body| {
            Permitted {
                body,
                _permit: permit,
            }
            .boxed_unsync()
        })
    })
}

/// A response body that holds its request's place in the service's concurrency until it
/// ends.
struct Permitted {
    body: HyperOutgoingBody,
    _permit: OwnedSemaphorePermit,
}

impl hyper::body::Body for Permitted {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// `body`, ending in an error once it has given more than `max` bytes (a body of unknown
/// length, chunked): the guest's read fails rather than the host buffering on.
fn limited(body: Inbound, max: u64) -> impl hyper::body::Body<Data = Bytes, Error = Error> {
    Limited::new(body, usize::try_from(max).unwrap_or(usize::MAX)).map_err(|e| {
        match e.downcast::<hyper::Error>() {
            Ok(e) => Error::Hyper(*e),
            Err(_) => Error::HttpRequestBodySize(None),
        }
    })
}

/// The response to send for the handler's `head` (or why there is none).
fn answer<S: Sandboxes>(
    entry: &Entry<S>,
    head: Result<Result<Response<HyperOutgoingBody>, ErrorCode>, RecvError>,
    timeout_at: Instant,
    broken: CancellationToken,
) -> Result<Response<HyperOutgoingBody>, Aborted> {
    let service = &*entry.env.name;
    match head {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            parts
                .headers
                .insert(TOKEN_HEADER, HeaderValue::from(entry.env.lease.term));
            let body = body::leased(body, entry.env.deadline.clone(), timeout_at, broken);
            Ok(Response::from_parts(parts, body.boxed_unsync()))
        }
        Err(_) if entry.env.deadline.has_passed() => Err(Aborted),
        // The call was cut by the request timeout: its own timer (or its instance's) fires at
        // the same instant as the request's, and may be seen first.
        Ok(Err(_)) | Err(_) if Instant::now() >= timeout_at => Ok(timed_out()),
        Ok(Err(code)) => {
            tracing::warn!(service, error = ?code, "request: the handler answered an error");
            Ok(plain(StatusCode::INTERNAL_SERVER_ERROR, "handler error\n"))
        }
        Err(_) => Ok(plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the handler gave no response\n",
        )),
    }
}

/// The handler's call for one request, on a task of its own (its body may stream after the
/// head is sent); `T` its store's data.
struct Call<S: Sandboxes> {
    entry: Arc<Entry<S>>,
    /// Its service's component (WASI 0.2).
    pre: ProxyPre<S::Data>,
    /// Its service's idle instances.
    pool: Arc<Pool<Instance<S::Data>>>,
    /// Cancelled when the call did not complete, before its store is dropped.
    broken: CancellationToken,
    /// Cancelled when no instance could be made for it (before `broken`).
    unstarted: CancellationToken,
    timeout_at: Instant,
    grace: Duration,
    /// A place in the service's concurrency, held until the call ends.
    _permit: OwnedSemaphorePermit,
    /// Counted in flight until the call ends.
    _in_flight: RunningGuard,
}

/// Whether the failed call of a request had an instance (reused, or instantiated), which it
/// retires: `served` before it, none instantiated when `unstarted`.
fn proxy_made(served: u32, unstarted: &CancellationToken) -> bool {
    served > 0 || !unstarted.is_cancelled()
}

/// What a request's call runs on: an instance kept from an earlier request, or a fresh store
/// to instantiate in.
enum Ready<T: 'static> {
    Reused(Instance<T>),
    Fresh(Store<T>),
}

impl<T: 'static> Ready<T> {
    fn store(&mut self) -> &mut Store<T> {
        match self {
            Self::Reused(instance) => &mut instance.store,
            Self::Fresh(store) => store,
        }
    }
}

impl<S: Sandboxes> Call<S> {
    async fn run(
        self,
        ready: Ready<S::Data>,
        request: Resource<HostIncomingRequest>,
        out: Resource<HostResponseOutparam>,
    ) {
        let (mut store, proxy, served) = match ready {
            Ready::Reused(Instance {
                store,
                proxy,
                served,
                ..
            }) => {
                self.entry.metrics.instance(true);
                (store, Some(proxy), served)
            }
            Ready::Fresh(store) => (store, None, 0),
        };
        // In a block of its own: the call (and its borrow of the store) ends with it.
        let outcome = {
            let pre = &self.pre;
            let call = async {
                let proxy = if let Some(proxy) = proxy {
                    proxy
                } else {
                    let proxy = pre
                        .instantiate_async(&mut store)
                        .await
                        .inspect_err(|_| self.unstarted.cancel())?;
                    self.entry.metrics.instance(false);
                    proxy
                };
                proxy
                    .wasi_http_incoming_handler()
                    .call_handle(&mut store, request, out)
                    .await
                    .map(|()| proxy)
            };
            tokio::pin!(call);
            let stopped = async {
                self.entry.env.stopping.cancelled().await;
                tokio::time::sleep(self.grace).await;
            };
            tokio::select! {
                r = &mut call => r.map_err(|e| {
                    if e.is::<Fenced>() { "fenced: lease deadline passed".to_owned() }
                    else { format!("trapped: {}", e.root_cause()) }
                }),
                () = tokio::time::sleep_until(self.timeout_at) => Err("request timeout".to_owned()),
                () = stopped => Err("stopped: grace period over".to_owned()),
            }
        };
        let outcome = match outcome {
            // The call returned: its instance may serve the next request (the pool says).
            Ok(proxy) => {
                let instance = Instance {
                    store,
                    proxy,
                    served: served + 1,
                    metrics: self.entry.metrics.clone(),
                };
                self.pool.give_back(instance);
                Ok(())
            }
            Err(reason) => {
                // Before the store (and with it the response body's sender) is dropped.
                self.broken.cancel();
                // Never reused: it trapped, was fenced, or ran past its time.
                drop(store);
                if proxy_made(served, &self.unstarted) {
                    self.entry.metrics.instance_retired(served + 1);
                }
                Err(reason)
            }
        };
        // The call is over: its instance, its place in the concurrency and its count in
        // flight go before the line that says so.
        let Self {
            entry,
            _permit: permit,
            _in_flight: in_flight,
            ..
        } = self;
        drop((permit, in_flight));
        if let Err(reason) = outcome {
            tracing::warn!(
                service = &*entry.env.name,
                reason,
                "request handler cut short"
            );
        }
    }
}
