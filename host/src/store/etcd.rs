//! etcd backend (SPEC §3): lease records are etcd keys bound to etcd leases, so the cluster,
//! not the caller, keeps the time.
//!
//! Keys under the configured prefix `P`:
//! - `P lease/<key>`: a lease record. Its value is the holder value; it is attached to an etcd
//!   lease of its own, so etcd deletes it when the lease runs out. Its term is the key's create
//!   revision: etcd revisions are global and only grow, so a later insert always gets a larger
//!   term, also after deletes and expiry.
//! - `P term/<key>`: written only by a handover ([`TtlStore::hand_over`]), with no lease and
//!   never deleted. A put keeps a key's create revision, and etcd refuses a delete and a put
//!   of one key in one transaction, so a handover records the term it issues as this key's
//!   mod revision (its own revision). A record's term is the larger of its create revision
//!   and this mod revision: a later insert creates the record anew, past both.
//! - `P kv/<space>/<key>`: the guests' fenced key-value space (no lease). `/` and `%` in a
//!   space name are percent-escaped, so spaces cannot overlap.
//! - `P kvusage/<space>`: a namespace's usage, `"<keys> <bytes>"`, kept by every fenced write
//!   (see `etcd/kv.rs`).
//!
//! Time, as etcd counts it:
//! - etcd leases last whole seconds: a TTL is rounded *up* to whole seconds, at least 1 s.
//!   The cluster may raise it further to its own minimum (1.5 × its election timeout, rounded
//!   up: 2 s with etcd's defaults); the store logs a warning once when that happens. A record
//!   therefore never expires earlier than asked, only later.
//! - The etcd leader sweeps expired leases about every 500 ms, so a record may still read as
//!   live for a moment after its TTL. Until the sweep deletes it, etcd treats it as present.
//! - etcd reports a lease's remaining time in whole seconds, truncated; [`TtlStore::get`]
//!   reports that plus one second, capped at the granted TTL: an upper bound on time left.

mod batch;
mod kv;
mod options;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, KvClient, LeaseClient,
    LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use tonic::Code;

pub use options::{EtcdOptions, EtcdTls, EtcdUrlError};

use super::{Candidates, HandOver, Record, StoreError, Term, TtlStore};
use crate::lease_value;

/// The store contract on an etcd cluster. Cheap to share behind an `Arc`; every call is one
/// or a few requests, each bounded by [`EtcdOptions::request_timeout`].
pub struct EtcdStore {
    client: Client,
    prefix: String,
    /// Comma-separated endpoints, named in every error.
    endpoints: String,
    request_timeout: Duration,
    /// The newest store revision any response showed; [`TtlStore::wait_released`] watches
    /// from just after it, so a delete between a `get` and the wait is not missed.
    seen_revision: AtomicI64,
    /// Whether the cluster raising a TTL has been logged already.
    warned_ttl: AtomicBool,
    /// The etcd lease our last successful write put each record on: a swap must find the
    /// record still on it, not only with the expected value (see `compare_and_swap`).
    written_on: Mutex<HashMap<String, i64>>,
    /// The etcd leases this handle granted, each with the moment before its grant was asked
    /// for and the TTL etcd granted (seconds): such a lease surely lives until then + TTL
    /// (etcd starts counting later, and only ever extends a lease), so [`TtlStore::get`] of a
    /// record on one needs no lease read. A host taking over a record handed to it onto its
    /// own candidacy lease saves that request. Entries go when revoked or run out.
    granted: Mutex<HashMap<i64, (tokio::time::Instant, i64)>>,
    /// The candidates read ahead of a handover ([`TtlStore::prepare_hand_over`]): their
    /// prefix, when the read began, and what it found.
    prepared: Mutex<Option<(String, tokio::time::Instant, Vec<etcd_client::KeyValue>)>>,
    /// The records that the releases ending the last wait handed over, by name, as the watch
    /// saw them ([`TtlStore::handed`]); each one's mod revision is its term.
    handed: Mutex<HashMap<String, etcd_client::KeyValue>>,
    /// What this handle knows of the key-value keys and leases its batches wrote and read
    /// (`batch.rs`), so that most batches are one request.
    known: Mutex<batch::KnownKeys>,
    /// Held by the batch of key-value writes under way: this handle applies one at a time.
    batching: tokio::sync::Mutex<()>,
}

/// How long candidates read ahead of a handover may stand in for a read at the handover.
const PREPARED_FOR: Duration = Duration::from_secs(1);

/// The cluster did not answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
struct NoAnswer(Duration);

/// A record that vvm-host did not write (no lease, or not UTF-8).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ForeignRecord(&'static str);

impl EtcdStore {
    /// Connects to the cluster and checks that it answers (and accepts the credentials).
    ///
    /// Fails with a transient error if no endpoint answers within the connect and request
    /// timeouts, and with a permanent one for bad credentials, TLS files or options.
    ///
    /// # Errors
    /// As above: [`StoreError::Transient`] or [`StoreError::Permanent`].
    pub async fn connect(options: EtcdOptions) -> Result<Self, StoreError> {
        let endpoints = options.endpoint_list();
        let context = format!("etcd {endpoints}: connecting");
        if options.endpoints.is_empty() {
            return Err(StoreError::permanent(context, "no endpoints given"));
        }
        let connect_options = options.connect_options()?;
        // With credentials, connecting already authenticates: a request that may hang too.
        let within = options.connect_timeout + options.request_timeout;
        let client = tokio::time::timeout(
            within,
            Client::connect(&options.endpoints, Some(connect_options)),
        )
        .await
        .map_err(|_| StoreError::transient(&context, NoAnswer(within)))?
        .map_err(|e| classify(&context, e))?;
        let store = Self {
            client,
            prefix: options.prefix,
            endpoints,
            request_timeout: options.request_timeout,
            seen_revision: AtomicI64::new(0),
            warned_ttl: AtomicBool::new(false),
            written_on: Mutex::default(),
            granted: Mutex::default(),
            prepared: Mutex::default(),
            handed: Mutex::default(),
            known: Mutex::default(),
            batching: tokio::sync::Mutex::new(()),
        };
        // Prove the cluster answers now rather than at the first campaign.
        let probe = GetOptions::new().with_prefix().with_count_only();
        let prefix = store.prefix.clone();
        let probed = store
            .call("connecting", "", || {
                let (mut kv, prefix, probe) = (store.kv(), prefix.clone(), probe.clone());
                async move { kv.get(prefix, Some(probe)).await }
            })
            .await?;
        store.saw(probed.header());
        tracing::info!(endpoints = %store.endpoints, prefix = %store.prefix, "connected to etcd");
        Ok(store)
    }

    fn kv(&self) -> KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(kv::MAX_RESPONSE_BYTES)
    }

    fn leases(&self) -> LeaseClient {
        self.client.lease_client()
    }

    fn record_key(&self, key: &str) -> String {
        format!("{}lease/{key}", self.prefix)
    }

    fn term_key(&self, key: &str) -> String {
        format!("{}term/{key}", self.prefix)
    }

    /// Runs one request within the request timeout and maps its error.
    ///
    /// A member that cannot be reached (killed, cut off) fails a request at once, and the
    /// client's balancer may pick it again: such a request is sent again, to whichever member
    /// the balancer picks, until the timeout. One dead member of three then costs nothing.
    async fn call<T, F>(
        &self,
        op: &str,
        key: &str,
        mut request: impl FnMut() -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let context = || match key {
            "" => format!("etcd {}: {op}", self.endpoints),
            key => format!("etcd {}: {op} {key:?}", self.endpoints),
        };
        let deadline = crate::clock::tokio_after(tokio::time::Instant::now(), self.request_timeout);
        loop {
            match tokio::time::timeout_at(deadline, request()).await {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(e)) if member_unreachable(&e) && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(op, key, error = %e, "etcd member unreachable; trying again");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Ok(Err(e)) => return Err(classify(&context(), e)),
                Err(_) => {
                    return Err(StoreError::transient(
                        context(),
                        NoAnswer(self.request_timeout),
                    ));
                }
            }
        }
    }

    /// Remembers the revision a response header carries.
    fn saw(&self, header: Option<&etcd_client::ResponseHeader>) {
        if let Some(h) = header {
            self.seen_revision
                .fetch_max(h.revision(), Ordering::Relaxed);
        }
    }

    /// Grants a fresh etcd lease for `ttl` (rounded up to whole seconds).
    async fn grant(&self, op: &str, key: &str, ttl: Duration) -> Result<i64, StoreError> {
        let seconds = lease_seconds(ttl);
        let asked = tokio::time::Instant::now();
        let granted = self
            .call(op, key, || {
                let mut leases = self.leases();
                async move { leases.grant(seconds, None).await }
            })
            .await?;
        self.saw(granted.header());
        if granted.ttl() > seconds && !self.warned_ttl.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                endpoints = %self.endpoints,
                asked_s = seconds,
                granted_s = granted.ttl(),
                "etcd raised the lease TTL to its minimum; records live longer than asked"
            );
        }
        let mut ours = self.granted.lock().unwrap_or_else(PoisonError::into_inner);
        ours.retain(|_, (at, secs)| at.elapsed() < secs_duration(*secs));
        ours.insert(granted.id(), (asked, granted.ttl()));
        Ok(granted.id())
    }

    /// Whole seconds surely left of `lease` if this handle granted it (see
    /// [`EtcdStore::granted`]), with its granted TTL.
    fn granted_left(&self, lease: i64) -> Option<(i64, i64)> {
        let ours = self.granted.lock().unwrap_or_else(PoisonError::into_inner);
        let (asked, secs) = ours.get(&lease)?;
        let left = secs_duration(*secs).checked_sub(asked.elapsed())?;
        Some((i64::try_from(left.as_secs()).ok()?, *secs))
    }

    /// Revokes a lease that holds nothing (any more); failures only leave it to run out.
    /// A `get` of `key`, owning what it needs (so [`Self::call`] can send it again).
    fn get_request(
        &self,
        key: String,
    ) -> impl Future<Output = Result<etcd_client::GetResponse, etcd_client::Error>> + use<> {
        let mut kv = self.kv();
        async move { kv.get(key, None).await }
    }

    fn written_on(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        // Single inserts and removals: a poisoned map is still consistent.
        self.written_on
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease the record under `key` is on: the one our last write used, or (for a record
    /// this handle has not written) the one etcd reports. `None` if there is no record. Taken
    /// out of the map: only a swap that is answered puts its lease back, so after one that
    /// errored, timed out or was dropped (and may land all the same) the next one reads.
    async fn current_lease(&self, op: &str, key: &str) -> Result<Option<i64>, StoreError> {
        if let Some(lease) = self.written_on().remove(key) {
            return Ok(Some(lease));
        }
        let mut response = self
            .call(op, key, || self.get_request(self.record_key(key)))
            .await?;
        self.saw(response.header());
        Ok(response
            .take_kvs()
            .first()
            .map(etcd_client::KeyValue::lease))
    }

    /// The swap of `compare_and_swap`, built for `lease`: the record must still hold
    /// `expected` *and* still be on `current`, so that a transaction delayed past a later,
    /// retried swap finds the record moved on and does nothing.
    fn swap_txn(&self, key: &str, expected: &str, new: &str, current: i64, lease: i64) -> Txn {
        let record = self.record_key(key);
        let put = PutOptions::new().with_lease(lease).with_prev_key();
        Txn::new()
            .when([
                Compare::value(record.as_str(), CompareOp::Equal, expected),
                Compare::lease(record.as_str(), CompareOp::Equal, current),
            ])
            .and_then([TxnOp::put(record, new, Some(put))])
    }

    /// Every key-value under the record prefix + `prefix`.
    async fn range(
        &self,
        op: &str,
        prefix: &str,
    ) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
        self.under(op, prefix, self.record_key(prefix), GetOptions::new())
            .await
    }

    /// Every handover term key under the term prefix + `prefix`.
    async fn terms(&self, prefix: &str) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
        self.under("list", prefix, self.term_key(prefix), GetOptions::new())
            .await
    }

    /// Every key-value whose key starts with `from`, read with `options`.
    async fn under(
        &self,
        op: &str,
        prefix: &str,
        from: String,
        options: GetOptions,
    ) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
        let options = options.with_prefix();
        let mut response = self
            .call(op, prefix, || {
                let (mut kv, from, options) = (self.kv(), from.clone(), options.clone());
                async move { kv.get(from, Some(options)).await }
            })
            .await?;
        self.saw(response.header());
        Ok(response.take_kvs())
    }

    /// The candidacy records under `prefix`. A serializable read, answered by the member at
    /// hand without a round to the cluster's leader: a stale answer costs nothing, since a
    /// handover's transaction checks that the candidacy it picked is unchanged.
    async fn candidates(&self, prefix: &str) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
        let from = self.record_key(prefix);
        let serializable = GetOptions::new().with_serializable();
        self.under("hand_over", prefix, from, serializable).await
    }

    /// The candidates under `prefix` read ahead of this handover, if that read is recent
    /// ([`PREPARED_FOR`]); used once.
    fn prepared_candidates(&self, prefix: &str) -> Option<Vec<etcd_client::KeyValue>> {
        let prepared = self
            .prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        let (of, asked, listed) = prepared;
        (of == prefix && asked.elapsed() < PREPARED_FOR).then_some(listed)
    }

    /// Hands `key`, if it holds `expected`, to the freshest eligible candidacy of `listed`
    /// (the largest mod revision) in one transaction that also checks that candidacy is
    /// unchanged. `None` if `listed` has no such candidacy or the transaction did not apply.
    async fn hand_over_from(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        listed: Vec<etcd_client::KeyValue>,
    ) -> Result<Option<HandOver>, StoreError> {
        let Some(candidate) = listed
            .into_iter()
            .filter(|kv| kv.lease() != 0 && kv.value_str().is_ok_and(|v| (candidates.eligible)(v)))
            .max_by_key(etcd_client::KeyValue::mod_revision)
        else {
            return Ok(None);
        };
        let to = candidate.value_str().unwrap_or_default().to_owned();
        let record = self.record_key(key);
        let on_its_lease = PutOptions::new()
            .with_lease(candidate.lease())
            .with_prev_key();
        let txn = Txn::new()
            .when([
                Compare::value(record.as_str(), CompareOp::Equal, expected),
                Compare::mod_revision(candidate.key(), CompareOp::Equal, candidate.mod_revision()),
            ])
            .and_then([
                TxnOp::put(record, to.as_str(), Some(on_its_lease)),
                TxnOp::put(self.term_key(key), "", None),
                TxnOp::delete(candidate.key(), None),
            ]);
        let response = self.txn("hand_over", key, txn).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        // The transaction's own revision: the term key's mod revision.
        let term = response
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        self.written_on().remove(key);
        tracing::debug!(key, to, term, "etcd record handed over");
        self.revoke_if_empty(previous_lease(&response)).await;
        Ok(Some(HandOver::To {
            to,
            term: u64::try_from(term).unwrap_or(0),
        }))
    }

    /// The record key of an etcd key under the record prefix, if it is one and UTF-8.
    fn record_name(&self, kv: &etcd_client::KeyValue) -> Option<String> {
        let full = kv.key_str().ok()?;
        full.strip_prefix(&self.record_key("")).map(str::to_owned)
    }

    /// Revokes `lease` if no record is attached to it any more.
    async fn revoke_if_empty(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        let attached = self
            .call("revoke", "", || {
                let mut leases = self.leases();
                let options = LeaseTimeToLiveOptions::new().with_keys();
                async move { leases.time_to_live(lease, Some(options)).await }
            })
            .await;
        match attached {
            Ok(ttl) if ttl.keys().is_empty() => self.revoke_quietly(lease).await,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(lease, error = %e, "could not read an etcd lease; it will run out");
            }
        }
    }

    async fn revoke_quietly(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        self.granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&lease);
        let revoke = self
            .call("revoke", "", || {
                let mut leases = self.leases();
                async move { leases.revoke(lease).await }
            })
            .await;
        if let Err(e) = revoke {
            tracing::debug!(lease, error = %e, "could not revoke an unused etcd lease; it will run out");
        }
    }

    /// Runs a transaction; on an error its outcome is unknown, so the lease it would attach
    /// is left to run out by itself rather than revoked (revoking could delete a record the
    /// transaction did write).
    async fn txn(&self, op: &str, key: &str, txn: Txn) -> Result<TxnResponse, StoreError> {
        let response = self
            .call(op, key, || {
                let (mut kv, txn) = (self.kv(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        self.saw(response.header());
        Ok(response)
    }

    /// One read of the record: its key-value, term and lease time left, `None` if it is gone.
    async fn read(
        &self,
        key: &str,
    ) -> Result<Option<(etcd_client::KeyValue, i64, i64, i64)>, StoreError> {
        // The record and its handover term in one read-only transaction (no raft write).
        let (record, terms) = (self.record_key(key), self.term_key(key));
        let response = self
            .call("get", key, || {
                let (mut kv, record, terms) = (self.kv(), record.clone(), terms.clone());
                let txn = Txn::new().and_then([TxnOp::get(record, None), TxnOp::get(terms, None)]);
                async move { kv.txn(txn).await }
            })
            .await?;
        self.saw(response.header());
        let mut got = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        });
        let (Some(kv), handed) = (got.next().flatten(), got.next().flatten()) else {
            return Ok(None);
        };
        if kv.lease() == 0 {
            return Err(StoreError::permanent(
                format!("etcd {}: get {key:?}", self.endpoints),
                ForeignRecord("the record has no lease: it was not written by vvm-host"),
            ));
        }
        let term = term_of(&kv, handed.as_ref());
        if let Some((left, granted)) = self.granted_left(kv.lease()) {
            return Ok(Some((kv, term, left, granted)));
        }
        let ttl = self
            .call("get", key, || {
                let (mut leases, id) = (self.leases(), kv.lease());
                async move { leases.time_to_live(id, None).await }
            })
            .await?;
        Ok(Some((kv, term, ttl.ttl(), ttl.granted_ttl())))
    }
}

#[async_trait]
impl TtlStore for EtcdStore {
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError> {
        const OP: &str = "insert_if_absent";
        let record = self.record_key(key);
        let lease = self.grant(OP, key, ttl).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                record.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                record,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let response = self.txn(OP, key, txn).await?;
        if !response.succeeded() {
            self.revoke_quietly(lease).await;
            return Ok(None);
        }
        // The put created the key in this transaction, so its create revision is the
        // transaction's revision.
        let term = response
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        self.written_on().insert(key.to_owned(), lease);
        tracing::debug!(key, value, term, lease, "etcd record inserted");
        Ok(Some(u64::try_from(term).unwrap_or(0)))
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        const OP: &str = "compare_and_swap";
        let Some(current) = self.current_lease(OP, key).await? else {
            return Ok(false);
        };
        // A fresh lease, not a keep-alive: a keep-alive would restore the *old* TTL and could
        // not be made conditional on the value in the same transaction.
        let lease = self.grant(OP, key, ttl).await?;
        let txn = self.swap_txn(key, expected, new, current, lease);
        let response = self.txn(OP, key, txn).await?;
        if !response.succeeded() {
            self.revoke_quietly(lease).await;
            return Ok(false);
        }
        self.written_on().insert(key.to_owned(), lease);
        // The key moved to the new lease; the old one holds nothing now.
        self.revoke_quietly(previous_lease(&response)).await;
        Ok(true)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError> {
        const OP: &str = "compare_and_delete";
        let record = self.record_key(key);
        let txn = Txn::new()
            .when([Compare::value(record.as_str(), CompareOp::Equal, expected)])
            .and_then([TxnOp::delete(
                record,
                Some(DeleteOptions::new().with_prev_key()),
            )]);
        let response = self.txn(OP, key, txn).await?;
        if response.succeeded() {
            self.written_on().remove(key);
            tracing::debug!(key, value = expected, "etcd record deleted");
            // Spread placement keeps a host's records on one lease (`renew_all`): the
            // others still need it.
            self.revoke_if_empty(previous_lease(&response)).await;
        }
        Ok(response.succeeded())
    }

    /// Two requests: a read of the candidates, then one transaction that moves the record
    /// onto the freshest candidate's own etcd lease (the one it renews its candidacy with),
    /// records the new term (`P term/<key>`), and deletes the candidacy, if the record still
    /// has `expected` and the candidacy is unchanged since the read. If the candidacy moved on
    /// meanwhile (renewed, expired), the record is deleted instead.
    async fn hand_over(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        _ttl: Duration,
    ) -> Result<HandOver, StoreError> {
        // Candidates read ahead, while the caller stopped its services, if that read is
        // recent; then, if that view finds no candidate or has gone stale (its transaction
        // fails), a fresh read; then the delete.
        if let Some(listed) = self.prepared_candidates(&candidates.prefix)
            && let Some(handed) = self
                .hand_over_from(key, expected, candidates, listed)
                .await?
        {
            return Ok(handed);
        }
        let listed = self.candidates(&candidates.prefix).await?;
        if let Some(handed) = self
            .hand_over_from(key, expected, candidates, listed)
            .await?
        {
            return Ok(handed);
        }
        Ok(HandOver::deleted_if(
            self.compare_and_delete(key, expected).await?,
        ))
    }

    async fn prepare_hand_over(&self, candidates: &Candidates) {
        let asked = tokio::time::Instant::now();
        match self.candidates(&candidates.prefix).await {
            Ok(listed) => {
                *self.prepared.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((candidates.prefix.clone(), asked, listed));
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the candidates ahead of a handover failed");
            }
        }
    }

    fn handed(&self, key: &str) -> Option<Record> {
        let kv = self
            .handed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)?;
        let (left, granted) = self.granted_left(kv.lease())?;
        Some(record(
            kv.value_str().ok()?,
            kv.mod_revision(),
            left,
            granted,
        ))
    }

    fn candidacy_ttl(&self, lease: Duration) -> Duration {
        lease
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        // A swap between reading the key and asking for its lease revokes the lease we ask
        // about; read once more before calling the record gone.
        for _ in 0..2 {
            let Some((kv, term, left, granted)) = self.read(key).await? else {
                return Ok(None);
            };
            if left < 0 {
                continue;
            }
            let value = kv.value_str().map_err(|_| {
                StoreError::permanent(
                    format!("etcd {}: get {key:?}", self.endpoints),
                    ForeignRecord("the record's value is not UTF-8"),
                )
            })?;
            return Ok(Some(record(value, term, left, granted)));
        }
        Ok(None)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError> {
        let mut listed = Vec::new();
        // One lease read per distinct lease: a spread host keeps all its records on one.
        let mut left: HashMap<i64, Option<(i64, i64)>> = HashMap::new();
        let handed: HashMap<Vec<u8>, etcd_client::KeyValue> = self
            .terms(prefix)
            .await?
            .into_iter()
            .map(|kv| (kv.key().to_vec(), kv))
            .collect();
        for kv in self.range("list", prefix).await? {
            let Some(key) = self.record_name(&kv) else {
                continue;
            };
            let term = term_of(&kv, handed.get(self.term_key(&key).as_bytes()));
            let lease = kv.lease();
            let known = if let Some(known) = left.get(&lease) {
                *known
            } else {
                let ttl = self
                    .call("list", &key, || {
                        let mut leases = self.leases();
                        async move { leases.time_to_live(lease, None).await }
                    })
                    .await?;
                let known = (ttl.ttl() >= 0).then(|| (ttl.ttl(), ttl.granted_ttl()));
                left.insert(lease, known);
                known
            };
            let (Some((ttl, granted)), Ok(value)) = (known, kv.value_str()) else {
                continue;
            };
            listed.push((key, record(value, term, ttl, granted)));
        }
        Ok(listed)
    }

    /// All of the holder's records move onto one fresh etcd lease in one transaction: one
    /// nested transaction per record, each putting it back with the value it was read with
    /// on the new lease, only if it still has that value *and* the lease it was read on (a
    /// record rewritten since the read is not renewed; a delayed renewal that lands after a
    /// later one finds the record moved on and does nothing, as in `compare_and_swap`).
    /// The leases the records left are revoked once empty. So a host's claims and membership
    /// share one etcd lease, renewed together. (etcd allows 128 operations per transaction
    /// by default (`--max-txn-ops`): a host holding more records than that fails to renew.)
    async fn renew_all(
        &self,
        prefixes: &[&str],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<(String, Term)>, StoreError> {
        const OP: &str = "renew_all";
        let mut ours = Vec::new();
        for prefix in prefixes {
            for kv in self.range(OP, prefix).await? {
                if kv
                    .value_str()
                    .is_ok_and(|value| lease_value::holder(value) == holder)
                    && let Some(key) = self.record_name(&kv)
                {
                    ours.push((key, kv.value().to_vec(), kv.lease(), kv.create_revision()));
                }
            }
        }
        if ours.is_empty() {
            return Ok(Vec::new());
        }
        let lease = self.grant(OP, holder, ttl).await?;
        let moves: Vec<TxnOp> = ours
            .iter()
            .map(|(key, value, old, _)| {
                let record = self.record_key(key);
                TxnOp::txn(
                    Txn::new()
                        .when([
                            Compare::value(record.as_str(), CompareOp::Equal, value.as_slice()),
                            Compare::lease(record.as_str(), CompareOp::Equal, *old),
                        ])
                        .and_then([TxnOp::put(
                            record,
                            value.as_slice(),
                            Some(PutOptions::new().with_lease(lease)),
                        )]),
                )
            })
            .collect();
        let response = self.txn(OP, holder, Txn::new().and_then(moves)).await?;
        let mut renewed = Vec::new();
        let mut left_behind = std::collections::BTreeSet::new();
        for ((key, _, old, term), op) in ours.into_iter().zip(response.op_responses()) {
            if let TxnOpResponse::Txn(nested) = op
                && nested.succeeded()
            {
                renewed.push((key, u64::try_from(term).unwrap_or(0)));
                left_behind.insert(old);
            }
        }
        if renewed.is_empty() {
            self.revoke_quietly(lease).await;
        }
        for old in left_behind {
            self.revoke_if_empty(old).await;
        }
        renewed.sort();
        Ok(renewed)
    }

    async fn wait_released(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.watch_deletes()).await;
    }
}

impl EtcdStore {
    /// Remembers, for [`TtlStore::handed`], each record put in the revision of a delete among
    /// `events`: a handover's transaction puts the record (on the candidate's lease) and its
    /// term key, and deletes the candidacy, all at one revision, which is the record's term.
    /// No other transaction puts a record and deletes one.
    fn remember_handovers(&self, events: &[etcd_client::Event]) {
        let deleted_at: Vec<i64> = events
            .iter()
            .filter(|e| e.event_type() == EventType::Delete)
            .filter_map(|e| e.kv().map(etcd_client::KeyValue::mod_revision))
            .collect();
        let mut handed = self.handed.lock().unwrap_or_else(PoisonError::into_inner);
        handed.clear();
        for kv in events
            .iter()
            .filter(|e| e.event_type() == EventType::Put)
            .filter_map(etcd_client::Event::kv)
            .filter(|kv| deleted_at.contains(&kv.mod_revision()))
        {
            if let Some(name) = self.record_name(kv) {
                handed.insert(name, kv.clone());
            }
        }
    }

    /// Returns at the first delete of a record (release or expiry) after the newest revision
    /// this store has seen, remembering what a handover put in that revision
    /// ([`EtcdStore::remember_handovers`]). If no watch can be set up, returns after a second
    /// (a spurious wake-up) so the caller looks again without spinning.
    async fn watch_deletes(&self) {
        let pause = || tokio::time::sleep(Duration::from_secs(1));
        let from = self.seen_revision.load(Ordering::Relaxed) + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let key = self.record_key("");
        let watch = || {
            let (mut watcher, key, options) =
                (self.client.watch_client(), key.clone(), options.clone());
            async move { watcher.watch(key, Some(options)).await }
        };
        let mut stream = match self.call("watch", &key, watch).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "etcd watch failed; waking after a pause");
                return pause().await;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) if response.canceled() => return,
                Ok(Some(response)) => {
                    let events = response.events();
                    if events.iter().any(|e| e.event_type() == EventType::Delete) {
                        self.remember_handovers(events);
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "etcd watch broke; waking after a pause");
                    return pause().await;
                }
            }
        }
    }
}

/// A record with `value` and `term` on a lease with `left` whole seconds left of `granted`
/// (etcd's figures): its time left between the two bounds below.
fn record(value: &str, term: i64, left: i64, granted: i64) -> Record {
    Record {
        value: value.to_owned(),
        term: u64::try_from(term).unwrap_or(0),
        time_left: upper_bound(left, granted),
        lives_at_least: lower_bound(left),
    }
}

/// `secs` etcd lease seconds as a duration (none if negative).
fn secs_duration(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// etcd lease seconds for `ttl`: rounded up, at least one.
fn lease_seconds(ttl: Duration) -> i64 {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

/// An upper bound on a lease's time left, from etcd's whole seconds left (truncated): one
/// second more, capped at the granted TTL.
fn upper_bound(left: i64, granted: i64) -> Duration {
    Duration::from_secs(u64::try_from((left + 1).min(granted)).unwrap_or(0))
}

/// A lower bound on a lease's time left: etcd's whole seconds, truncated.
fn lower_bound(left: i64) -> Duration {
    Duration::from_secs(u64::try_from(left).unwrap_or(0))
}

/// A record's term: its create revision, or the term a handover issued it since (the mod
/// revision of its term key, when that is the later one).
fn term_of(record: &etcd_client::KeyValue, handed: Option<&etcd_client::KeyValue>) -> i64 {
    handed
        .map_or(0, etcd_client::KeyValue::mod_revision)
        .max(record.create_revision())
}

/// The lease of the key-value a put or delete in a successful transaction replaced.
fn previous_lease(response: &TxnResponse) -> i64 {
    response
        .op_responses()
        .iter()
        .find_map(|op| match op {
            TxnOpResponse::Put(put) => put.prev_key().map(etcd_client::KeyValue::lease),
            TxnOpResponse::Delete(delete) => {
                delete.prev_kvs().first().map(etcd_client::KeyValue::lease)
            }
            _ => None,
        })
        .unwrap_or(0)
}

/// Sorts an etcd-client error into transient or permanent.
///
/// Permanent: what retrying cannot fix (bad credentials, missing permission, invalid
/// arguments or options, auth not enabled). Everything else (unreachable endpoints, broken
/// connections, timeouts, no leader or quorum, too many requests) is worth retrying.
/// True if the request failed because the member it went to could not be reached: sent
/// again, it may reach another.
fn member_unreachable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => status.code() == Code::Unavailable,
        _ => false,
    }
}

fn classify(context: &str, e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    let transient = match &e {
        E::GRpcStatus(status) => !matches!(
            status.code(),
            Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::Unimplemented
                | Code::FailedPrecondition
                | Code::OutOfRange
        ),
        E::TransportError(_)
        | E::IoError(_)
        | E::WatchError(_)
        | E::LeaseKeepAliveError(_)
        | E::Internal(_) => true,
        _ => false,
    };
    if transient {
        StoreError::transient(context, e)
    } else {
        StoreError::permanent(context, e)
    }
}
