//! The store's key layout (SPEC §3, §5, §6): every record vvm-host writes, by prefix. One
//! home, so that no two concepts can pick the same prefix and `status` reads what the hosts
//! write.
//!
//! ```text
//! slot/N            a slot's lease (together placement)         value: lease_value
//! candidate/HOLDER  a standby waiting for a slot (hand_over)    value: lease_value::candidate
//! service/NAME      a service's claim (spread placement)        value: holder
//! member/HOLDER     a spread member                             value: lease_value::candidate
//! announce/HOLDER   a joining spread member's wake-up           value: holder
//! handover/NAME     a service handed to another host            value: JSON (runtime)
//! kv space          guests' key-value records, in their own table or range, by namespace:
//!                   a service's name, or bucket/NAME for a shared bucket
//! kv schedule/NAME  a scheduled service's runs, one per fire time  value: JSON (runtime)
//!                   under fire/SECONDS (20 digits: byte order is time order)
//! ```

/// The prefix of the slots' lease records.
pub const SLOT_PREFIX: &str = "slot/";

/// The prefix of the records of hosts waiting for a slot, to which a releasing leader hands
/// its slot in the same write ([`crate::store::TtlStore::hand_over`]).
pub const CANDIDATE_PREFIX: &str = "candidate/";

/// Key prefix of the service claims (spread placement).
pub const SERVICE_PREFIX: &str = "service/";
/// Key prefix of the membership records (spread placement).
pub const MEMBER_PREFIX: &str = "member/";
/// Key prefix of the records a joining host writes and deletes at once to wake the others.
pub const ANNOUNCE_PREFIX: &str = "announce/";
/// Key prefix of the records of services handed to another host after a failure
/// (`on-failure = "hand-over"`), so that a failure that follows the service does not move
/// the slot again.
pub const HAND_OVER_PREFIX: &str = "handover/";

/// The prefix of the key-value namespaces of shared buckets (`kv-buckets`). A service's own
/// namespace is its name, which has no `/`, so the two never meet.
pub const BUCKET_PREFIX: &str = "bucket/";

/// The prefix of the key-value namespaces of scheduled services' run records.
pub const SCHEDULE_PREFIX: &str = "schedule/";

/// The prefix of a run record's key in its service's schedule namespace.
pub const FIRE_PREFIX: &str = "fire/";

/// The store key of slot `slot`.
pub fn slot_key(slot: u32) -> String {
    format!("{SLOT_PREFIX}{slot}")
}

/// The claim key of the service `name`.
pub fn service_key(name: &str) -> String {
    format!("{SERVICE_PREFIX}{name}")
}

/// The membership key of `holder`.
pub fn member_key(holder: &str) -> String {
    format!("{MEMBER_PREFIX}{holder}")
}

/// The hand-over record of the service `name`.
pub fn hand_over_key(name: &str) -> String {
    format!("{HAND_OVER_PREFIX}{name}")
}

/// The key-value namespace of the shared bucket `name`.
pub fn bucket_space(name: &str) -> String {
    format!("{BUCKET_PREFIX}{name}")
}

/// The key-value namespace of the run records of the scheduled service `name`.
pub fn schedule_space(name: &str) -> String {
    format!("{SCHEDULE_PREFIX}{name}")
}

/// The key of the run record of the fire time `unix_seconds` (zero-padded, so that keys sort
/// as the times do; a time before 1970 has none).
pub fn fire_key(unix_seconds: i64) -> Option<String> {
    u64::try_from(unix_seconds)
        .ok()
        .map(|s| format!("{FIRE_PREFIX}{s:020}"))
}

/// The fire time of the run record `key`, if it is one.
pub fn fire_time_of(key: &str) -> Option<i64> {
    key.strip_prefix(FIRE_PREFIX)?.parse().ok()
}
