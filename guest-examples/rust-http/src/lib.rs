//! Example HTTP service in Rust (world `http-service` of `../../wit/host.wit`): a GET adds one
//! to `hits` in the service's own key-value bucket (`wasi:keyvalue` `increment`, a write fenced
//! by the lease term) and answers `hits N (term T)`, T being the term of `lease.current`. Any
//! other method is 405. A failed write (another host leads now, the store is unreachable, a
//! limit) is 503 with the error's text.
//!
//! Served at `/rust-http/...` by default while the host leads; every response also carries the
//! host's `vvm-fencing-token` header. Each request runs in a fresh instance.

wit_bindgen::generate!({
    world: "http-service",
    path: "../../wit",
    generate_all,
});

use exports::wasi::http::incoming_handler::Guest;
use vvm::host::lease;
use wasi::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasi::keyvalue::{atomics, store};

struct Hits;

impl Guest for Hits {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let (status, body) = match request.method() {
            Method::Get => match count_hit() {
                Ok(hits) => (
                    200,
                    format!("hits {hits} (term {})\n", lease::current().term),
                ),
                Err(e) => (503, format!("{e}\n")),
            },
            _ => (405, "only GET\n".to_owned()),
        };
        respond(out, status, &body);
    }
}

/// Adds one to `hits` in the service's own bucket and returns the new count.
fn count_hit() -> Result<i64, String> {
    let bucket = store::open("default").map_err(error_text)?;
    atomics::increment(&bucket, "hits", 1).map_err(error_text)
}

/// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
/// `over a limit: ...`, or access denied.
fn error_text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

/// Sends `status` with `body` as plain text.
fn respond(out: ResponseOutparam, status: u16, body: &str) {
    let headers = Fields::new();
    let _ = headers.set("content-type", &[b"text/plain; charset=utf-8".to_vec()]);
    if status == 405 {
        let _ = headers.set("allow", &[b"GET".to_vec()]);
    }
    let response = OutgoingResponse::new(headers);
    let _ = response.set_status_code(status);
    let Ok(outgoing) = response.body() else {
        return;
    };
    ResponseOutparam::set(out, Ok(response));
    let Ok(stream) = outgoing.write() else {
        return;
    };
    let written = stream.blocking_write_and_flush(body.as_bytes());
    // The stream is the body's child: dropped before `finish`.
    drop(stream);
    if written.is_ok() {
        let _ = OutgoingBody::finish(outgoing, None);
    }
}

export!(Hits);
