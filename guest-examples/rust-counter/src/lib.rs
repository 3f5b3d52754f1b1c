//! Example service: every tick (1 s) adds one to `count` in the term-fenced key-value store
//! with `wasi:keyvalue` `increment`, atomically in the store. A write under a stale term
//! fails, and the service returns that error. It greets with `greeting` from its
//! configuration (`wasi:config`, `[service.rust-counter.config]` in vvm.toml).
//!
//! With `notify-url` in its configuration, it also POSTs `rust-counter count N term T` to that
//! URL after every increment (`wasi:http`, through `vvm_guest::http`) and logs the status or
//! the error. The operator must grant the URL's origin (`http = ["http://127.0.0.1:8080"]`
//! under `[service.rust-counter]`), or every request fails with `HttpRequestDenied`.

use std::time::Duration;

use vvm_guest::log::{Level, log};
use vvm_guest::wasi::config::store as config;
use vvm_guest::wasi::keyvalue::{atomics, store};
use vvm_guest::{Guest, http, info, lease, sleep_or_stop, tick};

struct Counter;

/// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
/// `over a limit: ...`, or access denied.
fn error_text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

/// Tells `url` the new count; a failure is logged, not fatal: the count is already stored.
/// The URL is not logged: the operator may have given it as a secret (`{ env = ... }`).
fn notify(url: &str, count: i64, term: u64) {
    let body = format!("rust-counter count {count} term {term}");
    let headers = [("content-type", "text/plain")];
    match http::request("POST", url, &headers, body.as_bytes()) {
        Ok(response) => info(&format!("notify: status {}", response.status)),
        Err(e) => log(Level::Warn, &format!("notify failed: {e}")),
    }
}

impl Guest for Counter {
    fn run() -> Result<(), String> {
        let lease = lease::current();
        let stopping = lease::stopping();
        let period = tick(Duration::from_secs(1));
        let greeting = config::get("greeting")
            .ok()
            .flatten()
            .unwrap_or_else(|| "hello".to_owned());
        let notify_url = config::get("notify-url").ok().flatten();
        info(&format!("counter started: term {}; {greeting}", lease.term));
        // The keys only: a value may be a secret the operator gave it.
        let keys: Vec<String> = config::get_all()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        info(&format!("config keys: [{}]", keys.join(", ")));
        // "" is the service's own namespace.
        let bucket = store::open("").map_err(error_text)?;
        loop {
            let count = atomics::increment(&bucket, "count", 1).map_err(|e| {
                let e = error_text(e);
                log(Level::Error, &format!("increment failed: {e}"));
                e
            })?;
            info(&format!("count {count}"));
            if let Some(url) = &notify_url {
                notify(url, count, lease.term);
            }
            if sleep_or_stop(&stopping, period) {
                return Ok(());
            }
        }
    }
}

vvm_guest::export!(Counter);
