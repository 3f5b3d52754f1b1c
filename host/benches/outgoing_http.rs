//! Outgoing HTTP (SPEC §10): requests per second from one guest (`test/http-client`, mode
//! `bench`: sequential GETs through `wasi:http/outgoing-handler`, timed in the guest) to a
//! local hyper server, beside the same requests sent by a plain Rust hyper client in the same
//! run: all on one kept-alive connection, as the guest's are (its service keeps connections
//! alive, issue 52), and, for scale, one connection per request.
//!
//! Run with `cargo bench -p vvm-host --bench outgoing_http`. `VVM_BENCH_REQUESTS` sets the
//! requests per row (default 2000); every row is run `VVM_BENCH_ROUNDS` times (default 3),
//! the rows taking turns, and the table shows each round's rate.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use vvm_host::clock::{Clock, SystemClock};
use vvm_host::interfaces::{HttpPolicy, OutgoingLimits};
use vvm_host::lease::LeaseDeadline;
use vvm_host::ops::Ops;
use vvm_host::problem::ProblemReporter;
use vvm_host::runtime::{Grants, RuntimeConfig, WasmServices};
use vvm_host::services::{LeaseInfo, ServiceContext, Services};
use vvm_host::store::{FencedKv as _, MemStore, Store, TtlStore};
use wasmtime_wasi_http::io::TokioIo;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench());
}

fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn bench() {
    let requests = env_number("VVM_BENCH_REQUESTS", 2000);
    let rounds = env_number("VVM_BENCH_ROUNDS", 3);
    let addr = serve().await;
    println!("outgoing HTTP GETs to a local hyper server, {requests} per row, requests per second");
    print!("{:<44} ", "client");
    for r in 1..=rounds {
        print!("{:>10}", format!("round {r}"));
    }
    println!();
    let mut plain = Vec::new();
    let mut kept = Vec::new();
    let mut guest = Vec::new();
    for _ in 0..rounds {
        plain.push(per_second(requests, hyper_per_connection(addr, requests)).await);
        kept.push(per_second(requests, hyper_kept_alive(addr, requests)).await);
        guest.push(guest_per_second(addr, requests).await);
    }
    let row = |name: &str, cells: &[f64], digits: usize| {
        print!("{name:<44} ");
        for cell in cells {
            print!("{cell:>10.digits$}");
        }
        println!();
    };
    row("plain hyper, a connection per request", &plain, 0);
    row("plain hyper, one kept-alive connection", &kept, 0);
    row("guest wasi:http (vvm-host), kept alive", &guest, 0);
    let ratios: Vec<f64> = guest.iter().zip(&kept).map(|(g, k)| g / k).collect();
    row("ratio guest / plain hyper kept alive", &ratios, 2);
}

/// A hyper HTTP/1 server on loopback answering `ok` to everything; its address.
async fn serve() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn per_second(requests: u32, run: impl Future<Output = ()>) -> f64 {
    let start = Instant::now();
    run.await;
    f64::from(requests) / start.elapsed().as_secs_f64()
}

fn get(addr: SocketAddr) -> hyper::Request<Empty<Bytes>> {
    hyper::Request::get("/bench")
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::new())
        .expect("request")
}

/// `requests` GETs, each on a new connection, as `wasi:http` makes them.
async fn hyper_per_connection(addr: SocketAddr, requests: u32) {
    for _ in 0..requests {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        // The connection closes on its own once the response is read, as the guest's do.
        tokio::spawn(conn);
        let response = sender.send_request(get(addr)).await.expect("response");
        response.into_body().collect().await.expect("body");
    }
}

/// `requests` GETs on one kept-alive connection.
async fn hyper_kept_alive(addr: SocketAddr, requests: u32) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let driver = tokio::spawn(conn);
    for _ in 0..requests {
        sender.ready().await.expect("ready");
        let response = sender.send_request(get(addr)).await.expect("response");
        response.into_body().collect().await.expect("body");
    }
    drop(sender);
    let _ = driver.await;
}

/// The `test/http-client` guest's rate: `requests` GETs through `wasi:http`, timed by the
/// guest itself, which stores the nanoseconds under `result/http` in its bucket.
async fn guest_per_second(addr: SocketAddr, requests: u32) -> f64 {
    let services = tempfile::tempdir().expect("services dir");
    testkit::guests::install(services.path(), &[("test/http-client", "bench")]);
    let mut config = RuntimeConfig::new(services.path());
    let origin = format!("http://{addr}");
    let policy = HttpPolicy::new(
        std::slice::from_ref(&origin),
        None,
        OutgoingLimits::default(),
    )
    .expect("policy");
    let grants = Grants {
        env: vec![
            ("URL".to_owned(), format!("{origin}/bench")),
            ("MODE".to_owned(), "bench".to_owned()),
            ("COUNT".to_owned(), requests.to_string()),
        ],
        http: Arc::new(policy),
        ..Grants::default()
    };
    config.grants.insert("bench".to_owned(), grants);
    let clock = Arc::new(SystemClock::local());
    let store = Arc::new(MemStore::new(clock.clone()));
    let lease = Duration::from_mins(10);
    let term = store
        .insert_if_absent("bench", "me", lease)
        .await
        .expect("insert")
        .expect("free");
    let (wasm, errors) = WasmServices::load(config, Ops::new(clock.clone())).expect("load");
    assert!(errors.is_empty(), "{errors:?}");
    let context = ServiceContext {
        lease: LeaseInfo {
            slot: 1,
            key: "bench".into(),
            holder: "me".into(),
            term,
            lease,
        },
        deadline: LeaseDeadline::fixed(clock.clone(), clock.now().after(lease)),
        stopping: CancellationToken::new(),
        problems: ProblemReporter::default(),
        store: Arc::clone(&store) as Arc<dyn Store>,
        running: vvm_host::lease_value::RunningReport::detached(),
    };
    let running = wasm.start(context).await.expect("start");
    // The guest writes its result last: wait for it (a benchmark may poll).
    let nanos = loop {
        if let Some(v) = store.kv_get("bench", "result/http").await.expect("kv_get") {
            break String::from_utf8(v)
                .expect("text")
                .parse::<f64>()
                .expect("nanoseconds");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    running.stop().await;
    f64::from(requests) / (nanos / 1e9)
}
