//! Test guest: one component that is a `vvm:host` service and an HTTP service at once. `run`
//! logs `both running term T` and counts `runs` in its key-value namespace, then waits for
//! the stop; every request is answered `200` with `both: term T, runs N` (N as `run` left it:
//! each request has its own instance, sharing only the store).

#![allow(missing_docs)]

wit_bindgen::generate!({
    inline: "
        package test:both;
        world both {
            include vvm:host/service@0.1.0;
            export wasi:http/incoming-handler@0.2.12;
        }
    ",
    path: "../../../wit",
    world: "test:both/both",
    generate_all,
});

use exports::wasi::http::incoming_handler::Guest as Handler;
use vvm::host::{lease, log};
use wasi::http::types::{
    Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
};
use wasi::keyvalue::{atomics, store};

struct Both;

impl Guest for Both {
    fn run() -> Result<(), String> {
        let term = lease::current().term;
        let bucket = store::open("default").map_err(|e| format!("{e:?}"))?;
        atomics::increment(&bucket, "runs", 1).map_err(|e| format!("{e:?}"))?;
        log::log(log::Level::Info, &format!("both running term {term}"));
        lease::stopping().block();
        Ok(())
    }
}

impl Handler for Both {
    fn handle(_request: IncomingRequest, out: ResponseOutparam) {
        let term = lease::current().term;
        let runs = store::open("default")
            .ok()
            .and_then(|b| b.get("runs").ok().flatten())
            .and_then(|v| String::from_utf8(v).ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        let response = OutgoingResponse::new(Fields::new());
        let _ = response.set_status_code(200);
        let Ok(body) = response.body() else {
            return;
        };
        ResponseOutparam::set(out, Ok(response));
        if let Ok(stream) = body.write() {
            let _ = stream
                .blocking_write_and_flush(format!("both: term {term}, runs {runs}").as_bytes());
        }
        let _ = OutgoingBody::finish(body, None);
    }
}

export!(Both);
