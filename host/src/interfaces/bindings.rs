//! The host side of the guest interfaces (SPEC §7, §10), generated from `wit/`: the
//! `vvm:host/service` world (`vvm:host`, `wasi:keyvalue@0.2.0-draft2` and
//! `wasi:config@0.2.0-draft`; WASI 0.2 itself is wasmtime-wasi's), and
//! `wasi:keyvalue@0.2.0-draft`, which components built for wasmtime's and wasmCloud's hosts
//! import; `fermyon:spin`'s key-value and variables, and `wasi:config@0.2.0-draft-2024-09-27`,
//! which Spin's SDKs import. The implementations are in `vvm`, `keyvalue`, `wasi_config` and
//! `spin`.

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

/// `fermyon:spin@2.0.0`'s `key-value` and `variables`, which components made with Spin's SDKs
/// import (`wit/spin`): a Spin `store` is a bucket of the same buckets.
pub(crate) mod spin {
    wasmtime::component::bindgen!({
        path: "wit/spin",
        world: "fermyon:spin/host",
        imports: { default: async | trappable },
        with: {
            "fermyon:spin/key-value.store": crate::interfaces::keyvalue::access::Bucket,
        },
    });
}

/// `spin:key-value@3.0.0`, which components made with Spin's current SDKs (WASI 0.3) import
/// (`wit/spin3`): its functions are async, called in the store's event loop with an
/// `Accessor`; a store is a bucket of the same buckets.
pub(crate) mod spin3 {
    wasmtime::component::bindgen!({
        path: "wit/spin3",
        world: "spin:key-value/host",
        imports: { default: trappable },
        with: {
            "spin:key-value/key-value.store": crate::interfaces::keyvalue::access::Bucket,
        },
        require_store_data_send: true,
    });
}

/// `spin:variables@3.0.0`, which components made with Spin's current SDKs import
/// (`wit/spin3-variables`).
pub(crate) mod spin3_variables {
    wasmtime::component::bindgen!({
        path: "wit/spin3-variables",
        world: "spin:variables/host",
        imports: { default: trappable },
        require_store_data_send: true,
    });
}

/// `wasi:config@0.2.0-draft-2024-09-27`, the version Spin's SDKs import (`wit/config-2024`).
pub(crate) mod config_2024 {
    wasmtime::component::bindgen!({
        path: "wit/config-2024",
        world: "wasi:config/imports",
        imports: { default: async | trappable },
    });
}

/// `wasi:keyvalue@0.2.0-draft2`'s `batch` as Spin ships it (`wit/keyvalue-spin`): the same
/// version as upstream's, another `get-many`. Its `store` is the `service` world's.
pub(crate) mod keyvalue_spin {
    wasmtime::component::bindgen!({
        path: "wit/keyvalue-spin",
        world: "wasi:keyvalue/spin-batch",
        imports: { default: async | trappable },
        with: {
            "wasi:keyvalue/store": super::service::wasi::keyvalue::store,
        },
    });
}

/// `fermyon:spin-cron@2.0.0`, the world a Spin cron component exports (`wit/spin-cron`):
/// `handle-cron-event`, called once per fire time.
pub(crate) mod spin_cron {
    wasmtime::component::bindgen!({
        path: "wit/spin-cron",
        world: "fermyon:spin-cron/spin-cron",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}
