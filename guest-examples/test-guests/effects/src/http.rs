//! The `wasi:http` effects: each prepares a request to `http://EFFECT_ADDR/fx` before the
//! stop; the effect after it is one `wasi:http` call (then, where the guest would otherwise
//! drop the exchange half-way, a bounded wait for the response, which has no effect of its
//! own but lets an allowed request reach the server before the instance goes away).

use vvm_guest::wasi::clocks::monotonic_clock;
use vvm_guest::wasi::http::outgoing_handler;
use vvm_guest::wasi::http::types::{
    Fields, FutureIncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use vvm_guest::wasi::io::poll;

use crate::{Act, err};

/// The body `http-body-write` sends after the stop.
const BODY: &[u8] = b"fenced-body-data";
/// How long an effect waits for the response before returning anyway (a server that holds
/// the response must not keep `run` from returning within the grace period).
const RESPONSE_WAIT_NS: u64 = 2_000_000_000;

/// A request for `http://EFFECT_ADDR/fx` with `fields` as its headers.
fn request(method: Method, fields: Fields) -> Result<OutgoingRequest, String> {
    let addr = std::env::var("EFFECT_ADDR").map_err(|_| "EFFECT_ADDR not granted".to_owned())?;
    let request = OutgoingRequest::new(fields);
    request.set_method(&method).map_err(err)?;
    request.set_scheme(Some(&Scheme::Http)).map_err(err)?;
    request.set_authority(Some(&addr)).map_err(err)?;
    request.set_path_with_query(Some("/fx")).map_err(err)?;
    Ok(request)
}

/// Waits up to [`RESPONSE_WAIT_NS`] for the response head: an error code fails, a response
/// or no answer yet is fine (the request was sent either way).
fn settle(future: &FutureIncomingResponse) -> Result<(), String> {
    let ready = future.subscribe();
    let timer = monotonic_clock::subscribe_duration(RESPONSE_WAIT_NS);
    poll::poll(&[&ready, &timer]);
    drop(ready); // a child of the future
    match future.get() {
        Some(Ok(Err(code))) => Err(err(code)),
        _ => Ok(()),
    }
}

/// The effect named `effect` (`http-handle`, `http-body-write`, `http-pending`), prepared.
pub fn prepare(effect: &str) -> Result<Act, String> {
    Ok(match effect {
        // Prepared: a complete request without a body. Effect: sending it.
        "http-handle" => {
            let req = request(Method::Post, Fields::new())?;
            Box::new(move || {
                let future = outgoing_handler::handle(req, None).map_err(err)?;
                settle(&future)
            })
        }
        // Prepared: a request with a 16-byte body, sent (its head may reach the server), and
        // the body's stream. Effect: writing the body.
        "http-body-write" => {
            let fields = Fields::new();
            let length = BODY.len().to_string().into_bytes();
            fields.set("content-length", &[length]).map_err(err)?;
            let req = request(Method::Post, fields)?;
            let body = req.body().map_err(err)?;
            let stream = body.write().map_err(err)?;
            let future = outgoing_handler::handle(req, None).map_err(err)?;
            Box::new(move || {
                stream.blocking_write_and_flush(BODY).map_err(err)?;
                drop(stream); // a child of the body: gone before `finish`
                OutgoingBody::finish(body, None).map_err(err)?;
                settle(&future)
            })
        }
        // Prepared: a GET sent, whose response the server holds back, and the pollable of its
        // response. Effect: waiting for the response, then taking it.
        "http-pending" => {
            let req = request(Method::Get, Fields::new())?;
            let future = outgoing_handler::handle(req, None).map_err(err)?;
            let ready = future.subscribe();
            Box::new(move || {
                ready.block();
                drop(ready); // a child of the future
                match future.get() {
                    Some(Ok(Ok(_response))) => Ok(()),
                    other => Err(format!("no response: {other:?}")),
                }
            })
        }
        other => return Err(format!("unknown effect {other:?}")),
    })
}
