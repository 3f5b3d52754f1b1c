//! An off-the-shelf HTTP server made with `wstd`, the way its README makes one: a binary
//! whose `main` becomes the `wasi:http/incoming-handler`. As a wasm32-wasip2 binary it also
//! exports `wasi:cli/run`, whose `main` panics: a host must serve it, never run it.

use wstd::http::{Body, Error, Request, Response};

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, Error> {
    let path = request.uri().path().to_owned();
    Ok(Response::new(format!("hello from wstd {path}\n").into()))
}
