//! Spread placement in-process: several hosts on one in-memory store, on tokio's paused clock,
//! with a services double that checks every rule at the moment it matters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Spread, SpreadConfig};
use crate::clock::{Clock, TokioClock};
use crate::keys::{MEMBER_PREFIX, SERVICE_PREFIX, member_key};
use crate::killer::Killer;
use crate::lease::LeaseDeadline;
use crate::lease_value::{self, Inventory};
use crate::ops::Ops;
use crate::services::{FrontDoor, RunningServices, SeparateServices, ServiceContext, ServiceError};
use crate::store::{MemStore, TtlStore};

mod failures;

const L: Duration = Duration::from_secs(4);

/// What every host's services did, checked as they do it.
#[derive(Default)]
struct World {
    /// Service name → holders running it now.
    running: Mutex<BTreeMap<String, Vec<String>>>,
    /// Every start's context, in order.
    starts: Mutex<Vec<ServiceContext>>,
    /// Broken rules, described.
    violations: Mutex<Vec<String>>,
    stops: AtomicUsize,
    /// Every front door opened, in order.
    doors: Mutex<Vec<Arc<DoorLog>>>,
}

/// What happened to one host's front door.
struct DoorLog {
    holder: String,
    deadline: LeaseDeadline,
    /// `passed` and `ahead` as its deadline moves, then `closed`.
    events: Mutex<Vec<&'static str>>,
}

impl DoorLog {
    fn events(&self) -> Vec<&'static str> {
        self.events.lock().unwrap().clone()
    }
}

/// A front door double: logs its deadline's moves until closed.
struct Door {
    log: Arc<DoorLog>,
    world: Arc<World>,
    _watch: tokio_util::task::AbortOnDropHandle<()>,
}

#[async_trait]
impl FrontDoor for Door {
    async fn close(self: Box<Self>) {
        // Closed last: no claim of this host's runs any more.
        let running = self.world.running.lock().unwrap().clone();
        if running.values().flatten().any(|h| *h == self.log.holder) {
            self.world.violate(format!(
                "{}: door closed before its claims",
                self.log.holder
            ));
        }
        self.log.events.lock().unwrap().push("closed");
    }
}

impl World {
    fn violate(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// How many services each holder runs, sorted descending.
    fn counts(&self) -> Vec<usize> {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for holders in self.running.lock().unwrap().values() {
            for h in holders {
                *by.entry(h.clone()).or_default() += 1;
            }
        }
        let mut counts: Vec<usize> = by.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts
    }

    /// Every service runs exactly once.
    fn each_once(&self, names: &[String]) -> bool {
        let running = self.running.lock().unwrap();
        names
            .iter()
            .all(|n| running.get(n).is_some_and(|h| h.len() == 1))
    }
}

/// The services double: `names`, started and stopped at once, checked against the store.
struct Doubles {
    names: Vec<String>,
    store: MemStore,
    world: Arc<World>,
    /// A service that reports a problem as soon as it runs on this host.
    fails: Option<String>,
    /// A service whose start never ends on this host.
    hangs: Option<String>,
    /// The host's holder value.
    holder: String,
    /// What the host has loaded, if the test says.
    inventory: Option<watch::Receiver<Inventory>>,
}

#[async_trait]
impl SeparateServices for Doubles {
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn inventory(&self) -> watch::Receiver<Inventory> {
        match &self.inventory {
            Some(inventory) => inventory.clone(),
            None => watch::channel(Inventory::default()).1,
        }
    }

    fn open_door(&self, membership: LeaseDeadline) -> Option<Box<dyn FrontDoor>> {
        let log = Arc::new(DoorLog {
            holder: self.holder.clone(),
            deadline: membership.clone(),
            events: Mutex::default(),
        });
        if self
            .world
            .doors
            .lock()
            .unwrap()
            .iter()
            .any(|d| d.holder == self.holder)
        {
            self.world
                .violate(format!("{}: a second door opened", self.holder));
        }
        self.world.doors.lock().unwrap().push(Arc::clone(&log));
        let watch = {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                loop {
                    log.deadline.passed().await;
                    log.events.lock().unwrap().push("passed");
                    log.deadline.ahead().await;
                    log.events.lock().unwrap().push("ahead");
                }
            })
        };
        Some(Box::new(Door {
            log,
            world: Arc::clone(&self.world),
            _watch: tokio_util::task::AbortOnDropHandle::new(watch),
        }))
    }

    async fn start_one(
        &self,
        name: &str,
        ctx: ServiceContext,
    ) -> Result<Box<dyn RunningServices>, ServiceError> {
        let lease = &ctx.lease;
        // Services only under a claim: the record is there, ours, with the term we were given.
        let record = self.store.get(&lease.key).await.unwrap();
        if record.as_ref().map(|r| (r.value.as_str(), r.term))
            != Some((lease.holder.as_str(), lease.term))
        {
            self.world
                .violate(format!("{name} started without its claim: {record:?}"));
        }
        if ctx.deadline.has_passed() || lease.slot != 0 || lease.key != format!("service/{name}") {
            self.world.violate(format!(
                "{name} started with {lease:?}, deadline {:?}",
                ctx.deadline
            ));
        }
        {
            let mut running = self.world.running.lock().unwrap();
            let holders = running.entry(name.to_owned()).or_default();
            if !holders.is_empty() {
                self.world
                    .violate(format!("{name} runs on {holders:?} and {}", lease.holder));
            }
            holders.push(lease.holder.clone());
        }
        if self.hangs.as_deref() == Some(name) {
            // Never returns; when the start is given up, the service is gone with it.
            let _gone = Gone {
                name: name.to_owned(),
                holder: lease.holder.clone(),
                world: Arc::clone(&self.world),
            };
            std::future::pending::<()>().await;
        }
        if self.fails.as_deref() == Some(name) {
            ctx.problems.report(crate::problem::Problem::Service {
                name: name.to_owned(),
                reason: "fails here".to_owned(),
            });
        }
        self.world.starts.lock().unwrap().push(ctx.clone());
        Ok(Box::new(One {
            name: name.to_owned(),
            ctx,
            store: self.store.clone(),
            world: Arc::clone(&self.world),
        }))
    }
}

/// Removes a service that never finished starting from the running ones when dropped.
struct Gone {
    name: String,
    holder: String,
    world: Arc<World>,
}

impl Drop for Gone {
    fn drop(&mut self) {
        let mut running = self.world.running.lock().unwrap();
        if let Some(holders) = running.get_mut(&self.name) {
            holders.retain(|h| *h != self.holder);
        }
    }
}

struct One {
    name: String,
    ctx: ServiceContext,
    store: MemStore,
    world: Arc<World>,
}

#[async_trait]
impl RunningServices for One {
    async fn stop(self: Box<Self>) {
        if !self.ctx.stopping.is_cancelled() {
            self.world
                .violate(format!("{} stopped without its stop signal", self.name));
        }
        // Ordered stop: the claim is deleted only after this returns, so a claim handed over
        // is still ours here (a lost one may be gone: that is why it was lost).
        let record = self.store.get(&self.ctx.lease.key).await.unwrap();
        let ours = record.is_some_and(|r| r.term == self.ctx.lease.term);
        if !ours && !self.ctx.deadline.has_passed() {
            self.world.violate(format!(
                "{}: claim gone before its service stopped, deadline still valid",
                self.name
            ));
        }
        let mut running = self.world.running.lock().unwrap();
        if let Some(holders) = running.get_mut(&self.name) {
            holders.retain(|h| *h != self.ctx.lease.holder);
        }
        self.world.stops.fetch_add(1, Ordering::SeqCst);
    }
}

/// A host of the group: its run, its stop token, its killer.
struct Member {
    holder: String,
    stop: CancellationToken,
    run: JoinHandle<()>,
    killer: Arc<Killer>,
    fired: Arc<AtomicUsize>,
}

struct Group {
    clock: TokioClock,
    store: MemStore,
    world: Arc<World>,
    names: Vec<String>,
    /// What a host to join has loaded, by holder, where the test says (taken at its join).
    inventory: Mutex<BTreeMap<String, watch::Receiver<Inventory>>>,
    /// Each host's metrics, by holder.
    ops: Mutex<BTreeMap<String, Ops>>,
}

impl Group {
    fn new(services: usize) -> Self {
        let clock = TokioClock::new();
        Self {
            store: MemStore::new(Arc::new(clock.clone())),
            clock,
            world: Arc::default(),
            names: (0..services).map(|i| format!("s{i}")).collect(),
            inventory: Mutex::default(),
            ops: Mutex::default(),
        }
    }

    fn join(&self, holder: &str) -> Member {
        self.join_with(holder, None, None)
    }

    fn join_with(&self, holder: &str, fails: Option<&str>, hangs: Option<&str>) -> Member {
        self.join_on(holder, Arc::new(self.store.clone()), fails, hangs)
    }

    fn join_on(
        &self,
        holder: &str,
        store: Arc<dyn crate::store::Store>,
        fails: Option<&str>,
        hangs: Option<&str>,
    ) -> Member {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        let (fired, killer) = Killer::counting(Arc::clone(&clock));
        let services = Arc::new(Doubles {
            names: self.names.clone(),
            store: self.store.clone(),
            world: Arc::clone(&self.world),
            fails: fails.map(str::to_owned),
            hangs: hangs.map(str::to_owned),
            holder: holder.to_owned(),
            inventory: self.inventory.lock().unwrap().remove(holder),
        });
        let config = SpreadConfig {
            lease: L,
            holder: holder.to_owned(),
            advertise: None,
        };
        let stop = CancellationToken::new();
        let ops = Ops::new(Arc::clone(&clock));
        self.ops
            .lock()
            .unwrap()
            .insert(holder.to_owned(), ops.clone());
        let run = tokio::spawn(
            Spread::new(config, store, services, ops)
                .with_clock_and_killer(clock, Arc::clone(&killer))
                .run(stop.clone()),
        );
        Member {
            holder: holder.to_owned(),
            stop,
            run,
            killer,
            fired,
        }
    }

    fn check(&self) {
        assert_eq!(*self.world.violations.lock().unwrap(), Vec::<String>::new());
    }

    /// The front door of `holder`.
    fn door(&self, holder: &str) -> Arc<DoorLog> {
        let doors = self.world.doors.lock().unwrap();
        let door = doors.iter().find(|d| d.holder == holder);
        Arc::clone(door.expect("a door opened"))
    }

    /// The holders of the live records under `prefix`.
    async fn holders(&self, prefix: &str) -> Vec<String> {
        let records = self.store.list(prefix).await.unwrap();
        let holders = records.iter().map(|(_, r)| lease_value::holder(&r.value));
        holders.map(str::to_owned).collect()
    }
}

/// Every host of `hosts` leaves: no rule broken before or after, every record deleted.
async fn all_leave(g: &Group, hosts: impl IntoIterator<Item = Member>) {
    g.check();
    for h in hosts {
        leave(h).await;
    }
    assert!(
        g.store.list("").await.unwrap().is_empty(),
        "every record deleted"
    );
    g.check();
}

async fn leave(m: Member) {
    m.stop.cancel();
    m.run.await.unwrap();
    assert_eq!(m.killer.deadline(), None, "{}: disarmed last", m.holder);
    assert_eq!(
        m.fired.load(Ordering::SeqCst),
        0,
        "{}: killer fired",
        m.holder
    );
}

#[tokio::test(start_paused = true)]
async fn three_hosts_run_seven_services_once_each_3_2_2() {
    let g = Group::new(7);
    let hosts: Vec<Member> = ["a", "b", "c"].iter().map(|h| g.join(h)).collect();
    tokio::time::sleep(L * 3).await;
    assert!(g.world.each_once(&g.names));
    assert_eq!(g.world.counts(), [3, 2, 2]);
    assert_eq!(g.holders(MEMBER_PREFIX).await.len(), 3);
    assert_eq!(g.holders(SERVICE_PREFIX).await.len(), 7);
    // At rest nothing moves: a renewal keeps every claim, a look changes nothing.
    let starts = g.world.starts.lock().unwrap().len();
    tokio::time::sleep(L * 5).await;
    assert_eq!(
        g.world.starts.lock().unwrap().len(),
        starts,
        "nothing moved"
    );
    // Guests see their claim's term; kv writes are fenced by it (a claim's own key).
    let latest: BTreeMap<String, ServiceContext> = g
        .world
        .starts
        .lock()
        .unwrap()
        .iter()
        .map(|c| (c.lease.key.clone(), c.clone()))
        .collect();
    assert_eq!(latest.len(), 7);
    for ctx in latest.values() {
        let record = g.store.get(&ctx.lease.key).await.unwrap().unwrap();
        assert_eq!(record.term, ctx.lease.term);
        assert!(!ctx.deadline.has_passed(), "renewed");
    }
    all_leave(&g, hosts).await;
}

/// A host's inventory: `s0` at version `s0`, `s1` at one version always, and `rejected`.
fn loaded(s0: &str, rejected: &[(&str, &str)]) -> Inventory {
    Inventory {
        versions: [("s0", s0), ("s1", "aaaaaaaaaaaa")]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .into(),
        rejected: (rejected.iter())
            .map(|(n, r)| ((*n).to_owned(), (*r).to_owned()))
            .collect(),
    }
}

/// The value of `holder`'s membership record.
async fn membership(g: &Group, holder: &str) -> String {
    let record = g.store.get(&member_key(holder)).await.unwrap();
    record.expect("a member").value
}

/// A member publishes what it has loaded and refused in its membership record (SPEC §13, for
/// `status`), rewrites it at once when that changes (no renewal tick waited for), keeps it
/// through its renewals, and deletes it when it leaves.
#[tokio::test(start_paused = true)]
async fn a_member_publishes_what_it_has_loaded_and_its_renewals_keep_it() {
    let g = Group::new(2);
    let (tx, rx) = watch::channel(loaded("0c9766887530", &[]));
    g.inventory.lock().unwrap().insert("a".to_owned(), rx);
    let hosts = [g.join("a"), g.join("b")];
    tokio::time::sleep(L).await;
    let value = membership(&g, "a").await;
    assert_eq!(lease_value::holder(&value), "a");
    assert_eq!(
        lease_value::versions(&value),
        Some(loaded("0c9766887530", &[]).versions)
    );
    assert_eq!(
        membership(&g, "b").await,
        "b",
        "nothing to say: the bare holder"
    );
    assert_eq!(g.world.counts(), [1, 1]);

    let now = loaded(
        "11def412bec5",
        &[("s2", "services/s2.wasm: not a component")],
    );
    tx.send_replace(now.clone());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let value = membership(&g, "a").await;
    assert_eq!(
        lease_value::versions(&value),
        Some(now.versions.clone()),
        "{value}"
    );
    assert_eq!(lease_value::rejected(&value), now.rejected);
    tokio::time::sleep(L * 3).await;
    assert_eq!(membership(&g, "a").await, value, "renewals keep the value");
    assert!(g.world.each_once(&g.names));
    assert_eq!(g.world.counts(), [1, 1], "nothing moved");
    all_leave(&g, hosts).await;
}

/// Members whose versions of a service differ each say so (log, and
/// `vvm_service_differs_from_leader` at 1 for that service only) from their next look at the
/// members, and no longer once they agree.
#[tokio::test(start_paused = true)]
async fn members_whose_versions_differ_say_so_until_they_agree() {
    let g = Group::new(2);
    let (a_tx, a_rx) = watch::channel(loaded("0c9766887530", &[]));
    let (b_tx, b_rx) = watch::channel(loaded("11def412bec5", &[]));
    g.inventory.lock().unwrap().insert("a".to_owned(), a_rx);
    g.inventory.lock().unwrap().insert("b".to_owned(), b_rx);
    let hosts = [g.join("a"), g.join("b")];
    let gauge = |holder: &str, service: &str| -> Option<String> {
        let text = g.ops.lock().unwrap()[holder].render();
        let series = format!("vvm_service_differs_from_leader{{service=\"{service}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&series))?;
        Some(line[series.len()..].to_owned())
    };
    tokio::time::sleep(L).await;
    for holder in ["a", "b"] {
        assert_eq!(gauge(holder, "s0").as_deref(), Some("1"), "{holder}");
        assert_eq!(gauge(holder, "s1"), None, "{holder}: s1 is the same");
    }
    b_tx.send_replace(loaded("0c9766887530", &[]));
    tokio::time::sleep(L).await;
    for holder in ["a", "b"] {
        assert_eq!(gauge(holder, "s0").as_deref(), Some("0"), "{holder}");
    }
    drop(a_tx);
    g.check();
    for h in hosts {
        leave(h).await;
    }
    g.check();
}

#[tokio::test(start_paused = true)]
async fn a_fourth_host_gets_work_without_waiting_for_expiry_2_2_2_1() {
    let g = Group::new(7);
    let mut hosts: Vec<Member> = ["a", "b", "c"].iter().map(|h| g.join(h)).collect();
    tokio::time::sleep(L * 3).await;
    assert_eq!(g.world.counts(), [3, 2, 2]);
    let stops = g.world.stops.load(Ordering::SeqCst);
    hosts.push(g.join("d"));
    // The newcomer's join wakes the others, who hand over at once; the newcomer hears the
    // release at once. No renewal tick (L/4), let alone an expiry (L), is waited for.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(g.world.each_once(&g.names));
    assert_eq!(g.world.counts(), [2, 2, 2, 1]);
    assert_eq!(
        g.world.stops.load(Ordering::SeqCst),
        stops + 1,
        "exactly one service moved"
    );
    g.check();
    for h in hosts {
        leave(h).await;
    }
    g.check();
}

#[tokio::test(start_paused = true)]
async fn a_graceful_leave_hands_every_service_over_at_once() {
    let g = Group::new(7);
    let mut hosts: Vec<Member> = ["a", "b", "c"].iter().map(|h| g.join(h)).collect();
    tokio::time::sleep(L * 3).await;
    let leaving = hosts.remove(0);
    let before = tokio::time::Instant::now();
    leave(leaving).await;
    // Deletes wake the others (no renewal tick, no expiry): on paused time, nothing has
    // to pass but what the stops and store calls themselves take.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(before.elapsed() < L / 4, "took {:?}", before.elapsed());
    assert!(g.world.each_once(&g.names), "{:?}", g.world.running);
    assert_eq!(g.world.counts(), [4, 3]);
    g.check();
    for h in hosts {
        leave(h).await;
    }
    g.check();
}

#[tokio::test(start_paused = true)]
async fn a_crashed_hosts_services_run_elsewhere_once_its_claims_expire() {
    let g = Group::new(7);
    let mut hosts: Vec<Member> = ["a", "b", "c"].iter().map(|h| g.join(h)).collect();
    tokio::time::sleep(L * 3).await;
    // "SIGKILL": the run ends where it stands; its instances are gone with it.
    let dead = hosts.remove(0);
    dead.run.abort();
    let _ = dead.run.await;
    for holders in g.world.running.lock().unwrap().values_mut() {
        holders.retain(|h| *h != dead.holder);
    }
    let held = g.holders(SERVICE_PREFIX).await;
    let orphaned = held.iter().filter(|h| **h == dead.holder).count();
    assert_eq!(orphaned, 3, "its claims outlive it until they expire");
    tokio::time::sleep(L / 2).await;
    assert_eq!(
        g.world.counts().iter().sum::<usize>(),
        4,
        "nobody takes a live claim"
    );
    tokio::time::sleep(L).await;
    assert!(g.world.each_once(&g.names));
    assert_eq!(g.world.counts(), [4, 3]);
    g.check();
    for h in hosts {
        leave(h).await;
    }
    g.check();
}

/// The front door belongs to the membership, not to a claim (issue 46): it opens once, when
/// the host joins; it stays open, its deadline ahead, while the host hands claims over and
/// their deadlines pass; it closes when the host leaves, after its
/// claims are released.
#[tokio::test(start_paused = true)]
async fn the_front_door_follows_the_membership_not_a_claim() {
    let g = Group::new(4);
    let a = g.join("a");
    tokio::time::sleep(L * 2).await;
    assert_eq!(g.world.counts(), [4]);
    let b = g.join("b");
    // Long enough for every handed-over claim's deadline to pass on A.
    tokio::time::sleep(L * 3).await;
    assert_eq!(g.world.counts(), [2, 2]);
    let door = g.door("a");
    assert!(!door.deadline.has_passed(), "renewed with the membership");
    assert_eq!(door.events(), Vec::<&str>::new(), "open throughout");
    let starts = g.world.starts.lock().unwrap().clone();
    let handed: Vec<&ServiceContext> = starts
        .iter()
        .filter(|c| c.lease.holder == "a" && c.stopping.is_cancelled())
        .collect();
    assert_eq!(handed.len(), 2, "A handed two claims over");
    assert!(handed.iter().all(|c| c.deadline.has_passed()));
    leave(b).await;
    assert_eq!(g.door("b").events().last(), Some(&"closed"));
    tokio::time::sleep(L).await;
    assert_eq!(g.door("a").events(), Vec::<&str>::new());
    leave(a).await;
    assert_eq!(
        g.door("a").events(),
        ["passed", "closed"],
        "left: no more taking"
    );
    g.check();
}
