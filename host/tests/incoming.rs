//! Incoming HTTP under a lease whose deadline the test moves (SPEC §10, "Incoming HTTP"):
//! the `test/http-hello` guest served by [`WasmServices`] in a [`MemStore`], asked over real
//! TCP. What a real process cannot show on cue: the moment the local deadline passes.

#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use testkit::http::raw_get;
use testkit::{guests, logs};
use tokio_util::sync::CancellationToken;
use vvm_host::clock::{Clock, ManualClock, SystemClock};
use vvm_host::lease::LeaseDeadline;
use vvm_host::lease_value::RunningReport;
use vvm_host::ops::Ops;
use vvm_host::problem::ProblemReporter;
use vvm_host::runtime::{RuntimeConfig, WasmServices};
use vvm_host::services::{LeaseInfo, ServiceContext, Services};
use vvm_host::store::{MemStore, TtlStore};

/// A connection to `addr` whose reads give up after 20 s (a host that never answers fails
/// the test's assertion, not a race).
fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    Ok(stream)
}

/// `test/http-hello` as service `hello`, served on a free loopback port under a lease whose
/// deadline the test moves.
struct Served {
    _dir: TempDir,
    addr: SocketAddr,
    term: u64,
    clock: Arc<SystemClock>,
    move_deadline: tokio::sync::watch::Sender<vvm_host::clock::Timestamp>,
    running: Box<dyn vvm_host::services::RunningServices>,
}

async fn serve(edit: impl FnOnce(&mut RuntimeConfig)) -> Served {
    logs::init();
    let dir = TempDir::new().unwrap();
    guests::install(dir.path(), &[("test/http-hello", "hello")]);
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = RuntimeConfig::new(dir.path());
    config.cache_dir = dir.path().join("cache");
    config.incoming_http.addr = Some(addr);
    edit(&mut config);
    let (services, _) =
        WasmServices::load(config, Ops::new(Arc::new(SystemClock::local()))).unwrap();
    let clock = Arc::new(SystemClock::local());
    let (move_deadline, deadline) =
        LeaseDeadline::manual(clock.clone(), clock.now().after(Duration::from_hours(1)));
    let store = MemStore::new(Arc::new(ManualClock::default()));
    let ttl = Duration::from_secs(20);
    let term = store
        .insert_if_absent("vvm/slot/1", "host-a", ttl)
        .await
        .unwrap()
        .unwrap();
    let ctx = ServiceContext {
        lease: LeaseInfo {
            slot: 1,
            key: "vvm/slot/1".into(),
            holder: "host-a".into(),
            term,
            lease: ttl,
        },
        deadline,
        stopping: CancellationToken::new(),
        problems: ProblemReporter::default(),
        store: Arc::new(store),
        running: RunningReport::detached(),
    };
    let running = services.start(ctx).await.unwrap();
    tokio::task::spawn_blocking(move || {
        // The listener opens as the service starts: the first connection not refused.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(std::time::Instant::now() < end, "never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .unwrap();
    Served {
        _dir: dir,
        addr,
        term,
        clock,
        move_deadline,
        running,
    }
}

/// Admission is under the lease: before the local deadline a request is served with the
/// term; once it has passed (the store may still say this host leads), a response in
/// progress is cut, never completed, and a new request is answered 503 with `Retry-After`
/// without reaching the guest. On stop the listener closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_lease_deadline_a_response_is_cut_and_a_request_is_503() {
    let Served {
        _dir,
        addr,
        term,
        clock,
        move_deadline,
        running,
    } = serve(|_| {}).await;
    let (slow, served) = tokio::task::spawn_blocking(move || {
        let served = raw_get(addr, "/hello/x");
        let mut slow = connect(addr).unwrap();
        write!(slow, "GET /hello/slow HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("chunk 1\n") {
            let n = slow.read(&mut buf).unwrap();
            assert!(n > 0, "closed before the first chunk");
            got.extend_from_slice(&buf[..n]);
        }
        (slow, served)
    })
    .await
    .unwrap();
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(
        served.contains(&format!("vvm-fencing-token: {term}\r\n")),
        "{served}"
    );

    move_deadline.send(clock.now()).unwrap();
    let (cut, refused) = tokio::task::spawn_blocking(move || {
        let mut slow = slow;
        let mut rest = Vec::new();
        // A reset ends it as well as a close.
        let _ = slow.read_to_end(&mut rest);
        (
            String::from_utf8_lossy(&rest).into_owned(),
            raw_get(addr, "/hello/late"),
        )
    })
    .await
    .unwrap();
    assert!(!cut.contains("chunk 500\n"), "the whole body came: {cut}");
    assert!(
        !cut.ends_with("\r\n0\r\n\r\n"),
        "the body looks complete: {cut}"
    );
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let lower = refused.to_ascii_lowercase();
    assert!(lower.contains("\r\nretry-after: 1\r\n"), "{refused}");
    assert!(
        !lower.contains("hello from"),
        "the guest answered: {refused}"
    );

    running.stop().await;
    let closed = connect(addr).unwrap_err();
    assert_eq!(closed.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// With the pooling allocator (on with `http-addr`) full, a request that gets no instance is
/// answered 503 with `Retry-After` (not 500: the client may try again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_gets_no_instance_is_503() {
    let served = serve(|config| {
        config.pooling = true;
        config.max_instances = 1;
    })
    .await;
    let addr = served.addr;
    let (waiting, full) = tokio::task::spawn_blocking(move || {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            // A request that holds the one instance for a minute, unless it finds the
            // instance taken (by the last request's handler, still returning): then it is
            // answered at once, and asked again.
            let mut waiting = connect(addr).unwrap();
            write!(waiting, "GET /hello/wait HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            waiting.set_nonblocking(true).unwrap();
            loop {
                assert!(std::time::Instant::now() < end, "the pool never filled");
                let answer = raw_get(addr, "/hello/x");
                if !answer.starts_with("HTTP/1.1 200") {
                    return (waiting, answer);
                }
                if waiting.peek(&mut [0u8; 1]).is_ok() {
                    break;
                }
            }
        }
    })
    .await
    .unwrap();
    assert!(full.starts_with("HTTP/1.1 503"), "{full}");
    assert!(
        full.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
        "{full}"
    );
    drop(waiting);
    served.running.stop().await;
}

/// A handler that spins past the request timeout is answered 504, every time: the call is
/// cut at the same instant the request gives up on it, and which of the two the host sees
/// first must not turn the 504 into a 500 ("the handler gave no response").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_the_request_timeout_is_always_504() {
    let served = serve(|config| {
        config.incoming_http.request_timeout = Duration::from_millis(5);
    })
    .await;
    let addr = served.addr;
    // Eight clients at once, so that the workers are busy with spinning guests (as on a
    // loaded machine) when the timeouts fire.
    let clients: Vec<_> = (0..8)
        .map(|_| {
            tokio::task::spawn_blocking(move || {
                (0..50)
                    .map(|_| raw_get(addr, "/hello/spin"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut wrong = Vec::new();
    for client in clients {
        let answers = client.await.unwrap();
        wrong.extend(
            answers
                .into_iter()
                .filter(|a| !a.starts_with("HTTP/1.1 504")),
        );
    }
    assert!(
        wrong.is_empty(),
        "{} of 400: {:?}",
        wrong.len(),
        wrong.first()
    );
    served.running.stop().await;
}
