//! The campaign (SPEC §5 step 1): try every slot each round until one is held, the
//! acquisition timeout passes or the shutdown begins; take over a slot handed to this host or
//! left by a holder that is gone; between rounds, sleep until the earliest record can expire,
//! waking early on a release.

use std::time::Duration;

use tokio::time::Instant;

use super::agreement::Agreement;
use super::{Launcher, Vvm};
use crate::clock::Timestamp;
use crate::elections::{ElectionError, Leadership};
use crate::holder::crash_lock::DeadHolders;
use crate::keys::slot_key;
use crate::lease::{renew_every, retry_pause};
use crate::lease_value;
use crate::problem::Problem;
use crate::store::Record;

impl Launcher {
    /// Deletes the record with `value` at `key`, whose holder's process is gone (its crash
    /// lock is free). By the exact value only (fencing, SPEC §4): a record rewritten since by
    /// anyone else stays. Whether it was deleted, or `None` if the store call failed.
    pub(super) async fn delete_dead_holder(
        &self,
        key: &str,
        value: &str,
        dead: &mut DeadHolders,
    ) -> Option<bool> {
        let holder = lease_value::holder(value);
        let delete = self.vvm.store.compare_and_delete(key, value);
        match self
            .within_quarter_lease("compare_and_delete", key, delete)
            .await
        {
            Ok(deleted) => {
                tracing::info!(
                    key,
                    holder,
                    deleted,
                    "deleting the record of a holder that is gone"
                );
                dead.forget(holder);
                Some(deleted)
            }
            Err(e) => {
                tracing::warn!(key, holder, error = %e,
                    "deleting the record of a holder that is gone failed");
                None
            }
        }
    }

    /// Takes over the slot `key` if its record names us (a handover), with no write: as the
    /// release that woke us left it, if the store saw that ([`crate::store::TtlStore::handed`]),
    /// else read.
    pub(super) async fn take_over_if_ours(
        &self,
        key: &str,
    ) -> Result<Option<Leadership>, ElectionError> {
        let Vvm { config, store, .. } = &self.vvm;
        let read_start = self.vvm.clock.now();
        let record = match store.handed(key) {
            Some(record) => Ok(Some(record)),
            None => self.within_quarter_lease("get", key, store.get(key)).await,
        };
        match record {
            Ok(Some(record)) if lease_value::holder(&record.value) == config.holder => {
                self.adopt(key, &record, read_start).await
            }
            _ => Ok(None),
        }
    }

    /// Takes over `record`, read from `key` from `read_start` on, which names us.
    pub(super) async fn adopt(
        &self,
        key: &str,
        record: &Record,
        read_start: Timestamp,
    ) -> Result<Option<Leadership>, ElectionError> {
        let Vvm { config, .. } = &self.vvm;
        let adopt = self
            .elections
            .adopt(key, &config.holder, record, read_start, config.lease);
        adopt.await
    }

    /// Tries every slot each round until one is acquired, shutdown begins (`Ok(None)`), or
    /// the acquisition timeout passes. Between rounds it sleeps until the earliest record can
    /// expire, waking early when the store reports a release. Each leader's record it reads
    /// goes to `agreement`, which may keep it from acquiring (`require-same-services`).
    pub(super) async fn campaign(
        &self,
        agreement: &mut Agreement,
    ) -> Result<Option<(u32, Leadership)>, Problem> {
        let Vvm { config, store, .. } = &self.vvm;
        let give_up_at = crate::clock::tokio_after(Instant::now(), config.acquisition_timeout);
        tracing::info!(
            slots = config.cluster_size,
            holder = config.holder,
            "campaigning"
        );
        let mut dead = DeadHolders::new(self.vvm.holder_locks.clone());
        // Slots held by another host at the last look, where a handover may reach us, and
        // whether a release, or a holder's exit, woke us since.
        let mut held_by_others = std::collections::HashSet::new();
        let mut may_be_handed = false;
        'round: loop {
            let mut wait = give_up_at.saturating_duration_since(Instant::now());
            // Listen for releases *before* looking at the slots: a release between our look
            // and our sleep would otherwise be missed, and we would sleep until its expiry.
            let released = store.wait_released(wait);
            tokio::pin!(released);
            let released_already = tokio::select! {
                biased;
                () = &mut released => true,
                () = std::future::ready(()) => false,
            };
            let mut seen_live = false;
            let handed_to_us = std::mem::take(&mut held_by_others);
            // Our services may have changed since the last round (a reload).
            agreement.check();
            for slot in 1..=config.cluster_size {
                if self.shutdown.is_cancelled() {
                    return Ok(None);
                }
                let key = slot_key(slot);
                // Held by another at our last look and released since (or its holder is gone):
                // it may have been handed to us.
                let handed = (may_be_handed || released_already) && handed_to_us.contains(&slot);
                match self
                    .try_slot(slot, &key, handed, &mut dead, agreement)
                    .await?
                {
                    SlotLook::Ours(leadership) => {
                        agreement.took_over(leadership.term());
                        return Ok(Some((slot, leadership)));
                    }
                    SlotLook::Stop => return Ok(None),
                    SlotLook::Again => continue 'round,
                    SlotLook::Soon(within) => wait = wait.min(within),
                    SlotLook::Held(left) => {
                        seen_live = true;
                        held_by_others.insert(slot);
                        wait = wait.min(left);
                    }
                }
            }
            if Instant::now() >= give_up_at {
                return Err(Problem::AcquisitionTimeout {
                    slots: config.cluster_size,
                    timeout: config.acquisition_timeout,
                });
            }
            if !seen_live || released_already {
                // Released between our insert and our read, or a store that cannot wait and
                // answered at once: try again soon, but never spin.
                wait = wait.max(Duration::from_millis(1));
            }
            // A release during the round has already completed `released`: look again at once.
            self.vvm.ops.health().step_due_in(wait, config.lease);
            may_be_handed = false;
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                () = &mut released, if !released_already => may_be_handed = true,
                () = tokio::time::sleep(wait) => {}
                // Its process is gone: look again at once. A holder that shut down in order
                // released first, and lets go of its lock right after, often before we hear of
                // the release: as after a release, look for a handover to us, then insert
                // (a record deleted, the insert wins; a crashed holder's, the round deletes it).
                () = dead.next() => may_be_handed = true,
            }
        }
    }

    /// One slot's turn in a round: a read if it may have been `handed` to us (which tells
    /// without the write an insert attempt is), else (or if not) an insert, and if that finds
    /// the slot taken, a look at who holds it. While `agreement` refuses, only the look.
    ///
    /// # Errors
    /// A store error that retrying cannot fix.
    async fn try_slot(
        &self,
        slot: u32,
        key: &str,
        handed: bool,
        dead: &mut DeadHolders,
        agreement: &mut Agreement,
    ) -> Result<SlotLook, Problem> {
        let config = &self.vvm.config;
        if agreement.refusal().is_some() {
            return Ok(self.look_at_taken(slot, key, dead, agreement).await);
        }
        if handed {
            match self.take_over_if_ours(key).await {
                Ok(Some(leadership)) => return Ok(SlotLook::Ours(leadership)),
                Ok(None) => {}
                Err(_) => return Ok(SlotLook::Stop),
            }
        }
        // No store call may hold the campaign up for ever: past L/4 it counts as a transient
        // failure (the insert, if it lands, is ours and is retaken or cleaned up; see
        // `look_at_taken`).
        let attempt = self.elections.acquire(key, &config.holder, config.lease);
        match self.within_quarter_lease("acquire", key, attempt).await {
            Ok(Some(leadership)) => return Ok(SlotLook::Ours(leadership)),
            Ok(None) => {}
            Err(ElectionError::CleanedUp) => return Ok(SlotLook::Stop),
            Err(ElectionError::Store(e)) if e.is_transient() => {
                tracing::warn!(slot, error = %e, "acquire failed, will retry");
                return Ok(SlotLook::Soon(retry_pause(config.lease)));
            }
            Err(ElectionError::Store(e)) => return Err(e.into()),
        }
        Ok(self.look_at_taken(slot, key, dead, agreement).await)
    }

    /// Reads slot `key`, which our insert found taken (or which we only look at while
    /// `agreement` refuses), and says what the campaign does about it.
    async fn look_at_taken(
        &self,
        slot: u32,
        key: &str,
        dead: &mut DeadHolders,
        agreement: &mut Agreement,
    ) -> SlotLook {
        let Vvm { config, store, .. } = &self.vvm;
        let read_start = self.vvm.clock.now();
        let refusing = agreement.refusal().is_some();
        match self.within_quarter_lease("get", key, store.get(key)).await {
            // Handed to us while we refuse (the leader read our candidacy before we refused):
            // give it straight back, by its exact value, for another host to take.
            Ok(Some(record)) if refusing && lease_value::holder(&record.value) == config.holder => {
                tracing::warn!(
                    slot,
                    "handed a slot while refusing to campaign; giving it back"
                );
                let give_back = store.compare_and_delete(key, &record.value);
                if let Err(e) = self
                    .within_quarter_lease("compare_and_delete", key, give_back)
                    .await
                {
                    tracing::warn!(slot, error = %e, "giving the slot back failed; it will expire");
                }
                SlotLook::Soon(renew_every(config.lease))
            }
            // A record with our holder value (unique per campaign) is ours: a leader handed it
            // to us as it released it, or an earlier insert of ours failed (a timeout, an
            // error) yet was applied. Take it over as it stands.
            Ok(Some(record)) if lease_value::holder(&record.value) == config.holder => {
                match self.adopt(key, &record, read_start).await {
                    Ok(Some(leadership)) => SlotLook::Ours(leadership),
                    // Too little time left: it was deleted; the slot is free.
                    Ok(None) => SlotLook::Soon(Duration::ZERO),
                    // Adopting fails only once the elections are cleaned up.
                    Err(_) => SlotLook::Stop,
                }
            }
            // The crash lock is named by the holder; the record's value may also carry its
            // services (`lease_value`), and is deleted whole.
            Ok(Some(record)) if dead.is_gone(lease_value::holder(&record.value)) => {
                match self.delete_dead_holder(key, &record.value, dead).await {
                    // Progress, not a spin: the slot may be free now.
                    Some(true) => SlotLook::Again,
                    // Rewritten meanwhile: look again soon.
                    Some(false) => SlotLook::Soon(Duration::ZERO),
                    None => SlotLook::Soon(retry_pause(config.lease)),
                }
            }
            Ok(Some(record)) => {
                dead.watch(key, lease_value::holder(&record.value));
                agreement.saw(&record);
                SlotLook::Held(record.time_left)
            }
            // Free, but we refuse: look again in a while (or sooner, at a release).
            Ok(None) if refusing => SlotLook::Soon(renew_every(config.lease)),
            Ok(None) => SlotLook::Soon(Duration::ZERO),
            Err(e) => {
                tracing::warn!(slot, error = %e, "reading the lease failed");
                SlotLook::Soon(retry_pause(config.lease))
            }
        }
    }
}

/// What a look at a slot that our insert found taken tells the campaign.
enum SlotLook {
    /// The record is ours: lead on it.
    Ours(Leadership),
    /// The elections are cleaned up: stop campaigning.
    Stop,
    /// A gone holder's record was deleted: begin the round again at once.
    Again,
    /// Look again within this long (zero: at once).
    Soon(Duration),
    /// Held by another live host, whose record can expire within this long.
    Held(Duration),
}
