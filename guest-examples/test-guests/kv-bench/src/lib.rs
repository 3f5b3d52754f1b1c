//! Benchmark guest (`host/benches/store.rs`): times `KV_OPS` (granted environment variable,
//! default 500) calls each of `wasi:keyvalue` get, set, increment and cas (a `cas` handle and
//! its `swap`) on its own bucket, one after the other, then writes each run's nanoseconds
//! under `result/<op>` and returns. Any refused call fails the run with its error.

use vvm_guest::wasi::clocks::monotonic_clock;
use vvm_guest::wasi::keyvalue::{atomics, store};
use vvm_guest::{Guest, info};

struct Bench;

fn text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

/// The nanoseconds `n` calls of `call` take.
fn timed(n: u64, mut call: impl FnMut(u64) -> Result<(), String>) -> Result<u64, String> {
    let start = monotonic_clock::now();
    for i in 0..n {
        call(i)?;
    }
    Ok(monotonic_clock::now() - start)
}

impl Guest for Bench {
    fn run() -> Result<(), String> {
        let n: u64 = std::env::var("KV_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500);
        let bucket = store::open("").map_err(text)?;
        bucket.set("get", b"value").map_err(text)?;
        let get = timed(n, |_| bucket.get("get").map(drop).map_err(text))?;
        let set = timed(n, |i| {
            bucket.set("set", i.to_string().as_bytes()).map_err(text)
        })?;
        let increment = timed(n, |_| {
            atomics::increment(&bucket, "count", 1)
                .map(drop)
                .map_err(text)
        })?;
        let cas = timed(n, |i| {
            let cas = atomics::Cas::new(&bucket, "cas").map_err(text)?;
            atomics::swap(cas, i.to_string().as_bytes()).map_err(|e| match e {
                atomics::CasError::StoreError(e) => text(e),
                atomics::CasError::CasFailed(_) => "cas lost".to_owned(),
            })
        })?;
        for (op, ns) in [
            ("get", get),
            ("set", set),
            ("increment", increment),
            ("cas", cas),
        ] {
            bucket
                .set(&format!("result/{op}"), ns.to_string().as_bytes())
                .map_err(text)?;
        }
        info(&format!("kv-bench: {n} calls each done"));
        Ok(())
    }
}

vvm_guest::export!(Bench);
