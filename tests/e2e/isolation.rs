//! Failure isolation (SPEC §6, issue 28): a service that traps, one that grows its memory past
//! the cap and one that spins, beside a good one. The failing ones are restarted on their own
//! with backoff up to the cap; the good one never pauses, the host keeps its one term, and the
//! slot never moves, unless the operator asked for a hand-over, and then once.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tempfile::TempDir;
use testkit::guests;
use testkit::host::{Host, Line};

use crate::{BIN, millis_between, one_heavy_test_at_a_time};

/// The good service's period, ms.
const TICK_MS: i64 = 200;
/// How long each scenario is watched.
const WATCH: Duration = Duration::from_secs(30);

/// A cluster directory whose services are `good` (the ticker, every [`TICK_MS`]) beside
/// `trap`, `hog` and `spin`, with a `vvm.toml` capping restarts at 1 s, and `extra` appended.
fn bad_neighbourhood(extra: &str) -> TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    for (guest, name) in [
        ("rust-ticker", "good"),
        ("test/trap", "trap"),
        ("test/hog", "hog"),
        ("test/spin", "spin"),
    ] {
        std::fs::copy(guests::guest(guest), services.join(format!("{name}.wasm"))).unwrap();
    }
    std::fs::write(
        dir.path().join("vvm.toml"),
        format!(
            "restart-backoff-max = \"1s\"\nmemory-limit-mib = 32\n\n\
             [service.good]\nenv = [\"TICK_MS={TICK_MS}\"]\n\n{extra}"
        ),
    )
    .unwrap();
    dir
}

/// `vvm-host serve` in `dir` at L = 1 s (the directory's `vvm.toml` applies).
fn host(name: &'static str, dir: &Path) -> Host {
    let cache = format!("cache-{name}");
    let args = [
        "serve",
        "--lease",
        "1s",
        "--cache-dir",
        &cache,
        "--grace-period",
        "1s",
    ];
    Host::start(BIN, name, dir, &args, "info")
}

/// The lines of `host` whose text holds every one of `needles`.
fn lines_with(host: &Host, needles: &[&str]) -> Vec<Line> {
    host.lines()
        .into_iter()
        .filter(|l| needles.iter().all(|n| l.text.contains(n)))
        .collect()
}

/// The longest gap between two lines of the good service's output, ms, and how many there
/// were.
fn longest_pause(host: &Host) -> (i64, usize) {
    let ticks = lines_with(host, &["\"service\":\"good\"", "tick "]);
    let longest = ticks
        .windows(2)
        .map(|w| millis_between(&w[0], &w[1]))
        .max()
        .unwrap_or(0);
    (longest, ticks.len())
}

/// Asserts that `service` failed and reached the 1 s cap of its backoff in `host`.
fn assert_capped(host: &Host, service: &str) {
    let service = format!("\"service\":\"{service}\"");
    let capped = lines_with(host, &[&service, "backing off", "\"wait\":\"1s\""]);
    assert!(
        !capped.is_empty(),
        "{service} never reached its cap:\n{}",
        lines_with(host, &[&service, "backing off"])
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Asserts that `host` led once and never shut down, showing how it lost its lease if it did.
fn assert_one_term(host: &Host) {
    let lost: Vec<String> = host
        .lines()
        .into_iter()
        .filter(|l| {
            ["renewal failed", "\"lost", "shutting down", "\"leading\""]
                .iter()
                .any(|n| l.text.contains(n))
        })
        .map(|l| l.text)
        .collect();
    assert_eq!(
        lines_with(host, &["\"leading\""]).len(),
        1,
        "one term:\n{}",
        lost.join("\n")
    );
    assert!(
        lines_with(host, &["shutting down"]).is_empty(),
        "{}",
        lost.join("\n")
    );
}

/// `vvm-host status --json` in `dir`, once its services show `ready`.
fn status_until(dir: &Path, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let since = Instant::now();
    loop {
        let out = Command::new(BIN)
            .args(["status", "--json"])
            .current_dir(dir)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if ready(&v) {
            return v;
        }
        assert!(since.elapsed() < Duration::from_secs(30), "status: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The service `name` of slot 1 in a `status --json` answer.
fn service<'a>(status: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    status["slots"][0]["services"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
}

#[test]
fn a_crash_looping_service_leaves_its_neighbours_and_the_lease_alone() {
    let _heavy = one_heavy_test_at_a_time();
    let dir = bad_neighbourhood("");
    let mut a = host("a", dir.path());
    a.wait_for(&["\"service\":\"good\"", "ticker started"]);
    std::thread::sleep(WATCH);

    let (pause, ticks) = longest_pause(&a);
    assert!(
        ticks as u128 >= WATCH.as_millis() / (TICK_MS as u128) / 2,
        "{ticks} ticks"
    );
    assert!(
        pause <= TICK_MS + 100,
        "the good service paused {pause} ms (period {TICK_MS} ms)"
    );
    assert_capped(&a, "trap");
    assert_capped(&a, "hog");
    assert_one_term(&a);
    assert_eq!(
        lines_with(&a, &["\"service\":\"good\"", "service running"]).len(),
        1,
        "the good service was never restarted"
    );
    // Said once, then counted: the trap's reason is not logged at every restart.
    assert_eq!(
        lines_with(&a, &["\"service\":\"trap\"", "service failed; backing off"]).len(),
        1
    );

    // status shows each service's state, restarts and last reason.
    let status = status_until(dir.path(), |v| {
        service(v, "trap").is_some_and(|s| s["restarts"].as_u64() >= Some(3))
    });
    let trap = service(&status, "trap").unwrap();
    assert!(
        trap["reason"].as_str().unwrap().contains("trapped"),
        "{trap}"
    );
    assert!(
        trap["state"] == "backing-off" || trap["state"] == "running",
        "{trap}"
    );
    let good = service(&status, "good").unwrap();
    assert_eq!(good["state"], "running", "{good}");
    assert_eq!(good["restarts"], 0, "{good}");
    assert_eq!(service(&status, "spin").unwrap()["state"], "running");

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

#[test]
fn a_crash_looping_service_never_moves_the_slot_between_two_hosts() {
    let _heavy = one_heavy_test_at_a_time();
    let dir = bad_neighbourhood("");
    let mut a = host("a", dir.path());
    a.wait_for(&["\"service\":\"good\"", "ticker started"]);
    let mut b = host("b", dir.path());
    b.wait_for(&["campaigning"]);
    std::thread::sleep(WATCH);

    assert_capped(&a, "trap");
    assert_eq!(lines_with(&a, &["\"leading\""]).len(), 1, "A kept its term");
    assert!(
        lines_with(&b, &["\"leading\""]).is_empty(),
        "the slot moved to B"
    );
    let (pause, _) = longest_pause(&a);
    assert!(pause <= TICK_MS + 100, "the good service paused {pause} ms");
    for h in [&mut a, &mut b] {
        h.signal(Signal::TERM);
        assert!(h.wait_exit().success());
    }
}

#[test]
fn a_hand_over_moves_the_slot_once_and_a_failure_that_follows_does_not_move_it_again() {
    let _heavy = one_heavy_test_at_a_time();
    let dir = bad_neighbourhood("[service.trap]\non-failure = \"hand-over\"\n");
    let mut a = host("a", dir.path());
    a.wait_for(&["\"service\":\"good\"", "ticker started"]);
    let mut b = host("b", dir.path());
    b.wait_for(&["campaigning"]);
    // A hands the slot over at the trap's first failure; B takes it, and the trap fails there
    // too: B keeps it in backoff.
    a.wait_for(&["handing the lease over"]);
    b.wait_for(&["\"leading\""]);
    b.wait_for(&["\"service\":\"trap\"", "kept here in backoff"]);
    std::thread::sleep(WATCH / 2);

    assert_eq!(lines_with(&a, &["\"leading\""]).len(), 1, "A led once");
    assert_eq!(
        lines_with(&b, &["\"leading\""]).len(),
        1,
        "B led once, and still"
    );
    assert!(lines_with(&b, &["handing the lease over"]).is_empty());
    assert_capped(&b, "trap");
    let status = status_until(dir.path(), |v| {
        v["hand_overs"].as_array().is_some_and(|h| !h.is_empty())
    });
    let record = &status["hand_overs"][0];
    assert_eq!(record["service"], "trap", "{status}");
    assert!(record["record"]["term"].as_u64().is_some(), "{status}");
    for h in [&mut a, &mut b] {
        h.signal(Signal::TERM);
        assert!(h.wait_exit().success());
    }
}
