//! A host's fair share under spread placement: join the group (membership record, wake-up,
//! what this host has loaded published in it), then claim free services up to the share and
//! hand the surplus over.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{Member, Phase};
use crate::clock::Timestamp;
use crate::keys::{ANNOUNCE_PREFIX, MEMBER_PREFIX, SERVICE_PREFIX};
use crate::lease::{LocalLease, attempt_patience};
use crate::lease_value;
use crate::services::{Peer, Peers};

use crate::store::{Record, Store, StoreError};

impl Member {
    /// Writes our membership record unless the last renewal found it.
    pub(super) async fn join_if_needed(&mut self) {
        if self.record_known {
            return;
        }
        let lease = self.lease();
        let start = self.s.clock.now();
        let value = self.membership_value();
        let insert = self
            .s
            .store
            .insert_if_absent(&self.record_key, &value, lease);
        match tokio::time::timeout(attempt_patience(lease), insert).await {
            // Holder values are unique: a live record under our key is ours.
            Ok(Ok(inserted)) => {
                self.record_known = true;
                self.membership_written(start);
                tracing::info!(member = self.record_key, "joined");
                // One found live (a renewal's answer lost) may carry an older set.
                self.published = inserted.is_some().then_some(value);
                if inserted.is_some() {
                    announce(&*self.s.store, self.holder(), lease).await;
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "joining failed; will retry"),
            Err(_) => tracing::warn!("joining timed out; will retry"),
        }
    }

    /// Our membership record's value now: our holder, what we have loaded and refused, and
    /// where the others reach our HTTP listener.
    fn membership_value(&mut self) -> String {
        let config = &self.s.config;
        let inventory = self.inventory.borrow_and_update();
        lease_value::candidate(&config.holder, &inventory, config.advertise)
    }

    /// Rewrites our membership record when what we have loaded changed since we wrote it
    /// (SPEC §13: every host publishes the versions it has). Its expiry is the renewals'
    /// business; a write that fails is tried again next round.
    pub(super) async fn publish(&mut self) {
        if !self.record_known {
            return;
        }
        let value = self.membership_value();
        if self.published.as_ref() == Some(&value) {
            return;
        }
        let lease = self.lease();
        let (store, key, holder) = (&self.s.store, &self.record_key, &self.s.config.holder);
        let published = self.published.clone();
        let swap = async {
            let old = match published {
                Some(old) => old,
                None => match our_value(&**store, key, holder).await? {
                    Some(value) => value,
                    // Gone: the next renewal says so, and we join again.
                    None => return Ok(false),
                },
            };
            store.compare_and_swap(key, &old, &value, lease).await
        };
        match tokio::time::timeout(attempt_patience(lease), swap).await {
            Ok(Ok(true)) => {
                tracing::debug!(
                    member = self.record_key,
                    "published what this host has loaded"
                );
                self.published = Some(value);
            }
            Ok(Ok(false)) => self.published = None,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "publishing the services loaded failed; will retry");
            }
            Err(_) => tracing::debug!("publishing the services loaded timed out; will retry"),
        }
    }

    /// Compares the versions we have loaded with those every other member's record says it
    /// has (SPEC §13): warns once per change of the differences, says once when they are
    /// gone, and keeps `vvm_service_differs_from_leader{service}` at 1 for each service that
    /// differs from some member's. A member whose record says nothing of its services (an
    /// older version) is not compared.
    fn compare(&mut self, members: &[(String, Record)]) {
        let ours = self.inventory.borrow().versions.clone();
        let mut now = Vec::new();
        for (_, r) in members {
            let holder = lease_value::holder(&r.value);
            if holder == self.holder() {
                continue;
            }
            let Some(theirs) = lease_value::versions(&r.value) else {
                continue;
            };
            let differ = lease_value::differences(&theirs, &ours).into_iter();
            now.extend(differ.map(|d| (d.service.clone(), format!("{d} (on {holder})"))));
        }
        now.sort();
        if now == self.differences {
            return;
        }
        (self.s.ops).services_differ(&services(&self.differences), &services(&now));
        if now.is_empty() {
            tracing::info!("this host's services are the other members' again");
        } else {
            let list: Vec<&str> = now.iter().map(|(_, d)| d.as_str()).collect();
            tracing::warn!(
                differences = list.join("; "),
                "this host's services differ from another member's"
            );
        }
        self.differences = now;
    }

    /// Deletes our membership record, whatever set of ours it carries.
    pub(super) fn delete_membership(
        &self,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let store = Arc::clone(&self.s.store);
        let (key, holder) = (self.record_key.clone(), self.holder().to_owned());
        let published = self.published.clone();
        async move {
            if let Some(value) = &published
                && store.compare_and_delete(&key, value).await?
            {
                return Ok(());
            }
            if let Some(value) = our_value(&*store, &key, &holder).await? {
                store.compare_and_delete(&key, &value).await?;
            }
            Ok(())
        }
    }

    /// Our membership record was written by a write that began at `start`: its deadline moves
    /// (and the door takes from a shared queue again); on the first join the door opens.
    pub(super) fn membership_written(&mut self, start: Timestamp) {
        let lease = self.lease();
        if let Some(membership) = &mut self.membership {
            membership.renewed(start, lease, true);
        } else {
            let membership = LocalLease::written(start, lease);
            let deadline = membership.deadline(Arc::clone(&self.s.clock));
            self.door = self.s.services.open_door(deadline);
            self.membership = Some(membership);
        }
    }

    /// Looks at the members and claims, then hands over surplus or claims free services.
    pub(super) async fn balance(&mut self) {
        self.join_if_needed().await;
        self.publish().await;
        let Some((members, records)) = look(&*self.s.store, self.lease()).await else {
            return;
        };
        self.compare(&members);
        self.direct(&members, &records);
        let names = self.s.services.names();
        let share = share_of(names.len(), &members, &records, self.holder());
        let running: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Running { .. }))
            .map(|(n, _)| n.clone())
            .collect();
        // Gone from the directory: its service has stopped already; give the claim back.
        let known: BTreeSet<&String> = names.iter().collect();
        for name in running.iter().filter(|n| !known.contains(n)) {
            tracing::info!(service = name, "releasing the claim of a removed service");
            self.begin_stop(name);
        }
        let mut running: Vec<String> = running.into_iter().filter(|n| known.contains(n)).collect();
        if running.len() > share {
            // Surplus: the last ones by name (every host agrees on nothing here; any choice works).
            for name in running.split_off(share) {
                tracing::info!(service = name, share, "handing over");
                self.begin_stop(&name);
            }
            self.log_running();
        }
        let claimed: HashMap<&str, &Record> = records
            .iter()
            .filter_map(|(k, r)| Some((k.strip_prefix(SERVICE_PREFIX)?, r)))
            .collect();
        let mut room = share.saturating_sub(running.len());
        // Whatever another holder stops renewing (a host that died) is looked at again the
        // moment it expires, not at our next renewal.
        let next_expiry = records
            .iter()
            .chain(members.iter())
            .filter(|(_, r)| lease_value::holder(&r.value) != self.holder())
            .map(|(_, r)| r.time_left + Duration::from_millis(1))
            .min();
        self.next_expiry = next_expiry;
        if room == 0 {
            return;
        }
        // Start at a place of our own in the list, so hosts joining together try different
        // services first.
        let offset = self.holder().bytes().map(usize::from).sum::<usize>() % names.len().max(1);
        let free: Vec<&String> = names
            .iter()
            .cycle()
            .skip(offset)
            .take(names.len())
            .filter(|n| {
                !claimed.contains_key(n.as_str())
                    && !self.claims.contains_key(*n)
                    && !self.cooldown.contains_key(*n)
            })
            .collect();
        let mut changed = false;
        for name in free {
            if room == 0 {
                break;
            }
            if self.claim(name).await {
                room -= 1;
                changed = true;
            }
        }
        if changed {
            self.log_running();
        }
    }
}

impl Member {
    /// Tells the front door who holds the services held elsewhere, as the records say: a
    /// claim's holder, at the address its membership advertises.
    fn direct(&self, members: &[(String, Record)], claims: &[(String, Record)]) {
        if let Some(directory) = &self.directory {
            let ours = self.s.config.advertise;
            directory.publish(peers(members, claims, self.holder(), ours));
        }
    }
}

/// The other members than `ours` and where they are reached, from the live `members` (an
/// address like ours, `our_addr`, is a listener we share: no way to them), and who holds each
/// service they claim, from the `claims` (`service/NAME`, valued by holder). A claim of a
/// holder that is no member any more is left out: it is being handed over, or expiring.
fn peers(
    members: &[(String, Record)],
    claims: &[(String, Record)],
    ours: &str,
    our_addr: Option<SocketAddr>,
) -> Peers {
    let addrs: HashMap<&str, Option<SocketAddr>> = members
        .iter()
        .map(|(_, r)| (lease_value::holder(&r.value), &r.value))
        .filter(|(holder, _)| *holder != ours)
        .map(|(holder, value)| {
            let addr = lease_value::advertised(value).filter(|addr| Some(*addr) != our_addr);
            (holder, addr)
        })
        .collect();
    let mut peers = Peers {
        members: addrs.values().flatten().copied().collect(),
        ..Peers::default()
    };
    for (key, r) in claims {
        let Some(name) = key.strip_prefix(SERVICE_PREFIX) else {
            continue;
        };
        let holder = lease_value::holder(&r.value);
        if holder == ours {
            continue;
        }
        match addrs.get(holder) {
            Some(Some(addr)) => {
                let holder = holder.to_owned();
                let addr = *addr;
                peers.holders.insert(name.to_owned(), Peer { holder, addr });
            }
            Some(None) => {
                peers.unreachable.insert(name.to_owned());
            }
            // Its host has left (or died): the claim is about to be handed over (or to
            // expire), and a request waits for its next holder.
            None => {}
        }
    }
    peers
}

/// The value of our membership record `key` as it is now, if it is there and `holder`'s.
async fn our_value(
    store: &dyn Store,
    key: &str,
    holder: &str,
) -> Result<Option<String>, StoreError> {
    let record = store.get(key).await?;
    Ok(record
        .map(|r| r.value)
        .filter(|value| lease_value::holder(value) == holder))
}

/// The services of a list of differences, as [`Member::compare`] keeps it.
fn services(differences: &[(String, String)]) -> Vec<&str> {
    differences
        .iter()
        .map(|(service, _)| service.as_str())
        .collect()
}

/// Wakes the other hosts now rather than at their next renewal, so they see a new member
/// and hand over at once: a record written and deleted straight away is a release every
/// waiting host hears ([`crate::store::TtlStore::wait_released`]; its spurious wake-ups are
/// allowed, so nothing else minds). Best effort: failing that, they see it within `L/4`.
async fn announce(store: &dyn Store, holder: &str, lease: Duration) {
    let key = format!("{ANNOUNCE_PREFIX}{holder}");
    let announce = async {
        store.insert_if_absent(&key, holder, lease).await?;
        store.compare_and_delete(&key, holder).await
    };
    if let Ok(Err(e)) = tokio::time::timeout(attempt_patience(lease), announce).await {
        tracing::debug!(error = %e, "announcing the join failed; the others see it at their next renewal");
    }
}

/// The live membership and claim records, or `None` (logged) if the store failed.
async fn look(
    store: &dyn Store,
    lease: Duration,
) -> Option<(Vec<(String, Record)>, Vec<(String, Record)>)> {
    let look = async {
        let members = store.list(MEMBER_PREFIX).await?;
        let claims = store.list(SERVICE_PREFIX).await?;
        Ok::<_, StoreError>((members, claims))
    };
    match tokio::time::timeout(attempt_patience(lease), look).await {
        Ok(Ok(looked)) => Some(looked),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "looking at the claims failed; will retry");
            None
        }
        Err(_) => {
            tracing::warn!("looking at the claims timed out; will retry");
            None
        }
    }
}

/// `holder`'s fair share of `services` services, given the live `members` and the `claims`
/// (each claim's value is its holder).
fn share_of(
    services: usize,
    members: &[(String, Record)],
    claims: &[(String, Record)],
    holder: &str,
) -> usize {
    let mut held_by: HashMap<&str, usize> = HashMap::new();
    for (_, r) in claims {
        *held_by.entry(r.value.as_str()).or_default() += 1;
    }
    let counts: Vec<(String, usize)> = members
        .iter()
        .map(|(_, r)| {
            let holder = lease_value::holder(&r.value);
            (holder.to_owned(), held_by.get(holder).copied().unwrap_or(0))
        })
        .collect();
    crate::placement::fair_share(services, &counts, holder)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease_value::Inventory;

    fn record(value: &str) -> Record {
        Record {
            value: value.to_owned(),
            term: 1,
            time_left: Duration::from_secs(1),
            lives_at_least: Duration::from_secs(1),
        }
    }

    fn member(holder: &str, addr: Option<&str>) -> (String, Record) {
        let addr = addr.map(|a| a.parse().unwrap());
        let value = lease_value::candidate(holder, &Inventory::default(), addr);
        (format!("{MEMBER_PREFIX}{holder}"), record(&value))
    }

    fn claim(name: &str, holder: &str) -> (String, Record) {
        (format!("{SERVICE_PREFIX}{name}"), record(holder))
    }

    /// A claim is forwarded to its holder's advertised address; one of a member without an
    /// address, or with ours (a shared listener), cannot be; one of a host that is no member
    /// any more (leaving, or dead) is waited out; our own claims are not the peers'.
    #[test]
    fn the_directory_names_each_claim_s_holder_where_it_can_be_reached() {
        let members = [
            member("us", Some("10.0.0.1:8080")),
            member("b", Some("10.0.0.2:8080")),
            member("quiet", None),
            member("twin", Some("10.0.0.1:8080")),
        ];
        let claims = [
            claim("mine", "us"),
            claim("on-b", "b"),
            claim("on-quiet", "quiet"),
            claim("on-twin", "twin"),
            claim("on-gone", "gone"),
        ];
        let peers = peers(
            &members,
            &claims,
            "us",
            Some("10.0.0.1:8080".parse().unwrap()),
        );
        let b: SocketAddr = "10.0.0.2:8080".parse().unwrap();
        assert_eq!(
            peers.holders,
            [(
                "on-b".to_owned(),
                Peer {
                    holder: "b".to_owned(),
                    addr: b
                }
            )]
            .into()
        );
        assert_eq!(
            peers.unreachable,
            ["on-quiet".to_owned(), "on-twin".to_owned()].into()
        );
        assert_eq!(peers.members, [b].into());
    }
}
