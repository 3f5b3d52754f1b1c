//! The store contract's conformance suite, written once and run against every backend.
//!
//! A backend's test module implements [`Backend`] and expands [`suite!`], which turns every
//! case below into a `#[tokio::test]`.

mod kv;

use std::sync::Arc;
use std::time::Duration;

use super::{
    Candidates, Fence, FencedKv, GroupCommit, HandOver, KvOp, KvQuota, KvRefusal, KvWrite, Store,
    StoreError, TtlStore,
};
use crate::clock::ManualClock;

/// How the suite opens a backend and moves its clock.
pub(crate) trait Backend: Send {
    /// The store under test.
    type Store: Store + 'static;
    /// True if a reopened store sees what the previous one wrote.
    const PERSISTENT: bool;
    /// True if the store's expiry runs on the suite's [`ManualClock`], exact to the
    /// nanosecond. False for a store that keeps its own time (etcd): `advance` then really
    /// sleeps, and the two cases that need an exact or rebootable clock are replaced by
    /// coarse ones (see [`expiry_is_inclusive`], [`records_from_before_a_reboot_are_expired`]).
    const EXACT_CLOCK: bool = true;
    /// The lease length the cases use (shorter for a backend whose time passes for real).
    const TTL: Duration = Duration::from_secs(10);
    /// How long after its expiry a record may still read as live: zero on an exact clock;
    /// etcd deletes expired leases in a periodic sweep.
    const EXPIRY_LAG: Duration = Duration::ZERO;
    /// Opens the store; for a persistent backend, on the data of earlier opens.
    async fn open(&mut self, clock: &ManualClock) -> Self::Store;
    /// Moves the store's clock `d` later.
    async fn advance(&mut self, clock: &ManualClock, d: Duration) {
        clock.advance(d);
    }
}

/// A backend behind a [`GroupCommit`]: its key-value writes wait in the queue, and are
/// applied with whatever else is queued.
pub(crate) struct Grouped<B>(pub B);

impl<B: Backend> Backend for Grouped<B> {
    type Store = GroupCommit;
    const PERSISTENT: bool = B::PERSISTENT;
    const EXACT_CLOCK: bool = B::EXACT_CLOCK;
    const TTL: Duration = B::TTL;
    const EXPIRY_LAG: Duration = B::EXPIRY_LAG;
    async fn open(&mut self, clock: &ManualClock) -> GroupCommit {
        GroupCommit::new(Arc::new(self.0.open(clock).await))
    }
    async fn advance(&mut self, clock: &ManualClock, d: Duration) {
        self.0.advance(clock, d).await;
    }
}

const NANO: Duration = Duration::from_nanos(1);

/// Expands to one `#[tokio::test]` per conformance case for the given [`Backend`] value.
macro_rules! suite {
    (@cases $backend:expr; $($case:ident),*) => {
        $(
            #[tokio::test]
            async fn $case() {
                let mut backend = $backend;
                $crate::store::conformance::$case(&mut backend).await;
            }
        )*
    };
    (@all $backend:expr) => {
        $crate::store::conformance::suite!(@cases $backend;
            insert_then_get, insert_on_existing_key_fails_even_with_same_value,
            cas_succeeds_on_own_value, cas_fails_on_wrong_value, cas_fails_on_absent_key,
            cas_resets_expiry, delete_own_value, delete_foreign_value_fails,
            expiry_is_inclusive, expired_record_is_absent_for_every_operation,
            terms_increase_across_delete_expire_and_reopen, get_reports_time_left,
            records_from_before_a_reboot_are_expired,
            an_insert_applied_despite_an_error_is_found_by_its_value_and_deleted,
            wait_released_wakes_on_delete, hand_over_passes_the_record_to_the_freshest_live_candidate,
            hand_over_passes_expired_and_ineligible_candidates_over_and_changes_nothing_when_not_held,
            hand_over_wakes_waiters_and_fences_the_old_term,
            a_handover_prepared_ahead_goes_to_a_live_candidate_even_if_the_view_went_stale,
            list_returns_the_live_records_under_a_prefix,
            renew_all_renews_every_record_of_the_holder_and_no_other,
            renew_all_renews_by_holder_and_keeps_each_value,
            renew_all_never_renews_a_record_the_holder_lost);
        $crate::store::conformance::suite!(@kv $backend);
    };
    // The cases of fenced key-value writes.
    (@kv $backend:expr) => {
        $crate::store::conformance::suite!(@cases $backend;
            kv_writes_are_fenced_by_term,
            a_stale_writer_racing_a_takeover_never_lands_after_the_new_one,
            a_stale_batch_racing_a_takeover_never_lands_after_the_new_one,
            a_stale_increment_racing_a_takeover_never_lands_after_the_new_one,
            a_stale_swap_racing_a_takeover_never_lands_after_the_new_one,
            kv_a_batch_keeps_the_last_write_of_a_key_and_lands_whole_or_not_at_all,
            kv_delete_removes_keys_and_an_absent_key_is_no_error,
            kv_get_many_answers_in_the_order_asked_with_absent_keys,
            kv_list_pages_through_a_prefix, kv_view_lists_a_prefix_with_the_namespaces_usage,
            kv_increment_counts_from_absent_and_refuses_text_and_overflow,
            kv_swap_compares_exact_bytes_and_absence_and_a_loss_writes_nothing,
            kv_a_key_quota_refuses_growth_writes_nothing_and_a_delete_frees_a_key,
            kv_a_byte_quota_refuses_growth_writes_nothing_and_lets_a_namespace_shrink,
            kv_usage_is_exact_after_mixed_writes, kv_a_batch_of_max_batch_keys_lands,
            kv_a_stale_term_refuses_every_kind_of_write,
            kv_two_writers_sharing_a_namespace_lose_nothing,
            kv_one_transaction_gives_each_write_its_own_answer,
            kv_concurrent_writers_through_a_group_commit_lose_nothing);
    };
    // `optional: expr` takes an `Option` of a backend; `None` (e.g. a missing server binary,
    // reported by whoever built the option) turns every case into a no-op.
    (optional: $backend:expr) => {
        $crate::store::conformance::suite!(@all match $backend {
            Some(backend) => backend,
            None => return,
        });
        /// The key-value cases again, every write through a group commit's queue.
        mod grouped {
            use super::*;
            $crate::store::conformance::suite!(@kv match $backend {
                Some(backend) => $crate::store::conformance::Grouped(backend),
                None => return,
            });
        }
    };
    ($backend:expr) => {
        $crate::store::conformance::suite!(@all $backend);
        /// The key-value cases again, every write through a group commit's queue.
        mod grouped {
            use super::*;
            $crate::store::conformance::suite!(@kv $crate::store::conformance::Grouped($backend));
        }
    };
}
pub(crate) use suite;

pub(crate) use kv::*;

/// A single fenced set, as the cases below write it: `true` if it landed, `false` if the
/// term was stale.
pub(crate) trait SetOne {
    async fn kv_set(
        &self,
        fence: &Fence<'_>,
        space: &str,
        key: &str,
        value: &[u8],
    ) -> Result<bool, StoreError>;
}

impl<S: FencedKv + ?Sized> SetOne for S {
    async fn kv_set(
        &self,
        fence: &Fence<'_>,
        space: &str,
        key: &str,
        value: &[u8],
    ) -> Result<bool, StoreError> {
        let writes = [KvWrite::Set { key, value }];
        let op = KvOp::Batch(&writes);
        match self
            .kv_apply(fence, space, &op, &KvQuota::UNLIMITED)
            .await?
        {
            Ok(_) => Ok(true),
            Err(KvRefusal::StaleTerm) => Ok(false),
            Err(refusal) => panic!("an unlimited set refused: {refusal}"),
        }
    }
}

pub(crate) async fn insert_then_get<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let term = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    let rec = s.get("k").await.unwrap().unwrap();
    assert_eq!((rec.value.as_str(), rec.term), ("a", term));
    assert!(s.get("other").await.unwrap().is_none());
}

pub(crate) async fn insert_on_existing_key_fails_even_with_same_value<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    assert!(
        s.insert_if_absent("k", "a", B::TTL)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(s.insert_if_absent("k", "a", B::TTL).await.unwrap(), None);
    assert_eq!(s.insert_if_absent("k", "b", B::TTL).await.unwrap(), None);
    assert_eq!(s.get("k").await.unwrap().unwrap().value, "a");
}

pub(crate) async fn cas_succeeds_on_own_value<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let term = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(s.compare_and_swap("k", "a", "b", B::TTL).await.unwrap());
    let rec = s.get("k").await.unwrap().unwrap();
    assert_eq!(
        (rec.value.as_str(), rec.term),
        ("b", term),
        "a swap keeps the term"
    );
}

pub(crate) async fn cas_fails_on_wrong_value<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(!s.compare_and_swap("k", "x", "b", B::TTL).await.unwrap());
    assert_eq!(s.get("k").await.unwrap().unwrap().value, "a");
}

pub(crate) async fn cas_fails_on_absent_key<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    assert!(!s.compare_and_swap("k", "a", "b", B::TTL).await.unwrap());
    assert!(
        s.get("k").await.unwrap().is_none(),
        "a failed swap creates nothing"
    );
}

pub(crate) async fn cas_resets_expiry<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(2)).unwrap())
        .await;
    assert!(s.compare_and_swap("k", "a", "a", B::TTL).await.unwrap());
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(1)).unwrap())
        .await;
    assert!(
        s.get("k").await.unwrap().is_some(),
        "the swap moved the expiry"
    );
    b.advance(&clock, Duration::from_secs(1) + B::EXPIRY_LAG)
        .await;
    assert!(s.get("k").await.unwrap().is_none());
}

pub(crate) async fn delete_own_value<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    assert!(s.get("k").await.unwrap().is_none());
    assert!(
        !s.compare_and_delete("k", "a").await.unwrap(),
        "already gone"
    );
}

pub(crate) async fn delete_foreign_value_fails<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(!s.compare_and_delete("k", "b").await.unwrap());
    assert_eq!(s.get("k").await.unwrap().unwrap().value, "a");
}

pub(crate) async fn expiry_is_inclusive<B: Backend>(b: &mut B) {
    if !B::EXACT_CLOCK {
        return expires_after_ttl_not_before(b).await;
    }
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    b.advance(&clock, B::TTL.checked_sub(NANO).unwrap()).await;
    assert_eq!(s.get("k").await.unwrap().unwrap().time_left, NANO);
    b.advance(&clock, NANO).await;
    assert!(
        s.get("k").await.unwrap().is_none(),
        "expired when now == expiry"
    );
}

pub(crate) async fn expired_record_is_absent_for_every_operation<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let old = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    b.advance(&clock, B::TTL + B::EXPIRY_LAG).await;
    assert!(s.get("k").await.unwrap().is_none());
    assert!(!s.compare_and_swap("k", "a", "a", B::TTL).await.unwrap());
    assert!(!s.compare_and_delete("k", "a").await.unwrap());
    let fence = Fence {
        writer: "svc",
        lease_key: "k",
        term: old,
    };
    assert!(!s.kv_set(&fence, "svc", "x", b"1").await.unwrap());
    let new = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(new > old);
}

pub(crate) async fn terms_increase_across_delete_expire_and_reopen<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    let t2 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert!(t2 > t1, "after delete: {t2} > {t1}");
    b.advance(&clock, B::TTL + B::EXPIRY_LAG).await;
    let t3 = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    assert!(t3 > t2, "after expiry: {t3} > {t2}");
    let other = s
        .insert_if_absent("other", "b", B::TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(other >= 1);
    if B::PERSISTENT {
        assert!(s.compare_and_delete("k", "b").await.unwrap());
        drop(s);
        let s = b.open(&clock).await;
        let t4 = s.insert_if_absent("k", "c", B::TTL).await.unwrap().unwrap();
        assert!(t4 > t3, "after reopen: {t4} > {t3}");
    }
}

pub(crate) async fn get_reports_time_left<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    assert_eq!(s.get("k").await.unwrap().unwrap().time_left, B::TTL);
    // 3 s, or a third of a shorter TTL (a store with its own clock counts whole seconds).
    let step = Duration::from_secs(3).min(B::TTL / 3);
    b.advance(&clock, step).await;
    assert_eq!(
        s.get("k").await.unwrap().unwrap().time_left,
        B::TTL.checked_sub(step).unwrap()
    );
}

pub(crate) async fn records_from_before_a_reboot_are_expired<B: Backend>(b: &mut B) {
    if !B::EXACT_CLOCK {
        return records_outlive_their_writer_until_the_ttl(b).await;
    }
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    clock.reboot();
    assert!(s.get("k").await.unwrap().is_none());
    let t2 = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    assert!(t2 > t1);
}

/// Stands in for [`expiry_is_inclusive`] on a store that keeps its own, coarser time: the
/// record is live a second before its TTL runs out (reporting at most that second left) and
/// gone once the TTL and the store's expiry lag have passed.
async fn expires_after_ttl_not_before<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(1)).unwrap())
        .await;
    let rec = s
        .get("k")
        .await
        .unwrap()
        .expect("live before its TTL ran out");
    assert!(
        rec.time_left <= Duration::from_secs(1),
        "{:?}",
        rec.time_left
    );
    b.advance(&clock, Duration::from_secs(1) + B::EXPIRY_LAG)
        .await;
    assert!(s.get("k").await.unwrap().is_none(), "gone after its TTL");
}

/// Stands in for [`records_from_before_a_reboot_are_expired`] on a store that keeps its own
/// time (a cluster): the host's reboot changes nothing, the record keeps its term until its
/// TTL runs out by the store's clock, and the next insert gets a larger term.
async fn records_outlive_their_writer_until_the_ttl<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    drop(s);
    clock.reboot();
    let s = b.open(&clock).await;
    let rec = s
        .get("k")
        .await
        .unwrap()
        .expect("the store, not the host, keeps time");
    assert_eq!((rec.value.as_str(), rec.term), ("a", t1));
    assert_eq!(s.insert_if_absent("k", "b", B::TTL).await.unwrap(), None);
    b.advance(&clock, B::TTL + B::EXPIRY_LAG).await;
    assert!(s.get("k").await.unwrap().is_none());
    let t2 = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    assert!(t2 > t1);
}

pub(crate) async fn kv_writes_are_fenced_by_term<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    let old = Fence {
        writer: "svc",
        lease_key: "k",
        term: t1,
    };
    assert!(s.kv_set(&old, "svc", "x", b"1").await.unwrap());
    assert_eq!(
        s.kv_get("svc", "x").await.unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(
        s.kv_get("other", "x").await.unwrap(),
        None,
        "namespaces are apart"
    );
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    let t2 = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    assert!(!s.kv_set(&old, "svc", "x", b"stale").await.unwrap());
    let new = Fence {
        writer: "svc",
        lease_key: "k",
        term: t2,
    };
    assert!(s.kv_set(&new, "svc", "x", b"2").await.unwrap());
    assert_eq!(
        s.kv_get("svc", "x").await.unwrap().as_deref(),
        Some(&b"2"[..])
    );
}

pub(crate) async fn wait_released_wakes_on_delete<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = Arc::new(b.open(&clock).await);
    s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let s = Arc::clone(&s);
        async move { s.wait_released(Duration::from_hours(1)).await }
    });
    // Let the waiter start waiting before the release.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(s.compare_and_delete("k", "a").await.unwrap());
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("wait_released returned after the delete, not after an hour")
        .unwrap();
}

/// The candidates of the hand-over cases.
fn cand() -> Candidates {
    Candidates::any("cand/")
}

/// A releasing holder passes its record to the freshest live candidate under the prefix in
/// one write: the candidate's value, a new term, a fresh TTL, and the candidate's record
/// gone. With no candidate left the record is deleted.
pub(crate) async fn hand_over_passes_the_record_to_the_freshest_live_candidate<B: Backend>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    s.insert_if_absent("cand/x", "x", B::TTL)
        .await
        .unwrap()
        .unwrap();
    b.advance(&clock, Duration::from_secs(1)).await;
    // Written later, though later by key: the freshest.
    s.insert_if_absent("cand/y", "y", B::TTL)
        .await
        .unwrap()
        .unwrap();
    // Another prefix is no candidate.
    s.insert_if_absent("candidates", "z", B::TTL)
        .await
        .unwrap()
        .unwrap();
    let handed = s.hand_over("k", "a", &cand(), B::TTL).await.unwrap();
    let HandOver::To { to, term: t2 } = handed else {
        panic!("not handed over: {handed:?}");
    };
    assert_eq!(to, "y", "the candidate written last");
    assert!(t2 > t1, "a new term: {t2} after {t1}");
    let rec = s.get("k").await.unwrap().unwrap();
    assert_eq!((rec.value.as_str(), rec.term), ("y", t2));
    assert!(rec.lives_at_least > B::TTL / 2, "a fresh TTL: {rec:?}");
    assert!(
        s.get("cand/y").await.unwrap().is_none(),
        "its candidacy is used up"
    );
    // The new holder renews as usual, then hands on to the next candidate.
    assert!(s.compare_and_swap("k", "y", "y+", B::TTL).await.unwrap());
    assert_eq!(
        s.get("k").await.unwrap().unwrap().term,
        t2,
        "a renewal keeps the term"
    );
    let HandOver::To { to, term: t3 } = s.hand_over("k", "y+", &cand(), B::TTL).await.unwrap()
    else {
        panic!("not handed over to x");
    };
    assert_eq!(to, "x");
    assert!(t3 > t2);
    assert_eq!(
        s.hand_over("k", "x", &cand(), B::TTL).await.unwrap(),
        HandOver::Deleted
    );
    assert!(s.get("k").await.unwrap().is_none());
    let t4 = s.insert_if_absent("k", "b", B::TTL).await.unwrap().unwrap();
    assert!(
        t4 > t3,
        "an insert after a handover still gets a larger term"
    );
    assert_eq!(s.get("k").await.unwrap().unwrap().term, t4);
    assert_eq!(s.get("candidates").await.unwrap().unwrap().value, "z");
}

/// [`TtlStore::prepare_hand_over`] reads ahead (etcd: the candidates) while the releasing host
/// stops its services. What it read may be stale by the handover: the candidate it saw has
/// withdrawn and another stands, or the one it saw is no longer eligible. The handover still
/// goes to a live, eligible candidate, never to the withdrawn one, and does not fall back to
/// a delete while one stands.
pub(crate) async fn a_handover_prepared_ahead_goes_to_a_live_candidate_even_if_the_view_went_stale<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    s.insert_if_absent("cand/x", "x", B::TTL)
        .await
        .unwrap()
        .unwrap();
    s.prepare_hand_over(&cand()).await;
    assert!(s.compare_and_delete("cand/x", "x").await.unwrap());
    s.insert_if_absent("cand/y", "y", B::TTL)
        .await
        .unwrap()
        .unwrap();
    let handed = s.hand_over("k", "a", &cand(), B::TTL).await.unwrap();
    let HandOver::To { to, term: t2 } = handed else {
        panic!("not handed over: {handed:?}");
    };
    assert_eq!(to, "y", "the candidate standing at the handover");
    assert!(t2 > t1);
    assert_eq!(s.get("k").await.unwrap().unwrap().value, "y");

    // Read ahead while eligible, ineligible by the handover (the freshest, z): passed over
    // for the other one.
    s.insert_if_absent("cand/w", "w", B::TTL)
        .await
        .unwrap()
        .unwrap();
    b.advance(&clock, Duration::from_secs(1)).await;
    s.insert_if_absent("cand/z", "z", B::TTL)
        .await
        .unwrap()
        .unwrap();
    s.prepare_hand_over(&cand()).await;
    let not_z = Candidates {
        prefix: "cand/".to_owned(),
        eligible: Arc::new(|value: &str| value != "z"),
    };
    let handed = s.hand_over("k", "y", &not_z, B::TTL).await.unwrap();
    let HandOver::To { to, .. } = handed else {
        panic!("not handed over: {handed:?}");
    };
    assert_eq!(to, "w");
    assert!(
        s.get("cand/z").await.unwrap().is_some(),
        "z stays a candidate"
    );
}

pub(crate) async fn hand_over_passes_expired_and_ineligible_candidates_over_and_changes_nothing_when_not_held<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    // A short-lived candidate first by key, then the record and a long-lived one.
    let short = if B::EXACT_CLOCK {
        B::TTL / 10
    } else {
        Duration::from_secs(1)
    };
    s.insert_if_absent("cand/a", "gone", short)
        .await
        .unwrap()
        .unwrap();
    b.advance(&clock, short + B::EXPIRY_LAG + NANO).await;
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    s.insert_if_absent("cand/b", "b", B::TTL)
        .await
        .unwrap()
        .unwrap();
    // Not ours: nothing changes.
    assert_eq!(
        s.hand_over("k", "other", &cand(), B::TTL).await.unwrap(),
        HandOver::NotHeld
    );
    assert_eq!(
        s.hand_over("absent", "a", &cand(), B::TTL).await.unwrap(),
        HandOver::NotHeld
    );
    let rec = s.get("k").await.unwrap().unwrap();
    assert_eq!((rec.value.as_str(), rec.term), ("a", t1));
    assert_eq!(s.get("cand/b").await.unwrap().unwrap().value, "b");
    // A live candidate that is not eligible (its process stopped, say) is passed over, even
    // the freshest.
    b.advance(&clock, Duration::from_secs(1)).await;
    s.insert_if_absent("cand/c", "stopped", B::TTL)
        .await
        .unwrap()
        .unwrap();
    let not_stopped = Candidates {
        eligible: Arc::new(|value: &str| value != "stopped"),
        ..cand()
    };
    let handed = s.hand_over("k", "a", &not_stopped, B::TTL).await.unwrap();
    assert!(
        matches!(&handed, HandOver::To { to, .. } if to == "b"),
        "the expired and the ineligible candidates are passed over: {handed:?}"
    );
    assert_eq!(s.get("cand/c").await.unwrap().unwrap().value, "stopped");
    let nobody = Candidates {
        eligible: Arc::new(|_: &str| false),
        ..cand()
    };
    assert_eq!(
        s.hand_over("k", "b", &nobody, B::TTL).await.unwrap(),
        HandOver::Deleted
    );
}

/// A handover wakes waiters as a delete does, and fences the old holder's writes out.
pub(crate) async fn hand_over_wakes_waiters_and_fences_the_old_term<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = Arc::new(b.open(&clock).await);
    let t1 = s.insert_if_absent("k", "a", B::TTL).await.unwrap().unwrap();
    s.insert_if_absent("cand/b", "b", B::TTL)
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let s = Arc::clone(&s);
        async move { s.wait_released(Duration::from_hours(1)).await }
    });
    // Let the waiter start waiting before the release.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let handed = s.hand_over("k", "a", &cand(), B::TTL).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("wait_released returned after the handover, not after an hour")
        .unwrap();
    let old = Fence {
        writer: "svc",
        lease_key: "k",
        term: t1,
    };
    assert!(!s.kv_set(&old, "svc", "x", b"stale").await.unwrap());
    if let HandOver::To { term, .. } = &handed {
        let term = *term;
        let new = Fence {
            writer: "svc",
            lease_key: "k",
            term,
        };
        assert!(s.kv_set(&new, "svc", "x", b"new").await.unwrap());
        assert!(s.compare_and_swap("k", "b", "b+", B::TTL).await.unwrap());
        assert!(s.kv_set(&new, "svc", "x", b"renewed").await.unwrap());
        // Released and taken anew: the handed term is stale too.
        assert!(s.compare_and_delete("k", "b+").await.unwrap());
        assert!(!s.kv_set(&new, "svc", "x", b"stale").await.unwrap());
        let t3 = s.insert_if_absent("k", "c", B::TTL).await.unwrap().unwrap();
        assert!(!s.kv_set(&new, "svc", "x", b"stale").await.unwrap());
        assert!(!s.kv_set(&old, "svc", "x", b"stale").await.unwrap());
        let newest = Fence {
            writer: "svc",
            lease_key: "k",
            term: t3,
        };
        assert!(s.kv_set(&newest, "svc", "x", b"newest").await.unwrap());
        assert_eq!(
            s.kv_get("svc", "x").await.unwrap().as_deref(),
            Some(&b"newest"[..])
        );
    }
    assert!(matches!(handed, HandOver::To { .. }));
}

pub(crate) async fn list_returns_the_live_records_under_a_prefix<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let tb = s
        .insert_if_absent("member/b", "b", B::TTL)
        .await
        .unwrap()
        .unwrap();
    let ta = s
        .insert_if_absent("member/a", "a", B::TTL)
        .await
        .unwrap()
        .unwrap();
    s.insert_if_absent("service/x", "a", B::TTL)
        .await
        .unwrap()
        .unwrap();
    s.insert_if_absent("memberx", "a", B::TTL)
        .await
        .unwrap()
        .unwrap();
    let members = s.list("member/").await.unwrap();
    let seen: Vec<(&str, &str, u64)> = members
        .iter()
        .map(|(k, r)| (k.as_str(), r.value.as_str(), r.term))
        .collect();
    assert_eq!(
        seen,
        [("member/a", "a", ta), ("member/b", "b", tb)],
        "sorted by key"
    );
    assert!(
        members
            .iter()
            .all(|(_, r)| r.time_left <= B::TTL + Duration::from_secs(1))
    );
    assert_eq!(s.list("service/").await.unwrap().len(), 1);
    assert!(s.list("nothing/").await.unwrap().is_empty());
    // Deleted and expired records are not listed.
    assert!(s.compare_and_delete("member/b", "b").await.unwrap());
    assert_eq!(s.list("member/").await.unwrap().len(), 1);
    b.advance(&clock, B::TTL + B::EXPIRY_LAG).await;
    assert!(s.list("member/").await.unwrap().is_empty());
}

/// Inserts `value` under `key` (absent) for `ttl`: its term.
async fn inserted(s: &impl TtlStore, key: &str, value: &str, ttl: Duration) -> super::Term {
    let term = s.insert_if_absent(key, value, ttl).await.unwrap();
    term.unwrap_or_else(|| panic!("{key} was live already"))
}

pub(crate) async fn renew_all_renews_every_record_of_the_holder_and_no_other<B: Backend>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let tx = inserted(&s, "service/x", "h", B::TTL).await;
    let ty = inserted(&s, "service/y", "h", B::TTL).await;
    let tm = inserted(&s, "member/h", "h", B::TTL).await;
    inserted(&s, "service/z", "other", B::TTL).await;
    inserted(&s, "slot/1", "h", B::TTL).await;
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(2)).unwrap())
        .await;
    let renewed = s
        .renew_all(&["service/", "member/"], "h", B::TTL)
        .await
        .unwrap();
    assert_eq!(
        renewed,
        [
            ("member/h".to_owned(), tm),
            ("service/x".to_owned(), tx),
            ("service/y".to_owned(), ty)
        ],
        "sorted by key, with their terms"
    );
    // Renewed records keep working as records: fenced writes, deletes.
    let fence = Fence {
        writer: "svc",
        lease_key: "service/x",
        term: tx,
    };
    assert!(s.kv_set(&fence, "x", "k", b"1").await.unwrap());
    assert!(s.compare_and_delete("service/x", "h").await.unwrap());
    assert_eq!(
        s.renew_all(&["service/", "member/"], "h", B::TTL)
            .await
            .unwrap(),
        [("member/h".to_owned(), tm), ("service/y".to_owned(), ty)]
    );
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(1)).unwrap())
        .await;
    for key in ["service/y", "member/h"] {
        let record = s.get(key).await.unwrap();
        assert_eq!(
            record.map(|r| r.value),
            Some("h".to_owned()),
            "{key} renewed"
        );
    }
    b.advance(&clock, B::EXPIRY_LAG).await;
    assert!(
        s.get("service/z").await.unwrap().is_none(),
        "another holder's"
    );
    assert!(
        s.get("slot/1").await.unwrap().is_none(),
        "outside the prefixes"
    );
}

/// A record's value is its holder, or its holder, a newline and more ([`crate::lease_value`]):
/// `renew_all` renews by the holder part and leaves each value as it was. A holder that
/// merely starts with the same characters is another holder.
pub(crate) async fn renew_all_renews_by_holder_and_keeps_each_value<B: Backend>(b: &mut B) {
    const MEMBER: &str = "h\n{\"loaded\":{\"a\":\"0123456789ab\"}}";
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    let tm = inserted(&s, "member/h", MEMBER, B::TTL).await;
    let tx = inserted(&s, "service/x", "h", B::TTL).await;
    let ty = inserted(&s, "service/y", "hx", B::TTL).await;
    let tz = inserted(&s, "service/z", "hx\n[]", B::TTL).await;
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(2)).unwrap())
        .await;
    assert_eq!(
        s.renew_all(&["member/", "service/"], "h", B::TTL)
            .await
            .unwrap(),
        [("member/h".to_owned(), tm), ("service/x".to_owned(), tx)],
        "the holder's records, by the holder part of their values"
    );
    for (key, value, term) in [("service/y", "hx", ty), ("service/z", "hx\n[]", tz)] {
        let record = s.get(key).await.unwrap().expect("still live");
        assert_eq!(
            (record.value.as_str(), record.term),
            (value, term),
            "{key} is another holder's, untouched"
        );
    }
    // Past the first expiry: the renewed records live on, each with its own value and term;
    // the others expired when they were due.
    b.advance(&clock, B::TTL.checked_sub(Duration::from_secs(1)).unwrap())
        .await;
    for (key, value, term) in [("member/h", MEMBER, tm), ("service/x", "h", tx)] {
        let record = s.get(key).await.unwrap().expect("renewed");
        assert_eq!(
            (record.value.as_str(), record.term),
            (value, term),
            "{key} keeps its value"
        );
    }
    b.advance(&clock, B::EXPIRY_LAG).await;
    for key in ["service/y", "service/z"] {
        assert!(s.get(key).await.unwrap().is_none(), "{key} not renewed");
    }
}

pub(crate) async fn renew_all_never_renews_a_record_the_holder_lost<B: Backend>(b: &mut B) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    // Lost by expiry: the renewal must not bring it back.
    s.insert_if_absent("service/x", "h", B::TTL)
        .await
        .unwrap()
        .unwrap();
    // Lost to another holder after a delete.
    s.insert_if_absent("service/y", "h", B::TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(s.compare_and_delete("service/y", "h").await.unwrap());
    s.insert_if_absent("service/y", "other", B::TTL)
        .await
        .unwrap()
        .unwrap();
    b.advance(&clock, B::TTL + B::EXPIRY_LAG).await;
    let ty = s
        .insert_if_absent("service/y", "other2", B::TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        s.renew_all(&["service/"], "h", B::TTL).await.unwrap(),
        [],
        "nothing is the holder's any more"
    );
    assert!(s.get("service/x").await.unwrap().is_none());
    let y = s.get("service/y").await.unwrap().unwrap();
    assert_eq!((y.value.as_str(), y.term), ("other2", ty));
    // The holder takes one again: a new term, renewed from then on.
    let tx = s
        .insert_if_absent("service/x", "h", B::TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        s.renew_all(&["service/"], "h", B::TTL).await.unwrap(),
        [("service/x".to_owned(), tx)]
    );
}

/// An insert that failed may have been applied (the answer was lost). On every backend the
/// caller finds its own record by reading it (its value is the caller's), and deletes it by
/// that value: what a campaign does to retake such a record at once, and an elections cleanup
/// to delete it (the lifecycle's side of it is tested over the fault-injecting double in
/// `host/tests/lifecycle`: `an_insert_applied_despite_an_error_does_not_make_the_host_wait_for_itself`
/// and the elections' cleanup case).
pub(crate) async fn an_insert_applied_despite_an_error_is_found_by_its_value_and_deleted<
    B: Backend,
>(
    b: &mut B,
) {
    let clock = ManualClock::default();
    let s = b.open(&clock).await;
    // The insert is applied; its answer is lost on the way back (an etcd timeout after the
    // cluster applied it, a redb commit whose caller gave up).
    let _lost = s.insert_if_absent("c", "me", B::TTL).await;
    let record = s.get("c").await.unwrap().expect("applied");
    assert_eq!(record.value, "me");
    assert!(record.time_left > Duration::ZERO);
    assert!(
        s.insert_if_absent("c", "me", B::TTL)
            .await
            .unwrap()
            .is_none(),
        "a second insert does not take it again: the campaign must read it"
    );
    assert!(!s.compare_and_delete("c", "other").await.unwrap());
    assert!(
        s.compare_and_delete("c", "me").await.unwrap(),
        "deleted by its value"
    );
    assert!(s.get("c").await.unwrap().is_none());
}
