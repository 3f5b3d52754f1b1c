//! `vvm-host check DIR` (SPEC §8): which services of a directory would load, which files
//! would not and why, and what to change, the way rustc's `help:` lines say it: the world to
//! target, the import to drop or build against this host's WIT, the grant a service lacks for
//! what it imports.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::component::{LoadError, LoadErrorKind, ServiceKind, service_name};
use super::config::Grants;
use super::wasm_services::WasmServices;
use super::{RuntimeConfig, RuntimeError};
use crate::interfaces::InstanceReuse;
use crate::interfaces::{spin, stubs};
use crate::ops::Ops;
use crate::sources::SourceRef;
use wasmtime_wasi_http::handler::ProxyPre;

/// What `vvm-host check DIR` reports: the services that load, the files that do not, and
/// what the services that load still lack.
#[derive(Debug)]
pub struct CheckReport {
    /// Services that would run: name and world.
    pub services: Vec<(String, ServiceKind)>,
    /// Files that would be rejected, with the reason.
    pub errors: Vec<LoadError>,
    /// What services that load lack to work as their imports suggest.
    pub notes: Vec<Note>,
}

impl CheckReport {
    /// True if every file would load.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Something a service that loads lacks: what, and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The service.
    pub service: String,
    /// What it lacks.
    pub note: String,
    /// What to change.
    pub help: String,
}

/// Validates every component of `config.services_dir`, or only `file` if given: it parses
/// and compiles, targets a supported world, and imports only what the host provides; and
/// whether each service has the grants its imports need. Fills the compile cache.
///
/// # Errors
/// As [`WasmServices::load`]; [`RuntimeError::NotAService`] for a `file` that no services
/// directory would take for a service.
pub fn check(config: RuntimeConfig, file: Option<PathBuf>) -> Result<CheckReport, RuntimeError> {
    let grants = config.grants.clone();
    let host_reuse = config.incoming_http.instance_reuse;
    let sharing = sharing_note(&config);
    let sources = config.sources.clone();
    // Nothing runs, so nothing is counted: the loads' series go to a set nobody reads.
    let unread = Ops::new(Arc::new(crate::clock::SystemClock::local()));
    let (services, errors) = match file {
        Some(path) if service_name(&path).is_none() => {
            return Err(RuntimeError::NotAService { path });
        }
        Some(path) => {
            // One file: the registry sources are not what was asked about.
            let config = RuntimeConfig {
                sources: BTreeMap::new(),
                ..config
            };
            WasmServices::load_files(config, unread, &CancellationToken::new(), vec![path])?
        }
        None => WasmServices::load(config, unread)?,
    };
    let notes = services
        .loaded()
        .iter()
        .flat_map(|svc| {
            let mut notes = grant_notes(&svc.name, &svc.imports, &grants);
            notes.extend(unrun_note(&svc.name, svc.kind(), &svc.exports));
            notes.extend(outbound_note(&svc.name, &svc.imports));
            let scheduled = grants.get(&svc.name).is_some_and(|g| g.schedule.is_some());
            notes.extend(schedule_note(&svc.name, svc.kind(), scheduled));
            notes.extend(wasi3_note(&svc.name, &svc.imports));
            notes.extend(unpinned_note(
                &svc.name,
                sources.get(&svc.name),
                svc.source.as_ref(),
            ));
            if matches!(svc.handler, Some(ProxyPre::P2(_))) {
                let own = grants.get(&svc.name).map(|g| g.instance_reuse);
                let reuse = InstanceReuse::p2(own.unwrap_or_default().over(host_reuse));
                notes.extend(reuse_note(&svc.name, reuse));
            }
            if svc.serves_http()
                && let Some((note, help)) = &sharing
            {
                notes.push(Note {
                    service: svc.name.clone(),
                    note: note.clone(),
                    help: help.clone(),
                });
            }
            notes
        })
        .collect();
    Ok(CheckReport {
        services: services.services(),
        errors,
        notes,
    })
}

/// Why `http-addr`'s socket would not be shared with the other hosts of this machine, and
/// what to change (SPEC §10: a stopped leader must keep nothing from its successor); `None`
/// when it would be, or when there is no `http-addr`.
fn sharing_note(config: &RuntimeConfig) -> Option<(String, String)> {
    let addr = config.incoming_http.addr?;
    let Some(dir) = &config.http_share_dir else {
        return Some((
            format!(
                "http-addr {addr} is not shared with the other hosts of this machine: there is \
                 no crash lock directory (an etcd store has none by default), so a stopped \
                 leader keeps the address from its successor"
            ),
            "set `lock-dir` to a local directory that every host of this machine uses, or \
                 start the hosts from a systemd socket unit (docs/http.md)"
                .to_owned(),
        ));
    };
    let others = crate::interfaces::incoming::other_addresses(dir, addr);
    (!others.is_empty()).then(|| {
        (
            format!(
                "other hosts of this machine and store serve http-addr {} and this one \
                 {addr}: they do not share a socket",
                others.join(", ")
            ),
            "give every host of one store on one machine the same http-addr".to_owned(),
        )
    })
}

/// What service `name`, importing `imports`, lacks of its grants in `all`.
fn grant_notes(name: &str, imports: &[String], all: &HashMap<String, Grants>) -> Vec<Note> {
    let grants = all.get(name);
    let imports_any = |prefix: &str| imports.iter().any(|i| i.starts_with(prefix));
    let mut notes = Vec::new();
    let network = grants.is_some_and(|g| g.network);
    if !network
        && (imports_any("wasi:sockets/tcp-create-socket")
            || imports_any("wasi:sockets/udp-create-socket")
            || imports_any("wasi:sockets/ip-name-lookup"))
    {
        notes.push(Note {
            service: name.to_owned(),
            note: "it imports wasi:sockets, but is not granted the network: its sockets and \
                   name lookups are refused"
                .to_owned(),
            help: format!("add `network = true` to [service.{name}] in vvm.toml"),
        });
    }
    let http = grants.is_some_and(|g| !g.http.denies_all());
    if !http && imports_any("wasi:http/outgoing-handler") {
        notes.push(Note {
            service: name.to_owned(),
            note: "it imports wasi:http/outgoing-handler, but no origin is granted: every \
                   request it makes is denied"
                .to_owned(),
            help: format!(
                "add the origins it may call to [service.{name}] in vvm.toml, e.g. \
                 `http = [\"https://api.example.com\"]`"
            ),
        });
    }
    notes
}

/// Whether service `name`, of `kind` and exporting `exports`, has a `wasi:cli/run` that is
/// never called: an HTTP service is only served (see `component::classify`).
fn unrun_note(name: &str, kind: ServiceKind, exports: &[String]) -> Option<Note> {
    let has_run = exports.iter().any(|e| e.starts_with("wasi:cli/run@"));
    (matches!(kind, ServiceKind::Http | ServiceKind::Http3) && has_run).then(|| Note {
        service: name.to_owned(),
        note: "it exports wasi:cli/run beside its HTTP handler: it is served request by \
               request, and its run is never called (as wasmtime serve does)"
            .to_owned(),
        help: "for code that runs for as long as the service does, beside the handler, \
               export `run` of the vvm:host service world instead (docs/http.md)"
            .to_owned(),
    })
}

/// Whether the instances of WASI 0.2 HTTP service `name`, reused as `reuse` says, keep state
/// from one request to the next (SPEC §12): a component written for a fresh instance per
/// request may not expect it.
fn reuse_note(name: &str, reuse: InstanceReuse) -> Option<Note> {
    (reuse.max_requests > 1).then(|| Note {
        service: name.to_owned(),
        note: format!(
            "its instances serve up to {} requests each (max-instance-reuse-count): it keeps \
             state between requests, its globals from one request to the next",
            reuse.max_requests
        ),
        help: format!(
            "keep no request's state in globals, or set `max-instance-reuse-count = 1` in \
             [service.{name}] (docs/http.md)"
        ),
    })
}

/// Whether service `name`, of `kind`, is run as its `schedule` (or lack of one) says: only a
/// command or Spin's cron world runs per fire time, and Spin's cron world only so.
fn schedule_note(name: &str, kind: ServiceKind, scheduled: bool) -> Option<Note> {
    let per_fire = matches!(
        kind,
        ServiceKind::Command | ServiceKind::Command3 | ServiceKind::Cron
    );
    let (note, help) = match (scheduled, kind) {
        (false, ServiceKind::Cron) => (
            "it exports Spin's cron handler (handle-cron-event) but has no schedule: it \
             never runs"
                .to_owned(),
            format!("add `schedule = \"0 * * * * *\"` (your cron) to [service.{name}]"),
        ),
        (true, kind) if !per_fire => (
            format!(
                "it has a schedule, but a {kind} is not run per fire time: each fire time \
                 fails"
            ),
            "build it as a wasi:cli command (a `main`) or with Spin's cron world, or remove \
             its `schedule`"
                .to_owned(),
        ),
        _ => return None,
    };
    Some(Note {
        service: name.to_owned(),
        note,
        help,
    })
}

/// Which of Spin's outbound interfaces, which vvm-host does not offer, service `name`
/// imports (`interfaces::spin`: they are stubs that trap when called).
fn outbound_note(name: &str, imports: &[String]) -> Option<Note> {
    let outbound: Vec<String> = imports
        .iter()
        .filter_map(|i| Some(format!("{i} ({})", spin::outbound(i)?)))
        .collect();
    (!outbound.is_empty()).then(|| Note {
        service: name.to_owned(),
        note: format!(
            "it imports Spin's outbound {}, which vvm-host does not offer: a call to one \
             traps (a Spin SDK imports them whether the app uses them or not)",
            outbound.join(", ")
        ),
        help: "keep a service's state in its fenced key-value store (`wasi:keyvalue`, or \
               Spin's key-value), and reach other systems over outgoing HTTP (`http` \
               grants)"
            .to_owned(),
    })
}

/// Which imports of service `name` are WASI 0.3's release candidate (served by the 0.3.0
/// implementation, whose types they have) and which are WASI 0.3's files and sockets (stubs
/// that trap: `interfaces::stubs`).
fn wasi3_note(name: &str, imports: &[String]) -> Option<Note> {
    let rc_suffix = format!("@{}", super::imports::RC);
    let rc: Vec<&str> = imports
        .iter()
        .filter(|i| i.ends_with(&rc_suffix) && stubs::stubbed(i).is_none())
        .map(String::as_str)
        .collect();
    let stubbed: Vec<&str> = imports
        .iter()
        .filter(|i| spin::outbound(i).is_none() && stubs::stubbed(i).is_some())
        .map(String::as_str)
        .collect();
    let mut says = Vec::new();
    if !rc.is_empty() {
        says.push(format!(
            "it imports WASI 0.3's release candidate {}, served by the WASI 0.3.0 \
             implementation (the same types)",
            rc.join(", ")
        ));
    }
    if !stubbed.is_empty() {
        says.push(format!(
            "it imports WASI 0.3's files and sockets ({}), which vvm-host does not offer: a \
             call to one traps",
            stubbed.join(", ")
        ));
    }
    (!says.is_empty()).then(|| Note {
        service: name.to_owned(),
        note: says.join("; "),
        help: "nothing to do if it never calls them (an SDK imports its whole platform); a \
               service granted `dirs` or `network` has WASI 0.2's files and sockets"
            .to_owned(),
    })
}

/// The packages the host provides interfaces of (in some versions).
const PROVIDED_PACKAGES: [&str; 13] = [
    "vvm:host",
    "spin:key-value",
    "spin:variables",
    "wasi:cli",
    "wasi:io",
    "wasi:clocks",
    "wasi:random",
    "wasi:filesystem",
    "wasi:sockets",
    "wasi:http",
    "wasi:keyvalue",
    "wasi:config",
    "fermyon:spin",
];

/// What the host provides, for a help line about an import it does not.
const PROVIDED: &str = "vvm:host/lease, log and kv @0.1.0; WASI 0.2.x (cli, io, clocks, \
                        random, filesystem, sockets, http); WASI 0.3.0 (cli, clocks, random, \
                        http); wasi:keyvalue @0.2.0-draft and @0.2.0-draft2; \
                        wasi:config/store @0.2.0-draft, @0.2.0-draft-2024-09-27 and @0.2.0-rc.1; \
                        fermyon:spin/key-value and variables @2.0.0; spin:key-value and \
                        spin:variables @3.0.0";

/// A registry source named by a tag alone (SPEC §13): what runs changes whenever the tag is
/// pushed again, and hosts loading at other times may run other bits.
fn unpinned_note(
    name: &str,
    written: Option<&SourceRef>,
    pulled: Option<&SourceRef>,
) -> Option<Note> {
    let (written, pulled) = (written?, pulled?);
    if written.is_pinned() {
        return None;
    }
    Some(Note {
        service: name.to_owned(),
        note: format!(
            "source {written} names a tag, not a digest: it resolved to {} now, and runs \
             whatever the tag names when a host loads it",
            pulled.digest.as_deref().unwrap_or("?")
        ),
        help: format!("pin the digest: source = \"{pulled}\""),
    })
}

/// What to change so that a file rejected for `kind` loads, if there is more to say than
/// the error does.
pub fn help(kind: &LoadErrorKind) -> Option<String> {
    match kind {
        LoadErrorKind::World(_) => Some(
            "target the `service` world of vvm-host's wit/host.wit (export `run`), or \
             `http-service` (export wasi:http/incoming-handler@0.2.x), or build a \
             wasi:cli command (a `main` for wasm32-wasip2), or a WASI 0.3 HTTP service \
             (export wasi:http/handler@0.3.0: Spin's SDK 7, the `wasip3` crate); `vvm-host \
             new` writes a project that does"
                .to_owned(),
        ),
        LoadErrorKind::WrongType { export, .. } => Some(format!(
            "{export} has another type than this host's: build against vvm-host's WIT \
             (wit/host.wit and wit/deps), as a project from `vvm-host new` does"
        )),
        LoadErrorKind::Imports(e) => Some(import_help(&format!("{e:#}"))),
        LoadErrorKind::Pull(e) => e.help().map(str::to_owned),
        LoadErrorKind::Name
        | LoadErrorKind::Read(_)
        | LoadErrorKind::Invalid(_)
        | LoadErrorKind::Compile(_) => None,
    }
}

/// The help for wasmtime's import error `text` (`component imports instance `NAME`, but a
/// matching implementation was not found in the linker`, with the cause after it).
fn import_help(text: &str) -> String {
    let name = [
        "imports instance `",
        "imports function `",
        "imports resource `",
    ]
    .iter()
    .find_map(|lead| {
        let rest = &text[text.find(lead)? + lead.len()..];
        Some(&rest[..rest.find('`')?])
    });
    let Some(name) = name else {
        return format!("import only what this host provides: {PROVIDED}");
    };
    let (package, version) = name.split_once('@').unwrap_or((name, ""));
    if package.starts_with("wasi:") && version.starts_with("0.3") {
        return format!(
            "`{name}` is a part of WASI 0.3 this host does not provide (it provides 0.3.0's \
             cli, clocks, random and http, and their release candidate {}; files and sockets \
             as stubs)",
            super::imports::RC
        );
    }
    let provided = PROVIDED_PACKAGES.contains(&package.split('/').next().unwrap_or(package));
    if provided {
        return format!(
            "this host provides `{package}`, but not as the component was built against \
             (@{version}): build against vvm-host's WIT (wit/host.wit and wit/deps), as a \
             project from `vvm-host new` does"
        );
    }
    format!(
        "remove the import of `{name}` (a library may pull it in) or build against \
         vvm-host's WIT; the host provides {PROVIDED}"
    )
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::interfaces::{HttpPolicy, OutgoingLimits};

    #[test]
    fn an_import_the_host_lacks_is_named_with_what_to_do() {
        let missing = "component imports instance `acme:db/query@1.0.0`, but a matching \
                       implementation was not found in the linker: instance export `run` has \
                       the wrong type: function implementation is missing";
        let help = import_help(missing);
        assert!(
            help.starts_with("remove the import of `acme:db/query@1.0.0`"),
            "{help}"
        );
        assert!(help.contains("wasi:keyvalue @0.2.0-draft"), "{help}");
        let p3 = import_help(
            "component imports instance `wasi:http/handler@0.3.0-rc-2025-09-16`, but a \
             matching implementation was not found in the linker",
        );
        assert!(
            p3.contains("a part of WASI 0.3 this host does not provide")
                && p3.contains("0.3.0-rc-2026-03-15"),
            "{p3}"
        );
        let wrong = import_help(
            "component imports instance `wasi:cli/environment@0.2.6`, but a matching \
             implementation was not found in the linker: instance export `get-environment` \
             has the wrong type: function implementation is missing",
        );
        assert!(
            wrong.contains("not as the component was built against (@0.2.6)"),
            "{wrong}"
        );
    }

    #[test]
    fn an_http_addr_that_would_not_be_shared_is_named_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RuntimeConfig::new(dir.path());
        assert!(
            sharing_note(&config).is_none(),
            "no http-addr, nothing to share"
        );
        let ours: SocketAddr = "127.0.0.1:1".parse().unwrap();
        config.incoming_http.addr = Some(ours);
        let (note, help) = sharing_note(&config).unwrap();
        assert!(note.contains("no crash lock directory"), "{note}");
        assert!(help.contains("`lock-dir`"), "{help}");

        config.http_share_dir = Some(dir.path().to_owned());
        assert!(
            sharing_note(&config).is_none(),
            "alone on its address, it shares"
        );
        // A live host of this machine and store serving another address.
        let other_addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|free| free.local_addr())
            .unwrap();
        let _held =
            crate::interfaces::incoming::SharedSocket::obtain(other_addr, dir.path()).unwrap();
        let (note, help) = sharing_note(&config).unwrap();
        assert!(note.contains("do not share a socket"), "{note}");
        assert!(help.contains("the same http-addr"), "{help}");
    }

    #[test]
    fn a_service_missing_a_grant_for_its_imports_is_told_which() {
        let imports = [
            "wasi:sockets/tcp-create-socket@0.2.12".to_owned(),
            "wasi:http/outgoing-handler@0.2.12".to_owned(),
        ];
        let none = HashMap::new();
        let notes = grant_notes("svc", &imports, &none);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(
            notes[0].help,
            "add `network = true` to [service.svc] in vvm.toml"
        );
        assert!(
            notes[1]
                .help
                .contains("`http = [\"https://api.example.com\"]`")
        );
        let http = HttpPolicy::new(
            &["https://api.example.com".to_owned()],
            None,
            OutgoingLimits::default(),
        )
        .unwrap();
        let granted = HashMap::from([(
            "svc".to_owned(),
            Grants {
                network: true,
                http: Arc::new(http),
                ..Grants::default()
            },
        )]);
        assert_eq!(grant_notes("svc", &imports, &granted), vec![]);
        assert_eq!(grant_notes("svc", &[], &none), vec![]);
    }
}
