//! Scheduled services (issue 40, SPEC §11), real processes at L = 1 s with a schedule every
//! second: each fire time runs once on the cluster through SIGKILLs of the leader, a stopped
//! leader never completes a fire time its successor ran, a Spin cron component runs
//! unchanged, and `status --json` shows what the log says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;

use crate::{BIN, serve};

/// A directory serving `guest` as the scheduled service `job` every second, writing into
/// `data/` (granted as `/data`), with `more` settings of `[service.job]`.
fn schedule_dir(guest: &str, more: &str) -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::copy(guests::guest(guest), services.join("job.wasm")).unwrap();
    let data = dir.path().join("data");
    std::fs::write(
        dir.path().join("vvm.toml"),
        format!(
            "[service.job]\nschedule = \"* * * * * *\"\ndirs = [{:?}]\n{more}",
            format!("{}:/data", data.display())
        ),
    )
    .unwrap();
    dir
}

/// The fire times the guest wrote into `data/fires`, each with how often.
fn fires(dir: &Path) -> BTreeMap<i64, usize> {
    let text = std::fs::read_to_string(dir.join("data/fires")).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let fire: i64 = line
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("a line that is no fire time: {line:?}"));
        *seen.entry(fire).or_insert(0) += 1;
    }
    seen
}

/// Waits until the guest has written `n` fire times in all.
fn wait_for_fires(dir: &Path, n: usize) {
    let end = std::time::Instant::now() + testkit::host::PATIENCE;
    while fires(dir).len() < n {
        assert!(
            std::time::Instant::now() < end,
            "fewer than {n} fire times ran: {:?}",
            fires(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `fire_time` of a log line, in Unix seconds.
fn fire_time(text: &str) -> Option<i64> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let at = v["fields"]["fire_time"].as_str()?;
    humantime::parse_rfc3339(at)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
}

/// The fire times the hosts' logs say were cut by a takeover.
fn cut(lines: &[testkit::host::Line]) -> BTreeSet<i64> {
    lines
        .iter()
        .filter(|l| l.text.contains("scheduled run was cut by a takeover"))
        .filter_map(|l| fire_time(&l.text))
        .collect()
}

/// Every fire time the guest wrote into `dir`'s `data/fires` ran once, and each from the
/// first to the last either ran or is said in `lines` to have been cut by a takeover.
fn assert_each_fire_time_once(dir: &Path, lines: &[testkit::host::Line]) -> (usize, usize) {
    let seen = fires(dir);
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "fire times run twice: {twice:?}");
    let cut = cut(lines);
    let (first, last) = (*seen.keys().next().unwrap(), *seen.keys().last().unwrap());
    let missing: Vec<i64> = (first..=last)
        .filter(|f| !seen.contains_key(f) && !cut.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "fire times neither run nor cut: {missing:?} (ran {seen:?}, cut {cut:?})"
    );
    (seen.len(), cut.len())
}

/// SPEC §11: the leader killed (SIGKILL) at random moments across about 30 fire times (each kill
/// right after a run it logged, or up to 1.5 s later), a standby taking over each time,
/// `catch-up = "all"`: no fire time ran twice, and every one from the first to the last
/// either ran or is said to have been cut by a takeover (its leader died inside it).
#[test]
fn each_fire_time_runs_once_through_sigkills_of_the_leader() {
    use std::io::Write as _;

    let _heavy = crate::one_heavy_test_at_a_time();
    let kills: usize = std::env::var("VVM_SCHEDULE_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let dir = schedule_dir("test/fire-command", "catch-up = \"all\"\n");
    let seed = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos(),
    ) | 1;
    println!("schedule kills: seed {seed}");
    let mut random = crate::fencing::Rng(seed);
    let mut hosts = [serve("a", dir.path(), "1s"), serve("b", dir.path(), "1s")];
    let mut all_lines = Vec::new();
    wait_for_fires(dir.path(), 2);
    for kill in 0..kills {
        // The leader is the one that runs the schedule: the next run's line names it.
        let marks = hosts.each_ref().map(Host::mark);
        let leader = loop {
            if let Some(i) = (0..2).find(|&i| {
                hosts[i].lines()[marks[i]..]
                    .iter()
                    .any(|l| l.text.contains("scheduled run ended"))
            }) {
                break i;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(Duration::from_millis(random.below(1500)));
        hosts[leader].signal(Signal::KILL);
        let _ = hosts[leader].wait_exit();
        all_lines.extend(hosts[leader].lines());
        let name = if kill % 2 == 0 { "c" } else { "d" };
        hosts[leader] = serve(name, dir.path(), "1s");
        let _ = writeln!(std::io::stderr(), "kill {kill}: host {leader}");
    }
    let ran = fires(dir.path()).len();
    wait_for_fires(dir.path(), ran + 3);
    for host in &mut hosts {
        host.signal(Signal::TERM);
        assert!(host.wait_exit().success());
        all_lines.extend(host.lines());
    }
    let (ran, cut) = assert_each_fire_time_once(dir.path(), &all_lines);
    println!("fire times through {kills} kills: {ran} ran, {cut} cut");
}

/// SPEC §11: a leader stopped (SIGSTOP) across fire times and continued after its deadline never
/// runs a fire time its successor ran: each ran once, and the resumed host logs no run of
/// one after its stop.
#[test]
fn a_stopped_leader_never_runs_a_fire_time_its_successor_ran() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = schedule_dir("test/fire-command", "catch-up = \"all\"\n");
    let mut a = serve("a", dir.path(), "1s");
    a.wait_for(&["scheduled run ended"]);
    let mut b = serve("b", dir.path(), "1s");
    b.wait_for(&["campaigning"]);
    let stopped_at = a.mark();
    let taken = a_stopped_until_b_runs(&a, &b);
    a.signal(Signal::CONT);
    // The resumed host learns it lost the lease (or its killer ends it); what it does after
    // must not be a run.
    let end = std::time::Instant::now() + testkit::host::PATIENCE;
    while a.wait_exit_or(Duration::from_millis(20)).is_none()
        && !a.lines()[stopped_at..]
            .iter()
            .any(|l| l.text.contains("lost"))
    {
        assert!(
            std::time::Instant::now() < end,
            "a neither lost its lease nor ended"
        );
    }
    let ran = fires(dir.path()).len();
    wait_for_fires(dir.path(), ran + 2);
    // What the resumed host logs of runs after the stop is a run it began before (cut by
    // the fence, or ended just before the stop), never one of a fire time its successor ran.
    let after_stop: Vec<String> = a.lines()[stopped_at..]
        .iter()
        .filter(|l| l.text.contains("scheduled run ended") && !l.text.contains("\"cut\""))
        .filter(|l| fire_time(&l.text).is_some_and(|f| f >= taken))
        .map(|l| l.text.clone())
        .collect();
    assert!(
        after_stop.is_empty(),
        "the resumed leader ran what its successor ran: {after_stop:#?}"
    );
    let seen = fires(dir.path());
    assert!(
        seen.values().all(|n| *n == 1),
        "a fire time ran twice: {seen:?}"
    );
    assert!(seen.contains_key(&taken), "{taken} ran: {seen:?}");
    for host in [&mut a, &mut b] {
        if host.wait_exit_or(Duration::ZERO).is_none() {
            host.signal(Signal::TERM);
            let _ = host.wait_exit();
        }
    }
}

/// Stops `a` until `b` has run a fire time; that fire time.
fn a_stopped_until_b_runs(a: &Host, b: &Host) -> i64 {
    let line = a.stop_until(b, &["scheduled run ended"]);
    fire_time(&line.text).unwrap()
}

/// A Spin cron component built with spin-cron's SDK (the `guest-rust` sample's handler)
/// runs unchanged once per fire time, `metadata.timestamp` the fire time; `check` says
/// which world it is; a failing run is an error in `status --json`, which shows the same
/// outcome, fire time and term as the log.
#[test]
fn a_spin_cron_component_runs_per_fire_time_and_status_shows_what_the_log_says() {
    let dir = schedule_dir("test/cron-sdk-app", "");
    let check = std::process::Command::new(BIN)
        .args(["check", "services"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(
        report.contains("ok    job (fermyon:spin-cron/spin-cron)"),
        "{report}"
    );
    let mut host = serve("a", dir.path(), "5s");
    wait_for_fires(dir.path(), 2);
    let text = std::fs::read_to_string(dir.path().join("data/fires")).unwrap();
    assert!(text.lines().all(|l| l.ends_with(" spin")), "{text}");
    let ended = host.wait_for(&["scheduled run ended", "\"ok\""]);
    let logged = fire_time(&ended.text).unwrap();
    let status = loop {
        let out = std::process::Command::new(BIN)
            .args(["status", "--json"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let schedule = v["slots"][0]["services"][0]["schedule"].clone();
        if schedule["last"]["fire"].as_i64() >= Some(logged) {
            break schedule;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status["schedule"], "* * * * * *");
    assert_eq!(status["timezone"], "UTC");
    assert_eq!(status["last"]["outcome"], "ok", "{status}");
    assert_eq!(status["last"]["term"], 1, "{status}");
    assert!(
        status["next"].as_i64() > status["last"]["fire"].as_i64(),
        "{status}"
    );
    let fire = status["last"]["fire"].as_i64().unwrap();
    let at = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(fire).unwrap());
    let stamp = humantime::format_rfc3339_seconds(at).to_string();
    let line = host.wait_for(&["scheduled run ended", &stamp]);
    assert!(line.text.contains("\"ok\""), "{}", line.text);
    assert_eq!(fire_time(&line.text), Some(fire));
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// A `wasi:cli` command of ours in Python (componentize-py) runs once per fire time, the fire
/// time in `VVM_FIRE_TIME`; a run that fails is `error` in the log, and the next fire time
/// runs as usual.
#[test]
fn a_python_command_runs_once_per_fire_time_and_a_failure_is_its_own() {
    let dir = schedule_dir("test/fire-python", "");
    let mut host = serve("a", dir.path(), "5s");
    wait_for_fires(dir.path(), 2);
    std::fs::write(dir.path().join("data/fail"), "").unwrap();
    let failed = host.wait_for(&["scheduled run ended", "\"error\""]);
    assert!(
        failed.text.contains("exited with code 1"),
        "{}",
        failed.text
    );
    std::fs::remove_file(dir.path().join("data/fail")).unwrap();
    let mark = host.mark();
    host.wait_for_from(mark, &["scheduled run ended", "\"ok\""]);
    let seen = fires(dir.path());
    assert!(
        seen.values().all(|n| *n == 1),
        "a fire time ran twice: {seen:?}"
    );
    // The failed run got its fire time too: it wrote it before it failed.
    let fire = fire_time(&failed.text).unwrap();
    assert!(seen.contains_key(&fire), "{fire} not in {seen:?}");
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// `concurrency = "skip"` (the default): a run that takes 1.5 s is still going at the next
/// fire time, which is skipped (and said so); no two runs overlap.
#[test]
fn a_run_still_going_skips_the_next_fire_time() {
    let dir = schedule_dir("test/fire-command", "env = [\"VVM_SLEEP_MS=1500\"]\n");
    let mut host = serve("a", dir.path(), "5s");
    host.wait_for(&["scheduled run skipped"]);
    wait_for_fires(dir.path(), 3);
    let fires: Vec<i64> = fires(dir.path()).into_keys().collect();
    assert!(
        fires.windows(2).all(|w| w[1] - w[0] >= 2),
        "two runs overlapped: {fires:?}"
    );
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// On etcd too (the records are the same fenced writes): a graceful takeover between two
/// hosts neither repeats nor loses a fire time (`catch-up = "all"`).
#[test]
fn on_etcd_a_takeover_neither_repeats_nor_loses_a_fire_time() {
    let Some(etcd) = testkit::etcd::EtcdServer::start() else {
        return;
    };
    let store = crate::etcd::store_url(&etcd);
    let dir = schedule_dir("test/fire-command", "catch-up = \"all\"\n");
    let mut a = crate::serve_on("a", dir.path(), "2s", &store);
    wait_for_fires(dir.path(), 2);
    let mut b = crate::serve_on("b", dir.path(), "2s", &store);
    b.wait_for(&["campaigning"]);
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    b.wait_for(&["scheduled run ended"]);
    let ran = fires(dir.path()).len();
    wait_for_fires(dir.path(), ran + 2);
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
    let mut lines = a.lines();
    lines.extend(b.lines());
    assert_each_fire_time_once(dir.path(), &lines);
}

/// Under spread placement the schedule follows its service's claim: of two hosts, the one
/// that holds `job` runs it; killed, the other takes the claim over and goes on, and no fire
/// time of `job` runs twice or is lost.
#[test]
fn under_spread_placement_the_schedule_follows_the_services_claim() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = schedule_dir("test/fire-command", "catch-up = \"all\"\n");
    std::fs::copy(
        guests::guest("test/fire-command"),
        dir.path().join("services/other.wasm"),
    )
    .unwrap();
    let other_data = dir.path().join("other-data");
    std::fs::create_dir(&other_data).unwrap();
    let settings = std::fs::read_to_string(dir.path().join("vvm.toml")).unwrap();
    std::fs::write(
        dir.path().join("vvm.toml"),
        format!(
            "placement = \"spread\"\n{settings}[service.other]\nschedule = \"* * * * * *\"\n\
             dirs = [{:?}]\n",
            format!("{}:/data", other_data.display())
        ),
    )
    .unwrap();
    let names = ["job".to_owned(), "other".to_owned()];
    let a = serve("a", dir.path(), "1s");
    let b = serve("b", dir.path(), "1s");
    testkit::spread::wait_for_rest(&[&a, &b], &names, &[1, 1]);
    wait_for_fires(dir.path(), 2);
    let (mut holder, mut rest) = if testkit::spread::running(&a).contains("job") {
        (a, b)
    } else {
        (b, a)
    };
    holder.signal(Signal::KILL);
    let _ = holder.wait_exit();
    testkit::spread::wait_for_rest(&[&rest], &names, &[2]);
    let ran = fires(dir.path()).len();
    wait_for_fires(dir.path(), ran + 2);
    rest.signal(Signal::TERM);
    assert!(rest.wait_exit().success());
    let mut lines = holder.lines();
    lines.extend(rest.lines());
    assert_each_fire_time_once(dir.path(), &lines);
}

/// A schedule changed in `vvm.toml` and reloaded (SIGHUP) applies from the next fire time,
/// without a restart of the service: every 2 s, then every second.
#[test]
fn a_reloaded_schedule_applies_from_the_next_fire_time() {
    let dir = schedule_dir("test/fire-command", "");
    let toml = dir.path().join("vvm.toml");
    let every_second = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        every_second.replace("\"* * * * * *\"", "\"*/2 * * * * *\""),
    )
    .unwrap();
    let mut host = serve("a", dir.path(), "5s");
    wait_for_fires(dir.path(), 2);
    let before: Vec<i64> = fires(dir.path()).into_keys().collect();
    assert!(before.iter().all(|f| f % 2 == 0), "{before:?}");
    std::fs::write(&toml, every_second).unwrap();
    let mark = host.mark();
    host.signal(Signal::HUP);
    host.wait_for_from(mark, &["schedule changed", "* * * * * *"]);
    let ran = fires(dir.path()).len();
    wait_for_fires(dir.path(), ran + 3);
    let after: Vec<i64> = fires(dir.path()).into_keys().skip(ran).collect();
    assert!(
        after.windows(2).any(|w| w[1] - w[0] == 1),
        "still every 2 s: {after:?}"
    );
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}
