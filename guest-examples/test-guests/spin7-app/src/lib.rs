//! Test guest: an HTTP component made with Spin's current Rust SDK (`spin-sdk` 7.0.0, WASI
//! 0.3: `wasi:http/handler@0.3.0`, `spin:key-value@3.0.0`, `spin:variables@3.0.0`), as its
//! documentation shows one, unchanged. Routed at `/items/:id` by its host: it adds one to
//! `count` in its default store and answers `GREETING item ID count N`, ID from Spin's
//! `spin-path-match-id` header, GREETING the variable `greeting`.

#![allow(missing_docs)]

use spin_sdk::http::{IntoResponse, Request, StatusCode};
use spin_sdk::{http_service, key_value, variables};

#[http_service]
async fn handle(req: Request) -> impl IntoResponse {
    let id = req
        .headers()
        .get("spin-path-match-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned();
    let store = match key_value::Store::open_default().await {
        Ok(store) => store,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("open: {e:?}\n")),
    };
    let count = match store.get("count").await {
        Ok(Some(v)) => String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0),
        Ok(None) => 0,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("get: {e:?}\n")),
    } + 1;
    if let Err(e) = store.set("count", count.to_string().as_bytes()).await {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("set: {e:?}\n"));
    }
    let greeting = variables::get("greeting")
        .await
        .unwrap_or_else(|e| format!("(no greeting: {e:?})"));
    (StatusCode::OK, format!("{greeting} item {id} count {count}\n"))
}
