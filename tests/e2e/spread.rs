//! Spread placement end to end (SPEC §6 "Placement", issue 19): real hosts share seven
//! services out between them, on redb and on etcd.
//!
//! Every service is a copy of the `test/journal` guest, with its own granted directory: it
//! appends `TERM SEQ` to `data/<service>/journal` every 2 ms under its claim's term. Terms of a
//! claim strictly increase with each acquisition, so if a service ever ran on two hosts at
//! once (or a host acted after its claim passed on), a lower term would follow a higher one.
//! Which services a host runs comes from its `spread: running` log lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use testkit::etcd::EtcdServer;
use testkit::guests;
use testkit::host::{Host, Line, PATIENCE};
use testkit::spread::running;

use crate::BIN;
use crate::fencing::{Rng, term_drops};

const SERVICES: usize = 7;
/// The lease of the group tests: renewals (and so the look that sees a new member) every
/// second, so a takeover within 500 ms of a release is the release's doing.
const LEASE: &str = "4s";
/// The lease of the chaos run: pauses of 0.3–4.3 s then often outlast it.
const CHAOS_LEASE: &str = "2s";

fn names() -> Vec<String> {
    (0..SERVICES).map(|i| format!("j{i}")).collect()
}

/// A directory with `services/j0..j6.wasm` (journal guests), each granted `data/<name>` as
/// `/data`, and a `vvm.toml` that turns spread placement on.
fn spread_dir() -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    let mut config = String::from("placement = \"spread\"\n");
    for name in names() {
        std::fs::copy(
            guests::guest("test/journal"),
            services.join(format!("{name}.wasm")),
        )
        .unwrap();
        let data = dir.path().join("data").join(&name);
        std::fs::create_dir_all(&data).unwrap();
        writeln!(
            config,
            "[service.{name}]\ndirs = [\"{}:/data\"]",
            data.display()
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("vvm.toml"), config).unwrap();
    dir
}

fn serve(name: &'static str, dir: &Path, store: &str, lease: &str) -> Host {
    testkit::host::serve_with(BIN, name, dir, [store, lease, "1s"], "info")
}

fn json(line: &Line) -> serde_json::Value {
    serde_json::from_str(&line.text).unwrap_or_default()
}

fn at(line: &Line) -> SystemTime {
    let stamp = json(line)["timestamp"].as_str().unwrap().to_owned();
    humantime::parse_rfc3339(&stamp).unwrap()
}

/// Waits until every service runs on exactly one of `hosts` at `counts` per host.
fn wait_for_rest(hosts: &[&Host], counts: &[usize]) {
    testkit::spread::wait_for_rest(hosts, &names(), counts);
}

/// The journal of `service`: its `(term, seq)` lines.
fn journal(dir: &Path, service: &str) -> Vec<(u64, u64)> {
    let text =
        std::fs::read_to_string(dir.join("data").join(service).join("journal")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (t, s) = l.split_once(' ')?;
            Some((t.parse().ok()?, s.parse().ok()?))
        })
        .collect()
}

/// No term ever goes down in any service's journal; returns the distinct terms per service.
fn assert_terms_never_go_down(dir: &Path) -> BTreeMap<String, usize> {
    names()
        .into_iter()
        .map(|name| {
            let lines = journal(dir, &name);
            assert!(!lines.is_empty(), "{name} never ran");
            assert_eq!(
                term_drops(&lines),
                vec![],
                "{name}: a lower term after a higher one"
            );
            let terms: BTreeSet<u64> = lines.iter().map(|l| l.0).collect();
            (name, terms.len())
        })
        .collect()
}

/// `vvm-host status` shows the members and which host runs each service, with its term and
/// time left, as the hosts' logs say.
fn assert_status(dir: &Path, store: &str, hosts: &[&Host]) {
    let out = crate::tools::tool(dir, &["status", "--store", store, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members = status["members"].as_array().unwrap();
    assert_eq!(members.len(), hosts.len(), "{status}");
    let claims = status["claims"].as_array().unwrap();
    assert_eq!(claims.len(), SERVICES, "{status}");
    let mut by_holder: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for claim in claims {
        assert!(claim["term"].as_u64().unwrap() > 0);
        assert!(claim["time_left_ms"].as_u64().unwrap() > 0);
        by_holder
            .entry(claim["holder"].as_str().unwrap().to_owned())
            .or_default()
            .insert(claim["service"].as_str().unwrap().to_owned());
    }
    let mut from_status: Vec<BTreeSet<String>> = by_holder.into_values().collect();
    let mut from_logs: Vec<BTreeSet<String>> = hosts.iter().map(|h| running(h)).collect();
    from_status.sort();
    from_logs.sort();
    assert_eq!(from_status, from_logs);
    let text = crate::tools::tool(dir, &["status", "--store", store]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("MEMBER") && text.contains("SERVICE"),
        "{text}"
    );
    for name in names() {
        assert!(text.contains(&name), "{text}");
    }
}

/// The index of the first log line of `host` with every needle.
fn index(host: &Host, needles: &[&str]) -> usize {
    host.wait_for_from(0, needles).0
}

fn stop(host: &mut Host) {
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success(), "{} stopped cleanly", host.name);
}

/// The whole life of a group on `store`: 3 hosts at rest 3/2/2; a fourth joins (2/2/2/1,
/// without waiting for any expiry); one leaves gracefully (its services move at once); one
/// is killed (its services move once their claims expire). No service ever runs twice.
fn group_life(store: &str) {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = spread_dir();
    let mut a = serve("a", dir.path(), store, LEASE);
    let mut b = serve("b", dir.path(), store, LEASE);
    let mut c = serve("c", dir.path(), store, LEASE);
    wait_for_rest(&[&a, &b, &c], &[3, 2, 2]);
    assert_status(dir.path(), store, &[&a, &b, &c]);
    for h in [&a, &b, &c] {
        // Compile before claiming: every service was loaded before the host claimed any.
        assert!(
            index(h, &["services loaded"]) < index(h, &["\"claimed\""]),
            "{}",
            h.name
        );
    }

    let mut d = serve("d", dir.path(), store, LEASE);
    let joined = Instant::now();
    wait_for_rest(&[&a, &b, &c, &d], &[2, 2, 2, 1]);
    println!(
        "spread: a fourth host got its share {:?} after it started",
        joined.elapsed()
    );

    // A graceful leave: its claims are deleted as its services stop, and the others take
    // them at once (they hear the deletes), not after the lease.
    let leaver = [&a, &b, &c, &d]
        .into_iter()
        .max_by_key(|h| running(h).len())
        .map(|h| h.name)
        .unwrap();
    let (leaving, staying): (Vec<&mut Host>, Vec<&mut Host>) = [&mut a, &mut b, &mut c, &mut d]
        .into_iter()
        .partition(|h| h.name == leaver);
    let leaving = leaving.into_iter().next().unwrap();
    let moved = running(leaving);
    stop(leaving);
    // The ordered shutdown, per claim: the group is left first, each service is stopped
    // before its claim is deleted, and the killer is disarmed last.
    let left = index(leaving, &["leaving the group"]);
    let mut last_release = left;
    for service in &moved {
        let stopped = index(leaving, &["service stopped", service]);
        let released = index(leaving, &["claim released", service]);
        assert!(left < stopped && stopped < released, "{service}");
        last_release = last_release.max(released);
    }
    let disarmed = leaving
        .lines()
        .iter()
        .rposition(|l| l.text.contains("killer disarmed"))
        .unwrap();
    assert!(last_release < disarmed);
    let staying: Vec<&Host> = staying.into_iter().map(|h| &*h).collect();
    wait_for_rest(&staying, &[3, 2, 2]);
    for service in &moved {
        let released = leaving.wait_for(&["claim released", service, "\"deleted\":true"]);
        let taken = staying
            .iter()
            .find_map(|h| {
                h.lines().into_iter().rev().find(|l| {
                    let v = json(l);
                    v["fields"]["message"] == "claimed" && v["fields"]["service"] == **service
                })
            })
            .unwrap();
        let gap = at(&taken).duration_since(at(&released)).unwrap_or_default();
        println!("spread: {service} moved {gap:?} after its release");
        assert!(
            gap < Duration::from_millis(500),
            "{service} was taken {gap:?} after its release: nobody woke on the delete"
        );
    }

    // A crash: the killed host's claims are waited out, then taken.
    let names: Vec<&'static str> = staying.iter().map(|h| h.name).collect();
    let [x, y, z] = names[..] else {
        panic!("three hosts stay");
    };
    let mut hosts: BTreeMap<&str, &mut Host> = [&mut a, &mut b, &mut c, &mut d]
        .into_iter()
        .filter(|h| [x, y, z].contains(&h.name))
        .map(|h| (h.name, h))
        .collect();
    let victim = hosts.remove(x).unwrap();
    victim.signal(Signal::KILL);
    victim.wait_exit();
    let survivors: Vec<&Host> = hosts.values().map(|h| &**h).collect();
    wait_for_rest(&survivors, &[4, 3]);
    for h in hosts.into_values() {
        stop(h);
    }
    let terms = assert_terms_never_go_down(dir.path());
    println!("spread: distinct terms per service {terms:?}");
}

#[test]
fn spread_on_redb_shares_seven_services_and_moves_them_without_overlap() {
    group_life("vvm.redb");
}

#[test]
fn spread_on_etcd_shares_seven_services_and_moves_them_without_overlap() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    group_life(&format!("etcd://{}", etcd.endpoint()));
}

#[test]
fn spread_chaos_on_redb_never_runs_a_service_twice() {
    chaos("vvm.redb");
}

#[test]
fn spread_chaos_on_etcd_never_runs_a_service_twice() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    chaos(&format!("etcd://{}", etcd.endpoint()));
}

/// Chaos: 3 hosts, random SIGKILL, SIGSTOP (then SIGCONT) and SIGTERM, a host that ends is
/// started again. In every service's journal the terms never go down. `VVM_SOAK_FAULTS` sets
/// the number of faults (default 12).
fn chaos(store: &str) {
    const NAMES: [&str; 3] = ["h0", "h1", "h2"];
    let _heavy = crate::one_heavy_test_at_a_time();
    let faults: usize = std::env::var("VVM_SOAK_FAULTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("spread chaos: seed {seed}, {faults} faults");
    let mut rng = Rng(seed);
    let dir = spread_dir();
    let mut hosts: Vec<Host> = NAMES
        .iter()
        .map(|n| serve(n, dir.path(), store, CHAOS_LEASE))
        .collect();
    let mut ended: Vec<Host> = Vec::new();
    {
        let all: Vec<&Host> = hosts.iter().collect();
        wait_for_rest(&all, &[3, 2, 2]);
    }
    for _ in 0..faults {
        let target = usize::try_from(rng.below(3)).unwrap();
        match rng.below(3) {
            0 => hosts[target].signal(Signal::KILL),
            1 => {
                hosts[target].signal(Signal::STOP);
                let paused = Duration::from_millis(300 + rng.below(4000));
                std::thread::sleep(paused);
                hosts[target].signal(Signal::CONT);
            }
            _ => hosts[target].signal(Signal::TERM),
        }
        std::thread::sleep(Duration::from_millis(100 + rng.below(900)));
        for (i, name) in NAMES.iter().enumerate() {
            if hosts[i].wait_exit_or(Duration::ZERO).is_some() {
                let fresh = serve(name, dir.path(), store, CHAOS_LEASE);
                ended.push(std::mem::replace(&mut hosts[i], fresh));
            }
        }
    }
    // The group settles again: every service once, 3/2/2 (a host that ends only now, e.g.
    // by its killer after the last pause, is started again too).
    let end = Instant::now() + PATIENCE;
    loop {
        for (i, name) in NAMES.iter().enumerate() {
            if hosts[i].wait_exit_or(Duration::ZERO).is_some() {
                let fresh = serve(name, dir.path(), store, CHAOS_LEASE);
                ended.push(std::mem::replace(&mut hosts[i], fresh));
            }
        }
        let all: Vec<&Host> = hosts.iter().collect();
        if testkit::spread::at_rest(&all, &names(), &[3, 2, 2]) {
            break;
        }
        assert!(
            Instant::now() < end,
            "seed {seed}: the group never settled: {:?}",
            all.iter().map(|h| (h.name, running(h))).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for h in &mut hosts {
        h.signal(Signal::TERM);
        h.wait_exit_or(Duration::from_secs(10));
    }
    let terms = assert_terms_never_go_down(dir.path());
    println!(
        "spread chaos: seed {seed}: {} hosts ended; distinct terms per service {terms:?}",
        ended.len()
    );
}

/// Hosts of both placements on one store would each run the services, unaware of the others'
/// leases: a spread host refuses a store a together host leads on, with one clear line.
#[test]
fn a_spread_host_refuses_a_store_in_use_by_a_together_host() {
    let dir = testkit::host::cluster_dir();
    let mut a = crate::serve("a", dir.path(), "2s");
    a.wait_for(&["tick 1:"]);
    let args = ["serve", "--placement", "spread", "--cache-dir", "cache-b"];
    let mut b = Host::start(BIN, "b", dir.path(), &args, "off");
    let status = b.wait_exit();
    let stderr: Vec<String> = b.lines().into_iter().map(|l| l.text).collect();
    assert!(!status.success(), "{stderr:?}");
    assert_eq!(stderr.len(), 1, "one line: {stderr:?}");
    assert!(
        stderr[0].contains(
            "placement spread: the store is in use by hosts with placement together (slot/1 is live)"
        ),
        "{stderr:?}"
    );
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}
