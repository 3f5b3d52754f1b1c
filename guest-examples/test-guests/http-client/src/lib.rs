//! Test guest: makes outgoing `wasi:http` requests (through `vvm_guest::http`) as its granted
//! environment says, and logs what came back.
//!
//! - `URL` (required): where to send the requests, e.g. `http://127.0.0.1:8080/path`.
//! - `METHOD` (default `GET`), `BODY` (default empty).
//! - `HEADER`: `name:value` to set on every request. When the host refuses it (e.g. the
//!   `vvm-fencing-token` it sets itself), logs `header refused: <name>: <error>` once and
//!   goes on without it.
//! - `EVERY_MS`: repeat every that many milliseconds until the stop (default: once in mode
//!   `request`, 5 in mode `token`).
//! - `MODE`:
//!   - `request` (default): logs one line per request, `http ok <status> <body>` (the body
//!     as lossy UTF-8, at most 200 characters) or `http error <error>` (an `ErrorCode` as its
//!     debug text, e.g. `ErrorCode::HttpRequestDenied`); then waits for the stop.
//!   - `token`: POSTs `<term> <seq>` (seq from 1) until the stop, logging only errors
//!     (`http error <error>`, at most one line a second), for a server that checks that
//!     terms never go back.
//!   - `bench`: `COUNT` requests (default 1000) one after the other, timed; the nanoseconds
//!     go under `result/http` in its own bucket, and it returns (`host/benches/outgoing_http.rs`).
//!
//! It returns `Ok` once told to stop.

use std::time::Duration;

use vvm_guest::http::{self, HttpError, Response};
use vvm_guest::wasi::clocks::monotonic_clock;
use vvm_guest::wasi::io::poll::Pollable;
use vvm_guest::wasi::keyvalue::store;
use vvm_guest::{Guest, info, lease, sleep_or_stop};

struct HttpClient;

/// The request to make, from the environment.
struct Request {
    url: String,
    method: String,
    body: Vec<u8>,
    /// Dropped once the host has refused it, so the log says so once.
    header: Option<(String, String)>,
}

impl Request {
    fn from_env() -> Result<Self, String> {
        let url = std::env::var("URL").map_err(|_| "URL not granted".to_owned())?;
        let header = std::env::var("HEADER")
            .ok()
            .map(|h| match h.split_once(':') {
                Some((name, value)) => (name.trim().to_owned(), value.trim().to_owned()),
                None => (h.trim().to_owned(), String::new()),
            });
        Ok(Self {
            url,
            method: std::env::var("METHOD").unwrap_or_else(|_| "GET".to_owned()),
            body: std::env::var("BODY").unwrap_or_default().into_bytes(),
            header,
        })
    }

    /// Sends it with `body`; a refused header is logged, dropped, and the request retried.
    fn send(&mut self, body: &[u8]) -> Result<Response, HttpError> {
        loop {
            let headers: Vec<(&str, &str)> = self
                .header
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            match http::request(&self.method, &self.url, &headers, body) {
                Err(HttpError::Header { name, error }) if self.header.is_some() => {
                    info(&format!("header refused: {name}: {error:?}"));
                    self.header = None;
                }
                result => return result,
            }
        }
    }
}

/// Milliseconds from the environment variable `EVERY_MS`, if granted.
fn every_ms() -> Option<u64> {
    std::env::var("EVERY_MS").ok().and_then(|v| v.parse().ok())
}

/// MODE `request`: one log line per request.
fn requests(mut request: Request, stopping: &Pollable) {
    let body = request.body.clone();
    loop {
        match request.send(&body) {
            Ok(response) => {
                let text = String::from_utf8_lossy(&response.body);
                let text: String = text.chars().take(200).collect();
                info(&format!("http ok {} {text}", response.status));
            }
            Err(e) => info(&format!("http error {e}")),
        }
        let Some(ms) = every_ms() else {
            stopping.block();
            return;
        };
        if sleep_or_stop(stopping, Duration::from_millis(ms)) {
            return;
        }
    }
}

/// MODE `token`: POSTs `<term> <seq>` until the stop, logging errors at most once a second.
fn tokens(mut request: Request, stopping: &Pollable) {
    const LOG_EVERY_NS: u64 = 1_000_000_000;
    request.method = "POST".to_owned();
    let term = lease::current().term;
    let period = Duration::from_millis(every_ms().unwrap_or(5));
    let mut last_log: Option<u64> = None;
    for seq in 1u64.. {
        if let Err(e) = request.send(format!("{term} {seq}").as_bytes()) {
            let now = monotonic_clock::now();
            if last_log.is_none_or(|at| now.saturating_sub(at) >= LOG_EVERY_NS) {
                info(&format!("http error {e}"));
                last_log = Some(now);
            }
        }
        if sleep_or_stop(stopping, period) {
            return;
        }
    }
}

/// MODE `bench` (`host/benches/outgoing_http.rs`): `COUNT` requests one after the other,
/// each read to its end, timed here; the nanoseconds go under `result/http` in the service's
/// bucket. Any failed request fails the run with its error.
fn bench(mut request: Request) -> Result<(), String> {
    let count: u64 = std::env::var("COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let body = request.body.clone();
    let start = monotonic_clock::now();
    for _ in 0..count {
        request.send(&body).map_err(|e| format!("http error {e}"))?;
    }
    let nanos = monotonic_clock::now() - start;
    let bucket = store::open("").map_err(|e| format!("{e:?}"))?;
    bucket
        .set("result/http", nanos.to_string().as_bytes())
        .map_err(|e| format!("{e:?}"))
}

impl Guest for HttpClient {
    fn run() -> Result<(), String> {
        let request = Request::from_env()?;
        let stopping = lease::stopping();
        match std::env::var("MODE").as_deref() {
            Err(_) | Ok("request") => requests(request, &stopping),
            Ok("token") => tokens(request, &stopping),
            Ok("bench") => bench(request)?,
            Ok(other) => return Err(format!("unknown MODE {other:?}")),
        }
        Ok(())
    }
}

vvm_guest::export!(HttpClient);
