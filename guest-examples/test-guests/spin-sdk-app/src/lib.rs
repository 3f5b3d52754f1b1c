//! Test guest: a Spin HTTP app written with spin-sdk 5.2.0 as Spin's docs write one, built with
//! plain `cargo build --target wasm32-wasip2` and served by vvm-host unchanged (issue 41).
//! It exports `wasi:http/incoming-handler@0.2.0` and imports `fermyon:spin/key-value@2.0.0`
//! and `fermyon:spin/variables@2.0.0`. Routes (the SDK's `Router`, on the full path):
//! - `GET /items/:id`: `200` with the value of key `id` in the default store, or `404`
//!   `no item <id>`;
//! - `POST /items/:id`: stores the body under key `id` in the default store, `200` `stored <id>`;
//! - both item answers carry `item-id` (the SDK router's `:id`) and `item-path-match-id` (the
//!   request's `spin-path-match-id` header from the host, `-` when absent);
//! - `GET /count`: adds one to key `hits` (a decimal number, 0 when absent) in the default
//!   store, `200` `hits N`;
//! - `GET /var/:name`: `200` with the variable's value, or the error's Display with `404` for
//!   `undefined` and `500` for any other error;
//! - `GET /open/:label`: `200` with `ok`, or the error's variant name (`no-such-store`,
//!   `access-denied`, `store-table-full`, `other: <message>`) when `Store::open(label)` fails;
//! - a store that cannot be opened or used in the routes above: `500` `key-value: <Display>`;
//! - anything else: the SDK router's `404` (`405` for a known path with another method).

use spin_sdk::http::{IntoResponse, Params, Request, Response, Router};
use spin_sdk::http_component;
use spin_sdk::key_value::{Error as KvError, Store};
use spin_sdk::variables;

#[http_component]
fn handle(req: Request) -> Response {
    let mut router = Router::new();
    router.get("/items/:id", get_item);
    router.post("/items/:id", post_item);
    router.get("/count", count);
    router.get("/var/:name", get_var);
    router.get("/open/:label", open_store);
    router.handle(req)
}

fn get_item(req: Request, params: Params) -> anyhow::Result<Response> {
    let id = params.get("id").unwrap_or_default();
    let store = match Store::open_default() {
        Ok(store) => store,
        Err(e) => return Ok(kv_error(e)),
    };
    let response = match store.get(id) {
        Ok(Some(value)) => item_response(200, &req, id, value),
        Ok(None) => item_response(404, &req, id, format!("no item {id}")),
        Err(e) => kv_error(e),
    };
    Ok(response)
}

fn post_item(req: Request, params: Params) -> anyhow::Result<Response> {
    let id = params.get("id").unwrap_or_default();
    let store = match Store::open_default() {
        Ok(store) => store,
        Err(e) => return Ok(kv_error(e)),
    };
    let response = match store.set(id, req.body()) {
        Ok(()) => item_response(200, &req, id, format!("stored {id}")),
        Err(e) => kv_error(e),
    };
    Ok(response)
}

fn item_response(status: u16, req: &Request, id: &str, body: impl Into<Vec<u8>>) -> Response {
    let path_match = req
        .header("spin-path-match-id")
        .and_then(|v| v.as_str())
        .unwrap_or("-");
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .header("item-id", id)
        .header("item-path-match-id", path_match)
        .body(body.into())
        .build()
}

fn count(_req: Request, _params: Params) -> impl IntoResponse {
    let store = match Store::open_default() {
        Ok(store) => store,
        Err(e) => return kv_error(e),
    };
    let hits = match store.get("hits") {
        Ok(value) => {
            value
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
                + 1
        }
        Err(e) => return kv_error(e),
    };
    if let Err(e) = store.set("hits", hits.to_string().as_bytes()) {
        return kv_error(e);
    }
    text(200, format!("hits {hits}"))
}

fn get_var(_req: Request, params: Params) -> impl IntoResponse {
    let name = params.get("name").unwrap_or_default();
    match variables::get(name) {
        Ok(value) => text(200, value),
        Err(e @ variables::Error::Undefined(_)) => text(404, e.to_string()),
        Err(e) => text(500, e.to_string()),
    }
}

fn open_store(_req: Request, params: Params) -> impl IntoResponse {
    let label = params.get("label").unwrap_or_default();
    let answer = match Store::open(label) {
        Ok(_) => "ok".to_owned(),
        Err(KvError::NoSuchStore) => "no-such-store".to_owned(),
        Err(KvError::AccessDenied) => "access-denied".to_owned(),
        Err(KvError::StoreTableFull) => "store-table-full".to_owned(),
        Err(KvError::Other(message)) => format!("other: {message}"),
    };
    text(200, answer)
}

fn kv_error(e: KvError) -> Response {
    text(500, format!("key-value: {e}"))
}

fn text(status: u16, body: impl Into<Vec<u8>>) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(body.into())
        .build()
}
