//! The key-value interfaces against a real (in-memory) store: buckets, the fence, the term,
//! every limit, and the draft's cursors, through the generated traits a guest's calls reach.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Resource;

use super::access::{Bucket, KvAccess, WriteBudget};
use crate::interfaces::KvLimits;
use crate::interfaces::bindings::keyvalue_draft::wasi::keyvalue as draft;
use crate::interfaces::bindings::service::vvm::host::kv;
use crate::interfaces::bindings::service::wasi::keyvalue::{atomics, batch, store};
use crate::interfaces::env::Fenced;
use crate::interfaces::env::ServiceEnv;
use crate::interfaces::env::tests::env;
use crate::interfaces::view::Interfaces;

fn access(limits: KvLimits, buckets: &[&str]) -> KvAccess {
    KvAccess {
        limits,
        buckets: buckets.iter().map(|b| (*b).to_owned()).collect(),
    }
}

/// An instance of `env`'s service with `access`, its write budget full for its rate.
fn host(env: &Arc<ServiceEnv>, access: KvAccess) -> Interfaces {
    *env.kv_budget.lock().unwrap() = WriteBudget::full(&access.limits);
    crate::interfaces::view::tests::interfaces(env, access)
}

/// A borrow of an open bucket, as a guest passes it to each call.
fn b(bucket: &Resource<Bucket>) -> Resource<Bucket> {
    Resource::new_borrow(bucket.rep())
}

async fn open(h: &mut Interfaces, name: &str) -> Result<Resource<Bucket>, store::Error> {
    store::Host::open(h, name.into()).await.unwrap()
}

async fn set(h: &mut Interfaces, bucket: &Resource<Bucket>, key: &str, value: &[u8]) -> String {
    match store::HostBucket::set(h, b(bucket), key.into(), value.to_vec())
        .await
        .unwrap()
    {
        Ok(()) => "ok".into(),
        Err(store::Error::Other(e)) => e,
        Err(e) => format!("{e:?}"),
    }
}

async fn get(h: &mut Interfaces, bucket: &Resource<Bucket>, key: &str) -> Option<Vec<u8>> {
    store::HostBucket::get(h, b(bucket), key.into())
        .await
        .unwrap()
        .unwrap()
}

/// Roomy limits, so a test meets only the limit it is about: the defaults, which set no
/// write rate.
fn roomy() -> KvLimits {
    KvLimits::default()
}

#[tokio::test]
async fn the_default_bucket_is_the_services_own_namespace_and_others_need_a_grant() {
    let (_clock, env) = env().await;
    let mut h = host(&env, access(roomy(), &["orders"]));
    let own = open(&mut h, "").await.unwrap();
    assert_eq!(set(&mut h, &own, "k", b"v").await, "ok");
    let default = open(&mut h, "default").await.unwrap();
    assert_eq!(get(&mut h, &default, "k").await, Some(b"v".to_vec()));
    // `vvm:host/kv` reads the same namespace.
    assert_eq!(
        kv::Host::get(&mut h, "k".into()).await.unwrap(),
        Ok(Some(b"v".to_vec()))
    );
    assert_eq!(
        env.store.kv_get("svc", "k").await.unwrap(),
        Some(b"v".to_vec())
    );

    let orders = open(&mut h, "orders").await.unwrap();
    assert_eq!(get(&mut h, &orders, "k").await, None, "buckets are apart");
    assert_eq!(set(&mut h, &orders, "o", b"1").await, "ok");
    assert_eq!(
        env.store.kv_get("bucket/orders", "o").await.unwrap(),
        Some(b"1".to_vec())
    );
    for name in ["other", "svc", "bucket/orders", "../svc"] {
        assert!(
            matches!(open(&mut h, name).await, Err(store::Error::AccessDenied)),
            "{name}"
        );
    }
}

/// Every kind of write traps past the local deadline, as every effect does, and the store is
/// not asked.
#[tokio::test]
async fn every_write_traps_past_the_deadline_and_writes_nothing() {
    let (clock, env) = env().await;
    let mut h = host(&env, access(roomy(), &[]));
    let own = open(&mut h, "").await.unwrap();
    let cas = atomics::HostCas::new(&mut h, b(&own), "k".into())
        .await
        .unwrap()
        .unwrap();
    clock.advance(Duration::from_mins(1));
    let trapped = |e: wasmtime::Error| assert!(e.is::<Fenced>(), "{e}");
    trapped(
        store::HostBucket::set(&mut h, b(&own), "k".into(), b"v".to_vec())
            .await
            .unwrap_err(),
    );
    trapped(
        store::HostBucket::delete(&mut h, b(&own), "k".into())
            .await
            .unwrap_err(),
    );
    trapped(
        atomics::Host::increment(&mut h, b(&own), "k".into(), 1)
            .await
            .unwrap_err(),
    );
    trapped(
        atomics::Host::swap(&mut h, cas, b"v".to_vec())
            .await
            .unwrap_err(),
    );
    trapped(
        batch::Host::set_many(&mut h, b(&own), vec![("k".into(), b"v".to_vec())])
            .await
            .unwrap_err(),
    );
    trapped(
        batch::Host::delete_many(&mut h, b(&own), vec!["k".into()])
            .await
            .unwrap_err(),
    );
    trapped(
        draft::atomics::Host::increment(&mut h, b(&own), "k".into(), 1)
            .await
            .unwrap_err(),
    );
    assert_eq!(env.store.kv_usage("svc").await.unwrap().keys, 0);
    // Reads have no effect: still allowed.
    assert_eq!(get(&mut h, &own, "k").await, None);
}

/// After another host took the lease, a write fails with an error that says so (the guest
/// can tell it from a store failure and from a limit), and writes nothing.
#[tokio::test]
async fn a_write_under_a_stale_term_says_so_and_writes_nothing() {
    let (_clock, env) = env().await;
    let mut h = host(&env, access(roomy(), &[]));
    let own = open(&mut h, "").await.unwrap();
    assert_eq!(set(&mut h, &own, "k", b"1").await, "ok");
    assert!(
        env.store
            .compare_and_delete(&env.lease.key, &env.lease.holder)
            .await
            .unwrap()
    );
    env.store
        .insert_if_absent(&env.lease.key, "other", Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    let e = set(&mut h, &own, "k", b"2").await;
    assert!(e.starts_with("stale term"), "{e}");
    let e = atomics::Host::increment(&mut h, b(&own), "n".into(), 1)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&e, store::Error::Other(m) if m.starts_with("stale term")),
        "{e:?}"
    );
    assert_eq!(get(&mut h, &own, "k").await, Some(b"1".to_vec()));
    assert_eq!(get(&mut h, &own, "n").await, None);
    let metrics = env.ops.render();
    assert!(
        metrics.contains(r#"vvm_kv_writes_total{service="svc",outcome="stale"} 2"#),
        "{metrics}"
    );
}

/// Over a limit a write fails with an error naming the limit, counted in `/metrics`, and
/// writes nothing; the rate refills with time and a batch counts each of its writes.
#[tokio::test(start_paused = true)]
async fn writes_over_a_limit_name_it_count_it_and_write_nothing() {
    let (_clock, env) = env().await;
    let limits = KvLimits {
        writes_per_second: Some(100),
        ..KvLimits::default()
    };
    let mut h = host(&env, access(limits, &[]));
    let own = open(&mut h, "").await.unwrap();
    let long_key = "k".repeat(limits.max_key_bytes + 1);
    let e = set(&mut h, &own, &long_key, b"v").await;
    assert!(
        e.starts_with("over a limit: a key of 1025 bytes; max-key-bytes is 1024"),
        "{e}"
    );
    let big = vec![0u8; limits.max_value_bytes + 1];
    let e = set(&mut h, &own, "k", &big).await;
    assert!(
        e.contains("a value of 1048577 bytes; max-value-bytes"),
        "{e}"
    );
    let too_many: Vec<(String, Vec<u8>)> = (0..=crate::store::MAX_BATCH)
        .map(|i| (i.to_string(), Vec::new()))
        .collect();
    let e = batch::Host::set_many(&mut h, b(&own), too_many)
        .await
        .unwrap()
        .unwrap_err();
    assert!(format!("{e:?}").contains("batch is 100"), "{e:?}");
    assert_eq!(env.store.kv_usage("svc").await.unwrap().keys, 0);

    // The rate: a batch of 60 and 40 single writes use the 100 writes of a second.
    let sixty: Vec<(String, Vec<u8>)> = (0..60).map(|i| (i.to_string(), Vec::new())).collect();
    batch::Host::set_many(&mut h, b(&own), sixty)
        .await
        .unwrap()
        .unwrap();
    for i in 0..40 {
        assert_eq!(set(&mut h, &own, "k", i.to_string().as_bytes()).await, "ok");
    }
    let e = set(&mut h, &own, "k", b"over").await;
    assert!(e.contains("writes-per-second is 100"), "{e}");
    assert_eq!(get(&mut h, &own, "k").await, Some(b"39".to_vec()));
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(set(&mut h, &own, "k", b"later").await, "ok");

    let metrics = env.ops.render();
    for (limit, n) in [
        ("max-key-bytes", 1),
        ("max-value-bytes", 1),
        ("batch", 1),
        ("writes-per-second", 1),
    ] {
        let line = format!(r#"vvm_kv_limit_refusals_total{{service="svc",limit="{limit}"}} {n}"#);
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

/// The namespace's quota of keys and bytes is the store's to check, in the write's
/// transaction; a delete frees what it held.
#[tokio::test]
async fn the_quota_of_keys_and_bytes_refuses_growth_and_a_delete_frees_it() {
    let (_clock, env) = env().await;
    let limits = KvLimits {
        max_keys: 2,
        max_bytes: 10,
        ..roomy()
    };
    let mut h = host(&env, access(limits, &[]));
    let own = open(&mut h, "").await.unwrap();
    assert_eq!(set(&mut h, &own, "a", b"1").await, "ok");
    assert_eq!(set(&mut h, &own, "b", b"1").await, "ok");
    let e = set(&mut h, &own, "c", b"1").await;
    assert!(
        e.starts_with("over a limit: the namespace would hold more keys; max-keys is 2"),
        "{e}"
    );
    let e = set(&mut h, &own, "a", b"123456789").await;
    assert!(e.contains("max-bytes is 10"), "{e}");
    store::HostBucket::delete(&mut h, b(&own), "b".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(set(&mut h, &own, "c", b"1").await, "ok");
    let usage = env.store.kv_usage("svc").await.unwrap();
    assert_eq!((usage.keys, usage.bytes), (2, 4));
    assert!(
        env.ops
            .render()
            .contains(r#"vvm_kv_limit_refusals_total{service="svc",limit="max-keys"} 1"#)
    );
}

#[tokio::test]
async fn increment_and_cas_are_atomic_and_a_lost_cas_hands_back_the_value_now_there() {
    let (_clock, env) = env().await;
    let mut h = host(&env, access(roomy(), &[]));
    let own = open(&mut h, "").await.unwrap();
    let n = atomics::Host::increment(&mut h, b(&own), "n".into(), 5)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 5);
    let n = draft::atomics::Host::increment(&mut h, b(&own), "n".into(), 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 7, "both versions count the same number");
    assert_eq!(set(&mut h, &own, "t", b"text").await, "ok");
    let e = atomics::Host::increment(&mut h, b(&own), "t".into(), 1)
        .await
        .unwrap()
        .unwrap_err();
    assert!(format!("{e:?}").contains("not a number"), "{e:?}");

    let cas = atomics::HostCas::new(&mut h, b(&own), "c".into())
        .await
        .unwrap()
        .unwrap();
    let current = atomics::HostCas::current(&mut h, Resource::new_borrow(cas.rep()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current, None);
    // Someone else writes first: the swap loses, and the handle it hands back holds the
    // value now there, so a retry can win.
    assert_eq!(set(&mut h, &own, "c", b"theirs").await, "ok");
    let again = match atomics::Host::swap(&mut h, cas, b"mine".to_vec())
        .await
        .unwrap()
    {
        Err(atomics::CasError::CasFailed(again)) => again,
        other => panic!("{other:?}"),
    };
    let current = atomics::HostCas::current(&mut h, Resource::new_borrow(again.rep()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.as_deref(), Some(&b"theirs"[..]));
    atomics::Host::swap(&mut h, again, b"mine".to_vec())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(get(&mut h, &own, "c").await, Some(b"mine".to_vec()));
}

/// Listing pages through every key once, with draft2's key cursors and the draft's numbered
/// ones; get-many answers in the order asked.
#[tokio::test]
async fn list_keys_pages_through_every_key_once_in_both_versions() {
    let (_clock, env) = env().await;
    let mut h = host(&env, access(roomy(), &[]));
    let own = open(&mut h, "").await.unwrap();
    let keys: Vec<String> = (0..2345).map(|i| format!("k{i:05}")).collect();
    for chunk in keys.chunks(100) {
        let writes = chunk.iter().map(|k| (k.clone(), b"v".to_vec())).collect();
        batch::Host::set_many(&mut h, b(&own), writes)
            .await
            .unwrap()
            .unwrap();
    }
    let mut listed = Vec::new();
    let mut cursor = None;
    loop {
        let page = store::HostBucket::list_keys(&mut h, b(&own), cursor)
            .await
            .unwrap()
            .unwrap();
        listed.extend(page.keys);
        cursor = page.cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(listed, keys);

    let old = draft::store::Host::open(&mut h, String::new())
        .await
        .unwrap()
        .unwrap();
    let mut listed = Vec::new();
    let mut cursor = None;
    loop {
        let page = draft::store::HostBucket::list_keys(&mut h, b(&old), cursor)
            .await
            .unwrap()
            .unwrap();
        listed.extend(page.keys);
        cursor = page.cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(listed, keys);
    let e = draft::store::HostBucket::list_keys(&mut h, b(&old), Some(99))
        .await
        .unwrap()
        .unwrap_err();
    assert!(format!("{e:?}").contains("unknown cursor 99"), "{e:?}");

    let asked = vec!["k00002".to_owned(), "none".to_owned(), "k00001".to_owned()];
    let got = batch::Host::get_many(&mut h, b(&own), asked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        got,
        vec![
            Some(("k00002".to_owned(), b"v".to_vec())),
            None,
            Some(("k00001".to_owned(), b"v".to_vec())),
        ]
    );
}

/// Two services granted one bucket share it; each still has its own namespace.
#[tokio::test]
async fn a_granted_bucket_is_shared_between_services() {
    let (_clock, env) = env().await;
    let other = Arc::new(ServiceEnv {
        name: "other".into(),
        lease: env.lease.clone(),
        deadline: env.deadline.clone(),
        stopping: env.stopping.clone(),
        problems: crate::problem::ProblemReporter::default(),
        store: Arc::clone(&env.store),
        ops: env.ops.clone(),
        kv_budget: std::sync::Mutex::new(WriteBudget::full(&KvLimits::default())),
        outgoing: Arc::clone(&env.outgoing),
    });
    let mut a = host(&env, access(roomy(), &["shared"]));
    let mut b_host = host(&other, access(roomy(), &["shared"]));
    let shared_a = open(&mut a, "shared").await.unwrap();
    let shared_b = open(&mut b_host, "shared").await.unwrap();
    assert_eq!(set(&mut a, &shared_a, "k", b"from svc").await, "ok");
    assert_eq!(
        get(&mut b_host, &shared_b, "k").await,
        Some(b"from svc".to_vec())
    );
    let own_b = open(&mut b_host, "").await.unwrap();
    assert_eq!(get(&mut b_host, &own_b, "k").await, None);
}
