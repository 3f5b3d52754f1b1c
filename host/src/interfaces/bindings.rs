//! The host side of the guest interfaces (SPEC §7, §10), generated from `wit/`: the
//! `vvm:host/service` world (`vvm:host`, `wasi:keyvalue@0.2.0-draft2` and
//! `wasi:config@0.2.0-draft`; WASI 0.2 itself is wasmtime-wasi's), and
//! `wasi:keyvalue@0.2.0-draft`, which components built for wasmtime's and wasmCloud's hosts
//! import. The implementations are in `vvm`, `keyvalue` and `wasi_config`.

/// The `vvm:host/service` world.
pub(crate) mod service {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "vvm:host/service",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "wasi:cli": wasmtime_wasi::p2::bindings::cli,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
            "wasi:filesystem": wasmtime_wasi::p2::bindings::filesystem,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:random": wasmtime_wasi::p2::bindings::random,
            "wasi:sockets": wasmtime_wasi::p2::bindings::sockets,
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:keyvalue/store.bucket": crate::interfaces::keyvalue::access::Bucket,
            "wasi:keyvalue/atomics.cas": crate::interfaces::keyvalue::access::Cas,
        },
    });
}

/// `wasi:keyvalue@0.2.0-draft`: the same buckets, with numbered cursors and no `cas`.
pub(crate) mod keyvalue_draft {
    wasmtime::component::bindgen!({
        path: "wit/keyvalue-draft",
        world: "wasi:keyvalue/imports",
        imports: { default: async | trappable },
        with: {
            "wasi:keyvalue/store.bucket": crate::interfaces::keyvalue::access::Bucket,
        },
    });
}
