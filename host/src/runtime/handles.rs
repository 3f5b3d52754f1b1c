//! How many handles one service instance may hold at once (SPEC §6: each service in its own
//! sandbox, its resources bounded as its memory is), and the share of the process's file
//! descriptors that guests may hold together.
//!
//! A handle is an entry in an instance's resource table: an open file or directory, a
//! socket, a stream, a timer. Each costs host memory, and with a directory or network grant
//! at most one host file descriptor. Without a bound, a guest that forgets to close what it
//! opens holds descriptors until the process has none left, and then the host cannot open
//! what it needs: a re-read of its configuration, a new service file, a connection to its
//! operations endpoint or to etcd. So an instance may hold at most `handle-limit` handles,
//! and the instances of granted services at most an even share of the process's descriptors
//! less [`HOST_DESCRIPTORS`] and the connections `http-addr` may hold ([`connection_cap`]).
//! Past its cap a guest's next open traps, its instance is dropped (and every descriptor with
//! it), and the service restarts with backoff like any failing one.
//!
//! The connections on `http-addr` are bounded the same way (SPEC §14): by default half of the
//! descriptors the host does not keep, so that neither a flood of connections nor the guests
//! can take the other's, nor the host's own.

use std::collections::HashMap;

use super::config::Grants;

/// The descriptors kept for the host itself: its store, locks, logs, the live directory's
/// reads and watch, the operations endpoint's connections (at most 64), etcd's channels.
const HOST_DESCRIPTORS: u64 = 256;

/// The most connections `http-addr` holds at once by default, whatever the descriptors: each
/// costs memory too (its buffers, its task), and `wasmtime serve` holds 1000.
pub(crate) const DEFAULT_MAX_CONNECTIONS_CEILING: u64 = 10_000;

/// The most connections open on `http-addr` at once, of `descriptors` the process may open:
/// `setting` if given, lowered (with a line saying so) to nine tenths of those the host does
/// not keep; by default half of those, at most [`DEFAULT_MAX_CONNECTIONS_CEILING`]. At least 1.
pub(crate) fn connection_cap(setting: Option<u32>, descriptors: u64) -> u64 {
    let free = descriptors.saturating_sub(HOST_DESCRIPTORS);
    let most = free / 10 * 9;
    match setting {
        None => (free / 2).min(DEFAULT_MAX_CONNECTIONS_CEILING),
        Some(n) if u64::from(n) > most => {
            tracing::warn!(
                max_connections = n,
                lowered_to = most,
                open_file_limit = descriptors,
                "max-connections is more than the open file limit allows: lowered"
            );
            most
        }
        Some(n) => u64::from(n),
    }
    .max(1)
}

/// Raises the process's soft limit on open files to its hard limit, as Go's runtime does at
/// start: the soft default of 1024 exists for `select(2)`, which nothing here uses, and the
/// guests' share of descriptors ([`instance_cap`]) is the larger for it.
pub fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let before = getrlimit(Resource::Nofile);
    if before.current == before.maximum {
        return;
    }
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::debug!(
            from = before.current,
            to = before.maximum,
            "open file limit raised"
        ),
        Err(e) => tracing::debug!(error = %e, "open file limit not raised"),
    }
}

/// The open file limit in force (`u64::MAX` for none).
pub(crate) fn descriptor_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Whether a service with `grants` holds host file descriptors through its handles.
fn holds_descriptors(grants: &Grants) -> bool {
    !grants.dirs.is_empty() || grants.network
}

/// The most handles an instance of `service` may hold: `limit`, and for a service that holds
/// descriptors, no more than its even share (among the services granted `all`) of the
/// `descriptors` the process may open, less [`HOST_DESCRIPTORS`]. A share below
/// [`crate::config::MIN_HANDLE_LIMIT`] is raised to it, as a guest cannot run with fewer.
pub(crate) fn instance_cap(
    service: &str,
    limit: u32,
    all: &HashMap<String, Grants>,
    descriptors: u64,
) -> usize {
    let limit = u64::from(limit);
    let cap = if all.get(service).is_some_and(holds_descriptors) {
        let granted = all.values().filter(|g| holds_descriptors(g)).count();
        let share = descriptors.saturating_sub(HOST_DESCRIPTORS)
            / u64::try_from(granted).unwrap_or(u64::MAX);
        limit
            .min(share)
            .max(u64::from(crate::config::MIN_HANDLE_LIMIT))
    } else {
        limit
    };
    usize::try_from(cap).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::config::DirGrant;

    fn granted(dirs: bool, network: bool) -> Grants {
        Grants {
            dirs: if dirs {
                vec![DirGrant {
                    host: "/tmp".into(),
                    guest: "/data".into(),
                    read_only: false,
                }]
            } else {
                Vec::new()
            },
            env: vec![("A".into(), "b".into())],
            network,
            ..Grants::default()
        }
    }

    #[test]
    fn connections_get_half_the_descriptors_the_host_does_not_keep() {
        // 20 000 descriptors: 256 the host's, half of the rest for connections.
        assert_eq!(connection_cap(None, 20_000), 9_872);
        assert_eq!(
            connection_cap(None, 1 << 20),
            DEFAULT_MAX_CONNECTIONS_CEILING
        );
        assert_eq!(connection_cap(None, 100), 1, "at least one");
        assert_eq!(connection_cap(Some(500), 20_000), 500);
        // More than the descriptors allow: nine tenths of those not the host's.
        assert_eq!(connection_cap(Some(50_000), 4096), 3_456);
    }

    #[test]
    fn granted_services_share_the_descriptors_the_host_does_not_keep() {
        let all: HashMap<String, Grants> = [
            ("files".to_owned(), granted(true, false)),
            ("net".to_owned(), granted(false, true)),
            ("env-only".to_owned(), granted(false, false)),
        ]
        .into();
        // Two services hold descriptors: each may have half of 1256 - 256.
        assert_eq!(instance_cap("files", 4096, &all, 1256), 500);
        assert_eq!(instance_cap("net", 4096, &all, 1256), 500);
        // The setting still bounds a share larger than it.
        assert_eq!(instance_cap("files", 300, &all, 1256), 300);
        assert_eq!(instance_cap("files", 4096, &all, u64::MAX), 4096);
        // No descriptors through its handles: only the setting.
        assert_eq!(instance_cap("env-only", 4096, &all, 1256), 4096);
        assert_eq!(instance_cap("ungranted", 4096, &all, 1256), 4096);
        // Too few descriptors to share: the least a guest can run with.
        assert_eq!(
            instance_cap("files", 4096, &all, 100),
            usize::try_from(crate::config::MIN_HANDLE_LIMIT).unwrap()
        );
    }
}
