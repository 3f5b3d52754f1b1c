//! The conformance cases of the guests' fenced key-value space ([`FencedKv`]): batches,
//! increments, swaps, reads, listing, quotas and usage, stale terms, and writers racing a
//! takeover or each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::Backend;
use crate::clock::ManualClock;
use crate::store::{
    Fence, FencedKv, FencedWrite, KvDone, KvOp, KvPage, KvQuota, KvRefusal, KvUsage, KvView,
    KvWrite, MAX_BATCH, OwnedOp, StoreError, Term, TtlStore,
};

const SPACE: &str = "svc";

fn set<'a>(key: &'a str, value: &'a [u8]) -> KvWrite<'a> {
    KvWrite::Set { key, value }
}

fn del(key: &str) -> KvWrite<'_> {
    KvWrite::Delete { key }
}

fn fence(term: Term) -> Fence<'static> {
    Fence {
        writer: "svc",
        lease_key: "k",
        term,
    }
}

/// A store with a live lease record `k`, and its term.
async fn leased<B: Backend>(b: &mut B, clock: &ManualClock) -> (B::Store, Term) {
    let s = b.open(clock).await;
    let term = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    (s, term)
}

/// Applies `op` to [`SPACE`] under `quota`; a store error fails the case.
async fn apply_within<S: FencedKv + ?Sized>(
    s: &S,
    term: Term,
    op: &KvOp<'_>,
    quota: &KvQuota,
) -> Result<KvDone, KvRefusal> {
    s.kv_apply(&fence(term), SPACE, op, quota).await.unwrap()
}

async fn apply<S: FencedKv + ?Sized>(
    s: &S,
    term: Term,
    op: &KvOp<'_>,
) -> Result<KvDone, KvRefusal> {
    apply_within(s, term, op, &KvQuota::UNLIMITED).await
}

async fn batch<S: FencedKv + ?Sized>(s: &S, term: Term, writes: &[KvWrite<'_>]) {
    assert_eq!(
        apply(s, term, &KvOp::Batch(writes)).await,
        Ok(KvDone::Written)
    );
}

async fn get<S: FencedKv + ?Sized>(s: &S, key: &str) -> Option<Vec<u8>> {
    s.kv_get(SPACE, key).await.unwrap()
}

async fn usage<S: FencedKv + ?Sized>(s: &S) -> KvUsage {
    s.kv_usage(SPACE).await.unwrap()
}

fn swap<'a>(key: &'a str, expected: Option<&'a [u8]>, new: &'a [u8]) -> KvOp<'a> {
    KvOp::Swap { key, expected, new }
}

pub(crate) async fn kv_a_batch_keeps_the_last_write_of_a_key_and_lands_whole_or_not_at_all<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    batch(&s, t, &[set("c", b"old")]).await;
    batch(
        &s,
        t,
        &[set("a", b"1"), set("b", b"2"), set("a", b"3"), del("c")],
    )
    .await;
    assert_eq!(get(&s, "a").await.as_deref(), Some(&b"3"[..]));
    assert_eq!(get(&s, "b").await.as_deref(), Some(&b"2"[..]));
    assert_eq!(get(&s, "c").await, None);
    // A key set then deleted in one batch ends deleted, and the other way round.
    batch(&s, t, &[set("d", b"x"), del("d"), del("b"), set("b", b"4")]).await;
    assert_eq!(get(&s, "d").await, None);
    assert_eq!(get(&s, "b").await.as_deref(), Some(&b"4"[..]));
    // A batch refused by the quota writes none of its keys, not even those that fit.
    let two_more = KvQuota {
        max_keys: 3,
        max_bytes: u64::MAX,
    };
    let three = [set("a", b"new"), set("e", b"1"), set("f", b"1")];
    let op = KvOp::Batch(&three);
    assert_eq!(
        apply_within(&s, t, &op, &two_more).await,
        Err(KvRefusal::TooManyKeys { limit: 3 })
    );
    assert_eq!(get(&s, "a").await.as_deref(), Some(&b"3"[..]));
    assert_eq!(get(&s, "e").await, None);
    assert_eq!(
        usage(&s).await,
        KvUsage::of([("a", &b"3"[..]), ("b", &b"4"[..])])
    );
}

pub(crate) async fn kv_delete_removes_keys_and_an_absent_key_is_no_error<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    batch(&s, t, &[set("a", b"1"), set("b", b"2"), set("c", b"3")]).await;
    batch(&s, t, &[del("a"), del("c"), del("never")]).await;
    assert_eq!(get(&s, "a").await, None);
    assert_eq!(get(&s, "c").await, None);
    assert_eq!(get(&s, "b").await.as_deref(), Some(&b"2"[..]));
    batch(&s, t, &[del("a")]).await;
    assert_eq!(usage(&s).await, KvUsage::of([("b", &b"2"[..])]));
    batch(&s, t, &[del("b")]).await;
    assert_eq!(usage(&s).await, KvUsage::default());
}

pub(crate) async fn kv_get_many_answers_in_the_order_asked_with_absent_keys<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    batch(&s, t, &[set("a", b"1"), set("b", b""), set("c", b"3")]).await;
    let got = s
        .kv_get_many(SPACE, &["c", "missing", "a", "b", "a"])
        .await
        .unwrap();
    let want: [Option<&[u8]>; 5] = [Some(b"3"), None, Some(b"1"), Some(b""), Some(b"1")];
    assert_eq!(
        got.iter().map(Option::as_deref).collect::<Vec<_>>(),
        want,
        "in order, an empty value is not an absent one"
    );
    assert!(s.kv_get_many(SPACE, &[]).await.unwrap().is_empty());
    assert_eq!(
        s.kv_get_many("other", &["a"]).await.unwrap(),
        [None],
        "namespaces are apart"
    );
}

pub(crate) async fn kv_list_pages_through_a_prefix<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    let keys = ["a/1", "a/2", "a/3", "a", "ab", "b/1"];
    let writes: Vec<KvWrite<'_>> = keys.iter().map(|k| set(k, b"v")).collect();
    batch(&s, t, &writes).await;
    s.kv_apply(
        &fence(t),
        "svc2",
        &KvOp::Batch(&[set("a/0", b"v")]),
        &KvQuota::UNLIMITED,
    )
    .await
    .unwrap()
    .unwrap();
    let list = |prefix: &'static str, after: Option<&'static str>, limit| {
        let s = &s;
        async move { s.kv_list(SPACE, prefix, after, limit).await.unwrap() }
    };
    let page = |keys: &[&str], more| KvPage {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        more,
    };
    assert_eq!(list("a/", None, 2).await, page(&["a/1", "a/2"], true));
    assert_eq!(list("a/", Some("a/2"), 2).await, page(&["a/3"], false));
    assert_eq!(list("a/", Some("a/3"), 2).await, page(&[], false));
    assert_eq!(
        list("a/", None, 3).await,
        page(&["a/1", "a/2", "a/3"], false)
    );
    assert_eq!(
        list("a", None, 10).await,
        page(&["a", "a/1", "a/2", "a/3", "ab"], false),
        "the prefix itself is a key"
    );
    assert_eq!(
        list("", Some("a/3"), 10).await,
        page(&["ab", "b/1"], false),
        "after a key that is not stored"
    );
    assert_eq!(list("a/", Some("0"), 1).await, page(&["a/1"], true));
    assert_eq!(list("a/", Some("z"), 5).await, page(&[], false));
    assert_eq!(list("a/", None, 0).await, page(&[], true));
    assert_eq!(list("c", None, 5).await, page(&[], false));
    // Each page after the last key of the one before: every key once.
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let got = s.kv_list(SPACE, "", after.as_deref(), 2).await.unwrap();
        all.extend(got.keys.iter().cloned());
        after = got.keys.last().cloned();
        if !got.more {
            break;
        }
    }
    let mut sorted = keys.map(str::to_owned).to_vec();
    sorted.sort();
    assert_eq!(all, sorted);
}

/// `kv_view` lists every key under a prefix with the whole namespace's usage, from one
/// state: more keys than one page of the etcd backend's reads, of two namespaces.
pub(crate) async fn kv_view_lists_a_prefix_with_the_namespaces_usage<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    let names: Vec<String> = (0..250).map(|i| format!("k/{i:03}")).collect();
    for chunk in names.chunks(MAX_BATCH) {
        let writes: Vec<KvWrite<'_>> = chunk.iter().map(|k| set(k, b"vv")).collect();
        batch(&s, t, &writes).await;
    }
    batch(&s, t, &[set("other", b"x")]).await;
    s.kv_apply(
        &fence(t),
        "svc2",
        &KvOp::Batch(&[set("k/x", b"v")]),
        &KvQuota::UNLIMITED,
    )
    .await
    .unwrap()
    .unwrap();
    let view = s.kv_view(SPACE, "k/").await.unwrap();
    assert_eq!(view.keys, names);
    assert_eq!(view.usage, usage(&s).await);
    assert_eq!(view.usage.keys, 251);
    let all = s.kv_view(SPACE, "").await.unwrap();
    assert_eq!(all.keys.len(), 251);
    assert_eq!(all.keys.last().map(String::as_str), Some("other"));
    let none = s.kv_view("empty", "").await.unwrap();
    assert_eq!(none, KvView::default());
}

pub(crate) async fn kv_increment_counts_from_absent_and_refuses_text_and_overflow<B: Backend>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    let incr = |key, delta| KvOp::Increment { key, delta };
    assert_eq!(apply(&s, t, &incr("n", 5)).await, Ok(KvDone::Number(5)));
    assert_eq!(apply(&s, t, &incr("n", -7)).await, Ok(KvDone::Number(-2)));
    assert_eq!(get(&s, "n").await.as_deref(), Some(&b"-2"[..]));
    assert_eq!(apply(&s, t, &incr("n", 0)).await, Ok(KvDone::Number(-2)));
    batch(&s, t, &[set("text", b"five")]).await;
    assert_eq!(
        apply(&s, t, &incr("text", 1)).await,
        Err(KvRefusal::NotANumber)
    );
    assert_eq!(get(&s, "text").await.as_deref(), Some(&b"five"[..]));
    let max = i64::MAX.to_string();
    batch(&s, t, &[set("max", max.as_bytes())]).await;
    assert_eq!(
        apply(&s, t, &incr("max", 1)).await,
        Err(KvRefusal::Overflow)
    );
    assert_eq!(get(&s, "max").await.as_deref(), Some(max.as_bytes()));
    assert_eq!(
        apply(&s, t, &incr("max", -1)).await,
        Ok(KvDone::Number(i64::MAX - 1))
    );
    assert_eq!(
        usage(&s).await,
        KvUsage::of([
            ("n", &b"-2"[..]),
            ("text", &b"five"[..]),
            ("max", (i64::MAX - 1).to_string().as_bytes()),
        ])
    );
}

pub(crate) async fn kv_swap_compares_exact_bytes_and_absence_and_a_loss_writes_nothing<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    assert_eq!(
        apply(&s, t, &swap("k", None, b"v1")).await,
        Ok(KvDone::Swapped(true))
    );
    assert_eq!(
        apply(&s, t, &swap("k", None, b"v9")).await,
        Ok(KvDone::Swapped(false)),
        "present, not absent"
    );
    assert_eq!(
        apply(&s, t, &swap("k", Some(b"v1 "), b"v9")).await,
        Ok(KvDone::Swapped(false)),
        "exact bytes"
    );
    assert_eq!(
        apply(&s, t, &swap("k", Some(b""), b"v9")).await,
        Ok(KvDone::Swapped(false))
    );
    assert_eq!(get(&s, "k").await.as_deref(), Some(&b"v1"[..]));
    assert_eq!(
        apply(&s, t, &swap("k", Some(b"v1"), b"v2")).await,
        Ok(KvDone::Swapped(true))
    );
    assert_eq!(get(&s, "k").await.as_deref(), Some(&b"v2"[..]));
    assert_eq!(
        apply(&s, t, &swap("absent", Some(b""), b"v")).await,
        Ok(KvDone::Swapped(false)),
        "an empty value is not absence"
    );
    assert_eq!(get(&s, "absent").await, None);
    assert_eq!(usage(&s).await, KvUsage::of([("k", &b"v2"[..])]));
}

/// A batch of `writes` under `quota`.
async fn batch_within<S: FencedKv + ?Sized>(
    s: &S,
    term: Term,
    writes: &[KvWrite<'_>],
    quota: &KvQuota,
) -> Result<KvDone, KvRefusal> {
    apply_within(s, term, &KvOp::Batch(writes), quota).await
}

pub(crate) async fn kv_a_key_quota_refuses_growth_writes_nothing_and_a_delete_frees_a_key<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    let keys = KvQuota {
        max_keys: 2,
        max_bytes: u64::MAX,
    };
    let written = Ok(KvDone::Written);
    assert_eq!(
        batch_within(&s, t, &[set("a", b"1"), set("b", b"2")], &keys).await,
        written
    );
    let refused = Err(KvRefusal::TooManyKeys { limit: 2 });
    assert_eq!(batch_within(&s, t, &[set("c", b"3")], &keys).await, refused);
    let incr = KvOp::Increment { key: "c", delta: 1 };
    assert_eq!(apply_within(&s, t, &incr, &keys).await, refused);
    let create = swap("c", None, b"3");
    assert_eq!(apply_within(&s, t, &create, &keys).await, refused);
    assert_eq!(get(&s, "c").await, None);
    assert_eq!(
        batch_within(&s, t, &[set("a", b"11")], &keys).await,
        written
    );
    // A delete frees a key, even for a set of another in the same batch.
    let both = [del("a"), set("c", b"3")];
    assert_eq!(batch_within(&s, t, &both, &keys).await, written);
    assert_eq!(
        usage(&s).await,
        KvUsage::of([("b", &b"2"[..]), ("c", &b"3"[..])])
    );
}

pub(crate) async fn kv_a_byte_quota_refuses_growth_writes_nothing_and_lets_a_namespace_shrink<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    // "b2" + "c3": 4 bytes.
    batch(&s, t, &[set("b", b"2"), set("c", b"3")]).await;
    let bytes = |max_bytes| KvQuota {
        max_keys: u64::MAX,
        max_bytes,
    };
    let written = Ok(KvDone::Written);
    assert_eq!(
        batch_within(&s, t, &[set("b", b"22")], &bytes(5)).await,
        written
    );
    let refused = Err(KvRefusal::TooManyBytes { limit: 5 });
    assert_eq!(
        batch_within(&s, t, &[set("b", b"222")], &bytes(5)).await,
        refused
    );
    let grow = swap("c", Some(b"3"), b"33");
    assert_eq!(apply_within(&s, t, &grow, &bytes(5)).await, refused);
    assert_eq!(get(&s, "b").await.as_deref(), Some(&b"22"[..]));
    assert_eq!(get(&s, "c").await.as_deref(), Some(&b"3"[..]));
    // Over a lowered quota (5 bytes held, 3 allowed): a shrink passes, growth does not.
    assert_eq!(
        batch_within(&s, t, &[set("b", b"2")], &bytes(3)).await,
        written
    );
    assert_eq!(
        batch_within(&s, t, &[set("c", b"33")], &bytes(3)).await,
        Err(KvRefusal::TooManyBytes { limit: 3 })
    );
    let same = KvOp::Increment { key: "c", delta: 1 };
    assert_eq!(
        apply_within(&s, t, &same, &bytes(3)).await,
        Ok(KvDone::Number(4)),
        "as many bytes as before"
    );
    assert_eq!(
        usage(&s).await,
        KvUsage::of([("b", &b"2"[..]), ("c", &b"4"[..])])
    );
}

pub(crate) async fn kv_usage_is_exact_after_mixed_writes<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    assert_eq!(usage(&s).await, KvUsage::default(), "an unused namespace");
    batch(
        &s,
        t,
        &[set("alpha", b"12345"), set("beta", b""), set("gamma", b"x")],
    )
    .await;
    apply(
        &s,
        t,
        &KvOp::Increment {
            key: "count",
            delta: 120,
        },
    )
    .await
    .unwrap();
    apply(&s, t, &swap("beta", Some(b""), b"bb")).await.unwrap();
    apply(&s, t, &swap("beta", Some(b"no"), b"bbbbbbb"))
        .await
        .unwrap();
    batch(&s, t, &[del("gamma"), set("alpha", b"1"), del("missing")]).await;
    s.kv_apply(
        &fence(t),
        "other",
        &KvOp::Batch(&[set("o", b"oo")]),
        &KvQuota::UNLIMITED,
    )
    .await
    .unwrap()
    .unwrap();
    let want = KvUsage::of([
        ("alpha", &b"1"[..]),
        ("beta", &b"bb"[..]),
        ("count", &b"120"[..]),
    ]);
    assert_eq!(usage(&s).await, want);
    assert_eq!(want, KvUsage { keys: 3, bytes: 20 });
    assert_eq!(
        s.kv_usage("other").await.unwrap(),
        KvUsage { keys: 1, bytes: 3 }
    );
    batch(&s, t, &[del("alpha"), del("beta"), del("count")]).await;
    assert_eq!(usage(&s).await, KvUsage::default());
    batch(&s, t, &[set("again", b"1")]).await;
    assert_eq!(usage(&s).await, KvUsage { keys: 1, bytes: 6 });
}

/// A batch of [`MAX_BATCH`] keys fits one transaction of every backend (etcd counts its
/// operations), to set, read and delete.
pub(crate) async fn kv_a_batch_of_max_batch_keys_lands<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    let names: Vec<String> = (0..MAX_BATCH).map(|i| format!("key{i:03}")).collect();
    let sets: Vec<KvWrite<'_>> = names.iter().map(|k| set(k, k.as_bytes())).collect();
    batch(&s, t, &sets).await;
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let got = s.kv_get_many(SPACE, &keys).await.unwrap();
    assert!(
        got.iter()
            .zip(&keys)
            .all(|(v, k)| v.as_deref() == Some(k.as_bytes()))
    );
    assert_eq!(
        usage(&s).await,
        KvUsage::of(keys.iter().map(|k| (*k, k.as_bytes())))
    );
    let page = s.kv_list(SPACE, "key", None, MAX_BATCH).await.unwrap();
    assert_eq!((page.keys.len(), page.more), (MAX_BATCH, false));
    let dels: Vec<KvWrite<'_>> = keys.iter().map(|k| del(k)).collect();
    batch(&s, t, &dels).await;
    assert_eq!(usage(&s).await, KvUsage::default());
}

/// After a takeover the old term refuses every kind of write, before deciding anything else:
/// not even a swap whose expected value matches lands, and nothing is written.
pub(crate) async fn kv_a_stale_term_refuses_every_kind_of_write<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, old) = leased(b, &clock).await;
    batch(&s, old, &[set("x", b"1"), set("n", b"7")]).await;
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    let new = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    let stale = Err(KvRefusal::StaleTerm);
    let many = [set("x", b"2"), del("n"), set("y", b"3")];
    let writes = [
        KvOp::Batch(&many),
        KvOp::Increment { key: "n", delta: 1 },
        KvOp::Increment {
            key: "text",
            delta: 1,
        },
        swap("x", Some(b"1"), b"2"),
        swap("x", Some(b"mismatch"), b"2"),
        swap("y", None, b"2"),
    ];
    let tight = KvQuota {
        max_keys: 0,
        max_bytes: 0,
    };
    for op in &writes {
        assert_eq!(apply(&s, old, op).await, stale, "{op:?}");
        assert_eq!(apply_within(&s, old, op, &tight).await, stale, "{op:?}");
    }
    assert_eq!(get(&s, "x").await.as_deref(), Some(&b"1"[..]));
    assert_eq!(get(&s, "n").await.as_deref(), Some(&b"7"[..]));
    assert_eq!(get(&s, "y").await, None);
    assert_eq!(
        usage(&s).await,
        KvUsage::of([("x", &b"1"[..]), ("n", &b"7"[..])])
    );
    // The new term writes; a term never issued does not.
    batch(&s, new, &[set("x", b"new")]).await;
    assert_eq!(apply(&s, new + 1_000_000, &writes[0]).await, stale);
    assert_eq!(apply(&s, u64::MAX, &writes[0]).await, stale);
    assert_eq!(get(&s, "x").await.as_deref(), Some(&b"new"[..]));
}

/// Two writers (two hosts, or two services sharing a bucket) increment one key `N` times each
/// from two handles, concurrently: no increment is lost, and the usage is exact.
pub(crate) async fn kv_two_writers_sharing_a_namespace_lose_nothing<B: Backend>(b: &mut B) {
    const N: i64 = 40;
    let clock = ManualClock::default();
    let first = Arc::new(b.open(&clock).await);
    // Clones of a store that does not persist share it; others open the same store again.
    let second = if B::PERSISTENT {
        Arc::new(b.open(&clock).await)
    } else {
        Arc::clone(&first)
    };
    let mut writers = Vec::new();
    for (s, lease) in [(first, "k1"), (second, "k2")] {
        let term = s
            .insert_if_absent(lease, "a", B::TTL)
            .await
            .unwrap()
            .unwrap();
        writers.push(tokio::spawn(async move {
            let fence = Fence {
                writer: "svc",
                lease_key: lease,
                term,
            };
            let op = KvOp::Increment { key: "n", delta: 1 };
            for _ in 0..N {
                let done = s
                    .kv_apply(&fence, "bucket/shared", &op, &KvQuota::UNLIMITED)
                    .await
                    .unwrap();
                assert!(matches!(done, Ok(KvDone::Number(_))), "{done:?}");
            }
            s
        }));
    }
    let mut stores = Vec::new();
    for writer in writers {
        stores.push(writer.await.unwrap());
    }
    let total = (2 * N).to_string();
    for s in &stores {
        assert_eq!(
            s.kv_get("bucket/shared", "n").await.unwrap().as_deref(),
            Some(total.as_bytes())
        );
        assert_eq!(
            s.kv_usage("bucket/shared").await.unwrap(),
            KvUsage::of([("n", total.as_bytes())])
        );
    }
}

/// A kind of fenced write, for [`race_a_takeover`].
#[derive(Clone, Copy, Debug)]
enum Racer {
    /// One set of `x`.
    Set,
    /// The old writer deletes `x` and `y` and sets `z`; the new one the other way round.
    Batch,
    /// Adds 1 to `x` (the old writer 1000).
    Increment,
    /// Swaps `x` from what the writer last saw.
    Swap,
}

impl Racer {
    /// The old writer's `i`th write: whether it landed (`false`: refused as stale).
    async fn old_write<S: FencedKv + ?Sized>(
        self,
        s: &S,
        old: Term,
        i: u64,
    ) -> Result<bool, StoreError> {
        let value = format!("old {i}");
        let value = value.as_bytes();
        let one = [set("x", value)];
        let many = [del("x"), del("y"), set("z", value)];
        let seen = match self {
            Self::Swap => s.kv_get(SPACE, "x").await?,
            _ => None,
        };
        let op = match self {
            Self::Set => KvOp::Batch(&one),
            Self::Batch => KvOp::Batch(&many),
            Self::Increment => KvOp::Increment {
                key: "x",
                delta: 1000,
            },
            Self::Swap => swap("x", seen.as_deref(), value),
        };
        let done = s
            .kv_apply(&fence(old), SPACE, &op, &KvQuota::UNLIMITED)
            .await?;
        match done {
            Ok(_) => Ok(true),
            Err(KvRefusal::StaleTerm) => Ok(false),
            Err(refusal) => panic!("{self:?} refused: {refusal}"),
        }
    }

    /// The new writer's `j`th write and its read back, which must find that write and no
    /// stale one after it. `last`: what the writer's previous write left in `x`.
    async fn new_write<S: FencedKv + ?Sized>(
        self,
        s: &S,
        new: Term,
        j: u64,
        last: &mut Option<Vec<u8>>,
    ) {
        let value = format!("new {j}");
        let value = value.as_bytes();
        match self {
            Self::Set => batch(s, new, &[set("x", value)]).await,
            Self::Batch => batch(s, new, &[set("x", value), set("y", value), del("z")]).await,
            Self::Increment => {
                let done = apply(s, new, &KvOp::Increment { key: "x", delta: 1 }).await;
                let Ok(KvDone::Number(sum)) = done else {
                    panic!("{done:?}");
                };
                if let Some(before) = last.as_deref() {
                    let before: i64 = std::str::from_utf8(before).unwrap().parse().unwrap();
                    assert_eq!(sum, before + 1, "a stale increment landed in between");
                }
                *last = Some(sum.to_string().into_bytes());
            }
            Self::Swap => {
                if last.is_none() {
                    *last = get(s, "x").await;
                }
                let op = swap("x", last.as_deref(), value);
                assert_eq!(
                    apply(s, new, &op).await,
                    Ok(KvDone::Swapped(true)),
                    "a stale swap landed in between"
                );
            }
        }
        if !matches!(self, Self::Increment) {
            *last = Some(value.to_vec());
        }
        let read = s.kv_get_many(SPACE, &["x", "y", "z"]).await.unwrap();
        let want = match self {
            Self::Batch => vec![last.clone(), last.clone(), None],
            _ => vec![last.clone(), None, None],
        };
        assert_eq!(
            read, want,
            "{self:?}: a stale write landed after the new term's"
        );
    }
}

pub(crate) async fn a_stale_writer_racing_a_takeover_never_lands_after_the_new_one<B: Backend>(
    b: &mut B,
) {
    race_a_takeover(b, Racer::Set).await;
}

pub(crate) async fn a_stale_batch_racing_a_takeover_never_lands_after_the_new_one<B: Backend>(
    b: &mut B,
) {
    race_a_takeover(b, Racer::Batch).await;
}

pub(crate) async fn a_stale_increment_racing_a_takeover_never_lands_after_the_new_one<
    B: Backend,
>(
    b: &mut B,
) {
    race_a_takeover(b, Racer::Increment).await;
}

pub(crate) async fn a_stale_swap_racing_a_takeover_never_lands_after_the_new_one<B: Backend>(
    b: &mut B,
) {
    race_a_takeover(b, Racer::Swap).await;
}

/// Two writers race from separate threads: the old leader keeps writing under its term while
/// a takeover happens and the new leader writes under the new term, reading back after each
/// write. A stale write must never land after a write of the newer term.
async fn race_a_takeover<B: Backend>(b: &mut B, racer: Racer) {
    let clock = ManualClock::default();
    let s = Arc::new(b.open(&clock).await);
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU32::new(0));
    let (under_way, started) = tokio::sync::oneshot::channel();
    let old_writer = std::thread::spawn({
        let (s, stop, refused) = (Arc::clone(&s), Arc::clone(&stop), Arc::clone(&refused));
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut under_way = Some(under_way);
                let mut landed = 0u32;
                for i in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    match racer.old_write(&*s, t1, i).await {
                        Ok(true) => {
                            landed += 1;
                            if let Some(tell) = under_way.take() {
                                let _ = tell.send(());
                            }
                        }
                        Ok(false) => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => {}
                    }
                }
                landed
            })
        }
    });
    // The old writer is under way before the takeover.
    tokio::time::timeout(Duration::from_secs(30), started)
        .await
        .expect("the old writer landed a write in time")
        .expect("the old writer landed a write");
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    let t2 = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    // The new leader writes and reads back until the old writer has raced it for a while
    // (at least 40 writes, and until a stale write of it was refused).
    let racing = std::time::Instant::now();
    let mut last = None;
    for j in 0u64.. {
        if j >= 40 && refused.load(Ordering::SeqCst) > 0 {
            break;
        }
        assert!(
            racing.elapsed() < Duration::from_secs(30),
            "the old writer never ran after the takeover"
        );
        racer.new_write(&*s, t2, j, &mut last).await;
        if j >= 40 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let landed = tokio::task::spawn_blocking(move || old_writer.join().unwrap())
        .await
        .unwrap();
    assert!(landed > 0, "the old writer wrote before the takeover");
}

/// One transaction of many writes (a group commit's batch): each write gets its own answer,
/// sees the writes before it, and a refusal (a stale term, a quota, a swap that lost, a value
/// that is no number) writes nothing of that write and leaves its neighbours be.
pub(crate) async fn kv_one_transaction_gives_each_write_its_own_answer<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    batch(&s, t, &[set("text", b"words")]).await;
    let write = |term: Term, op: OwnedOp, quota: KvQuota| FencedWrite {
        writer: "svc".to_owned(),
        lease_key: "k".to_owned(),
        term,
        space: SPACE.to_owned(),
        op,
        quota,
    };
    let one =
        |key: &str, value: &[u8]| OwnedOp::Batch(vec![(key.to_owned(), Some(value.to_vec()))]);
    // After `text` and `a`, the namespace holds 2 keys: a third is over this quota.
    let two_keys = KvQuota {
        max_keys: 2,
        max_bytes: u64::MAX,
    };
    let all = KvQuota::UNLIMITED;
    let writes = [
        write(t, one("a", b"1"), all),
        write(
            t,
            OwnedOp::Swap("b".into(), Some(b"x".to_vec()), b"y".to_vec()),
            all,
        ),
        write(t, one("over", b"q"), two_keys),
        write(t + 1_000_000, one("stale", b"s"), all),
        write(t, OwnedOp::Increment("n".into(), 5), all),
        write(t, OwnedOp::Increment("text".into(), 1), all),
        write(
            t,
            OwnedOp::Swap("a".into(), Some(b"1".to_vec()), b"2".to_vec()),
            all,
        ),
        write(t, OwnedOp::Increment("n".into(), 1), all),
    ];
    let answers = s.kv_apply_batch(&writes).await.unwrap();
    assert_eq!(
        answers,
        vec![
            Ok(KvDone::Written),
            Ok(KvDone::Swapped(false)),
            Err(KvRefusal::TooManyKeys { limit: 2 }),
            Err(KvRefusal::StaleTerm),
            Ok(KvDone::Number(5)),
            Err(KvRefusal::NotANumber),
            Ok(KvDone::Swapped(true)),
            Ok(KvDone::Number(6)),
        ]
    );
    assert_eq!(get(&s, "a").await.as_deref(), Some(&b"2"[..]));
    assert_eq!(get(&s, "n").await.as_deref(), Some(&b"6"[..]));
    for refused in ["b", "over", "stale"] {
        assert_eq!(get(&s, refused).await, None, "{refused}");
    }
    assert_eq!(get(&s, "text").await.as_deref(), Some(&b"words"[..]));
    assert_eq!(
        usage(&s).await,
        KvUsage::of([("text", &b"words"[..]), ("a", &b"2"[..]), ("n", &b"6"[..])])
    );
    // A batch of refusals only writes nothing, and answers each.
    let refused = [
        write(t + 1, one("x", b"1"), all),
        write(t, OwnedOp::Increment("text".into(), 1), all),
    ];
    assert_eq!(
        s.kv_apply_batch(&refused).await.unwrap(),
        vec![Err(KvRefusal::StaleTerm), Err(KvRefusal::NotANumber)]
    );
}

/// Writers of several services increment one shared key and keys of their own, all at once:
/// no increment is lost, none counted twice, each answer is a count no other got, and the
/// usage is exact (through a group commit, many share each transaction).
pub(crate) async fn kv_concurrent_writers_through_a_group_commit_lose_nothing<B: Backend>(
    b: &mut B,
) {
    const WRITERS: usize = 12;
    const EACH: i64 = 15;
    let clock = ManualClock::default();
    let (s, t) = leased(b, &clock).await;
    let s = Arc::new(s);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let writer = format!("service-{w}");
            let fence = Fence {
                writer: &writer,
                lease_key: "k",
                term: t,
            };
            let own = format!("own-{w}");
            let mut counts = Vec::new();
            for _ in 0..EACH {
                let shared = KvOp::Increment { key: "n", delta: 1 };
                let done = s
                    .kv_apply(&fence, SPACE, &shared, &KvQuota::UNLIMITED)
                    .await;
                match done.unwrap() {
                    Ok(KvDone::Number(n)) => counts.push(n),
                    other => panic!("{other:?}"),
                }
                let mine = KvOp::Increment {
                    key: &own,
                    delta: 1,
                };
                let done = s.kv_apply(&fence, SPACE, &mine, &KvQuota::UNLIMITED).await;
                assert!(matches!(done, Ok(Ok(KvDone::Number(_)))), "{done:?}");
            }
            counts
        }));
    }
    let mut counts = Vec::new();
    for task in tasks {
        counts.extend(task.await.unwrap());
    }
    counts.sort_unstable();
    let total = i64::try_from(WRITERS).unwrap() * EACH;
    assert_eq!(counts, (1..=total).collect::<Vec<_>>(), "each count once");
    let total = total.to_string();
    assert_eq!(get(&*s, "n").await.as_deref(), Some(total.as_bytes()));
    let each = EACH.to_string();
    let mut expected = vec![("n".to_owned(), total.clone())];
    expected.extend((0..WRITERS).map(|w| (format!("own-{w}"), each.clone())));
    let want = KvUsage::of(expected.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
    assert_eq!(usage(&*s).await, want);
}
