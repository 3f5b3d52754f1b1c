//! The VVM lifecycle (SPEC §5) through the public API, with recording doubles, on paused time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};
use vvm_host::clock::TokioClock;
use vvm_host::holder::crash_lock::HolderLockDir;
use vvm_host::keys::CANDIDATE_PREFIX;
use vvm_host::killer::{KILLER_EXIT_CODE, Killer};
use vvm_host::problem::{Problem, ProblemReporter};
use vvm_host::store::{MemStore, StoreError, TtlStore};
use vvm_host::vvm::{LaunchedVvm, Vvm, VvmConfig, VvmState};

use crate::common::journal::{Event, Journal};
use crate::common::services::{Behaviour, RecordingServices};
use crate::common::store::{Fault, FaultyStore, Op, mem_store};
use crate::common::{child, ops};

const L: Duration = Duration::from_secs(20);
const MS: Duration = Duration::from_millis(1);

struct Host {
    vvm: LaunchedVvm,
    store: Arc<FaultyStore>,
    services: Arc<RecordingServices>,
    killer: Arc<Killer>,
    fired: Arc<AtomicUsize>,
}

fn config(holder: &str, slots: u32) -> VvmConfig {
    VvmConfig {
        cluster_size: slots,
        lease: L,
        acquisition_timeout: Duration::from_mins(2),
        holder: holder.to_owned(),
        require_same_services: false,
    }
}

fn launch_with(mem: &MemStore, journal: &Journal, config: VvmConfig, b: Behaviour) -> Host {
    let store = FaultyStore::new(mem.clone(), &config.holder, journal);
    launch_on(store, journal, config, b, None)
}

/// Launches a host on `store` (set up by the caller), with holder locks in `locks` if any.
fn launch_on(
    store: Arc<FaultyStore>,
    journal: &Journal,
    config: VvmConfig,
    b: Behaviour,
    locks: Option<Arc<HolderLockDir>>,
) -> Host {
    let services = RecordingServices::new(&config.holder, b, journal);
    let clock = TokioClock::new();
    let (fired, killer) = Killer::counting(Arc::new(clock.clone()));
    let vvm = Vvm::provide(config, store.clone(), services.clone(), ops())
        .with_clock_and_killer(Arc::new(clock), Arc::clone(&killer))
        .with_holder_locks(locks)
        .launch();
    Host {
        vvm,
        store,
        services,
        killer,
        fired,
    }
}

fn launch(mem: &MemStore, journal: &Journal, holder: &str) -> Host {
    launch_with(mem, journal, config(holder, 1), Behaviour::default())
}

/// Waits until the VVM leads and returns its slot.
async fn leading(h: &Host) -> u32 {
    let mut state = h.vvm.state();
    let s = state
        .wait_for(|s| matches!(s, VvmState::Leading { .. }))
        .await
        .unwrap()
        .clone();
    match s {
        VvmState::Leading { slot, .. } => slot,
        _ => unreachable!(),
    }
}

/// Shuts down, failing (not hanging) if the sequence does not end.
async fn shut(vvm: LaunchedVvm) -> Option<Problem> {
    tokio::time::timeout(L * 10, vvm.shutdown())
        .await
        .expect("the shutdown sequence hangs")
}

/// Lets every ready task run without moving the clock.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

async fn record(mem: &MemStore, slot: u32) -> Option<String> {
    mem.get(&format!("slot/{slot}"))
        .await
        .unwrap()
        .map(|r| r.value)
}

/// A store call of `op` on slot 1 that succeeded.
fn succeeded(op: Op) -> Event {
    Event::Store {
        op,
        key: "slot/1".into(),
        result: Ok(true),
    }
}

/// Asserts that every `before` of `who` came before the first `after` of `who`.
fn assert_order(journal: &Journal, who: &str, before: &Event, after: &Event) {
    let (b, a) = (journal.last(who, before), journal.first(who, after));
    assert!(
        b.is_some() && a.is_some() && b < a,
        "expected every {who} {before:?} before {after:?}:\n{}",
        journal.dump()
    );
}

#[tokio::test(start_paused = true)]
async fn provide_starts_nothing() {
    let journal = Journal::default();
    let store = FaultyStore::new(mem_store(), "a", &journal);
    let services = RecordingServices::new("a", Behaviour::default(), &journal);
    let vvm = Vvm::provide(config("a", 1), store.clone(), services.clone(), ops());
    sleep(L).await;
    assert!(store.calls().is_empty());
    assert!(journal.is_empty());
    drop(vvm);
}

#[tokio::test(start_paused = true)]
async fn start_and_stop_deletes_the_lease_record_and_disarms_the_killer() {
    let mem = mem_store();
    let journal = Journal::default();
    let h = launch(&mem, &journal, "a");
    assert_eq!(leading(&h).await, 1);
    settle().await;
    assert_eq!(h.services.running(), 1);
    let ctx = h.services.last_context().unwrap();
    assert_eq!((ctx.lease.slot, ctx.lease.term), (1, 1));
    assert_eq!(ctx.lease.holder, "a");
    assert_eq!(ctx.lease.key, "slot/1");
    assert!(h.killer.deadline().is_some(), "armed while leading");
    sleep(L * 3).await;
    assert_eq!(
        record(&mem, 1).await.as_deref(),
        Some("a"),
        "kept by renewals"
    );

    let state = h.vvm.state();
    assert_eq!(shut(h.vvm).await, None);
    assert_eq!(*state.borrow(), VvmState::ShutDown);
    assert_eq!(
        record(&mem, 1).await,
        None,
        "shutdown deletes the lease record"
    );
    assert_eq!(h.services.running(), 0);
    assert_eq!(h.killer.deadline(), None, "disarmed");
    assert_eq!(h.fired.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn services_start_only_once_the_slot_is_held_and_stop_before_the_record_is_deleted() {
    let mem = mem_store();
    let journal = Journal::default();
    let h = launch(&mem, &journal, "a");
    leading(&h).await;
    settle().await;
    shut(h.vvm).await;
    assert_order(&journal, "a", &succeeded(Op::Insert), &Event::StartBegin);
    assert_order(&journal, "a", &Event::Stopped, &succeeded(Op::Delete));
    assert_eq!(h.killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn a_second_vvm_on_one_slot_gets_the_acquisition_timeout_without_polling_blindly() {
    let mem = mem_store();
    let journal = Journal::default();
    let a = launch(&mem, &journal, "a");
    leading(&a).await;
    let t0 = Instant::now();
    let mut cfg = config("b", 1);
    cfg.acquisition_timeout = Duration::from_secs(30);
    let b = launch_with(&mem, &journal, cfg, Behaviour::default());
    let problem = b.vvm.problems().wait().await;
    assert_eq!(
        problem,
        Problem::AcquisitionTimeout {
            slots: 1,
            timeout: Duration::from_secs(30)
        }
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(30));
    // Tried at 0, at the expiry it saw (20 s; renewed meanwhile) and at the timeout.
    let tries = b.store.calls_of(Op::Insert);
    assert!(tries.len() <= 4, "polled {} times", tries.len());
    assert!(journal.first("b", &Event::StartBegin).is_none());
    assert_eq!(b.killer.deadline(), None, "never armed");
    assert_eq!(shut(b.vvm).await, Some(problem));
    assert_eq!(shut(a.vvm).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_service_that_fails_to_start_is_a_problem() {
    let mem = mem_store();
    let journal = Journal::default();
    let b = Behaviour {
        fail_start: Some("bad component".into()),
        ..Behaviour::default()
    };
    let h = launch_with(&mem, &journal, config("a", 1), b);
    let problem = h.vvm.problems().wait().await;
    assert_eq!(
        problem,
        Problem::Service {
            name: "double".into(),
            reason: "bad component".into()
        }
    );
    assert_eq!(shut(h.vvm).await, Some(problem));
    assert_eq!(record(&mem, 1).await, None);
    assert_eq!(h.killer.deadline(), None);
}

/// A bug that panics the launcher must not leave a held record (or a hang) behind: it is a
/// problem, the guests' deadline passes, the lease is released and the killer disarmed.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_launcher_is_a_problem_and_releases_the_lease() {
    let mem = mem_store();
    let journal = Journal::default();
    let b = Behaviour {
        panic_start: true,
        ..Behaviour::default()
    };
    let h = launch_with(&mem, &journal, config("a", 1), b);
    let problem = h.vvm.problems().wait().await;
    assert!(
        matches!(&problem, Problem::Internal(m) if m.contains("start panics")),
        "{problem:?}"
    );
    let mut state = h.vvm.state();
    state.wait_for(|s| *s == VvmState::ShutDown).await.unwrap();
    assert_eq!(
        record(&mem, 1).await,
        None,
        "released without a shutdown call"
    );
    assert_eq!(h.killer.deadline(), None);
    let ctx = h.services.last_context().unwrap();
    assert!(
        ctx.deadline.has_passed(),
        "no guest effect after the release"
    );
    assert_eq!(shut(h.vvm).await, Some(problem));
}

#[tokio::test(start_paused = true)]
async fn leadership_loss_is_a_problem_and_tells_the_services_to_stop() {
    let mem = mem_store();
    let journal = Journal::default();
    let h = launch(&mem, &journal, "a");
    leading(&h).await;
    settle().await;
    let t0 = Instant::now();
    let ctx = h.services.last_context().unwrap();
    assert!(mem.compare_and_delete("slot/1", "a").await.unwrap());
    assert_eq!(h.vvm.problems().wait().await, Problem::LeadershipLost);
    assert_eq!(Instant::now() - t0, L / 4, "noticed at the next renewal");
    assert!(
        ctx.stopping.is_cancelled(),
        "services hear the stop at once"
    );
    assert_eq!(shut(h.vvm).await, Some(Problem::LeadershipLost));
    assert!(
        journal
            .first("a", &Event::StopBegin { stopping: true })
            .is_some()
    );
    assert_eq!(h.services.running(), 0);
    assert_eq!(h.killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn update_problem_keeps_the_first_and_ignores_later_ones() {
    let problems = ProblemReporter::default();
    assert_eq!(problems.get(), None);
    assert!(problems.report(Problem::LeadershipLost));
    let later = StoreError::permanent("test", "later");
    assert!(!problems.report(Problem::Store(later.into())));
    assert_eq!(problems.wait().await, Problem::LeadershipLost);
    assert_eq!(problems.get(), Some(Problem::LeadershipLost));
}

#[tokio::test(start_paused = true)]
async fn shutdown_right_after_launch_ends_cleanly() {
    let mem = mem_store();
    let journal = Journal::default();
    let h = launch(&mem, &journal, "a");
    assert_eq!(shut(h.vvm).await, None);
    assert!(journal.first("a", &Event::StartBegin).is_none());
    assert_eq!(record(&mem, 1).await, None);
    assert_eq!(h.killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn shutdown_while_campaigning_ends_at_once() {
    let mem = mem_store();
    let journal = Journal::default();
    let a = launch(&mem, &journal, "a");
    leading(&a).await;
    let b = launch(&mem, &journal, "b");
    sleep(Duration::from_secs(7)).await;
    let t = Instant::now();
    assert_eq!(shut(b.vvm).await, None);
    assert_eq!(Instant::now(), t, "no wait");
    assert!(journal.first("b", &Event::StartBegin).is_none());
    assert_eq!(
        record(&mem, 1).await.as_deref(),
        Some("a"),
        "a's lease untouched"
    );
    shut(a.vvm).await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_while_an_acquisition_hangs_ends_and_cleans_up_the_write() {
    let mem = mem_store();
    let journal = Journal::default();
    let cfg = config("a", 1);
    let store = FaultyStore::new(mem.clone(), "a", &journal);
    store.script(Op::Insert, [Fault::Stall]);
    let services = RecordingServices::new("a", Behaviour::default(), &journal);
    let clock = TokioClock::new();
    let (_, killer) = Killer::counting(Arc::new(clock.clone()));
    let vvm = Vvm::provide(cfg, store.clone(), services, ops())
        .with_clock_and_killer(Arc::new(clock), Arc::clone(&killer))
        .launch();
    sleep(Duration::from_secs(3)).await;
    assert_eq!(store.calls_of(Op::Insert).len(), 1, "the insert hangs");
    let t = Instant::now();
    assert_eq!(shut(vvm).await, None);
    assert_eq!(Instant::now(), t, "no wait for the hung insert");
    assert!(journal.first("a", &Event::StartBegin).is_none());
    // The insert may have landed on a real store: cleanup deletes our record there.
    assert_eq!(store.calls_of(Op::Delete).len(), 1);
    assert_eq!(killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_slow_service_start_cuts_it_short_and_ends_in_order() {
    let mem = mem_store();
    let journal = Journal::default();
    let b = Behaviour {
        slow_start: Duration::from_secs(10),
        ..Behaviour::default()
    };
    let h = launch_with(&mem, &journal, config("a", 1), b);
    leading(&h).await;
    sleep(Duration::from_secs(1)).await;
    assert!(journal.first("a", &Event::StartBegin).is_some());
    let t = Instant::now();
    assert_eq!(shut(h.vvm).await, None);
    assert_eq!(Instant::now(), t);
    assert_order(
        &journal,
        "a",
        &Event::StartCutShort,
        &Event::StopBegin { stopping: true },
    );
    assert_order(&journal, "a", &Event::Stopped, &succeeded(Op::Delete));
    assert_eq!(h.services.running(), 0);
    assert_eq!(h.killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_slow_service_stop_waits_for_it_and_ends_in_order() {
    let mem = mem_store();
    let journal = Journal::default();
    let b = Behaviour {
        slow_stop: Duration::from_secs(4),
        ..Behaviour::default()
    };
    let h = launch_with(&mem, &journal, config("a", 1), b);
    leading(&h).await;
    settle().await;
    let t = Instant::now();
    let killer = Arc::clone(&h.killer);
    assert_eq!(shut(h.vvm).await, None);
    assert_eq!(Instant::now() - t, Duration::from_secs(4));
    assert_order(&journal, "a", &Event::Stopped, &succeeded(Op::Delete));
    assert_eq!(killer.deadline(), None);
}

/// A campaign that wins while its candidacy's first write is still under way withdraws the
/// candidacy after that write has landed, so none is left standing for a campaign that is over
/// (a releasing leader could hand it a slot nobody takes over). The write lands even if its
/// caller stops waiting, as a redb write does.
#[tokio::test(start_paused = true)]
async fn a_campaign_that_wins_at_once_leaves_no_candidacy_behind() {
    let mem = mem_store();
    let journal = Journal::default();
    let h = launch(&mem, &journal, "a");
    // Before the launcher's first step: the paused runtime has not run it yet.
    h.store.land_late(Op::Insert, CANDIDATE_PREFIX, L / 20);
    leading(&h).await;
    sleep(L).await;
    let candidacy = format!("{}a", vvm_host::keys::CANDIDATE_PREFIX);
    assert_eq!(mem.get(&candidacy).await.unwrap(), None, "left standing");
    assert_eq!(shut(h.vvm).await, None);
}

/// The release's read-ahead (on etcd, the candidates it may hand the lease to) runs while the
/// services stop, so the release after them is one write; and it never holds the release up:
/// a read that does not answer is dropped once the services have stopped.
#[tokio::test(start_paused = true)]
async fn the_release_reads_ahead_while_the_services_stop_and_never_waits_for_that_read() {
    for stalled in [false, true] {
        let mem = mem_store();
        let journal = Journal::default();
        let b = Behaviour {
            slow_stop: Duration::from_secs(2),
            ..Behaviour::default()
        };
        let h = launch_with(&mem, &journal, config("a", 1), b);
        leading(&h).await;
        settle().await;
        if stalled {
            h.store.stall_key(vvm_host::keys::CANDIDATE_PREFIX);
        }
        let t = Instant::now();
        let shut_down = tokio::time::timeout(L * 10, shut(h.vvm)).await;
        assert_eq!(shut_down, Ok(None), "stalled read-ahead: {stalled}");
        assert_eq!(
            Instant::now() - t,
            Duration::from_secs(2),
            "the stop, no more"
        );
        assert_order(&journal, "a", &Event::PrepareRelease, &Event::Stopped);
        assert_order(&journal, "a", &Event::Stopped, &succeeded(Op::Delete));
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_leadership_loss_the_record_stays_until_the_services_have_stopped() {
    let mem = mem_store();
    let journal = Journal::default();
    let b = Behaviour {
        slow_stop: Duration::from_secs(2),
        ..Behaviour::default()
    };
    let h = launch_with(&mem, &journal, config("a", 1), b);
    leading(&h).await;
    h.store.set_default(Op::Cas, Fault::Transient);
    sleep(L / 4 + L / 10 + MS).await; // lost at the third failed attempt
    assert_eq!(h.vvm.problems().get(), Some(Problem::LeadershipLost));
    h.store.set_default(Op::Cas, Fault::Pass);
    assert_eq!(
        record(&mem, 1).await.as_deref(),
        Some("a"),
        "kept until stopped"
    );
    assert_eq!(shut(h.vvm).await, Some(Problem::LeadershipLost));
    assert_order(&journal, "a", &Event::Stopped, &succeeded(Op::Delete));
    assert_eq!(record(&mem, 1).await, None);
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_renewal_retries_ends_cleanly_without_a_problem() {
    let mem = mem_store();
    let journal = Journal::default();
    let h = launch(&mem, &journal, "a");
    leading(&h).await;
    h.store.set_default(Op::Cas, Fault::Transient);
    sleep(L / 4 + L / 40).await; // between the first failed attempt and its retry
    h.store.set_default(Op::Cas, Fault::Pass);
    let cas = h.store.calls_of(Op::Cas).len();
    assert_eq!(
        shut(h.vvm).await,
        None,
        "a shutdown is not a leadership loss"
    );
    assert_eq!(
        h.store.calls_of(Op::Cas).len(),
        cas,
        "no retry after shutdown"
    );
    assert_order(&journal, "a", &Event::Stopped, &succeeded(Op::Delete));
    assert_eq!(record(&mem, 1).await, None);
    assert_eq!(h.killer.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn three_slots_four_vvms_exactly_three_lead_and_the_fourth_takes_a_freed_slot_at_once() {
    let mem = mem_store();
    let journal = Journal::default();
    let mut hosts = Vec::new();
    for name in ["a", "b", "c"] {
        let h = launch_with(&mem, &journal, config(name, 3), Behaviour::default());
        leading(&h).await;
        hosts.push(h);
    }
    let d = launch_with(&mem, &journal, config("d", 3), Behaviour::default());
    sleep(L * 2).await; // renewals go on; d keeps campaigning
    let slots: Vec<u32> = {
        let mut s = Vec::new();
        for h in &hosts {
            s.push(leading(h).await);
        }
        s
    };
    assert_eq!(slots, vec![1, 2, 3]);
    assert_eq!(*d.vvm.state().borrow(), VvmState::Campaigning);
    assert!(journal.first("d", &Event::StartBegin).is_none());
    // Stop the holder of slot 2: d takes slot 2 as soon as its record is deleted.
    let b = hosts.remove(1);
    shut(b.vvm).await;
    let released = Instant::now();
    assert_eq!(leading(&d).await, 2);
    assert!(
        Instant::now() - released < MS,
        "woken by the release, not by expiry"
    );
    settle().await;
    assert_eq!(d.services.running(), 1);
    for h in hosts {
        assert_eq!(shut(h.vvm).await, None);
    }
    assert_eq!(shut(d.vvm).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_release_while_the_standby_is_looking_is_not_missed() {
    let mem = mem_store();
    let journal = Journal::default();
    let a = launch(&mem, &journal, "a");
    leading(&a).await;
    let t0 = Instant::now();
    let cfg = config("b", 1);
    let store = FaultyStore::new(mem.clone(), "b", &journal);
    // b reads a's live record at t0, but the answer reaches it only at t0+1.
    store.script(Op::Get, [Fault::DelayAfter(Duration::from_secs(1))]);
    let services = RecordingServices::new("b", Behaviour::default(), &journal);
    let clock = TokioClock::new();
    let (_, killer) = Killer::counting(Arc::new(clock.clone()));
    let b = Vvm::provide(cfg, store, services, ops())
        .with_clock_and_killer(Arc::new(clock), killer)
        .launch();
    sleep(Duration::from_millis(500)).await;
    assert_eq!(shut(a.vvm).await, None); // released at t0+0.5, while b is looking
    let mut state = b.state();
    state
        .wait_for(|s| matches!(s, VvmState::Leading { .. }))
        .await
        .unwrap();
    assert_eq!(
        Instant::now() - t0,
        Duration::from_secs(1),
        "not at a's expiry (t0+20)"
    );
    assert_eq!(shut(b).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_exactly_when_a_crashed_leaders_record_expires() {
    let mem = mem_store();
    let journal = Journal::default();
    let a = launch(&mem, &journal, "a");
    leading(&a).await;
    let t0 = Instant::now();
    let b = launch(&mem, &journal, "b");
    // a crashes at t0+7: its last renewal was at t0+5, so its record expires at t0+25.
    sleep(Duration::from_secs(7)).await;
    a.store.stall_everything();
    let last_write = a
        .store
        .calls()
        .iter()
        .filter(|c| c.result == Some(Ok(true)) && c.op == Op::Cas)
        .map(|c| c.start)
        .max()
        .unwrap();
    assert_eq!(last_write - t0, L / 4);
    assert_eq!(leading(&b).await, 1);
    assert_eq!(
        Instant::now(),
        last_write + L,
        "not before expiry, and not later"
    );
    let won = b.store.calls_of(Op::Insert);
    assert!(
        won[..won.len() - 1]
            .iter()
            .all(|c| c.result == Some(Ok(false)))
    );
    assert!(
        won.len() <= 4,
        "slept until expiries, tried {} times",
        won.len()
    );
    assert_eq!(shut(b.vvm).await, None);
    // a's shutdown is bounded even though its store hangs.
    shut(a.vvm).await;
    assert_eq!(a.killer.deadline(), None);
}

// ---- no leaks ----------------------------------------------------------------------------

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).unwrap().count()
}

/// Child: 1000 launch/shutdown cycles, then tasks, threads and fds are back where they were.
#[test]
fn no_task_thread_or_fd_outlives_a_thousand_launch_shutdown_cycles() {
    if !child::is_child() {
        let (out, _) = child::run_child(
            "vvm::no_task_thread_or_fd_outlives_a_thousand_launch_shutdown_cycles",
        );
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("cycles=1000"));
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mem = mem_store();
        let cycle = async || {
            let journal = Journal::default();
            let h = launch(&mem, &journal, "a");
            leading(&h).await;
            settle().await;
            assert_eq!(h.services.running(), 1);
            sleep(L / 2 + MS).await; // two renewals
            assert_eq!(shut(h.vvm).await, None);
            assert_eq!(h.killer.deadline(), None);
        };
        cycle().await;
        settle().await;
        let handle = tokio::runtime::Handle::current();
        let before = (
            handle.metrics().num_alive_tasks(),
            count_dir("/proc/self/task"),
            count_dir("/proc/self/fd"),
        );
        for _ in 0..1000 {
            cycle().await;
        }
        settle().await;
        let after = (
            handle.metrics().num_alive_tasks(),
            count_dir("/proc/self/task"),
            count_dir("/proc/self/fd"),
        );
        assert_eq!(before, after, "(tasks, threads, fds) before vs after");
        println!("cycles=1000 tasks/threads/fds={after:?}");
    });
}

// ---- the real killer ends a VVM whose services ignore the stop -------------------------------

/// Child: a VVM with the real killer and a 2 s lease loses its leadership (the store's CAS
/// fails), and its services ignore the stop, so shutdown hangs. A standby in the same process
/// tries to take the slot every 10 ms. The killer must end the process before it can.
#[test]
fn the_real_killer_ends_a_vvm_whose_services_ignore_the_stop_before_the_lease_passes_on() {
    const LEASE: Duration = Duration::from_secs(2);
    if child::is_child() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mem = mem_store();
            let journal = Journal::default();
            let store = FaultyStore::new(mem.clone(), "a", &journal);
            let b = Behaviour {
                ignore_stop: true,
                ..Behaviour::default()
            };
            let services = RecordingServices::new("a", b, &journal);
            let mut cfg = config("a", 1);
            cfg.lease = LEASE;
            let vvm = Vvm::provide(cfg, store.clone(), services, ops()).launch();
            let mut state = vvm.state();
            state
                .wait_for(|s| matches!(s, VvmState::Leading { .. }))
                .await
                .unwrap();
            store.set_default(Op::Cas, Fault::Transient);
            let problem = vvm.problems().wait().await;
            assert_eq!(problem, Problem::LeadershipLost);
            let last_success = store
                .calls()
                .iter()
                .filter(|c| c.result == Some(Ok(true)) && matches!(c.op, Op::Insert | Op::Cas))
                .map(|c| c.start)
                .max()
                .unwrap();
            println!(
                "last_success_ms={}",
                child::unix_ms(child::wall_of(last_success))
            );
            // A standby polls the shared store directly.
            tokio::spawn(async move {
                loop {
                    if mem
                        .insert_if_absent("slot/1", "standby", LEASE)
                        .await
                        .unwrap()
                        .is_some()
                    {
                        println!(
                            "taken_over_ms={}",
                            child::unix_ms(std::time::SystemTime::now())
                        );
                    }
                    sleep(Duration::from_millis(10)).await;
                }
            });
            vvm.shutdown().await; // hangs in the services' stop
            println!("shutdown returned");
        });
        std::process::exit(0);
    }
    let name =
        "vvm::the_real_killer_ends_a_vvm_whose_services_ignore_the_stop_before_the_lease_passes_on";
    let (out, exited) = child::run_child(name);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(KILLER_EXIT_CODE), "{stdout}");
    assert!(!stdout.contains("shutdown returned"), "{stdout}");
    assert!(
        !stdout.contains("taken_over_ms"),
        "the lease passed on: {stdout}"
    );
    let last = child::reported(&out.stdout, "last_success_ms").unwrap();
    let lived = child::unix_ms(exited) - last;
    assert!(
        lived >= 1590,
        "fired too early: {lived} ms after the last write"
    );
    assert!(lived < 2000, "the record could have expired: {lived} ms");
}

/// An insert that failed (a timeout, an error) may have been applied all the same. The host
/// must not then take its own record for someone else's and wait out the lease: it retakes
/// the slot at once.
#[tokio::test(start_paused = true)]
async fn an_insert_applied_despite_an_error_does_not_make_the_host_wait_for_itself() {
    let mem = mem_store();
    let journal = Journal::default();
    let name = "a";
    let store = FaultyStore::new(mem.clone(), name, &journal);
    store.script(Op::Insert, [Fault::ApplyThenTransient]);
    let services = RecordingServices::new(name, Behaviour::default(), &journal);
    let clock = TokioClock::new();
    let (_, killer) = Killer::counting(Arc::new(clock.clone()));
    let t0 = Instant::now();
    let vvm = Vvm::provide(config(name, 1), store, services, ops())
        .with_clock_and_killer(Arc::new(clock), Arc::clone(&killer))
        .launch();
    let mut state = vvm.state();
    state
        .wait_for(|s| matches!(s, VvmState::Leading { .. }))
        .await
        .unwrap();
    let waited = Instant::now() - t0;
    assert!(waited < L / 10, "waited {waited:?} for its own record");
    assert_eq!(shut(vvm).await, None);
    assert_eq!(record(&mem, 1).await, None);
}

/// No store call holds the campaign up for ever: an insert that never answers counts as a
/// transient failure after L/4, and the next round acquires.
#[tokio::test(start_paused = true)]
async fn a_store_call_that_never_answers_does_not_hang_the_campaign() {
    let mem = mem_store();
    let journal = Journal::default();
    let store = FaultyStore::new(mem.clone(), "a", &journal);
    store.script(Op::Insert, [Fault::Stall]);
    let services = RecordingServices::new("a", Behaviour::default(), &journal);
    let clock = TokioClock::new();
    let (_, killer) = Killer::counting(Arc::new(clock.clone()));
    let t0 = Instant::now();
    let vvm = Vvm::provide(config("a", 1), store, services, ops())
        .with_clock_and_killer(Arc::new(clock), killer)
        .launch();
    let mut state = vvm.state();
    tokio::time::timeout(
        L * 2,
        state.wait_for(|s| matches!(s, VvmState::Leading { .. })),
    )
    .await
    .expect("the campaign hung on a stalled insert")
    .unwrap();
    let waited = Instant::now() - t0;
    assert!(waited >= L / 4 && waited < L / 2, "led after {waited:?}");
    assert_eq!(shut(vvm).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_graceful_leader_hands_its_slot_to_the_standby_in_its_one_release_write() {
    let mem = mem_store();
    let journal = Journal::default();
    let a = launch(&mem, &journal, "a");
    leading(&a).await;
    let a_term = mem.get("slot/1").await.unwrap().unwrap().term;
    let b = launch(&mem, &journal, "b");
    sleep(L).await; // b stands as a candidate, and renews its candidacy
    assert_eq!(*b.vvm.state().borrow(), VvmState::Campaigning);
    shut(a.vvm).await;
    let released = Instant::now();
    assert_eq!(leading(&b).await, 1);
    assert!(Instant::now() - released < MS, "at once");
    let record = mem.get("slot/1").await.unwrap().unwrap();
    assert!(record.value.starts_with('b'), "{record:?}");
    assert!(
        record.term > a_term,
        "a new term: {} after {a_term}",
        record.term
    );
    assert!(
        b.store
            .calls_of(Op::Insert)
            .iter()
            .all(|c| c.result != Some(Ok(true))),
        "b wrote nothing to take the slot: a's release handed it over"
    );
    // b's deadlines count from a's handover write, and its renewals go on as after an insert.
    settle().await;
    assert_eq!(b.services.running(), 1);
    sleep(L * 3).await;
    assert_eq!(
        *b.vvm.state().borrow(),
        VvmState::Leading {
            slot: 1,
            term: record.term
        }
    );
    assert_eq!(b.fired.load(Ordering::SeqCst), 0, "the killer never fired");
    assert!(
        mem.list("candidate/").await.unwrap().is_empty(),
        "no candidacy left"
    );
    assert_eq!(shut(b.vvm).await, None);
    assert!(mem.get("slot/1").await.unwrap().is_none());
}

/// A standby that hears its leader is gone through the leader's holder lock (SPEC §4) before
/// it hears of the release (here it never does) looks for a handover first: the slot handed
/// to it just before the leader exited is taken over by a read, with no insert attempt (a
/// write on the takeover's path). On real time: the lock is let go of by a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_woken_by_its_leaders_lock_looks_for_a_handover_before_inserting() {
    let mem = mem_store();
    let journal = Journal::default();
    let dir = tempfile::tempdir().unwrap();
    let locks = Some(Arc::new(HolderLockDir::open(dir.path()).unwrap()));
    let host = |name: &str| FaultyStore::new(mem.clone(), name, &journal);
    let a = launch_on(
        host("a"),
        &journal,
        config("a", 1),
        Behaviour::default(),
        locks.clone(),
    );
    leading(&a).await;
    let b_store = host("b");
    b_store.deafen();
    let b = launch_on(
        b_store,
        &journal,
        config("b", 1),
        Behaviour::default(),
        locks,
    );
    // b stands as a candidate and has read a's record; it starts waiting on a's lock right
    // after the read, with no await between (given 100 ms here: a lock gone before the wait
    // began would not be heard of at all).
    while mem.list("candidate/").await.unwrap().is_empty()
        || !b.store.calls_of(Op::Get).iter().any(|c| c.end.is_some())
    {
        sleep(MS).await;
    }
    sleep(MS * 100).await;
    let released = Instant::now();
    shut(a.vvm).await;
    tokio::time::timeout(L / 4, leading(&b))
        .await
        .expect("b took over at once, not at the record's expiry");
    let late_inserts: Vec<_> = b
        .store
        .calls_of(Op::Insert)
        .into_iter()
        .filter(|c| c.key == "slot/1" && c.start >= released)
        .collect();
    assert!(
        late_inserts.is_empty(),
        "b tried to insert: {late_inserts:?}"
    );
    assert_eq!(shut(b.vvm).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_slot_handed_to_a_host_that_leads_another_is_handed_on() {
    let mem = mem_store();
    let journal = Journal::default();
    // Slot 2 was handed to c just as c won slot 1 (c's candidacy was still live), and d
    // stands as a candidate.
    mem.insert_if_absent("slot/2", "c", L)
        .await
        .unwrap()
        .unwrap();
    mem.insert_if_absent("candidate/d", "d", L)
        .await
        .unwrap()
        .unwrap();
    let c = launch_with(&mem, &journal, config("c", 2), Behaviour::default());
    assert_eq!(leading(&c).await, 1);
    settle().await;
    assert_eq!(
        mem.get("slot/2").await.unwrap().map(|r| r.value).as_deref(),
        Some("d"),
        "c handed slot 2 on to the next candidate"
    );
    assert_eq!(shut(c.vvm).await, None);
}
