//! The value of a lease record (SPEC §4, §8): the holder, and the services running under the
//! lease, so that `vvm-host status` shows them without any write of its own.
//!
//! The leader writes the running services with the renewal it makes anyway (the same
//! compare-and-swap, now with a new value), so this costs no extra commit.
//!
//! Encoding, chosen so that old readers and old records keep working:
//!
//! ```text
//! value    = holder                         ; no service runs (and every older record)
//!          | holder "\n" services
//! services = JSON array of [name, version, since]   ; since: Unix seconds
//! ```
//!
//! e.g. `myhost/4242/18a3f0c2/0\n[["ticker","3fa1c09be2d4",1795467301]]`. A holder never
//! contains a newline ([`crate::vvm::holder_value`] replaces control characters), so the first
//! newline ends it; JSON escapes any character a service name (a file stem) may contain.
//! Everything that compares values (compare-and-delete, the campaign's own-record check)
//! compares the whole value or the [`holder`] part, never a prefix.

use std::sync::Arc;

use tokio::sync::watch;

/// One service running under a lease, as the record carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningService {
    /// The service's name (its file stem).
    pub name: String,
    /// Its version: the start of the SHA-256 of its file, in hex.
    pub version: String,
    /// When it started under this lease, Unix seconds.
    pub since: u64,
}

/// The value to write for `holder` with `services` running.
pub fn encode(holder: &str, services: &[RunningService]) -> String {
    if services.is_empty() {
        return holder.to_owned();
    }
    let list: Vec<(&str, &str, u64)> = services
        .iter()
        .map(|s| (s.name.as_str(), s.version.as_str(), s.since))
        .collect();
    // Serializing strings and integers cannot fail.
    let json = serde_json::to_string(&list).unwrap_or_else(|_| "[]".to_owned());
    format!("{holder}\n{json}")
}

/// The holder part of a record's value.
pub fn holder(value: &str) -> &str {
    value.split_once('\n').map_or(value, |(holder, _)| holder)
}

/// The running services a record's value carries: none for a value without any (an older
/// record, a leader whose services have not started), or one this version cannot read.
pub fn services(value: &str) -> Vec<RunningService> {
    let Some((_, json)) = value.split_once('\n') else {
        return Vec::new();
    };
    let Ok(list) = serde_json::from_str::<Vec<(String, String, u64)>>(json) else {
        return Vec::new();
    };
    list.into_iter()
        .map(|(name, version, since)| RunningService {
            name,
            version,
            since,
        })
        .collect()
}

/// Where the services of one leadership say which of them run; the lease's next renewal
/// writes it into the record. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RunningReport(Arc<watch::Sender<Vec<RunningService>>>);

impl RunningReport {
    /// A report and the receiver the renewal reads.
    pub fn new() -> (Self, watch::Receiver<Vec<RunningService>>) {
        let (tx, rx) = watch::channel(Vec::new());
        (Self(Arc::new(tx)), rx)
    }

    /// A report nobody reads (tests, tools).
    pub fn detached() -> Self {
        Self::new().0
    }

    /// Replaces the list of running services.
    pub fn set(&self, services: Vec<RunningService>) {
        self.0.send_if_modified(|now| {
            let changed = *now != services;
            *now = services;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, since: u64) -> RunningService {
        RunningService {
            name: name.into(),
            version: "0123456789ab".into(),
            since,
        }
    }

    #[test]
    fn no_services_is_the_bare_holder_as_older_records_are() {
        assert_eq!(encode("h/1/ff/0", &[]), "h/1/ff/0");
        assert_eq!(holder("h/1/ff/0"), "h/1/ff/0");
        assert!(services("h/1/ff/0").is_empty());
    }

    #[test]
    fn services_round_trip_whatever_their_names() {
        let list = vec![
            svc("ticker", 1_795_467_301),
            svc("odd, name@\"with\"\nnewline [x]", 7),
        ];
        let value = encode("h/1/ff/0", &list);
        assert_eq!(holder(&value), "h/1/ff/0");
        assert_eq!(services(&value), list);
        assert_eq!(
            encode("h", &[svc("t", 5)]),
            "h\n[[\"t\",\"0123456789ab\",5]]",
            "the documented encoding"
        );
    }

    #[test]
    fn an_unreadable_services_part_still_shows_the_holder() {
        assert_eq!(holder("h\n{not json"), "h");
        assert!(services("h\n{not json").is_empty());
    }

    #[test]
    fn a_report_changes_only_when_the_list_does() {
        let (report, mut rx) = RunningReport::new();
        report.set(vec![svc("a", 1)]);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        report.set(vec![svc("a", 1)]);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(*rx.borrow(), vec![svc("a", 1)]);
    }
}
