//! Elections (SPEC §4) through the public API, on paused tokio time driving the store's clock.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{Instant, advance, sleep};
use vvm_host::clock::{SystemClock, Timestamp, TokioClock};
use vvm_host::elections::{ElectionError, Elections};
use vvm_host::holder::holder_value;
use vvm_host::killer::{KILLER_EXIT_CODE, Killer};
use vvm_host::lease::valid_until;
use vvm_host::lease_value::{self, ServiceStatus};
use vvm_host::store::{MemStore, TtlStore};

use crate::common::journal::Journal;
use crate::common::store::{Call, Fault, FaultyStore, Op, mem_store};
use crate::common::{child, ops};

const L: Duration = Duration::from_secs(20);
const KEY: &str = "slot/1";
const ME: &str = "me";

struct Fixture {
    clock: TokioClock,
    store: Arc<FaultyStore>,
    killer: Arc<Killer>,
    elections: Arc<Elections>,
    fired: Arc<std::sync::atomic::AtomicUsize>,
}

fn fixture_on(mem: MemStore) -> Fixture {
    let journal = Journal::default();
    let store = FaultyStore::new(mem, "a", &journal);
    let clock = TokioClock::new();
    let (fired, killer) = Killer::counting(Arc::new(clock.clone()));
    let elections = Elections::new(
        store.clone(),
        Arc::clone(&killer),
        Arc::new(clock.clone()),
        ops(),
    );
    Fixture {
        clock,
        store,
        killer,
        elections,
        fired,
    }
}

impl Fixture {
    /// The elections' clock reading at tokio instant `t`.
    fn at(&self, t: Instant) -> Timestamp {
        self.clock.at(t)
    }
}

fn fixture() -> Fixture {
    fixture_on(mem_store())
}

fn starts(calls: &[Call], t0: Instant) -> Vec<Duration> {
    calls.iter().map(|c| c.start - t0).collect()
}

#[tokio::test(start_paused = true)]
async fn acquire_renews_every_quarter_lease_and_release_deletes() {
    let f = fixture();
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    assert_eq!(lead.key(), KEY);
    assert_eq!(lead.term(), 1);
    assert_eq!(f.killer.deadline(), Some(f.at(t0 + L.mul_f64(0.8))));
    sleep(L * 2 + Duration::from_secs(1)).await;
    // Renewed at L/4, L/2, ... 2L: the record outlived its first expiry.
    let cas = f.store.calls_of(Op::Cas);
    let expected: Vec<Duration> = (1..=8).map(|i| L / 4 * i).collect();
    assert_eq!(starts(&cas, t0), expected);
    assert!(cas.iter().all(|c| c.result == Some(Ok(true))));
    let record = f.store.inner.get(KEY).await.unwrap().unwrap();
    assert_eq!(record.value, ME);
    assert_eq!(
        record.time_left,
        L.checked_sub(Duration::from_secs(1)).unwrap(),
        "renewed at 2L"
    );
    assert!(!lead.is_lost());

    f.elections.release(KEY).await;
    assert!(lead.is_lost(), "release fires lost");
    assert!(
        f.store.inner.get(KEY).await.unwrap().is_none(),
        "record deleted"
    );
    // Never fired while the lease was renewed.
    assert_eq!(f.fired.load(Ordering::SeqCst), 0);
    // Release leaves the killer armed (its deadline 0.8 L past the last renewal); disarming
    // is the shutdown's last step. Done here before time moves on: the watchdog is a real
    // thread, and one that woke late would read the paused clock past that deadline (CI saw
    // it fire once so).
    f.killer.disarm();
    sleep(L).await;
    assert_eq!(
        f.store.calls_of(Op::Cas).len(),
        8,
        "no renewal after release"
    );
    assert_eq!(f.fired.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn acquire_of_a_held_key_fails_even_with_the_same_value() {
    let mem = mem_store();
    let a = fixture_on(mem.clone());
    let b = fixture_on(mem);
    let _lead = a.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    assert!(
        b.elections
            .acquire(KEY, "other", L)
            .await
            .unwrap()
            .is_none()
    );
    assert!(b.elections.acquire(KEY, ME, L).await.unwrap().is_none());
    assert_eq!(
        b.killer.deadline(),
        None,
        "a failed acquisition arms nothing"
    );
    // Another key is free.
    assert!(
        b.elections
            .acquire("slot/2", "other", L)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn cas_false_because_the_key_changed_is_lost_and_the_foreign_record_stays() {
    let f = fixture();
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    // Someone else's value appears under the key (e.g. an operator, or a split brain).
    assert!(
        f.store
            .inner
            .compare_and_swap(KEY, ME, "usurper", L)
            .await
            .unwrap()
    );
    lead.lost().await;
    assert_eq!(Instant::now() - t0, L / 4, "lost at the first renewal");
    assert!(lead.deadline().has_passed(), "loss pulls the deadline in");
    let record = f.store.inner.get(KEY).await.unwrap().unwrap();
    assert_eq!(record.value, "usurper", "the foreign record is not deleted");
    sleep(L).await;
    assert_eq!(f.store.calls_of(Op::Cas).len(), 1, "the renewal loop ended");
}

#[tokio::test(start_paused = true)]
async fn key_deleted_underneath_is_lost() {
    let f = fixture();
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    sleep(L / 2 + Duration::from_secs(1)).await;
    assert!(f.store.inner.compare_and_delete(KEY, ME).await.unwrap());
    lead.lost().await;
    assert_eq!(Instant::now() - t0, L / 4 * 3, "lost at the next renewal");
    assert_eq!(f.store.calls_of(Op::Cas).len(), 3);
    assert!(f.store.inner.get(KEY).await.unwrap().is_none());
    // Loss pulls the guests' deadline in to the moment it is known: no grace period of guest
    // effects. The killer keeps the last successful write's deadline for the shutdown.
    assert_eq!(lead.deadline().get(), f.at(t0 + L / 4 * 3));
    assert!(lead.deadline().has_passed());
    assert_eq!(f.killer.deadline(), Some(valid_until(f.at(t0 + L / 2), L)));
}

#[tokio::test(start_paused = true)]
async fn release_without_acquire_is_a_no_op() {
    let f = fixture();
    f.elections.release(KEY).await;
    f.elections.release("never/held").await;
    assert!(f.store.calls().is_empty());
    assert_eq!(f.killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn acquire_after_cleanup_fails_without_touching_the_store() {
    let f = fixture();
    let _lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.elections.cleanup().await;
    assert!(f.store.inner.get(KEY).await.unwrap().is_none());
    let calls = f.store.calls().len();
    let again = f.elections.acquire("slot/2", ME, L).await;
    assert!(matches!(again, Err(ElectionError::CleanedUp)), "{again:?}");
    assert_eq!(f.store.calls().len(), calls);
}

#[tokio::test(start_paused = true)]
async fn cleanup_during_a_stalled_renewal_releases_and_ends_the_loop() {
    let f = fixture();
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.store.script(Op::Cas, [Fault::Stall]);
    sleep(L / 4 + Duration::from_secs(1)).await;
    assert_eq!(f.store.calls_of(Op::Cas).len(), 1, "the CAS hangs");
    f.elections.cleanup().await;
    assert_eq!(
        Instant::now() - t0,
        L / 4 + Duration::from_secs(1),
        "no wait"
    );
    assert!(lead.is_lost());
    assert!(f.store.inner.get(KEY).await.unwrap().is_none());
    sleep(L).await;
    assert_eq!(f.store.calls_of(Op::Cas).len(), 1, "the renewal loop ended");
    // The killer stays armed: disarming is the shutdown sequence's last step.
    assert_eq!(f.killer.deadline(), Some(valid_until(f.at(t0), L)));
}

#[tokio::test(start_paused = true)]
async fn cleanup_during_cas_retries_releases_and_ends_the_loop() {
    let f = fixture();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.store.script(Op::Cas, [Fault::Transient]);
    sleep(L / 4 + L / 40).await; // between the first attempt and its retry
    assert_eq!(f.store.calls_of(Op::Cas).len(), 1);
    f.elections.cleanup().await;
    assert!(lead.is_lost());
    assert!(f.store.inner.get(KEY).await.unwrap().is_none());
    sleep(L).await;
    assert_eq!(f.store.calls_of(Op::Cas).len(), 1, "no retry after cleanup");
}

#[tokio::test(start_paused = true)]
async fn cleanup_is_bounded_when_the_store_stalls() {
    let f = fixture();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.store.stall_everything();
    let t = Instant::now();
    f.elections.cleanup().await;
    assert_eq!(Instant::now() - t, L / 4, "the delete waits L/4 at most");
    assert!(lead.is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_once_recovers_with_exactly_four_cas_calls() {
    let f = fixture();
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.store.script(Op::Cas, [Fault::Transient]);
    // The window: acquisition up to just after the second tick following the recovery.
    sleep(L / 4 + L / 20 + L / 2 + L / 40).await;
    let cas = f.store.calls_of(Op::Cas);
    assert_eq!(
        starts(&cas, t0),
        vec![L / 4, L / 4 + L / 20, L / 2 + L / 20, L / 4 * 3 + L / 20],
        "error, retry L/20 later, then every L/4 from the recovered write"
    );
    assert_eq!(cas[0].result, Some(Err(())));
    assert!(cas[1..].iter().all(|c| c.result == Some(Ok(true))));
    assert!(!lead.is_lost());
    assert_eq!(
        lead.deadline().get(),
        valid_until(f.at(t0 + L / 4 * 3 + L / 20), L)
    );
}

#[tokio::test(start_paused = true)]
async fn persistent_errors_lose_the_lease_after_exactly_three_attempts_l20_apart() {
    let f = fixture();
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.store.set_default(Op::Cas, Fault::Transient);
    lead.lost().await;
    let lost_at = Instant::now() - t0;
    let cas = f.store.calls_of(Op::Cas);
    assert_eq!(
        starts(&cas, t0),
        vec![L / 4, L / 4 + L / 20, L / 4 + L / 10]
    );
    assert_eq!(
        lost_at,
        L / 4 + L / 10,
        "lost right after the third attempt"
    );
    assert_eq!(
        lead.deadline().get(),
        f.at(t0 + L / 4 + L / 10),
        "loss pulls the deadline in to now"
    );
    // Lost, but the record stays until the owner has stopped its services and releases it:
    // nobody else can take the slot while a guest of ours might still run.
    assert_eq!(f.store.inner.get(KEY).await.unwrap().unwrap().value, ME);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(f.store.calls_of(Op::Cas).len(), 3, "no fourth attempt");
    assert_eq!(
        f.killer.deadline(),
        Some(valid_until(f.at(t0), L)),
        "never moved"
    );
    f.elections.release(KEY).await;
    assert!(
        f.store.inner.get(KEY).await.unwrap().is_none(),
        "release deletes it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_not_handed_on_before_the_killer_deadline() {
    let mem = mem_store();
    let f = fixture_on(mem.clone());
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    f.store.set_default(Op::Cas, Fault::Transient);
    lead.lost().await;
    // The owner never releases (its services ignore the stop): the slot stays taken until
    // the record written at t0 expires at t0+L, after the killer's deadline at t0+0.8·L.
    let standby = fixture_on(mem);
    loop {
        if standby
            .elections
            .acquire(KEY, "standby", L)
            .await
            .unwrap()
            .is_some()
        {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(Instant::now() - t0, L, "taken over only at expiry");
    assert!(f.killer.deadline().unwrap() < f.at(t0 + L));
}

#[tokio::test(start_paused = true)]
async fn valid_until_is_the_start_of_the_last_successful_write_plus_0_8_l() {
    let f = fixture();
    let secs = Duration::from_secs;
    // A slow insert (answer 3 s after the write): counted from before the write.
    f.store.script(Op::Insert, [Fault::DelayAfter(secs(3))]);
    let t0 = Instant::now();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    assert_eq!(Instant::now() - t0, secs(3));
    assert_eq!(lead.deadline().get(), f.at(t0 + secs(16)));
    assert_eq!(f.killer.deadline(), Some(f.at(t0 + secs(16))));
    // A slow renewal at t0+5 (lands 2 s after it started): counted from its start.
    f.store
        .script(Op::Cas, [Fault::DelayBefore(secs(2)), Fault::Transient]);
    tokio::time::sleep_until(t0 + secs(8)).await;
    assert_eq!(lead.deadline().get(), f.at(t0 + secs(5 + 16)));
    assert_eq!(f.killer.deadline(), Some(f.at(t0 + secs(5 + 16))));
    // The renewal at t0+10 fails: nothing moves until its retry at t0+11 succeeds.
    tokio::time::sleep_until(t0 + Duration::from_millis(10_500)).await;
    assert_eq!(f.store.calls_of(Op::Cas).len(), 2);
    assert_eq!(lead.deadline().get(), f.at(t0 + secs(5 + 16)));
    assert_eq!(f.killer.deadline(), Some(f.at(t0 + secs(5 + 16))));
    tokio::time::sleep_until(t0 + Duration::from_millis(11_500)).await;
    assert_eq!(lead.deadline().get(), f.at(t0 + secs(11 + 16)));
    assert_eq!(f.killer.deadline(), Some(f.at(t0 + secs(11 + 16))));
    // Renewal stalls: each attempt gives up after L/10 (t0+16..18, 19..21, 22..24), and the
    // lease is lost at t0+24, which pulls the deadline in: before its t0+27, and well before
    // the record written at t0+11 expires at t0+31. The killer keeps t0+27.
    f.store.set_default(Op::Cas, Fault::Stall);
    tokio::time::sleep_until(t0 + Duration::from_millis(23_990)).await;
    assert!(!lead.deadline().has_passed() && !lead.is_lost());
    // Timers round up to whole milliseconds: a few of them in a row land a little later.
    tokio::time::sleep_until(t0 + Duration::from_millis(24_100)).await;
    let cas: Vec<Duration> = f
        .store
        .calls_of(Op::Cas)
        .iter()
        .map(|c| c.start - t0)
        .collect();
    assert!(
        lead.is_lost(),
        "lost after three attempts of L/10, not hung; attempts at {cas:?}"
    );
    assert!(lead.deadline().has_passed());
    let pulled_in = lead.deadline().get();
    assert!(
        f.at(t0 + secs(24)) <= pulled_in && pulled_in <= f.at(t0 + Duration::from_millis(24_100))
    );
    assert_eq!(f.killer.deadline(), Some(f.at(t0 + secs(11 + 16))));
    assert!(
        f.store.inner.get(KEY).await.unwrap().is_some(),
        "still live until t0+31"
    );
}

#[tokio::test(start_paused = true)]
async fn an_acquisition_that_lands_past_its_local_deadline_is_given_back() {
    let f = fixture();
    f.store
        .script(Op::Insert, [Fault::DelayAfter(Duration::from_secs(17))]);
    assert!(f.elections.acquire(KEY, ME, L).await.unwrap().is_none());
    assert_eq!(
        f.killer.deadline(),
        None,
        "no killer for a lease it cannot use"
    );
    assert!(
        f.store.inner.get(KEY).await.unwrap().is_none(),
        "given back"
    );
}

#[tokio::test(start_paused = true)]
async fn the_killer_keeps_the_earliest_deadline_of_several_leases() {
    let f = fixture();
    let t0 = Instant::now();
    let _one = f.elections.acquire("slot/1", ME, L).await.unwrap().unwrap();
    advance(Duration::from_secs(1)).await;
    let _two = f.elections.acquire("slot/2", ME, L).await.unwrap().unwrap();
    assert_eq!(f.killer.deadline(), Some(valid_until(f.at(t0), L)));
    // slot/1 cannot renew; slot/2 can. slot/2's renewals must not push the killer past slot/1.
    f.store.stall_key("slot/1");
    tokio::time::sleep_until(t0 + Duration::from_millis(15_500)).await; // slot/2 renews twice
    let renewed = f
        .store
        .calls_of(Op::Cas)
        .iter()
        .filter(|c| c.key == "slot/2" && c.result == Some(Ok(true)))
        .count();
    assert!(renewed >= 2);
    assert_eq!(f.killer.deadline(), Some(valid_until(f.at(t0), L)));
}

#[test]
fn holder_values_are_unique_per_process_run() {
    if child::is_child() {
        println!("holder={}", holder_value());
        return;
    }
    let here = holder_value();
    assert!(
        here.contains(&format!("/{}/", std::process::id())),
        "{here}"
    );
    assert_ne!(here, holder_value(), "two VVMs in one process differ too");
    let child = || {
        let (out, _) = child::run_child("elections::holder_values_are_unique_per_process_run");
        assert!(out.status.success());
        child::reported_str(&out.stdout, "holder").unwrap()
    };
    let (one, two) = (child(), child());
    assert_ne!(one, two);
    assert_ne!(one, here);
}

// ---- the killer invariant, over random CAS outcomes and delays --------------------------

fn fault() -> impl Strategy<Value = Fault> {
    let d = (0u64..8_000).prop_map(Duration::from_millis);
    prop_oneof![
        6 => Just(Fault::Pass),
        2 => Just(Fault::Transient),
        1 => Just(Fault::Answer(false)),
        1 => Just(Fault::Stall),
        2 => d.clone().prop_map(Fault::DelayBefore),
        2 => d.clone().prop_map(Fault::DelayAfter),
        1 => d.prop_map(Fault::DelayThenTransient),
        1 => Just(Fault::ApplyThenTransient),
    ]
}

/// Runs elections over `faults` and checks the invariant at every step of `step`.
fn check_invariant(lease: Duration, faults: Vec<Fault>, step: Duration) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let f = fixture();
        f.store.script(Op::Cas, faults);
        let lead = f.elections.acquire(KEY, ME, lease).await.unwrap().unwrap();
        let mut previous = f.killer.deadline().unwrap();
        let mut previous_check = Instant::now();
        let end = Instant::now() + lease * 4;
        while Instant::now() < end {
            sleep(step).await;
            let now = Instant::now();
            let armed = f.killer.deadline().ok_or("the killer was disarmed")?;
            // The start of the last write that succeeded and whose answer came back.
            let last_success = f
                .store
                .calls()
                .iter()
                .filter(|c| c.op != Op::Get && c.result == Some(Ok(true)))
                .filter(|c| c.op != Op::Delete)
                .map(|c| c.start)
                .max()
                .ok_or("no successful write")?;
            let bound = valid_until(f.at(last_success), lease);
            if armed != bound {
                return Err(format!("armed {armed:?} != last success + 0.8L {bound:?}"));
            }
            if armed > previous
                && !f.store.calls().iter().any(|c| {
                    // A write that succeeded since the previous check, not any earlier one.
                    c.op == Op::Cas
                        && c.result == Some(Ok(true))
                        && c.end.is_some_and(|e| previous_check <= e && e <= now)
                })
            {
                return Err("moved later without a successful write".into());
            }
            if lead.is_lost() {
                // Loss pulls the guests' deadline in; the killer keeps its own.
                if !lead.deadline().has_passed() {
                    return Err("lost, but the guests' deadline has not passed".into());
                }
            } else if lead.deadline().get() != armed {
                return Err("the local valid-until differs from the killer".into());
            }
            // While our record is live, the killer fires strictly before it can expire, so
            // nobody else can acquire the slot while this process may still act.
            if let Some(record) = f.store.inner.get(KEY).await.unwrap()
                && record.value == ME
            {
                let expiry = f.at(now + record.time_left);
                if armed >= expiry {
                    return Err(format!("armed {armed:?} not before expiry {expiry:?}"));
                }
            }
            previous = armed;
            previous_check = now;
        }
        f.elections.cleanup().await;
        f.killer.disarm();
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn killer_deadline_never_exceeds_last_successful_write_plus_0_8_l(
        lease_s in 1u64..40,
        faults in proptest::collection::vec(fault(), 0..24),
        step_ms in 50u64..1_500,
    ) {
        let lease = Duration::from_secs(lease_s);
        // Delays are scaled to the lease: up to 0.4·L.
        let scale = |d: Duration| d.mul_f64(lease.as_secs_f64() / 20.0);
        let faults = faults
            .into_iter()
            .map(|f| match f {
                Fault::DelayBefore(d) => Fault::DelayBefore(scale(d)),
                Fault::DelayAfter(d) => Fault::DelayAfter(scale(d)),
                Fault::DelayThenTransient(d) => Fault::DelayThenTransient(scale(d)),
                other => other,
            })
            .collect();
        let step = Duration::from_millis(step_ms).mul_f64(lease.as_secs_f64() / 20.0);
        check_invariant(lease, faults, step.max(Duration::from_millis(1)))
            .map_err(TestCaseError::fail)?;
    }
}

// ---- the real killer, in a real child process --------------------------------------------

/// Child: acquire a 2 s lease with the real killer, then the store stalls. The killer must end
/// the process with its exit code at 0.8·L, before the record could expire.
#[test]
fn the_real_killer_ends_a_process_whose_store_stalls_before_the_record_can_expire() {
    const LEASE: Duration = Duration::from_secs(2);
    if child::is_child() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let journal = Journal::default();
            let store = FaultyStore::new(mem_store(), "child", &journal);
            let clock = Arc::new(SystemClock::local());
            let elections = Elections::new(
                store.clone(),
                Arc::new(Killer::new(clock.clone())),
                clock,
                ops(),
            );
            let start = std::time::SystemTime::now();
            let _lead = elections.acquire(KEY, ME, LEASE).await.unwrap().unwrap();
            println!("acquired_ms={}", child::unix_ms(start));
            store.stall_everything();
            sleep(Duration::from_secs(30)).await;
            println!("still alive");
        });
        std::process::exit(0);
    }
    let name =
        "elections::the_real_killer_ends_a_process_whose_store_stalls_before_the_record_can_expire";
    let (out, exited) = child::run_child(name);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(KILLER_EXIT_CODE), "{stdout}");
    assert!(!stdout.contains("still alive"));
    let acquired = child::reported(&out.stdout, "acquired_ms").unwrap();
    let lived = child::unix_ms(exited) - acquired;
    // Fired at 0.8·L (1600 ms) after the acquisition began; the record expires at L at the
    // earliest (2000 ms, it was written after `start`).
    assert!(lived >= 1590, "fired too early: {lived} ms");
    assert!(lived < 2000, "the record could have expired: {lived} ms");
}

// ---- suspend: CLOCK_BOOTTIME moves, CLOCK_MONOTONIC does not --------------------------------

/// The machine sleeps for longer than the lease: boot time jumps, tokio's (monotonic) time
/// does not. On resume the guests' deadline has passed and the killer fires, before any
/// renewal could run.
#[tokio::test(start_paused = true)]
async fn a_suspend_longer_than_the_lease_passes_the_deadline_and_fires_the_killer() {
    let f = fixture();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    sleep(L / 8).await;
    assert!(!lead.deadline().has_passed());
    assert_eq!(f.fired.load(Ordering::SeqCst), 0);

    f.clock.suspend(L * 3);
    assert!(lead.deadline().has_passed(), "effects are refused at once");
    assert_eq!(
        f.store.calls_of(Op::Cas).len(),
        0,
        "no renewal ran meanwhile"
    );
    // The killer's thread re-reads the clock at least every `RECHECK` of real time.
    let waited = std::time::Instant::now();
    while f.fired.load(Ordering::SeqCst) == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the killer never fired"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(f.killer.has_fired());
}

/// Child: a tracing subscriber on stderr (as the binary has), stderr a full pipe nobody reads,
/// and another thread holding the stderr lock. The real killer must still end the process with
/// its exit code, promptly: firing may not log through tracing, take a lock, or block.
#[test]
fn the_real_killer_ends_a_process_whose_stderr_is_blocked() {
    use vvm_host::clock::Clock;

    const DEADLINE: Duration = Duration::from_millis(300);
    if child::is_child() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .init();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _held = std::io::stderr().lock();
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_hours(1));
        });
        locked_rx.recv().unwrap();
        let clock = Arc::new(SystemClock::local());
        let killer = Killer::new(clock.clone());
        let deadline = clock.now().after(DEADLINE);
        println!("deadline_ns={}", deadline.since_boot.as_nanos());
        killer.arm(deadline);
        std::thread::sleep(Duration::from_secs(30));
        println!("still alive");
        std::process::exit(0);
    }
    // A pipe filled to the brim, whose read end stays open and unread.
    let (read_end, write_end) = rustix::pipe::pipe().unwrap();
    rustix::fs::fcntl_setfl(&write_end, rustix::fs::OFlags::NONBLOCK).unwrap();
    while rustix::io::write(&write_end, &[0u8; 4096]).is_ok() {}
    rustix::fs::fcntl_setfl(&write_end, rustix::fs::OFlags::empty()).unwrap();
    let name = "elections::the_real_killer_ends_a_process_whose_stderr_is_blocked";
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(child::CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(write_end))
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let ended = SystemClock::local().now();
    drop(read_end);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(KILLER_EXIT_CODE), "{stdout}");
    assert!(!stdout.contains("still alive"));
    let deadline = child::reported(&out.stdout, "deadline_ns").unwrap();
    let late = Duration::from_nanos(
        u64::try_from(ended.since_boot.as_nanos().saturating_sub(deadline)).unwrap(),
    );
    // The bound only catches a killer that blocks (the old one never ended); the figure is
    // the measurement: a few milliseconds, mostly this parent noticing the exit.
    println!("ended {late:?} after the deadline");
    assert!(
        late < Duration::from_secs(5),
        "ended {late:?} after the deadline"
    );
}

/// An insert that returned an error may have been applied: cleanup deletes the record all the
/// same, so a standby need not wait out the lease.
#[tokio::test(start_paused = true)]
async fn cleanup_deletes_a_record_whose_insert_failed_but_was_applied() {
    let f = fixture();
    f.store.script(Op::Insert, [Fault::ApplyThenTransient]);
    assert!(f.elections.acquire(KEY, ME, L).await.is_err());
    assert_eq!(f.store.inner.get(KEY).await.unwrap().unwrap().value, ME);
    f.elections.cleanup().await;
    assert!(
        f.store.inner.get(KEY).await.unwrap().is_none(),
        "cleanup deleted the record of the failed insert"
    );
}

fn running(name: &str, since: u64) -> Vec<ServiceStatus> {
    vec![ServiceStatus::running(name, "0123456789ab", since)]
}

/// The running services ride along with the renewal (no extra write), readable by status; a
/// release deletes the record whatever list it carries.
#[tokio::test(start_paused = true)]
async fn renewals_carry_the_running_services_and_release_deletes_the_record() {
    let f = fixture();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    lead.running_report().set(running("ticker", 7));
    sleep(L / 4 + Duration::from_millis(1)).await;
    let record = f.store.inner.get(KEY).await.unwrap().unwrap();
    assert_eq!(
        record.value,
        lease_value::encode(ME, &running("ticker", 7), &lease_value::Rejected::new())
    );
    assert_eq!(lease_value::holder(&record.value), ME);
    assert_eq!(lease_value::services(&record.value), running("ticker", 7));
    assert_eq!(f.store.calls_of(Op::Cas).len(), 1, "one write per renewal");
    f.elections.release(KEY).await;
    assert_eq!(f.store.inner.get(KEY).await.unwrap(), None, "released");
}

/// A renewal that changed the value landed but failed to answer: the next renewal swaps from
/// the value that landed instead of calling the lease lost, and a release deletes it too.
#[tokio::test(start_paused = true)]
async fn a_changed_value_that_landed_without_an_answer_is_still_ours() {
    let f = fixture();
    let lead = f.elections.acquire(KEY, ME, L).await.unwrap().unwrap();
    lead.running_report().set(running("a", 1));
    f.store.script(Op::Cas, [Fault::ApplyThenTransient]);
    sleep(L / 4 + Duration::from_millis(1)).await;
    let landed = f.store.inner.get(KEY).await.unwrap().unwrap();
    assert_eq!(lease_value::services(&landed.value), running("a", 1));
    // The retry (L/20 later) and the next renewals swap from the value that landed.
    lead.running_report().set(running("b", 2));
    sleep(L).await;
    assert!(!lead.is_lost(), "the lease was kept");
    let record = f.store.inner.get(KEY).await.unwrap().unwrap();
    assert_eq!(lease_value::services(&record.value), running("b", 2));

    // A swap in flight when the release comes may land before the delete: still deleted.
    lead.running_report().set(running("c", 3));
    f.store.script(Op::Cas, [Fault::ApplyThenTransient]);
    sleep(L / 4).await;
    f.elections.release(KEY).await;
    assert_eq!(f.store.inner.get(KEY).await.unwrap(), None, "released");
}
