//! {{name}}: a vvm-host HTTP service (world `http-service` of `wit/host.wit`), served at
//! `/{{name}}/` while its host leads, each request in a fresh instance. A GET adds one to `hits`
//! in its key-value store (`wasi:keyvalue`, a write fenced by the lease term) and answers
//! `hits N (term T)`. With `upstream-url` in its configuration (`wasi:config`), it also GETs
//! that URL (`wasi:http`) and adds the status: `; upstream 200`.

wit_bindgen::generate!({
    world: "http-service",
    path: "wit",
    generate_all,
});

use exports::wasi::http::incoming_handler::Guest;
use vvm::host::lease;
use wasi::config::store as config;
use wasi::http::outgoing_handler;
use wasi::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingRequest, OutgoingResponse,
    ResponseOutparam, Scheme,
};
use wasi::keyvalue::{atomics, store};

struct Service;

impl Guest for Service {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let (status, body) = match request.method() {
            Method::Get => match count_hit() {
                Ok(hits) => (200, answer(hits)),
                Err(e) => (503, format!("{e}\n")),
            },
            _ => (405, "only GET\n".to_owned()),
        };
        respond(out, status, &body);
    }
}

/// Adds one to `hits` in the service's own bucket and returns the new count. The write fails
/// once another host leads (`stale term ...`).
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

/// `hits N (term T)`, and the upstream's status when `upstream-url` is configured.
fn answer(hits: i64) -> String {
    let term = lease::current().term;
    let upstream = match config::get("upstream-url") {
        Ok(Some(url)) => match upstream_status(&url) {
            Ok(status) => format!("; upstream {status}"),
            Err(e) => format!("; upstream failed: {e}"),
        },
        _ => String::new(),
    };
    format!("hits {hits} (term {term}){upstream}\n")
}

/// GETs `url` (`http[s]://host[:port][/path]`) and returns the response's status. The host
/// sends it only to an origin in the service's `http` allow-list (else `HttpRequestDenied`),
/// and adds the `vvm-fencing-token` header.
fn upstream_status(url: &str) -> Result<u16, String> {
    let (scheme, rest) = url.split_once("://").ok_or("no scheme")?;
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    let scheme = if scheme == "https" { Scheme::Https } else { Scheme::Http };
    let request = OutgoingRequest::new(Fields::new());
    request.set_scheme(Some(&scheme)).map_err(|()| "bad scheme")?;
    request.set_authority(Some(authority)).map_err(|()| "bad host")?;
    request.set_path_with_query(Some(path)).map_err(|()| "bad path")?;
    let future = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => Ok(response.status()),
        Some(Ok(Err(e))) => Err(format!("{e:?}")),
        _ => Err("no response".to_owned()),
    }
}

/// Sends `status` with `body` as plain text.
fn respond(out: ResponseOutparam, status: u16, body: &str) {
    let headers = Fields::new();
    let _ = headers.set("content-type", &[b"text/plain; charset=utf-8".to_vec()]);
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

export!(Service);
