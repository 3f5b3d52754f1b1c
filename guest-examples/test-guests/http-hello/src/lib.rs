//! Test guest: a plain `wasi:http/proxy` component (no `vvm:host` import), as an off-the-shelf
//! HTTP component is. Every request is answered `200` with the body `hello from <path>` (the
//! path and query as received), written in two pieces so that the body is streamed.

#![allow(missing_docs)]

wit_bindgen::generate!({
    world: "wasi:http/proxy@0.2.12",
    path: "../../../wit",
    generate_all,
});

use exports::wasi::http::incoming_handler::Guest;
use wasi::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

struct Hello;

impl Guest for Hello {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let response = OutgoingResponse::new(Fields::new());
        let _ = response.set_status_code(200);
        let Ok(body) = response.body() else {
            return;
        };
        ResponseOutparam::set(out, Ok(response));
        let Ok(stream) = body.write() else {
            return;
        };
        for piece in ["hello from ", path.as_str()] {
            if stream.blocking_write_and_flush(piece.as_bytes()).is_err() {
                return;
            }
        }
        drop(stream);
        let _ = OutgoingBody::finish(body, None);
    }
}

export!(Hello);
