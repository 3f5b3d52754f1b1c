//! Tests of the etcd backend against a real `etcd` child process.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::etcd::{EtcdServer, ServerTls, free_ports};

use super::*;
use crate::clock::ManualClock;
use crate::store::conformance::{self, Backend, SetOne};
use crate::store::{Fence, FencedKv};

/// One etcd per test case; every open connects a new client to it.
pub(super) struct Etcd {
    server: EtcdServer,
}

impl Etcd {
    pub(super) fn start() -> Option<Self> {
        EtcdServer::start().map(|server| Self { server })
    }

    fn options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.server.endpoint()],
            ..EtcdOptions::default()
        }
    }

    pub(super) async fn store(&self) -> EtcdStore {
        EtcdStore::connect(self.options()).await.unwrap()
    }

    /// A plain client for looking behind the store's back.
    async fn raw(&self) -> Client {
        Client::connect([self.server.endpoint()], None)
            .await
            .unwrap()
    }
}

impl Backend for Etcd {
    type Store = EtcdStore;
    const PERSISTENT: bool = true;
    const EXACT_CLOCK: bool = false;
    const TTL: Duration = Duration::from_secs(3);
    // The leader sweeps expired leases every 500 ms; the rest is headroom for a busy CI.
    const EXPIRY_LAG: Duration = Duration::from_millis(1500);

    async fn open(&mut self, _clock: &ManualClock) -> EtcdStore {
        self.store().await
    }

    /// The cluster keeps its own time: let it pass.
    async fn advance(&mut self, _clock: &ManualClock, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

conformance::suite!(optional: Etcd::start());

/// Number of leases the cluster holds.
async fn lease_count(raw: &mut Client) -> usize {
    raw.leases().await.unwrap().leases().len()
}

#[tokio::test]
async fn ttl_is_rounded_up_to_whole_seconds() {
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    for (ttl, secs) in [
        (Duration::from_nanos(1), 1),
        (Duration::from_millis(1200), 2),
    ] {
        s.insert_if_absent("k", "a", ttl).await.unwrap().unwrap();
        assert_eq!(
            s.get("k").await.unwrap().unwrap().time_left,
            Duration::from_secs(secs)
        );
        assert!(s.compare_and_delete("k", "a").await.unwrap());
    }
}

#[tokio::test]
async fn swap_uses_the_new_ttl_and_no_lease_is_left_behind() {
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    let mut raw = etcd.raw().await;
    s.insert_if_absent("k", "a", Duration::from_mins(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        s.insert_if_absent("k", "b", Duration::from_mins(1))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        lease_count(&mut raw).await,
        1,
        "the failed insert's lease is revoked"
    );
    // A keep-alive would restore 60 s; the contract says expiry becomes now + the new TTL.
    assert!(
        s.compare_and_swap("k", "a", "a", Duration::from_secs(2))
            .await
            .unwrap()
    );
    assert_eq!(
        s.get("k").await.unwrap().unwrap().time_left,
        Duration::from_secs(2)
    );
    assert!(
        !s.compare_and_swap("k", "x", "a", Duration::from_secs(9))
            .await
            .unwrap()
    );
    assert_eq!(
        lease_count(&mut raw).await,
        1,
        "old and unused leases are revoked"
    );
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    assert_eq!(lease_count(&mut raw).await, 0);
}

#[tokio::test]
async fn wait_released_wakes_on_expiry() {
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    s.insert_if_absent("k", "a", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let start = Instant::now();
    s.wait_released(Duration::from_secs(30)).await;
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
    assert!(
        s.get("k").await.unwrap().is_none(),
        "woke because the record expired"
    );
}

#[tokio::test]
async fn wait_released_sees_a_delete_between_get_and_wait() {
    let Some(etcd) = Etcd::start() else { return };
    let (waiter, holder) = (etcd.store().await, etcd.store().await);
    holder
        .insert_if_absent("k", "a", Duration::from_mins(1))
        .await
        .unwrap()
        .unwrap();
    assert!(waiter.get("k").await.unwrap().is_some());
    assert!(holder.compare_and_delete("k", "a").await.unwrap());
    // The delete happened before the watch exists; the watch starts at the revision the
    // waiter's get saw, so it still reports it.
    tokio::time::timeout(
        Duration::from_secs(10),
        waiter.wait_released(Duration::from_mins(1)),
    )
    .await
    .expect("woke for the earlier delete");
}

/// A handover wakes the waiting candidate, and the watch that woke it tells it the record it
/// was handed, with the handover's term and its own lease's time left: it takes the lease over
/// with no read. Another waiter (not the candidate) is told nothing and reads.
#[tokio::test]
async fn a_candidate_woken_by_a_handover_is_told_its_record_without_a_read() {
    let Some(etcd) = Etcd::start() else { return };
    let (holder, candidate, other) = (
        etcd.store().await,
        Arc::new(etcd.store().await),
        Arc::new(etcd.store().await),
    );
    let lease = Duration::from_secs(30);
    holder
        .insert_if_absent("slot/1", "a", lease)
        .await
        .unwrap()
        .unwrap();
    candidate
        .insert_if_absent("cand/b", "b", lease)
        .await
        .unwrap()
        .unwrap();
    // Both have looked (the watch starts after what they saw), then wait.
    assert!(candidate.get("slot/1").await.unwrap().is_some());
    assert!(other.get("slot/1").await.unwrap().is_some());
    let waiting = |s: &Arc<EtcdStore>| {
        let s = Arc::clone(s);
        tokio::spawn(async move { s.wait_released(Duration::from_mins(1)).await })
    };
    let (woken, other_woken) = (waiting(&candidate), waiting(&other));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let handed = holder
        .hand_over("slot/1", "a", &Candidates::any("cand/"), lease)
        .await
        .unwrap();
    let HandOver::To { to, term } = handed else {
        panic!("not handed over: {handed:?}");
    };
    assert_eq!(to, "b");
    for waiter in [woken, other_woken] {
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the handover woke the waiter")
            .unwrap();
    }
    let told = candidate.handed("slot/1").expect("told without a read");
    assert_eq!((told.value.as_str(), told.term), ("b", term));
    assert!(told.lives_at_least >= Duration::from_secs(20), "{told:?}");
    assert!(told.time_left >= told.lives_at_least);
    let read = candidate.get("slot/1").await.unwrap().unwrap();
    assert_eq!((read.value, read.term), (told.value, told.term));
    assert!(candidate.handed("slot/1").is_none(), "told once");
    assert!(
        other.handed("slot/1").is_none(),
        "not on its lease: it reads"
    );
}

#[tokio::test]
async fn writes_do_not_wake_a_waiter() {
    let Some(etcd) = Etcd::start() else { return };
    let s = Arc::new(etcd.store().await);
    let start = Instant::now();
    let waiter = tokio::spawn({
        let s = Arc::clone(&s);
        async move { s.wait_released(Duration::from_secs(2)).await }
    });
    s.insert_if_absent("k", "a", Duration::from_mins(1))
        .await
        .unwrap()
        .unwrap();
    assert!(
        s.compare_and_swap("k", "a", "b", Duration::from_mins(1))
            .await
            .unwrap()
    );
    waiter.await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn prefixes_and_kv_spaces_are_apart() {
    let Some(etcd) = Etcd::start() else { return };
    let a = etcd.store().await;
    let b = EtcdStore::connect(EtcdOptions {
        prefix: "other/".into(),
        ..etcd.options()
    })
    .await
    .unwrap();
    let term = a
        .insert_if_absent("k", "a", Duration::from_mins(1))
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.insert_if_absent("k", "b", Duration::from_mins(1))
            .await
            .unwrap()
            .is_some()
    );
    let fence = Fence {
        writer: "svc",
        lease_key: "k",
        term,
    };
    assert!(a.kv_set(&fence, "s/x", "y", b"1").await.unwrap());
    assert!(a.kv_set(&fence, "s", "x/y", b"2").await.unwrap());
    assert_eq!(
        a.kv_get("s/x", "y").await.unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(
        a.kv_get("s", "x/y").await.unwrap().as_deref(),
        Some(&b"2"[..])
    );
    assert_eq!(b.kv_get("s", "x/y").await.unwrap(), None);
}

#[tokio::test]
async fn unreachable_endpoint_is_transient_and_quick() {
    let [port] = free_ports();
    let endpoint = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let err = EtcdStore::connect(EtcdOptions {
        endpoints: vec![endpoint.clone()],
        connect_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(500),
        ..EtcdOptions::default()
    })
    .await
    .err()
    .expect("nothing listens there");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains(&endpoint), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_dead_cluster_fails_calls_within_the_request_timeout() {
    let Some(etcd) = Etcd::start() else { return };
    let s = EtcdStore::connect(EtcdOptions {
        request_timeout: Duration::from_millis(500),
        ..etcd.options()
    })
    .await
    .unwrap();
    s.insert_if_absent("k", "a", Duration::from_mins(1))
        .await
        .unwrap()
        .unwrap();
    drop(etcd);
    let start = Instant::now();
    let err = s
        .compare_and_swap("k", "a", "a", Duration::from_mins(1))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    let err = s.get("k").await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let start = Instant::now();
    s.wait_released(Duration::from_secs(30)).await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "no watch: a spurious wake-up soon"
    );
}

#[tokio::test]
async fn wrong_password_is_permanent_and_right_one_works() {
    let Some(etcd) = Etcd::start() else { return };
    let mut raw = etcd.raw().await;
    raw.role_add("root").await.unwrap();
    raw.user_add("root", "secret", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.auth_enable().await.unwrap();
    let with = |password: &str| EtcdOptions {
        user: Some("root".into()),
        password: Some(password.into()),
        ..etcd.options()
    };
    let err = EtcdStore::connect(with("wrong"))
        .await
        .err()
        .expect("bad password");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains(&etcd.server.endpoint()), "{err}");
    let s = EtcdStore::connect(with("secret")).await.unwrap();
    assert!(
        s.insert_if_absent("k", "a", Duration::from_secs(5))
            .await
            .unwrap()
            .is_some()
    );
    let anonymous = EtcdStore::connect(etcd.options())
        .await
        .err()
        .expect("no user");
    assert!(!anonymous.is_transient(), "{anonymous}");
}

/// Writes a CA, a server certificate for 127.0.0.1 and a client certificate (PEM) into `dir`.
fn write_certificates(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for name in ["server", "client"] {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }
}

#[tokio::test]
async fn tls_with_a_client_certificate() {
    let certs = tempfile::tempdir().unwrap();
    let path = |name: &str| certs.path().join(name);
    write_certificates(certs.path());
    let server_tls = ServerTls {
        ca: &path("ca.pem"),
        cert: &path("server.pem"),
        key: &path("server-key.pem"),
    };
    let Some(server) = EtcdServer::start_tls(&server_tls) else {
        return;
    };
    let options = |cert: Option<PathBuf>, key: Option<PathBuf>| EtcdOptions {
        endpoints: vec![server.endpoint()],
        tls: Some(EtcdTls {
            ca: Some(path("ca.pem")),
            cert,
            key,
        }),
        request_timeout: Duration::from_secs(1),
        ..EtcdOptions::default()
    };
    let s = EtcdStore::connect(options(
        Some(path("client.pem")),
        Some(path("client-key.pem")),
    ))
    .await
    .unwrap();
    s.insert_if_absent("k", "a", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.get("k").await.unwrap().unwrap().value, "a");
    let refused = EtcdStore::connect(options(None, None)).await.err();
    assert!(
        refused.is_some(),
        "the server requires a client certificate"
    );
    let plain = EtcdStore::connect(EtcdOptions {
        endpoints: vec![server.endpoint()],
        request_timeout: Duration::from_secs(1),
        ..EtcdOptions::default()
    })
    .await
    .err();
    assert!(plain.is_some(), "the server speaks only TLS on this port");
}

#[test]
fn classification() {
    use etcd_client::Error as E;
    let grpc = |code, msg: &str| E::GRpcStatus(tonic::Status::new(code, msg));
    let transient = |e| classify("ctx", e).is_transient();
    assert!(transient(grpc(
        Code::Unavailable,
        "etcdserver: request timed out"
    )));
    assert!(transient(grpc(Code::Unavailable, "etcdserver: no leader")));
    assert!(transient(grpc(
        Code::DeadlineExceeded,
        "context deadline exceeded"
    )));
    assert!(transient(grpc(
        Code::NotFound,
        "etcdserver: requested lease not found"
    )));
    assert!(!transient(grpc(
        Code::InvalidArgument,
        "etcdserver: authentication failed"
    )));
    assert!(!transient(grpc(
        Code::PermissionDenied,
        "etcdserver: permission denied"
    )));
    assert!(!transient(E::InvalidArgs("bad".into())));
    assert_eq!(lease_seconds(Duration::ZERO), 1);
    assert_eq!(lease_seconds(Duration::from_secs(2)), 2);
    assert_eq!(lease_seconds(Duration::from_millis(2001)), 3);
}

/// A renewal's transaction is delayed in the network past the client's timeout; the retry
/// succeeds, and then the delayed one arrives. It must not move the record back onto its own
/// (older) lease: a value compare alone would let it, and the record would then expire by
/// that lease, earlier than the holder's deadline assumes.
#[tokio::test]
async fn a_delayed_swap_cannot_move_the_record_back_onto_an_older_lease() {
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    let ttl = Duration::from_secs(5);
    s.insert_if_absent("k", "me", ttl).await.unwrap().unwrap();
    // The first attempt: its lease granted and its transaction built, then held back.
    let current = s.current_lease("test", "k").await.unwrap().unwrap();
    let delayed_lease = s.grant("test", "k", ttl).await.unwrap();
    let delayed = s.swap_txn("k", "me", "me", current, delayed_lease);
    // The retry goes through.
    assert!(s.compare_and_swap("k", "me", "me", ttl).await.unwrap());
    let retried = s.current_lease("test", "k").await.unwrap().unwrap();
    assert_ne!(retried, current);
    // The delayed attempt lands late: the record has moved on, so it does nothing.
    let late = s.txn("test", "k", delayed).await.unwrap();
    assert!(!late.succeeded(), "the delayed swap was applied");
    let mut raw = etcd.raw().await;
    let record = raw.get(s.record_key("k"), None).await.unwrap();
    assert_eq!(
        record.kvs()[0].lease(),
        retried,
        "the record is on the retry's lease"
    );
}

/// A fenced write of one key under the lease `k`, which it takes.
async fn leased(s: &EtcdStore) -> crate::store::Term {
    s.insert_if_absent("k", "a", Duration::from_mins(1))
        .await
        .unwrap()
        .unwrap()
}

/// A namespace written before usage was kept (keys under `kv/`, no usage key): its usage is
/// counted from its keys, the first fenced write records it, and an unreadable usage key is
/// counted again.
#[tokio::test]
async fn usage_of_data_written_before_usage_was_kept_is_counted() {
    use crate::store::{KvOp, KvQuota, KvRefusal, KvUsage, KvWrite};
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    let mut raw = etcd.raw().await;
    raw.put("vvm/kv/svc/a", "123", None).await.unwrap();
    raw.put("vvm/kv/svc/bb", "", None).await.unwrap();
    raw.put("vvm/kv/svc2/z", "zz", None).await.unwrap();
    assert_eq!(
        s.kv_usage("svc").await.unwrap(),
        KvUsage { keys: 2, bytes: 6 }
    );
    let fence = Fence {
        writer: "svc",
        lease_key: "k",
        term: leased(&s).await,
    };
    let quota = KvQuota {
        max_keys: 3,
        max_bytes: u64::MAX,
    };
    let set = |key, value: &'static [u8]| {
        let s = &s;
        async move {
            let writes = [KvWrite::Set { key, value }];
            s.kv_apply(&fence, "svc", &KvOp::Batch(&writes), &quota)
                .await
                .unwrap()
        }
    };
    assert!(set("c", b"1").await.is_ok());
    assert_eq!(
        set("d", b"1").await,
        Err(KvRefusal::TooManyKeys { limit: 3 })
    );
    let usage_key = |raw: &mut Client| {
        let mut raw = raw.clone();
        async move {
            let got = raw.get("vvm/kvusage/svc", None).await.unwrap();
            // "<keys> <bytes> <mark of the write>": the figures.
            got.kvs().first().map(|kv| {
                let text = String::from_utf8(kv.value().to_vec()).unwrap();
                let figures: Vec<&str> = text.split(' ').take(2).collect();
                figures.join(" ").into_bytes()
            })
        }
    };
    assert_eq!(usage_key(&mut raw).await.as_deref(), Some(&b"3 8"[..]));
    // An unreadable usage key is counted again, and rewritten by the next write.
    raw.put("vvm/kvusage/svc", "garbage", None).await.unwrap();
    assert_eq!(
        s.kv_usage("svc").await.unwrap(),
        KvUsage { keys: 3, bytes: 8 }
    );
    assert_eq!(
        set("d", b"1").await,
        Err(KvRefusal::TooManyKeys { limit: 3 })
    );
    assert!(set("c", b"22").await.is_ok(), "an overwrite");
    assert_eq!(usage_key(&mut raw).await.as_deref(), Some(&b"3 9"[..]));
    // Emptied, the namespace keeps its usage key at zero (see `etcd/kv.rs`).
    let empty = [
        KvWrite::Delete { key: "a" },
        KvWrite::Delete { key: "bb" },
        KvWrite::Delete { key: "c" },
    ];
    assert!(
        s.kv_apply(&fence, "svc", &KvOp::Batch(&empty), &quota)
            .await
            .unwrap()
            .is_ok()
    );
    assert_eq!(usage_key(&mut raw).await.as_deref(), Some(&b"0 0"[..]));
    assert_eq!(s.kv_usage("svc").await.unwrap(), KvUsage::default());
    assert_eq!(
        s.kv_usage("svc2").await.unwrap(),
        KvUsage { keys: 1, bytes: 3 }
    );
}

/// A 1 MiB value goes through (etcd takes requests up to 1.5 MiB by default; the client
/// takes responses past its default 4 MiB), and so does a read of 100 such values at once.
#[tokio::test]
async fn a_mebibyte_value_and_a_read_of_a_hundred_of_them_go_through() {
    use crate::store::{KvOp, KvQuota, KvUsage, KvWrite, MAX_BATCH};
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    let fence = Fence {
        writer: "svc",
        lease_key: "k",
        term: leased(&s).await,
    };
    let names: Vec<String> = (0..MAX_BATCH).map(|i| format!("big{i:03}")).collect();
    let values: Vec<Vec<u8>> = (0..MAX_BATCH)
        .map(|i| vec![u8::try_from(i).unwrap(); 1 << 20])
        .collect();
    for (key, value) in names.iter().zip(&values) {
        let op = KvOp::Batch(&[KvWrite::Set { key, value }]);
        let done = s.kv_apply(&fence, "svc", &op, &KvQuota::UNLIMITED).await;
        assert!(matches!(done, Ok(Ok(_))), "{key}: {done:?}");
    }
    assert_eq!(
        s.kv_get("svc", &names[7]).await.unwrap().as_deref(),
        Some(values[7].as_slice())
    );
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let got = s.kv_get_many("svc", &keys).await.unwrap();
    assert!(
        got.iter()
            .zip(&values)
            .all(|(g, v)| g.as_deref() == Some(v.as_slice()))
    );
    assert_eq!(
        s.kv_usage("svc").await.unwrap(),
        KvUsage::of(keys.iter().zip(&values).map(|(k, v)| (*k, v.as_slice())))
    );
    // A delete of all of them reads them all first (for the usage).
    let dels: Vec<KvWrite<'_>> = keys.iter().map(|key| KvWrite::Delete { key }).collect();
    let done = s
        .kv_apply(&fence, "svc", &KvOp::Batch(&dels), &KvQuota::UNLIMITED)
        .await;
    assert!(matches!(done, Ok(Ok(_))), "{done:?}");
    assert_eq!(s.kv_usage("svc").await.unwrap(), KvUsage::default());
}

/// More distinct keys than one etcd transaction takes: a permanent error naming the limit,
/// and nothing written.
#[tokio::test]
async fn a_write_of_more_keys_than_a_transaction_takes_is_refused() {
    use crate::store::{KvOp, KvQuota, KvWrite, MAX_BATCH};
    let Some(etcd) = Etcd::start() else { return };
    let s = etcd.store().await;
    let fence = Fence {
        writer: "svc",
        lease_key: "k",
        term: leased(&s).await,
    };
    let names: Vec<String> = (0..=MAX_BATCH).map(|i| format!("k{i}")).collect();
    let sets: Vec<KvWrite<'_>> = names
        .iter()
        .map(|key| KvWrite::Set { key, value: b"1" })
        .collect();
    let e = s
        .kv_apply(&fence, "svc", &KvOp::Batch(&sets), &KvQuota::UNLIMITED)
        .await
        .unwrap_err();
    assert!(!e.is_transient(), "{e}");
    assert!(
        e.to_string().contains(&format!("at most {MAX_BATCH}")),
        "{e}"
    );
    assert_eq!(s.kv_get("svc", "k0").await.unwrap(), None);
}
