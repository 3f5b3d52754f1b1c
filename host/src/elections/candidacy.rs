//! Standing as a candidate (SPEC §4, **[departs]** in `elections`): a record under the
//! candidates prefix, rewritten every quarter of its life, to which a releasing holder may
//! hand its lease in its one write. An offer, never required: a store failure only leaves the
//! record to expire or be written at the next tick.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::Elections;
use crate::lease::{attempt_patience, release_patience, renew_every};

impl Elections {
    /// Stands as a candidate for the leases of other holders: a record `key` with our
    /// `holder` value that lives `ttl` and is rewritten every `ttl / 4`, which a releasing
    /// holder may hand its lease to (see [`Elections::adopt`]). Each store call waits at most
    /// as long as a renewal of a lease `lease` long would. It ends, and the record is deleted,
    /// when the returned [`Candidacy`] is withdrawn. A store failure only leaves the record to
    /// expire or be written at the next tick: standing is an offer, never required.
    pub fn stand(
        self: &Arc<Self>,
        key: &str,
        holder: &str,
        ttl: Duration,
        lease: Duration,
    ) -> Candidacy {
        let stop = CancellationToken::new();
        let task = tokio::spawn(Arc::clone(self).keep_standing(
            key.to_owned(),
            holder.to_owned(),
            (ttl, lease),
            stop.clone(),
        ));
        Candidacy { stop, task }
    }

    async fn keep_standing(
        self: Arc<Self>,
        key: String,
        holder: String,
        (ttl, lease): (Duration, Duration),
        stop: CancellationToken,
    ) {
        let mut written = false;
        loop {
            let write = async {
                if written
                    && self
                        .store
                        .compare_and_swap(&key, &holder, &holder, lease)
                        .await?
                {
                    return Ok(true);
                }
                // Not yet written, expired, or taken by a handover: write it afresh.
                self.store
                    .insert_if_absent(&key, &holder, lease)
                    .await
                    .map(|t| t.is_some())
            };
            // Not cut short by the stop: a write dropped mid-way could land after the delete
            // below and leave the candidacy standing for a campaign that is over. It is
            // bounded by its timeout.
            match tokio::time::timeout(attempt_patience(lease), write).await {
                Ok(Ok(true)) => {
                    if !written {
                        tracing::debug!(key, "standing as a candidate");
                    }
                    written = true;
                }
                Ok(Ok(false)) => written = false,
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
            }
        }
        // A write that timed out may still land after this delete; the record then expires
        // (on redb only after CANDIDACY_TTL), and no host of this process hands it a slot
        // meanwhile (`holder::can_take_over`).
        let withdraw = self.store.compare_and_delete(&key, &holder);
        if let Ok(Err(e)) = tokio::time::timeout(release_patience(lease), withdraw).await {
            tracing::debug!(key, error = %e, "withdrawing the candidacy failed; it will expire");
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
