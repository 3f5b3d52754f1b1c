//! Test guest: a plain `wasi:http/proxy` component (no `vvm:host` import), as an off-the-shelf
//! HTTP component is. By the request path's last segment:
//! - `spin`: spins for ever, never answering (a handler the request timeout must stop);
//! - `wait`: answers after a minute (holding a place in its service's concurrency);
//! - `slow`: answers `200` at once, then streams `chunk N\n` for N in 1..=500, one every
//!   20 ms (a response in progress for ten seconds);
//! - `headers`: `200` with the request's `spin-*` headers, a `NAME: VALUE` line each, sorted;
//! - anything else: `200` with the body `hello from <path>` (the path and query as
//!   received), written in two pieces so that the body is streamed.

#![allow(missing_docs)]

wit_bindgen::generate!({
    world: "wasi:http/proxy@0.2.12",
    path: "../../../wit",
    generate_all,
});

use exports::wasi::http::incoming_handler::Guest;
use wasi::clocks::monotonic_clock;
use wasi::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

struct Hello;

/// Nanoseconds in a millisecond.
const MS: u64 = 1_000_000;

impl Guest for Hello {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let last = path
            .split('?')
            .next()
            .and_then(|p| p.rsplit('/').next())
            .map(str::to_owned);
        let last = last.as_deref();
        match last {
            Some("spin") => spin(),
            Some("wait") => monotonic_clock::subscribe_duration(60_000 * MS).block(),
            _ => {}
        }
        let pieces: Vec<String> = if last == Some("slow") {
            (1..=500).map(|n| format!("chunk {n}\n")).collect()
        } else if last == Some("headers") {
            let mut lines: Vec<String> = request
                .headers()
                .entries()
                .into_iter()
                .filter(|(name, _)| name.starts_with("spin-"))
                .map(|(name, value)| format!("{name}: {}\n", String::from_utf8_lossy(&value)))
                .collect();
            lines.sort();
            lines
        } else {
            vec!["hello from ".to_owned(), path.clone()]
        };
        let pause = if last == Some("slow") { 20 * MS } else { 0 };
        let response = OutgoingResponse::new(Fields::new());
        let _ = response.set_status_code(200);
        let Ok(body) = response.body() else {
            return;
        };
        ResponseOutparam::set(out, Ok(response));
        let Ok(stream) = body.write() else {
            return;
        };
        for piece in pieces {
            if stream.blocking_write_and_flush(piece.as_bytes()).is_err() {
                return;
            }
            if pause > 0 {
                monotonic_clock::subscribe_duration(pause).block();
            }
        }
        drop(stream);
        let _ = OutgoingBody::finish(body, None);
    }
}

/// Loops for ever without a call to the host.
fn spin() -> ! {
    let mut n = 0u64;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

export!(Hello);
