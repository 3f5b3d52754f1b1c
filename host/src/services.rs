//! The seam between the lifecycle and whatever it runs while a slot is held (SPEC §5, §6).
//!
//! The lifecycle ([`crate::vvm`]) only knows [`Services`]; the Wasm runtime implements it, and
//! tests implement it with doubles that record what happened.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::lease::LeaseDeadline;
use crate::lease_value::{Inventory, RunningReport};
use crate::problem::ProblemReporter;
use crate::store::{Store, Term};

/// The lease a set of services runs under, as guests see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The slot held, 1..=cluster size; 0 under spread placement, where each service holds
    /// a claim of its own (`key` names it).
    pub slot: u32,
    /// The store key of that slot's lease record.
    pub key: String,
    /// This host's holder value (unique per process run).
    pub holder: String,
    /// The fencing term issued when the slot was acquired.
    pub term: Term,
    /// The lease duration `L` written with every acquire and renew.
    pub lease: Duration,
}

/// Everything the services of one leadership get from the lifecycle.
#[derive(Clone)]
pub struct ServiceContext {
    /// The lease held.
    pub lease: LeaseInfo,
    /// The local lease deadline: past it, no guest effect may happen (SPEC §4, §6).
    pub deadline: LeaseDeadline,
    /// Cancelled when the services must stop (shutdown or leadership loss).
    pub stopping: CancellationToken,
    /// Reports a problem to the lifecycle (first one wins).
    pub problems: ProblemReporter,
    /// The store, for the guests' fenced key-value space.
    pub store: Arc<dyn Store>,
    /// Where the services say which of them run; the lease's renewals write it into the
    /// record, for `vvm-host status`.
    pub running: RunningReport,
}

/// Why services could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A service failed to start; the message names it and the reason.
    #[error("service {name}: {reason}")]
    Start {
        /// The service's name (its file stem for Wasm services).
        name: String,
        /// Why it failed.
        reason: String,
    },
}

/// A set of services the lifecycle starts once a slot is held.
#[async_trait]
pub trait Services: Send + Sync + 'static {
    /// Starts every service under `ctx.lease`; returns once all have started. Must return
    /// promptly (with what did start) once `ctx.stopping` is cancelled.
    async fn start(&self, ctx: ServiceContext) -> Result<Box<dyn RunningServices>, ServiceError>;

    /// The version of each service loaded now, by name, and why each refused one was,
    /// changing as the services do (a file replaced, added or removed while serving): what
    /// this host would run if it led, and publishes to the fleet (SPEC §13). Call within a
    /// tokio runtime. A set without versions (a double) is empty and never changes.
    fn inventory(&self) -> watch::Receiver<Inventory> {
        watch::channel(Inventory::default()).1
    }
}

/// Services started for one leadership.
#[async_trait]
pub trait RunningServices: Send {
    /// Tells every service to stop, waits out the grace period, then drops every instance
    /// still there. Returns when no guest code can run any more.
    async fn stop(self: Box<Self>);
}

/// A host's front door under spread placement: its HTTP listener, open for its membership of
/// the group rather than for any one claim (claims come and go while the host stays).
#[async_trait]
pub trait FrontDoor: Send {
    /// Stops accepting, lets the open connections finish the request in progress within the
    /// grace period, then drops them. Returns when no connection is left.
    async fn close(self: Box<Self>);
}

/// A host of the group that holds a service: its holder value and the address it advertises
/// (SPEC §13, forwarding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its holder value.
    pub holder: String,
    /// Where its HTTP listener is reached.
    pub addr: SocketAddr,
}

/// The other hosts of the group, as the store's records said when placement last looked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peers {
    /// Who holds each service another host runs, by service name, where it can be reached.
    pub holders: BTreeMap<String, Peer>,
    /// The services other hosts hold that cannot be forwarded to: their host advertises no
    /// address, or this host's own (a listening socket they share). A service neither here
    /// nor in `holders` is held by nobody now.
    pub unreachable: BTreeSet<String>,
    /// The address each other member advertises.
    pub members: BTreeSet<SocketAddr>,
}

/// Where the front door forwards requests for services this host does not hold: placement
/// publishes the holders it reads from the store ([`Directory::publish`]), the front door
/// reads them, and asks placement to look again ([`Directory::ask`]) when a holder turned out
/// to be gone. Shared by the two; placement is its only writer.
#[derive(Debug)]
pub struct Directory {
    peers: watch::Sender<Peers>,
    asked: Notify,
}

impl Default for Directory {
    fn default() -> Self {
        Self {
            peers: watch::Sender::new(Peers::default()),
            asked: Notify::new(),
        }
    }
}

impl Directory {
    /// The holders are `peers` from now on; those waiting for a change are woken only if they
    /// differ from the last.
    pub fn publish(&self, peers: Peers) {
        self.peers.send_if_modified(|old| {
            let changed = *old != peers;
            *old = peers;
            changed
        });
    }

    /// The holders as last published, and their changes to come.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Peers> {
        self.peers.subscribe()
    }

    /// A holder was not there: placement is asked to look at the store again now rather than
    /// at its next round.
    pub fn ask(&self) {
        self.asked.notify_one();
    }

    /// Resolves when the front door has asked for a new look since the last time.
    pub async fn asked(&self) {
        self.asked.notified().await;
    }
}

/// The services of spread placement ([`crate::placement`]): each one started on its own,
/// under a claim of its own.
#[async_trait]
pub trait SeparateServices: Send + Sync + 'static {
    /// The names of the services there are now, sorted.
    fn names(&self) -> Vec<String>;

    /// Opens this host's front door for its membership of the group, if it serves HTTP: it
    /// accepts until closed, and on a socket shared with other hosts only while `membership`
    /// (the membership's local deadline) is ahead. Each request it takes is judged by the
    /// claim of the service it asks for.
    fn open_door(&self, membership: LeaseDeadline) -> Option<Box<dyn FrontDoor>>;

    /// Where the front door forwards requests for services other hosts hold, when it forwards
    /// (`forward`): placement keeps it up to date.
    fn directory(&self) -> Option<Arc<Directory>> {
        None
    }

    /// What this host has loaded and refused, as [`Services::inventory`]: the membership
    /// record publishes it to the group (SPEC §13).
    fn inventory(&self) -> watch::Receiver<Inventory> {
        watch::channel(Inventory::default()).1
    }

    /// Starts the service `name` alone under `ctx.lease` (its claim); returns once it has
    /// started. It follows the services directory as [`Services::start`] does: a replaced
    /// version is swapped, a removed service stops.
    async fn start_one(
        &self,
        name: &str,
        ctx: ServiceContext,
    ) -> Result<Box<dyn RunningServices>, ServiceError>;
}
