//! An off-the-shelf `wasi:http/proxy` component made with the `wasi` crate alone, as the
//! crate's own example makes one.

use std::io::Write as _;

use wasi::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

struct Hello;

impl wasi::exports::http::incoming_handler::Guest for Hello {
    fn handle(request: IncomingRequest, response_out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let response = OutgoingResponse::new(Fields::new());
        let body = response.body().expect("the body of a new response");
        ResponseOutparam::set(response_out, Ok(response));
        let mut out = body.write().expect("the body's stream");
        out.write_all(format!("hello from wasi {path}\n").as_bytes())
            .expect("write the body");
        out.flush().expect("flush the body");
        drop(out);
        OutgoingBody::finish(body, None).expect("finish the body");
    }
}

wasi::http::proxy::export!(Hello);
