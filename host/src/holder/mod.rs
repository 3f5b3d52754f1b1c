//! Who a host is (SPEC §2 "holder value", §4, §5): a holder value unique per process run, and
//! whether the host behind a holder value can take a lease over now. Its crash lock, by which
//! a standby on the same machine learns from the kernel that a holder is gone, is
//! [`crash_lock`].

pub mod crash_lock;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::keys::CANDIDATE_PREFIX;
use crate::store::Candidates;

/// A holder value unique per process run, not just per machine: `host/pid/start-nanos/seq`.
///
/// The pid tells processes on one machine apart, the nanos of the first call tell apart runs
/// that reuse a pid, and `seq` counts calls so two VVMs in one process never share a value.
pub fn holder_value() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!("{}/{}", this_run(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// This process's part of its holder values: node name, pid and start time.
fn this_run() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        // No control characters: a newline ends the holder in a record's value (`lease_value`).
        let host = node_name();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{host}/{}/{nanos:x}", std::process::id())
    })
}

/// The hosts our slot may be handed to: those standing under [`CANDIDATE_PREFIX`] that
/// [`can_take_over`].
pub(crate) fn candidates() -> Candidates {
    Candidates {
        prefix: CANDIDATE_PREFIX.to_owned(),
        // A candidacy's value may carry its services after the holder (`lease_value`).
        eligible: Arc::new(|value: &str| can_take_over(crate::lease_value::holder(value))),
    }
}

/// Whether the host of `holder` (a [`holder_value`]) can take a lease over now: not when it
/// runs on this machine and its process is stopped (SIGSTOP, a debugger) or gone; a stopped
/// standby handed a slot would leave it idle until the record expires. Nor when it is a
/// campaign of this very process: a process runs one campaign at a time and the releasing
/// one has withdrawn its candidacy, so such a record is left over from an earlier campaign
/// (a candidacy write still under way when its campaign ended lands after the delete). A
/// host on another machine, or whose process this one cannot see (another pid namespace),
/// is taken as able.
pub fn can_take_over(holder: &str) -> bool {
    if holder
        .strip_prefix(this_run())
        .is_some_and(|campaign| campaign.starts_with('/'))
    {
        return false;
    }
    let mut parts = holder.rsplitn(4, '/');
    let (Some(_seq), Some(_nanos), Some(pid), Some(host)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    if host != node_name() || pid.parse::<u32>().is_err() {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // No such process here: gone, or in another pid namespace. Either way it cannot be
        // told from a live one, and a delete is the safe fallback.
        return false;
    };
    // `pid (comm) state ...`: the command may hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("T" | "t" | "Z" | "X" | "x"))
}

/// This machine's node name as a holder value carries it.
fn node_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .replace(char::is_control, "_")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::keys::slot_key;

    /// A holder value of a process of this machine.
    fn local_holder(pid: u32) -> String {
        format!("{}/{pid}/1a2b/0", node_name())
    }

    /// A candidacy left over from an earlier campaign of this process (its write landed
    /// after the campaign withdrew it; on redb it would live an hour) is never handed a slot:
    /// its holder is alive but no campaign of it waits. The release deletes the record, and
    /// the slot is free at once.
    #[tokio::test]
    async fn a_left_over_candidacy_of_this_process_is_never_handed_a_slot() {
        use crate::store::{HandOver, MemStore, TtlStore};
        let store = MemStore::new(Arc::new(crate::clock::ManualClock::default()));
        let left_over = holder_value();
        let lease = Duration::from_secs(20);
        store
            .insert_if_absent(&format!("{CANDIDATE_PREFIX}{left_over}"), &left_over, lease)
            .await
            .unwrap()
            .unwrap();
        let leader = holder_value();
        store
            .insert_if_absent(&slot_key(1), &leader, lease)
            .await
            .unwrap()
            .unwrap();
        let handed = store
            .hand_over(&slot_key(1), &leader, &candidates(), lease)
            .await
            .unwrap();
        assert_eq!(handed, HandOver::Deleted);
    }

    #[test]
    fn a_stopped_or_gone_local_process_cannot_take_over_any_other_can() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let holder = local_holder(child.id());
        assert!(can_take_over(&holder), "a running process");
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
        // The state changes once the signal is delivered.
        let stopped = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(2));
            !can_take_over(&holder)
        });
        assert!(stopped, "a stopped process");
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
        let resumed = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(2));
            can_take_over(&holder)
        });
        assert!(resumed, "running again");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!can_take_over(&holder), "gone");
        // Not ours to judge: another machine, or no pid in the value.
        assert!(can_take_over(&format!("elsewhere/{}/1a2b/0", child.id())));
        assert!(can_take_over("not a holder value"));
        // A campaign of this process: left over, never handed a slot.
        assert!(!can_take_over(&holder_value()), "this process");
    }
}
