//! Spread placement when things go wrong: a claim lost, the killer's deadline, a service
//! failing here, a start that never ends, a release that goes unanswered.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_lost_claim_stops_that_service_alone_with_its_deadline_passed_at_once() {
    let g = Group::new(2);
    let a = g.join("a");
    tokio::time::sleep(L).await;
    assert_eq!(g.world.counts(), [2]);
    let (lost, kept) = {
        let starts = g.world.starts.lock().unwrap();
        (starts[0].clone(), starts[1].clone())
    };
    // Someone else's write takes the record from under the host (an operator, a bug).
    assert!(
        g.store
            .compare_and_delete(&lost.lease.key, "a")
            .await
            .unwrap()
    );
    // The next renewal (within L/4) does not return it: lost.
    tokio::time::sleep(L / 4).await;
    assert!(lost.deadline.has_passed(), "pulled in at once");
    assert!(lost.stopping.is_cancelled());
    assert!(!kept.deadline.has_passed(), "the other claim is untouched");
    assert!(!kept.stopping.is_cancelled());
    // Free again: the host claims it anew, under a higher term.
    tokio::time::sleep(L / 4).await;
    let again = g.world.starts.lock().unwrap().last().cloned().unwrap();
    assert_eq!(again.lease.key, lost.lease.key);
    assert!(again.lease.term > lost.lease.term);
    assert_eq!(g.world.counts(), [2]);
    g.check();
    leave(a).await;
    g.check();
}

#[tokio::test(start_paused = true)]
async fn the_killer_follows_the_earliest_claim_deadline_and_is_disarmed_last() {
    let g = Group::new(3);
    let a = g.join("a");
    tokio::time::sleep(L / 8).await;
    let earliest = g
        .world
        .starts
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.deadline.get())
        .min()
        .unwrap();
    assert_eq!(a.killer.deadline(), Some(earliest));
    // Renewals move it later, one write for all claims.
    tokio::time::sleep(L * 2).await;
    let deadlines: Vec<_> = g
        .world
        .starts
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.deadline.get())
        .collect();
    assert!(
        deadlines.iter().all(|d| *d == deadlines[0]),
        "renewed together"
    );
    assert_eq!(a.killer.deadline(), Some(deadlines[0]));
    assert!(deadlines[0] > earliest);
    leave(a).await;
    g.check();
}

#[tokio::test(start_paused = true)]
async fn more_hosts_than_services_leave_the_extra_ones_idle_and_disarmed() {
    let g = Group::new(2);
    let hosts: Vec<Member> = ["a", "b", "c"].iter().map(|h| g.join(h)).collect();
    tokio::time::sleep(L * 2).await;
    assert!(g.world.each_once(&g.names));
    assert_eq!(g.world.counts(), [1, 1]);
    let idle: Vec<&Member> = hosts
        .iter()
        .filter(|m| {
            let running = g.world.running.lock().unwrap();
            !running.values().any(|h| h.contains(&m.holder))
        })
        .collect();
    assert_eq!(idle.len(), 1);
    assert_eq!(idle[0].killer.deadline(), None, "nothing to guard");
    for h in hosts {
        leave(h).await;
    }
    g.check();
}

#[tokio::test(start_paused = true)]
async fn a_service_that_fails_here_is_handed_to_a_healthy_host() {
    let g = Group::new(2);
    let a = g.join_with("a", Some("s0"), None);
    tokio::time::sleep(L / 8).await;
    let b = g.join("b");
    tokio::time::sleep(L * 2).await;
    let running = g.world.running.lock().unwrap().clone();
    assert_eq!(running["s0"], ["b"], "{running:?}");
    assert_eq!(running["s1"], ["a"], "{running:?}");
    g.check();
    leave(a).await;
    leave(b).await;
    g.check();
}

#[tokio::test(start_paused = true)]
async fn a_start_that_never_ends_is_given_up_and_renewals_go_on() {
    let g = Group::new(2);
    let a = g.join_with("a", None, Some("s0"));
    tokio::time::sleep(L * 3).await;
    assert_eq!(a.fired.load(Ordering::SeqCst), 0, "renewed meanwhile");
    assert_eq!(g.world.running.lock().unwrap()["s1"], ["a"]);
    let b = g.join("b");
    tokio::time::sleep(L * 2).await;
    assert_eq!(
        g.world.running.lock().unwrap()["s0"],
        ["b"],
        "taken by the host where it starts"
    );
    g.check();
    leave(a).await;
    leave(b).await;
    g.check();
}

/// A release that went unanswered may still land, and it deletes by our holder value: had
/// this host claimed the service again meanwhile, the late delete would remove that new claim
/// while its service runs here, and another host could claim and run it too. So a host does
/// not claim again, for two leases, a service whose release it could not confirm.
#[tokio::test(start_paused = true)]
async fn a_service_whose_release_went_unanswered_is_not_claimed_again_here_at_once() {
    let g = Group::new(2);
    // The host's store, whose deletes of claims land late: the write is on its way when the
    // caller stops waiting for it (a timeout), as a write to a slow disk or a busy etcd.
    let late = crate::store::faulty::FaultyStore::new(g.store.clone(), "late", &());
    late.land_late(crate::store::faulty::Op::Delete, SERVICE_PREFIX, L / 2);
    let a = g.join_on("a", late, None, None);
    tokio::time::sleep(L).await;
    assert_eq!(g.world.counts(), [2]);
    // B joins: A hands one service over; its delete times out (L/4) and lands at L/2.
    let b = g.join("b");
    tokio::time::sleep(L).await;
    assert_eq!(g.world.counts(), [1, 1]);
    let moved = g
        .world
        .running
        .lock()
        .unwrap()
        .iter()
        .find(|(_, h)| h[0] == "b")
        .map(|(n, _)| n.clone())
        .unwrap();
    // B leaves: the service is free and A has room, but A may not claim it yet.
    leave(b).await;
    tokio::time::sleep(L / 2).await;
    assert_eq!(g.world.counts(), [1], "A claimed {moved} again at once");
    // Once the pause is over, A takes it: at rest nothing is left unclaimed.
    tokio::time::sleep(L * 2).await;
    assert_eq!(g.world.counts(), [2]);
    assert!(g.world.each_once(&g.names));
    g.check();
    leave(a).await;
    g.check();
}

/// A membership lost (its record deleted from under the host) stops the door taking from a
/// shared queue while the host cannot join again (its inserts fail); once it has joined again,
/// the same door takes again.
#[tokio::test(start_paused = true)]
async fn a_lost_membership_pauses_the_door_until_the_host_joins_again() {
    use crate::store::faulty::{Fault, FaultyStore, Op};
    let g = Group::new(2);
    let faulty = FaultyStore::new(g.store.clone(), "a", &());
    let a = g.join_on("a", faulty.clone(), None, None);
    tokio::time::sleep(L).await;
    assert_eq!(g.door("a").events(), Vec::<&str>::new());
    faulty.script(Op::Insert, [Fault::Transient; 2]);
    assert!(g.store.compare_and_delete("member/a", "a").await.unwrap());
    // The next renewal (within L/4) misses the record, and the join after it fails.
    tokio::time::sleep(L / 4).await;
    let door = g.door("a");
    assert_eq!(door.events(), ["passed"]);
    assert!(g.holders(MEMBER_PREFIX).await.is_empty());
    // The next join (a renewal later) fails too; the one after lands.
    tokio::time::sleep(L).await;
    assert_eq!(g.holders(MEMBER_PREFIX).await, ["a"], "joined again");
    assert_eq!(door.events(), ["passed", "ahead"]);
    assert!(!door.deadline.has_passed());
    leave(a).await;
    g.check();
}
