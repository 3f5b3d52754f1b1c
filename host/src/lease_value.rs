//! The value of a lease record (SPEC §4, §6, §8): the holder, and the services under the lease
//! with their state (running, backing off, stopped), restarts and last reason, so that
//! `vvm-host status` shows them without any write of its own.
//!
//! The leader writes the running services with the renewal it makes anyway (the same
//! compare-and-swap, now with a new value), so this costs no extra commit.
//!
//! Encoding, chosen so that old readers and old records keep working:
//!
//! ```text
//! value    = holder                         ; no service runs (and every older record)
//!          | holder "\n" services
//! services = JSON array of service
//! service  = [name, version, since]         ; running, never failed: as older records
//!          | [name, version, since, state, restarts, reason, until_ms]
//!          | [name, version, since, state, restarts, reason, until_ms, schedule]
//!          | [name, version, since, state, restarts, reason, until_ms, schedule, reuse]
//!          | [name, "", 0, "rejected", 0, reason, null]   ; its latest version was refused
//! ```
//!
//! A standby's candidacy record (SPEC §13, agreement) carries the services it has loaded in
//! the same form of value, so that a leader handing it the slot copies a value every reader
//! reads, and its services part, an object rather than an array, says that nothing runs yet;
//! a spread member's membership record carries the same:
//!
//! ```text
//! value    = holder | holder "\n" {"loaded": {name: version, ...}, "rejected": {name: reason, ...},
//!                                   "host": {"http": "IP:PORT"}}
//! ```
//!
//! `host.http` is the address the host's peers reach its HTTP listener at (`advertise-addr`),
//! for forwarding (SPEC §13).
//!
//! A `rejected` service ([`Inventory::rejected`]) is one whose latest file or registry source
//! the host refused (not a component, a failed pull, ...), with the reason; the version it
//! had before, if any, runs on and is listed as loaded. Readers from before rejections were
//! written skip such an entry (an unknown state) and ignore the `rejected` key.
//!
//! `since` is Unix seconds; `state` is `running`, `backing-off` or `stopped`; `reason` (or
//! `null`) is cut to [`MAX_REASON_CHARS`]; `until_ms` (or `null`) is when a service backing
//! off starts again, Unix milliseconds. `schedule`, for a scheduled service, is a JSON object
//! ([`ScheduleStatus`]): its schedule, its last fire time and outcome, and its next (`null`
//! for a service without one that has `reuse`). `reuse`, for an HTTP service, is its instance
//! reuse ([`ReuseStatus`]).
//!
//! e.g. `myhost/4242/18a3f0c2/0\n[["ticker","3fa1c09be2d4",1795467301]]`. A holder never
//! contains a newline ([`crate::holder::holder_value`] replaces control characters), so the first
//! newline ends it; JSON escapes any character a service name (a file stem) may contain.
//! Everything that compares values (compare-and-delete, the campaign's own-record check)
//! compares the whole value or the [`holder`] part, never a prefix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

/// The longest reason a record carries, in characters: a guest's 5 MB trap message is cut
/// here, so every renewal stays small (the log has the whole reason once).
pub const MAX_REASON_CHARS: usize = 200;

/// Where a service under a lease is now (SPEC §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceState {
    /// An instance runs (or is being instantiated).
    Running,
    /// It failed and is restarted at `until_ms` (Unix milliseconds).
    BackingOff {
        /// When the next start is due, Unix milliseconds.
        until_ms: u64,
    },
    /// Not running, and not restarted under this lease: it returned, or was handed over.
    Stopped,
}

impl ServiceState {
    /// The state's name in `status`, `/metrics` and the log: `running`, `backing-off`,
    /// `stopped`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::BackingOff { .. } => "backing-off",
            Self::Stopped => "stopped",
        }
    }
}

/// One service under a lease, as the record carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceStatus {
    /// The service's name (its file stem).
    pub name: String,
    /// Its version: the start of the SHA-256 of its file, in hex.
    pub version: String,
    /// When it started under this lease, Unix seconds.
    pub since: u64,
    /// Where it is now.
    pub state: ServiceState,
    /// How often it was restarted after a failure under this lease.
    pub restarts: u32,
    /// Why it last failed or stopped, cut to [`MAX_REASON_CHARS`]; `None` if it never did.
    pub reason: Option<String>,
    /// For a scheduled service, its schedule, last run and next fire time.
    pub schedule: Option<ScheduleStatus>,
    /// For an HTTP service, how its instances are reused.
    pub reuse: Option<ReuseStatus>,
}

/// How an HTTP service's instances are reused, as `status` shows it (SPEC §12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReuseStatus {
    /// `max-instance-reuse-count`.
    pub max_requests: u32,
    /// `max-instance-concurrent-reuse-count`.
    pub max_concurrent: u32,
    /// `idle-instance-timeout`, milliseconds.
    pub idle_ms: u64,
}

/// A scheduled service's schedule as `status` shows it (SPEC §11).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScheduleStatus {
    /// The cron expression.
    pub schedule: String,
    /// Its time zone.
    pub timezone: String,
    /// The last fire time looked at, and what became of it.
    #[serde(default)]
    pub last: Option<RunStatus>,
    /// The next fire time, Unix seconds.
    #[serde(default)]
    pub next: Option<i64>,
}

/// What became of one fire time.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunStatus {
    /// The fire time, Unix seconds.
    pub fire: i64,
    /// `ok`, `error`, `cut`, `skipped` or `missed`.
    pub outcome: String,
    /// For `error`, what went wrong (cut to [`MAX_REASON_CHARS`]); for `missed`, why.
    #[serde(default)]
    pub error: Option<String>,
    /// How long it ran, for a run that ended.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// The term it was run (or looked at) under.
    pub term: u64,
}

impl ServiceStatus {
    /// A service that runs, has never failed, and started at `since` (Unix seconds).
    pub fn running(name: &str, version: &str, since: u64) -> Self {
        Self {
            name: name.to_owned(),
            version: version.to_owned(),
            since,
            state: ServiceState::Running,
            restarts: 0,
            reason: None,
            schedule: None,
            reuse: None,
        }
    }
}

/// The value to write for `holder` with `services` under its lease, and the services whose
/// latest version it refused (`rejected`, after them).
pub fn encode(holder: &str, services: &[ServiceStatus], rejected: &Rejected) -> String {
    if services.is_empty() && rejected.is_empty() {
        return holder.to_owned();
    }
    let refused = rejected.iter().map(|(name, reason)| {
        let (name, reason) = (Value::from(name.as_str()), Value::from(cut(reason)));
        let fields = [name, "".into(), 0.into(), REJECTED.into(), 0.into(), reason];
        Value::Array(fields.into_iter().chain([Value::Null]).collect())
    });
    let list: Vec<Value> = services.iter().map(entry).chain(refused).collect();
    // Serializing strings and integers cannot fail.
    let json = serde_json::to_string(&list).unwrap_or_else(|_| "[]".to_owned());
    format!("{holder}\n{json}")
}

/// One service as a JSON array: `[name, version, since]` for a healthy running service (what
/// every older reader reads), else `[name, version, since, state, restarts, reason,
/// until_ms]` with `null` for an absent reason or deadline.
fn entry(s: &ServiceStatus) -> Value {
    let mut fields = vec![
        Value::from(s.name.as_str()),
        Value::from(s.version.as_str()),
        Value::from(s.since),
    ];
    if s.state != ServiceState::Running
        || s.restarts > 0
        || s.reason.is_some()
        || s.schedule.is_some()
        || s.reuse.is_some()
    {
        let until = match s.state {
            ServiceState::BackingOff { until_ms } => Value::from(until_ms),
            _ => Value::Null,
        };
        let reason = s
            .reason
            .as_deref()
            .map_or(Value::Null, |r| Value::from(cut(r)));
        fields.extend([
            Value::from(s.state.name()),
            Value::from(s.restarts),
            reason,
            until,
        ]);
        if s.schedule.is_some() || s.reuse.is_some() {
            let schedule = s.schedule.as_ref().map(serde_json::to_value);
            fields.push(schedule.and_then(Result::ok).unwrap_or(Value::Null));
        }
        if let Some(reuse) = &s.reuse {
            fields.push(serde_json::to_value(reuse).unwrap_or(Value::Null));
        }
    }
    Value::Array(fields)
}

/// `reason` cut to [`MAX_REASON_CHARS`], with an ellipsis where it was cut.
pub fn cut(reason: &str) -> String {
    match reason.char_indices().nth(MAX_REASON_CHARS) {
        Some((at, _)) => format!("{}…", &reason[..at]),
        None => reason.to_owned(),
    }
}

/// The version of each service a host has loaded, by name: the first 12 hex digits of the
/// SHA-256 of its component, as [`ServiceStatus::version`].
pub type Versions = BTreeMap<String, String>;

/// The services whose latest version a host refused, by name, with the reason.
pub type Rejected = BTreeMap<String, String>;

/// The state name of a refused service's entry in a lease's list.
const REJECTED: &str = "rejected";

/// The key of a candidacy's (or membership's) facts about its host: `{"http": "IP:PORT"}`, the
/// address it advertises. A map of strings, as `loaded` and `rejected` are, so that readers
/// from before it read the rest of the value as they did.
const HOST: &str = "host";

/// What a host's services directory and registry sources came to: what it would run if it
/// led, and publishes to the fleet (SPEC §13).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Every service loaded, with its version.
    pub versions: Versions,
    /// Every service whose latest version was refused, with why. The version before it, if
    /// any, is still loaded (and in `versions`).
    pub rejected: Rejected,
}

/// The value of a candidacy (or membership) record of `holder` with what it has `loaded`, and
/// the address its HTTP listener is reached at by the other hosts, if it `advertise`s one.
pub fn candidate(holder: &str, loaded: &Inventory, advertise: Option<SocketAddr>) -> String {
    let Inventory { versions, rejected } = loaded;
    if versions.is_empty() && rejected.is_empty() && advertise.is_none() {
        return holder.to_owned();
    }
    let mut json = serde_json::Map::new();
    if !(versions.is_empty() && rejected.is_empty()) {
        // Absent, the value says nothing of what the host loaded ([`versions`]).
        json.insert("loaded".to_owned(), serde_json::json!(versions));
    }
    if !rejected.is_empty() {
        let rejected: Rejected = rejected.iter().map(|(n, r)| (n.clone(), cut(r))).collect();
        json.insert(REJECTED.to_owned(), serde_json::json!(rejected));
    }
    if let Some(addr) = advertise {
        json.insert(
            HOST.to_owned(),
            serde_json::json!({ "http": addr.to_string() }),
        );
    }
    format!("{holder}\n{}", Value::Object(json))
}

/// The address a candidacy's or membership's value advertises for its host's HTTP listener,
/// if any (and if it reads as one).
pub fn advertised(value: &str) -> Option<SocketAddr> {
    let (_, json) = value.split_once('\n')?;
    let mut candidate = serde_json::from_str::<BTreeMap<String, Versions>>(json).ok()?;
    candidate.remove(HOST)?.get("http")?.parse().ok()
}

/// The services a record's value says its host has loaded, by name: a candidacy's loaded set,
/// or every service under a lease (whatever its state); `None` when the value says nothing of
/// them (a bare holder: an older record, a leader whose services have not started, a host
/// without any), or cannot be read.
pub fn versions(value: &str) -> Option<Versions> {
    let (_, json) = value.split_once('\n')?;
    if let Ok(candidate) = serde_json::from_str::<BTreeMap<String, Versions>>(json) {
        return candidate.get("loaded").cloned();
    }
    let list = serde_json::from_str::<Vec<Vec<Value>>>(json).ok()?;
    let services = list.iter().filter_map(|fields| parse(fields));
    Some(services.map(|s| (s.name, s.version)).collect())
}

/// The services a record's value says its host refused (a candidacy's, a membership's or a
/// lease's), with the reason; none when it says nothing of them.
pub fn rejected(value: &str) -> Rejected {
    let Some((_, json)) = value.split_once('\n') else {
        return Rejected::new();
    };
    if let Ok(mut candidate) = serde_json::from_str::<BTreeMap<String, Rejected>>(json) {
        return candidate.remove(REJECTED).unwrap_or_default();
    }
    let list = serde_json::from_str::<Vec<Vec<Value>>>(json).unwrap_or_default();
    let refused = list.iter().filter_map(|fields| {
        let [name, _, _, state, _, reason, ..] = fields.as_slice() else {
            return None;
        };
        let (name, reason) = (name.as_str()?, reason.as_str()?);
        (state.as_str()? == REJECTED).then(|| (name.to_owned(), reason.to_owned()))
    });
    refused.collect()
}

/// The holder part of a record's value.
pub fn holder(value: &str) -> &str {
    value.split_once('\n').map_or(value, |(holder, _)| holder)
}

/// The services a record's value carries: none for a value without any (an older record, a
/// leader whose services have not started), or one this version cannot read. A refused
/// service is not one of them ([`rejected`]).
pub fn services(value: &str) -> Vec<ServiceStatus> {
    let Some((_, json)) = value.split_once('\n') else {
        return Vec::new();
    };
    let Ok(list) = serde_json::from_str::<Vec<Vec<Value>>>(json) else {
        return Vec::new();
    };
    list.iter().filter_map(|fields| parse(fields)).collect()
}

/// One entry of [`entry`]'s form; `None` if it is not one.
fn parse(fields: &[Value]) -> Option<ServiceStatus> {
    let name = fields.first()?.as_str()?.to_owned();
    let version = fields.get(1)?.as_str()?.to_owned();
    let since = fields.get(2)?.as_u64()?;
    let mut status = ServiceStatus::running(&name, &version, since);
    if let Some(state) = fields.get(3) {
        status.state = match state.as_str()? {
            "running" => ServiceState::Running,
            "stopped" => ServiceState::Stopped,
            "backing-off" => ServiceState::BackingOff {
                until_ms: fields.get(6).and_then(Value::as_u64).unwrap_or(0),
            },
            _ => return None,
        };
        status.restarts = fields
            .get(4)
            .and_then(Value::as_u64)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        status.reason = fields.get(5).and_then(Value::as_str).map(str::to_owned);
        status.schedule = fields
            .get(7)
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        status.reuse = fields
            .get(8)
            .and_then(|v| serde_json::from_value(v.clone()).ok());
    }
    Some(status)
}

/// One service whose version on this host is not another host's (the leader's, or another
/// spread member's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The service's name.
    pub service: String,
    /// The other host's version, or `None` if it has no such service.
    pub theirs: Option<String>,
    /// Ours, or `None` if we have no such service.
    pub ours: Option<String>,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} there, {} here",
            self.service,
            sha(self.theirs.as_deref()),
            sha(self.ours.as_deref())
        )
    }
}

/// A version as operators see it: `sha256:` and the 12 hex digits the records carry, or
/// `none` for a service a host does not have.
pub fn sha(version: Option<&str>) -> String {
    version.map_or_else(|| "none".to_owned(), |v| format!("sha256:{v}…"))
}

/// The services whose version differs between `theirs` and `ours`, by name.
pub fn differences(theirs: &Versions, ours: &Versions) -> Vec<Difference> {
    let names: std::collections::BTreeSet<&String> = theirs.keys().chain(ours.keys()).collect();
    names
        .into_iter()
        .filter(|name| theirs.get(*name) != ours.get(*name))
        .map(|name| Difference {
            service: name.clone(),
            theirs: theirs.get(name).cloned(),
            ours: ours.get(name).cloned(),
        })
        .collect()
}

/// What one leadership's lease record says of the host's services ([`encode`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The services under the lease, in name order.
    pub services: Vec<ServiceStatus>,
    /// The services the host refused ([`Inventory::rejected`]).
    pub rejected: Rejected,
}

/// Where the services of one leadership say how each of them is, and the host which of its
/// services it refused; the lease's next renewal writes it into the record. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RunningReport(Arc<watch::Sender<Report>>);

impl RunningReport {
    /// A report and the receiver the renewal reads.
    pub fn new() -> (Self, watch::Receiver<Report>) {
        let (tx, rx) = watch::channel(Report::default());
        (Self(Arc::new(tx)), rx)
    }

    /// A report nobody reads (tests, tools).
    pub fn detached() -> Self {
        Self::new().0
    }

    /// Replaces the whole list of services.
    pub fn set(&self, services: Vec<ServiceStatus>) {
        self.0.send_if_modified(|now| {
            let changed = now.services != services;
            now.services = services;
            changed
        });
    }

    /// Replaces the services the host refused.
    pub fn set_rejected(&self, rejected: Rejected) {
        self.0.send_if_modified(|now| {
            let changed = now.rejected != rejected;
            now.rejected = rejected;
            changed
        });
    }

    /// Sets the status of the service `status.name`, adding it (in name order) if absent.
    pub fn update(&self, status: ServiceStatus) {
        self.0.send_if_modified(|now| {
            let now = &mut now.services;
            match now.binary_search_by(|s| s.name.cmp(&status.name)) {
                Ok(i) if now[i] == status => false,
                Ok(i) => {
                    now[i] = status;
                    true
                }
                Err(i) => {
                    now.insert(i, status);
                    true
                }
            }
        });
    }

    /// Removes the service `name`, if it is there.
    pub fn remove(&self, name: &str) {
        self.0.send_if_modified(|now| {
            let before = now.services.len();
            now.services.retain(|s| s.name != name);
            now.services.len() != before
        });
    }

    /// A receiver of every change from now on (tests wait on it).
    pub fn subscribe(&self) -> watch::Receiver<Report> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A candidacy's loaded set and a leader's services read back as the same kind of set; a
    /// candidacy's value carries no running service, and its holder part is the holder.
    #[test]
    fn a_candidacy_and_a_lease_say_which_versions_their_host_has_loaded() {
        let loaded = Versions::from([
            ("hello".to_owned(), "0c9766887530".to_owned()),
            ("ticker".to_owned(), "11def412bec5".to_owned()),
        ]);
        let value = candidate("b/2/ff", &only(&loaded), None);
        assert_eq!(holder(&value), "b/2/ff");
        assert_eq!(versions(&value), Some(loaded.clone()));
        assert!(services(&value).is_empty(), "nothing runs on a standby");
        assert_eq!(candidate("b/2/ff", &Inventory::default(), None), "b/2/ff");
        assert_eq!(versions("b/2/ff"), None);
        let mut ticker = svc("ticker", 1);
        ticker.version = "11def412bec5".into();
        ticker.state = ServiceState::Stopped;
        let mut hello = svc("hello", 1);
        hello.version = "0c9766887530".into();
        let lease = encode("a/1/ee", &[hello, ticker], &Rejected::new());
        assert_eq!(versions(&lease), Some(loaded));
        assert_eq!(versions("a/1/ee\nnot json"), None);
    }

    /// A member's advertised address rides beside what it loaded: read back whole, ignored by
    /// every reader of the rest (and of older values, which say none), and on its own when
    /// the host loaded nothing.
    #[test]
    fn a_membership_carries_its_advertised_address_and_older_readers_skip_it() {
        let addr: SocketAddr = "10.0.0.7:8080".parse().unwrap();
        let loaded = Versions::from([("hello".to_owned(), "0c9766887530".to_owned())]);
        let value = candidate("b/2/ff", &only(&loaded), Some(addr));
        assert_eq!(holder(&value), "b/2/ff");
        assert_eq!(advertised(&value), Some(addr));
        assert_eq!(versions(&value), Some(loaded.clone()));
        assert!(super::rejected(&value).is_empty());
        let older: BTreeMap<String, Versions> =
            serde_json::from_str(value.split_once('\n').unwrap().1).unwrap();
        assert_eq!(older["loaded"], loaded, "as an older reader reads it");
        let bare = candidate("b/2/ff", &Inventory::default(), Some(addr));
        assert_eq!(advertised(&bare), Some(addr));
        assert_eq!(versions(&bare), None, "it says nothing of what is loaded");
        assert_eq!(advertised(&candidate("b/2/ff", &only(&loaded), None)), None);
        assert_eq!(advertised("b/2/ff"), None);
        assert_eq!(
            advertised("b/2/ff\n{\"host\":{\"http\":\"nowhere\"}}"),
            None
        );
        let lease = encode("a/1/ee", &[svc("hello", 1)], &Rejected::new());
        assert_eq!(advertised(&lease), None);
    }

    fn svc(name: &str, since: u64) -> ServiceStatus {
        ServiceStatus::running(name, "0123456789ab", since)
    }

    fn only(versions: &Versions) -> Inventory {
        Inventory {
            versions: versions.clone(),
            rejected: Rejected::new(),
        }
    }

    /// A service only one side has, and one whose versions differ, are differences; the
    /// same version on both sides is none.
    #[test]
    fn differences_name_each_service_whose_version_is_not_the_same() {
        let set = |pairs: [(&str, &str); 2]| -> Versions {
            pairs.map(|(n, v)| (n.to_owned(), v.to_owned())).into()
        };
        let theirs = set([("hello", "0c9766887530"), ("gone", "aaaaaaaaaaaa")]);
        let ours = set([("hello", "11def412bec5"), ("new", "bbbbbbbbbbbb")]);
        let d = differences(&theirs, &ours);
        let names: Vec<&str> = d.iter().map(|d| d.service.as_str()).collect();
        assert_eq!(names, ["gone", "hello", "new"]);
        assert_eq!(
            d[1].to_string(),
            "hello: sha256:0c9766887530… there, sha256:11def412bec5… here"
        );
        assert_eq!(d[2].theirs, None);
        assert!(differences(&ours, &ours).is_empty());
    }

    /// A refused service rides in a candidacy's object and after a lease's services, with
    /// its reason cut; it is not among the services or the versions, and a reader of the
    /// older forms reads everything else as before.
    #[test]
    fn a_refused_service_is_told_beside_the_loaded_ones_and_older_readers_skip_it() {
        let long = format!(
            "services/bad.wasm: not a valid component: {}",
            "x".repeat(5000)
        );
        let rejected = Rejected::from([
            ("bad".to_owned(), long.clone()),
            (
                "pulled".to_owned(),
                "oci://r/p@sha256:00: 401 Unauthorized".to_owned(),
            ),
        ]);
        let cut_rejected: Rejected = rejected.iter().map(|(n, r)| (n.clone(), cut(r))).collect();
        let hello = Versions::from([("hello".to_owned(), "0c9766887530".to_owned())]);
        let loaded = Inventory {
            versions: hello.clone(),
            rejected: rejected.clone(),
        };
        let standby = candidate("b/2/ff", &loaded, None);
        assert_eq!(holder(&standby), "b/2/ff");
        assert_eq!(versions(&standby), Some(hello.clone()));
        assert_eq!(super::rejected(&standby), cut_rejected);
        assert!(standby.len() < 1024, "{} bytes", standby.len());
        let older: BTreeMap<String, Versions> =
            serde_json::from_str(standby.split_once('\n').unwrap().1).unwrap();
        assert_eq!(older["loaded"], hello, "as an older reader reads it");

        let mut running = svc("hello", 1);
        running.version = "0c9766887530".into();
        let lease = encode("a/1/ee", std::slice::from_ref(&running), &rejected);
        assert_eq!(
            services(&lease),
            vec![running],
            "a refused service runs nothing"
        );
        assert_eq!(versions(&lease), Some(hello));
        assert_eq!(super::rejected(&lease), cut_rejected);
        assert!(lease.len() < 1024, "{} bytes", lease.len());

        let only_refused = encode("a/1/ee", &[], &rejected);
        assert!(services(&only_refused).is_empty());
        assert_eq!(
            versions(&only_refused),
            Some(Versions::new()),
            "it says: nothing loaded"
        );
        assert_eq!(super::rejected(&only_refused), cut_rejected);
        assert!(super::rejected("a/1/ee").is_empty());
        assert!(super::rejected(&encode("a", &[svc("t", 5)], &Rejected::new())).is_empty());
    }

    /// A scheduled service's schedule, last run and next fire time come back as written; a
    /// reader of the seven-field form reads the rest of the entry as before.
    #[test]
    fn a_schedule_round_trips_beside_the_state() {
        let mut s = svc("report", 1_795_467_301);
        s.schedule = Some(ScheduleStatus {
            schedule: "0 */5 * * * *".into(),
            timezone: "Europe/Berlin".into(),
            last: Some(RunStatus {
                fire: 1_795_467_600,
                outcome: "error".into(),
                error: Some("exited with code 1".into()),
                duration_ms: Some(12),
                term: 3,
            }),
            next: Some(1_795_467_900),
        });
        let value = encode("h/1/ff/0", std::slice::from_ref(&s), &Rejected::new());
        assert_eq!(services(&value), vec![s.clone()]);
        let json = value.split_once('\n').unwrap().1;
        let list: Vec<Vec<Value>> = serde_json::from_str(json).unwrap();
        assert_eq!(list[0].len(), 8, "{json}");
        assert_eq!(list[0][3], "running");
    }

    /// An HTTP service's reuse comes back as written, after a `null` schedule; a reader of the
    /// eight-field form reads the rest as before.
    #[test]
    fn instance_reuse_round_trips_after_the_schedule() {
        let mut s = svc("hello", 1_795_467_301);
        s.reuse = Some(ReuseStatus {
            max_requests: 128,
            max_concurrent: 1,
            idle_ms: 1000,
        });
        let value = encode("h/1/ff/0", std::slice::from_ref(&s), &Rejected::new());
        assert_eq!(services(&value), vec![s.clone()]);
        let json = value.split_once('\n').unwrap().1;
        let list: Vec<Vec<Value>> = serde_json::from_str(json).unwrap();
        assert_eq!((list[0].len(), &list[0][7]), (9, &Value::Null), "{json}");
    }

    #[test]
    fn no_services_is_the_bare_holder_as_older_records_are() {
        assert_eq!(encode("h/1/ff/0", &[], &Rejected::new()), "h/1/ff/0");
        assert_eq!(holder("h/1/ff/0"), "h/1/ff/0");
        assert!(services("h/1/ff/0").is_empty());
    }

    #[test]
    fn services_round_trip_whatever_their_names() {
        let list = vec![
            svc("ticker", 1_795_467_301),
            svc("odd, name@\"with\"\nnewline [x]", 7),
        ];
        let value = encode("h/1/ff/0", &list, &Rejected::new());
        assert_eq!(holder(&value), "h/1/ff/0");
        assert_eq!(services(&value), list);
        assert_eq!(
            encode("h", &[svc("t", 5)], &Rejected::new()),
            "h\n[[\"t\",\"0123456789ab\",5]]",
            "the documented encoding"
        );
    }

    #[test]
    fn a_failing_service_carries_its_state_restarts_and_a_cut_reason() {
        let long = "x".repeat(5 << 20);
        let backing_off = ServiceStatus {
            state: ServiceState::BackingOff {
                until_ms: 1_795_467_301_500,
            },
            restarts: 3,
            reason: Some(long.clone()),
            ..svc("trap", 9)
        };
        let stopped = ServiceStatus {
            state: ServiceState::Stopped,
            reason: Some("returned".into()),
            ..svc("done", 9)
        };
        let value = encode(
            "h",
            &[backing_off.clone(), stopped.clone(), svc("ok", 9)],
            &Rejected::new(),
        );
        assert!(
            value.len() < 1024,
            "a 5 MB reason is cut: {} bytes",
            value.len()
        );
        let read = services(&value);
        assert_eq!(read[0].state, backing_off.state);
        assert_eq!(read[0].restarts, 3);
        let reason = read[0].reason.as_deref().unwrap();
        assert_eq!(reason.chars().count(), MAX_REASON_CHARS + 1);
        assert!(reason.ends_with('…'), "{reason}");
        assert_eq!(read[1], stopped);
        assert_eq!(read[2], svc("ok", 9));
        assert!(
            value.ends_with(",[\"ok\",\"0123456789ab\",9]]"),
            "a healthy service is written as older readers read it: {value}"
        );
    }

    #[test]
    fn reports_update_one_service_in_name_order() {
        let (report, rx) = RunningReport::new();
        report.update(svc("b", 1));
        report.update(svc("a", 1));
        let failed = ServiceStatus {
            restarts: 1,
            ..svc("b", 1)
        };
        report.update(failed.clone());
        assert_eq!(rx.borrow().services, vec![svc("a", 1), failed]);
        report.remove("a");
        report.remove("nothing");
        assert_eq!(rx.borrow().services.len(), 1);
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
        assert_eq!(rx.borrow().services, vec![svc("a", 1)]);
        let rejected = Rejected::from([("bad".to_owned(), "not a component".to_owned())]);
        report.set_rejected(rejected.clone());
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        report.set_rejected(rejected);
        assert!(!rx.has_changed().unwrap());
    }
}
