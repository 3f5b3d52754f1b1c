//! Test guest: a plain `wasi:http/proxy` component (no `vvm:host` import), as an off-the-shelf
//! HTTP component is. By the request path's last segment:
//! - `spin`: spins for ever, never answering (a handler the request timeout must stop);
//! - `wait`: answers after a minute (holding a place in its service's concurrency);
//! - `slow`: answers `200` at once, then streams `chunk N\n` for N in 1..=500, one every
//!   20 ms (a response in progress for ten seconds);
//! - `headers`: `200` with the request's `spin-*` headers, a `NAME: VALUE` line each, sorted;
//! - `count`: `200` with `count N instance X`: N counts the requests this instance has served
//!   (a global), X is a random number the instance drew at its first (instance reuse);
//! - `trap`: traps before answering (a panic);
//! - `grow`: asks for 512 MiB, past any memory cap, and traps when refused;
//! - anything else: `200` with the body `hello from <path>` (the path and query as
//!   received), written in two pieces so that the body is streamed.

#![allow(missing_docs)]

wit_bindgen::generate!({
    world: "wasi:http/proxy@0.2.12",
    path: "../../../wit",
    generate_all,
});

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use exports::wasi::http::incoming_handler::Guest;
use wasi::clocks::monotonic_clock;
use wasi::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

struct Hello;

/// Requests this instance has begun.
static COUNT: AtomicU32 = AtomicU32::new(0);
/// This instance's random number, drawn at its first `count`.
static INSTANCE: OnceLock<u64> = OnceLock::new();

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
        let count = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
        match last {
            Some("spin") => spin(),
            Some("wait") => monotonic_clock::subscribe_duration(60_000 * MS).block(),
            Some("trap") => panic!("trap asked for"),
            Some("grow") => {
                let big: Vec<u8> = vec![1; 512 << 20];
                std::hint::black_box(&big);
            }
            _ => {}
        }
        let pieces: Vec<String> = if last == Some("count") {
            let id = *INSTANCE.get_or_init(wasi::random::random::get_random_u64);
            vec![format!("count {count} instance {id:016x}")]
        } else if last == Some("slow") {
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
