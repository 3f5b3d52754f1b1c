//! Agreement (SPEC §13): whether this host, standing by, would run the bits the leader runs.
//!
//! The leader's record carries the version of every service under its lease
//! ([`crate::lease_value`]); the campaign reads it anyway, each time it looks at a slot
//! another host holds. [`Agreement`] compares that with what this host has loaded (the
//! services' [`Versions`], which follow the services directory) and
//! - warns once per change of the difference (one line, every differing service in it), and
//!   says once when it is gone, with `vvm_service_differs_from_leader{service}` for each;
//! - when this host takes over, logs per service what differs from the set the previous term
//!   ran, so a takeover onto other bits is never silent;
//! - under `require-same-services`, keeps this host from campaigning (and `/healthz` at 503)
//!   while it differs from the last leader it saw, so a fleet that must never run other bits
//!   cannot. A host that has seen no leader campaigns: there is nothing to differ from.
//!
//! Only the campaign's task uses it; nothing here waits or writes.

use tokio::sync::watch;

use crate::lease_value::{self, Difference, Inventory, Versions, differences, sha};
use crate::ops::Ops;
use crate::store::{Record, Term};

/// The last leader's set this host saw, and what it made of it.
pub(super) struct Agreement {
    ours: watch::Receiver<Inventory>,
    require_same: bool,
    ops: Ops,
    /// The last leader seen: its holder, term and versions.
    leader: Option<(String, Term, Versions)>,
    /// The difference last said (warned, and in the metrics).
    said: Vec<Difference>,
}

impl Agreement {
    /// Compares `ours` with each leader seen; refuses to campaign while they differ if
    /// `require_same`. Reports to `ops`.
    pub(super) fn new(ours: watch::Receiver<Inventory>, require_same: bool, ops: Ops) -> Self {
        Self {
            ours,
            require_same,
            ops,
            leader: None,
            said: Vec::new(),
        }
    }

    /// The live `record` of a slot another host holds was read: if it says which services
    /// its holder runs, that is the leader's set from now on.
    pub(super) fn saw(&mut self, record: &Record) {
        if let Some(versions) = lease_value::versions(&record.value) {
            let holder = lease_value::holder(&record.value).to_owned();
            self.leader = Some((holder, record.term, versions));
        }
        self.check();
    }

    /// Compares our set with the last leader's, and says (log, metrics, health) what changed.
    pub(super) fn check(&mut self) {
        let Some((holder, term, theirs)) = &self.leader else {
            return;
        };
        let now = differences(theirs, &self.ours.borrow().versions);
        if now == self.said {
            return;
        }
        self.ops.services_differ(&names(&self.said), &names(&now));
        if now.is_empty() {
            tracing::info!(
                leader = holder,
                term,
                "this host's services are the leader's again"
            );
        } else {
            let list: Vec<String> = now.iter().map(ToString::to_string).collect();
            tracing::warn!(
                leader = holder,
                term,
                differences = list.join("; "),
                refusing = self.require_same,
                "this host's services differ from the leader's"
            );
        }
        self.said = now;
        // `/healthz` first, then the line: whoever reads the line finds `/healthz` saying so.
        let refusal = self.refusal();
        let was_refusing = self.ops.health().refusal().is_some();
        self.ops.health().refusing(refusal.clone());
        if refusal.is_some() != was_refusing {
            if let Some(reason) = &refusal {
                tracing::warn!(reason, "not campaigning (require-same-services)");
            } else if self.require_same {
                tracing::info!("campaigning again (require-same-services)");
            }
        }
    }

    /// Why this host must not campaign now, if it must not: `require-same-services`, and its
    /// services differ from the last leader's.
    pub(super) fn refusal(&self) -> Option<String> {
        if !self.require_same || self.said.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.said.iter().map(|d| d.service.as_str()).collect();
        Some(format!(
            "require-same-services is set and this host's services differ from the leader's ({})",
            names.join(", ")
        ))
    }

    /// This host took a slot over under `term`: logs, per service, what differs from the set
    /// the previous term ran (as last seen), and clears what a standby reports.
    pub(super) fn took_over(&mut self, term: Term) {
        if let Some((holder, previous, theirs)) = &self.leader {
            for d in differences(theirs, &self.ours.borrow().versions) {
                tracing::warn!(
                    service = d.service,
                    previous_term = previous,
                    previous_holder = holder,
                    term,
                    "{}: {} under term {previous}, {} now",
                    d.service,
                    sha(d.theirs.as_deref()),
                    sha(d.ours.as_deref()),
                );
            }
        }
        self.ops.services_differ(&names(&self.said), &[]);
        self.said.clear();
        self.ops.health().refusing(None);
    }
}

/// The services of `differences`.
fn names(differences: &[Difference]) -> Vec<&str> {
    differences.iter().map(|d| d.service.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;

    fn versions(pairs: &[(&str, &str)]) -> Versions {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn loaded(pairs: &[(&str, &str)]) -> Inventory {
        Inventory {
            versions: versions(pairs),
            ..Inventory::default()
        }
    }

    fn record(value: String, term: Term) -> Record {
        Record {
            value,
            term,
            time_left: std::time::Duration::from_secs(1),
            lives_at_least: std::time::Duration::from_secs(1),
        }
    }

    fn leader_with(v: &Versions) -> String {
        let services: Vec<_> = v
            .iter()
            .map(|(n, v)| lease_value::ServiceStatus::running(n, v, 1))
            .collect();
        lease_value::encode("a/1/ee", &services, &lease_value::Rejected::new())
    }

    /// Under `require-same-services` a standby refuses (and `/healthz` says why) while its
    /// set differs from the last leader's, and campaigns again once its own set is the
    /// leader's (a fixed file reloaded); without it, it never refuses. A record that says
    /// nothing of its services changes nothing.
    #[test]
    fn require_same_services_refuses_while_the_sets_differ_and_no_longer() {
        let ops = Ops::new(Arc::new(ManualClock::default()));
        let theirs = versions(&[("hello", "0c9766887530")]);
        let (tx, rx) = watch::channel(loaded(&[("hello", "11def412bec5")]));
        let mut agreement = Agreement::new(rx.clone(), true, ops.clone());
        assert_eq!(
            agreement.refusal(),
            None,
            "no leader seen: nothing to differ from"
        );
        agreement.saw(&record(leader_with(&theirs), 1));
        let reason = agreement.refusal().expect("refuses");
        assert!(reason.contains("hello"), "{reason}");
        assert_eq!(ops.health().refusal(), Some(reason));
        agreement.saw(&record("a/1/ee".to_owned(), 1));
        assert!(agreement.refusal().is_some(), "a bare holder says nothing");
        tx.send_replace(loaded(&[("hello", "0c9766887530")]));
        agreement.check();
        assert_eq!(agreement.refusal(), None);
        assert_eq!(ops.health().refusal(), None);

        let mut lenient = Agreement::new(rx, false, ops.clone());
        tx.send_replace(loaded(&[("hello", "11def412bec5")]));
        lenient.saw(&record(leader_with(&theirs), 1));
        assert_eq!(lenient.refusal(), None);
        assert_eq!(ops.health().refusal(), None);
        lenient.took_over(2);
    }
}
