//! Test guest: a WASI 0.3 HTTP service (`wasi:http/handler@0.3.0`), made with the `wasip3`
//! crate as a user of today's toolchains makes one. By the request path's last segment:
//! - `delay` (query `ms=N&id=K`): prints `begin K`, waits N ms, prints `effect K` (a guest
//!   effect, which the host logs), then answers `done K`; many of them run at once in one
//!   instance;
//! - `count`: `count N instance X`, N the requests this instance has begun (a global), X a
//!   number it drew at its first;
//! - `out`: sends `GET` to the URL in its environment variable `URL` through
//!   `wasi:http/client@0.3.0` and answers `upstream STATUS`, or `send failed: ERROR`;
//! - anything else: `hello from p3 PATH`.

#![allow(missing_docs)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use wasip3::clocks::monotonic_clock;
use wasip3::http::types::{ErrorCode, Fields, Method, Request, Response, Scheme};
use wasip3::{wit_future, wit_stream};

wasip3::http::service::export!(P3);

struct P3;

/// Requests this instance has begun.
static COUNT: AtomicU32 = AtomicU32::new(0);
/// This instance's random number, drawn at its first `count`.
static INSTANCE: OnceLock<u64> = OnceLock::new();

impl wasip3::exports::http::handler::Guest for P3 {
    async fn handle(request: Request) -> Result<Response, ErrorCode> {
        let count = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
        let path = request.get_path_with_query().unwrap_or_default();
        let (route, query) = path.split_once('?').unwrap_or((&path, ""));
        let last = route.rsplit('/').next().unwrap_or_default();
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_default()
                .to_owned()
        };
        let body = match last {
            "delay" => {
                let ms: u64 = param("ms").parse().unwrap_or(0);
                let id = param("id");
                println!("begin {id}");
                monotonic_clock::wait_for(ms * 1_000_000).await;
                println!("effect {id}");
                format!("done {id}")
            }
            "count" => {
                let id = *INSTANCE.get_or_init(wasip3::random::random::get_random_u64);
                format!("count {count} instance {id:016x}")
            }
            "out" => match outgoing().await {
                Ok(status) => format!("upstream {status}"),
                Err(e) => format!("send failed: {e:?}"),
            },
            _ => format!("hello from p3 {path}"),
        };
        Ok(text(body))
    }
}

/// A `200` whose body, `body`, is written after the head is returned.
fn text(body: String) -> Response {
    let headers = Fields::from_list(&[("content-type".into(), b"text/plain".to_vec())])
        .unwrap_or_else(|_| Fields::new());
    let (mut body_tx, body_rx) = wit_stream::new();
    let (trailers_tx, trailers_rx) = wit_future::new(|| Ok(None));
    let (response, _sent) = Response::new(headers, Some(body_rx), trailers_rx);
    drop(trailers_tx);
    wasip3::spawn(async move {
        let rest = body_tx.write_all(body.into_bytes()).await;
        assert!(rest.is_empty());
    });
    response
}

/// `GET` of the URL in `URL` (`http://host:port/path`): its status.
async fn outgoing() -> Result<u16, ErrorCode> {
    let url = std::env::var("URL").unwrap_or_default();
    let rest = url.strip_prefix("http://").unwrap_or(&url);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (_, trailers) = wit_future::new(|| Ok(None));
    let (request, _sent) = Request::new(Fields::new(), None, trailers, None);
    let _ = request.set_method(&Method::Get);
    let _ = request.set_scheme(Some(&Scheme::Http));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
    let response = wasip3::http::client::send(request).await?;
    Ok(response.get_status_code())
}
