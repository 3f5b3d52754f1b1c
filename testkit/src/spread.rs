//! Spread placement as the hosts' logs show it: which services each host runs (its last
//! `spread: running` line), and waiting until a group is at rest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::host::{Host, Line, PATIENCE};

/// The value of the string field `name` in a JSON log line, if any (service names and
/// holders never contain quotes).
fn field<'a>(line: &'a Line, name: &str) -> Option<&'a str> {
    let start = line.text.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let len = line.text[start..].find('"')?;
    Some(&line.text[start..start + len])
}

/// The last `spread: running` line of `host`, if any.
pub fn last_running_line(host: &Host) -> Option<Line> {
    host.lines()
        .into_iter()
        .rev()
        .find(|l| field(l, "message") == Some("spread: running"))
}

/// The services `host` runs now, by its last `spread: running` line.
pub fn running(host: &Host) -> BTreeSet<String> {
    last_running_line(host)
        .and_then(|l| {
            let list = field(&l, "services")?;
            Some(
                list.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        })
        .unwrap_or_default()
}

/// True if every one of `names` runs on exactly one of `hosts`, and the counts per host,
/// sorted descending, are `counts`.
pub fn at_rest(hosts: &[&Host], names: &[String], counts: &[usize]) -> bool {
    let sets: Vec<BTreeSet<String>> = hosts.iter().map(|h| running(h)).collect();
    let mut seen: BTreeMap<&String, usize> = BTreeMap::new();
    for name in sets.iter().flatten() {
        *seen.entry(name).or_default() += 1;
    }
    let once = names.iter().all(|n| seen.get(n) == Some(&1));
    let mut have: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
    have.sort_unstable_by(|a, b| b.cmp(a));
    once && have == counts
}

/// Waits (up to [`PATIENCE`]) until [`at_rest`] holds.
pub fn wait_for_rest(hosts: &[&Host], names: &[String], counts: &[usize]) {
    let end = Instant::now() + PATIENCE;
    while !at_rest(hosts, names, counts) {
        assert!(
            Instant::now() < end,
            "no rest at {counts:?} within {PATIENCE:?}: {:?}",
            hosts
                .iter()
                .map(|h| (h.name, running(h)))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
