//! Standing as a candidate (SPEC §4, **[departs]** in `elections`): a record under the
//! candidates prefix, rewritten every quarter of its life, to which a releasing holder may
//! hand its lease in its one write. An offer, never required: a store failure only leaves the
//! record to expire or be written at the next tick.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::Elections;
use crate::lease::{attempt_patience, release_patience, renew_every};
use crate::lease_value::{self, Inventory};

impl Elections {
    /// Stands as a candidate for the leases of other holders: a record `key` with our
    /// `holder` and the services we have loaded and refused (`loaded`,
    /// [`lease_value::candidate`]) that lives `ttl` and is rewritten every `ttl / 4`, and at
    /// once when `loaded` changes,
    /// which a releasing holder may hand its lease to (see [`Elections::adopt`]). Each store
    /// call waits at most as long as a renewal of a lease `lease` long would. It ends, and the
    /// record is deleted, when the returned [`Candidacy`] is withdrawn. A store failure only
    /// leaves the record to expire or be written at the next tick: standing is an offer,
    /// never required.
    pub fn stand(
        self: &Arc<Self>,
        key: &str,
        holder: &str,
        loaded: watch::Receiver<Inventory>,
        ttl: Duration,
        lease: Duration,
    ) -> Candidacy {
        let stop = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(self).keep_standing(
            key.to_owned(),
            holder.to_owned(),
            loaded,
            (ttl, lease),
            stop.clone(),
        ));
        Candidacy { stop, task }
    }

    async fn keep_standing(
        self: Arc<Self>,
        key: String,
        holder: String,
        mut loaded: watch::Receiver<Inventory>,
        (ttl, lease): (Duration, Duration),
        stop: CancellationToken,
    ) {
        // The value that stands (our last write that landed), and the last one tried.
        let mut written: Option<String> = None;
        let mut tried = holder.clone();
        loop {
            let value = lease_value::candidate(&holder, &loaded.borrow_and_update(), None);
            tried.clone_from(&value);
            let write = async {
                if let Some(old) = &written
                    && self.store.compare_and_swap(&key, old, &value, ttl).await?
                {
                    return Ok(true);
                }
                // Not yet written, expired, or taken by a handover: write it afresh.
                self.store
                    .insert_if_absent(&key, &value, ttl)
                    .await
                    .map(|t| t.is_some())
            };
            // Not cut short by the stop: a write dropped mid-way could land after the delete
            // below and leave the candidacy standing for a campaign that is over. It is
            // bounded by its timeout.
            match tokio::time::timeout(attempt_patience(lease), write).await {
                Ok(Ok(true)) => {
                    if written.is_none() {
                        tracing::debug!(key, "standing as a candidate");
                    }
                    written = Some(value);
                }
                Ok(Ok(false)) => written = None,
                Ok(Err(e)) => {
                    tracing::debug!(key, error = %e, "standing as a candidate failed");
                }
                Err(_) => tracing::debug!(key, "standing as a candidate timed out"),
            }
            if stop.is_cancelled() {
                break;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep(renew_every(ttl)) => {}
                // A double's set never changes (its sender is gone): no branch then.
                Ok(()) = loaded.changed() => {}
            }
        }
        // A write that timed out may still land after this delete; the record then expires
        // (on redb only after CANDIDACY_TTL), and no host of this process hands it a slot
        // meanwhile (`holder::can_take_over`). The value tried last stands if it landed,
        // else the one written before it.
        for value in std::iter::once(tried).chain(written) {
            let withdraw = self.store.compare_and_delete(&key, &value);
            match tokio::time::timeout(release_patience(lease), withdraw).await {
                // Not (or no longer) that value: try the one written before it.
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(key, error = %e, "withdrawing the candidacy failed; it will expire");
                    break;
                }
                Ok(Ok(true)) | Err(_) => break,
            }
        }
    }
}

/// A standing offer to take leases over ([`Elections::stand`]). Dropping it stops the offer
/// in the background; [`Candidacy::withdraw`] waits until its record is deleted.
pub struct Candidacy {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Candidacy {
    /// Stops standing and deletes the candidacy record (bounded by `L/4`).
    pub async fn withdraw(mut self) {
        self.stop.cancel();
        // Never panics on its own; an abort is not ours to report.
        let _ = (&mut self.task).await;
    }
}

impl Drop for Candidacy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::killer::Killer;
    use crate::lease_value::Versions;
    use crate::ops::Ops;
    use crate::store::{MemStore, TtlStore};

    /// The record of `key` once `ok` holds of its value (paused time runs the candidacy).
    async fn record_until(store: &MemStore, ok: impl Fn(&str) -> bool) -> crate::store::Record {
        for _ in 0..1000 {
            if let Some(record) = store.get("candidate/b").await.unwrap()
                && ok(&record.value)
            {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the candidacy never got there");
    }

    /// A candidacy lives its own `ttl` (an hour on redb, so that standbys write rarely), not
    /// the lease; it says which services its host has loaded, writes a change of them at once
    /// (not a quarter of an hour later), and the withdrawal deletes the value that stands.
    #[tokio::test(start_paused = true)]
    async fn a_candidacy_lives_its_ttl_and_follows_the_services_loaded() {
        let clock = ManualClock::default();
        let store = MemStore::new(Arc::new(clock.clone()));
        let elections = Elections::new(
            Arc::new(store.clone()),
            Arc::new(Killer::new(Arc::new(clock.clone()))),
            Arc::new(clock.clone()),
            Ops::new(Arc::new(clock.clone())),
        );
        let hello = |v: &str| Versions::from([("hello".to_owned(), v.to_owned())]);
        let loaded = |v: &str| Inventory {
            versions: hello(v),
            ..Inventory::default()
        };
        let (tx, rx) = watch::channel(loaded("0c9766887530"));
        let (ttl, lease) = (Duration::from_hours(1), Duration::from_secs(2));
        let candidacy = elections.stand("candidate/b", "b", rx, ttl, lease);
        let first = record_until(&store, |v| {
            lease_value::versions(v) == Some(hello("0c9766887530"))
        })
        .await;
        assert!(first.time_left > lease, "lives {:?}", first.time_left);
        assert_eq!(lease_value::holder(&first.value), "b");
        tx.send_replace(loaded("11def412bec5"));
        record_until(&store, |v| {
            lease_value::versions(v) == Some(hello("11def412bec5"))
        })
        .await;
        candidacy.withdraw().await;
        assert!(store.get("candidate/b").await.unwrap().is_none());
    }
}
