//! The live services directory (SPEC §6): `.wasm` files added, replaced and removed while
//! real hosts serve, on the leader and on a standby; SIGHUP re-reads the configuration; status
//! shows the running services.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::{Host, Line};

use crate::{BIN, serve, stamp};

/// A directory with an empty `services/`, and its path.
fn empty_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    (dir, services)
}

/// A host serving `dir` with a 2 s lease (renewals every 500 ms), its services followed.
fn host(name: &'static str, dir: &Path) -> Host {
    let host = serve(name, dir, "2s");
    host.wait_for(&["following the services directory"]);
    host
}

/// `"service":"NAME"`, as the JSON log lines carry it.
fn tag(service: &str) -> String {
    format!("\"service\":\"{service}\"")
}

/// Lines of `host` from index `from` containing every needle.
fn lines_with(host: &Host, from: usize, needles: &[&str]) -> Vec<Line> {
    host.lines()
        .into_iter()
        .skip(from)
        .filter(|l| needles.iter().all(|n| l.text.contains(n)))
        .collect()
}

/// The ticker padded with a custom section to `size` bytes: a valid component, a new version.
pub(crate) fn padded_ticker(size: usize) -> Vec<u8> {
    let mut bytes = std::fs::read(guests::guest("rust-ticker")).unwrap();
    let name = b"padding";
    let payload = size.saturating_sub(bytes.len() + name.len() + 7);
    let mut section = Vec::new();
    leb128(&mut section, name.len());
    section.extend_from_slice(name);
    section.resize(section.len() + payload, 0);
    bytes.push(0); // custom section id
    leb128(&mut bytes, section.len());
    bytes.extend_from_slice(&section);
    bytes
}

fn leb128(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Added, replaced by a good version (the old one hears the stop and ends in its grace
/// period, the new one runs under the same lease), replaced by a bad one (the good one keeps
/// running, the log names the file and the reason), removed (stopped): each one log line.
#[test]
fn services_are_added_replaced_and_removed_while_serving() {
    let (dir, services) = empty_dir();
    let mut a = host("a", dir.path());
    a.wait_for(&["services started"]);
    let file = services.join("svc.wasm");

    std::fs::copy(guests::guest("rust-ticker"), &file).unwrap();
    a.wait_for(&["service added", &tag("svc")]);
    let (started, _) = a.wait_for_from(0, &[&tag("svc"), "tick 1:"]);
    let term = a.wait_for(&["leading"]);

    // Replaced in place with another component.
    let mark = a.mark();
    std::fs::write(&file, std::fs::read(guests::guest("rust-counter")).unwrap()).unwrap();
    let (replaced, _) = a.wait_for_from(mark, &["service replaced", &tag("svc")]);
    let (stopping, _) = a.wait_for_from(mark, &[&tag("svc"), "ticker stopping"]);
    let (counted, _) = a.wait_for_from(mark, &[&tag("svc"), "count 1"]);
    assert!(started < replaced && replaced < stopping && stopping < counted);
    assert_eq!(
        lines_with(&a, 0, &["\"leading\""]).len(),
        1,
        "the same lease throughout: {term:?}"
    );

    // Replaced with a file that is no component: the counter keeps counting.
    let mark = a.mark();
    std::fs::write(&file, b"\0asm\x0d\0\x01\0 truncated").unwrap();
    let (rejected, line) = a.wait_for_from(mark, &["service rejected", &tag("svc")]);
    assert!(
        line.text.contains("svc.wasm") && line.text.contains("not a valid component"),
        "names the file and the reason: {}",
        line.text
    );
    let (later, _) = a.wait_for_from(rejected + 1, &[&tag("svc"), "count "]);
    assert!(later > rejected);
    assert!(lines_with(&a, mark, &["service removed"]).is_empty());

    // Replaced with a file far past any component's size (sparse: it takes no disk): refused
    // by its size, unread, and the counter keeps counting.
    let mark = a.mark();
    std::fs::File::create(&file)
        .unwrap()
        .set_len(64 << 30)
        .unwrap();
    let (rejected, line) = a.wait_for_from(mark, &["service rejected", &tag("svc")]);
    assert!(
        line.text.contains("svc.wasm") && line.text.contains("too large"),
        "names the file and the reason: {}",
        line.text
    );
    let (later, _) = a.wait_for_from(rejected + 1, &[&tag("svc"), "count "]);
    assert!(later > rejected);
    assert!(lines_with(&a, mark, &["service removed"]).is_empty());

    // Removed: stopped, and nothing of it runs any more.
    let mark = a.mark();
    std::fs::remove_file(&file).unwrap();
    let (removed, _) = a.wait_for_from(mark, &["service removed", &tag("svc")]);
    a.wait_for_from(removed, &[&tag("svc"), "stopped within grace"]);
    std::thread::sleep(Duration::from_millis(1500));
    let after = a.mark();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        lines_with(&a, after, &[&tag("svc"), "count "]).is_empty(),
        "a removed service still runs"
    );
    for change in ["service added", "service replaced", "service removed"] {
        assert_eq!(lines_with(&a, 0, &[change]).len(), 1, "{change}: one line");
    }

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// A 12 MB component copied slowly (written in chunks over about 1.5 s, the file open
/// throughout) is loaded once, complete, after its writer closes it: never half-written.
/// Loading a large component logs when it started and how long it took.
#[test]
fn a_slow_copy_of_a_large_component_is_loaded_only_when_complete() {
    let (dir, services) = empty_dir();
    let mut a = host("a", dir.path());
    let bytes = padded_ticker(12 << 20);
    let mut out = std::fs::File::create(services.join("big.wasm")).unwrap();
    for chunk in bytes.chunks(1 << 20) {
        out.write_all(chunk).unwrap();
        out.flush().unwrap();
        std::thread::sleep(Duration::from_millis(120));
    }
    let closed = std::time::Instant::now();
    drop(out);
    let added = a.wait_for(&["service added", &tag("big")]);
    assert!(added.at >= closed, "loaded before the copy was complete");
    a.wait_for(&[&tag("big"), "tick 1:"]);
    let loading = a.wait_for(&["loading a large component", &tag("big")]);
    assert!(loading.text.contains(&format!("\"bytes\":{}", bytes.len())));
    assert!(added.text.contains("duration_ms"), "{}", added.text);
    assert!(lines_with(&a, 0, &["service rejected"]).is_empty());
    assert_eq!(lines_with(&a, 0, &["service added"]).len(), 1);
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// A file written under a temporary name and renamed into place is loaded once; the
/// temporary names (dotfiles, `.part`, `~`) are never services. A file rejected at start is
/// not reported again by the first look at the directory.
#[test]
fn a_rename_into_place_is_loaded_and_temporary_names_are_not() {
    let (dir, services) = empty_dir();
    std::fs::write(services.join("bad.wasm"), b"not wasm").unwrap();
    let mut a = host("a", dir.path());
    let ticker = std::fs::read(guests::guest("rust-ticker")).unwrap();
    for temporary in [".moved.wasm.x1Y2", "moved.wasm.part", "moved.wasm~"] {
        std::fs::write(services.join(temporary), &ticker).unwrap();
    }
    std::fs::rename(
        services.join(".moved.wasm.x1Y2"),
        services.join("moved.wasm"),
    )
    .unwrap();
    a.wait_for(&["service added", &tag("moved")]);
    a.wait_for(&[&tag("moved"), "tick 1:"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines_with(&a, 0, &["service added"]).len(), 1);
    assert_eq!(lines_with(&a, 0, &["service running"]).len(), 1);
    assert_eq!(
        lines_with(&a, 0, &["service rejected"]).len(),
        1,
        "bad.wasm, once"
    );
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// 50 files dropped at once: all 50 run, each exactly once.
#[test]
fn fifty_files_dropped_at_once_all_run_once() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let (dir, services) = empty_dir();
    let mut a = host("a", dir.path());
    let ticker = guests::guest("rust-ticker");
    let names: Vec<String> = (0..50).map(|i| format!("s{i:02}")).collect();
    for name in &names {
        std::fs::copy(&ticker, services.join(format!("{name}.wasm"))).unwrap();
    }
    for name in &names {
        a.wait_for(&[&tag(name), "tick 1:"]);
    }
    // Time for a duplicate start to show, were there one.
    std::thread::sleep(Duration::from_secs(1));
    for name in &names {
        assert_eq!(
            lines_with(&a, 0, &["service added", &tag(name)]).len(),
            1,
            "{name}"
        );
        assert_eq!(
            lines_with(&a, 0, &["service running", &tag(name)]).len(),
            1,
            "{name} started more than once"
        );
    }
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// A standby follows the directory too: after a service is added, the standby that takes
/// over runs it with nothing to compile (no load of any kind after it acquires the slot).
/// Status lists the services of the slot, and since when.
#[test]
fn a_standby_that_takes_over_after_an_add_runs_the_new_service_without_compiling() {
    let dir = testkit::host::cluster_dir();
    let mut a = host("a", dir.path());
    a.wait_for(&["rust-ticker", "tick 1:"]);
    let b = host("b", dir.path());
    b.wait_for(&["campaigning"]);

    std::fs::copy(
        guests::guest("rust-counter"),
        dir.path().join("services/fresh.wasm"),
    )
    .unwrap();
    a.wait_for(&[&tag("fresh"), "count 1"]);
    let added = b.wait_for(&["service added", &tag("fresh")]);
    assert!(added.text.contains("\"compiled\":true"), "{}", added.text);

    // Status shows both services of slot 1 once a renewal (every 500 ms) has written them.
    let mut listed = Vec::new();
    for _ in 0..40 {
        let out = Command::new(BIN)
            .args(["status", "--json"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let slot = &v["slots"][0];
        listed = slot["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect();
        if listed.len() == 2 {
            assert!(slot["services"][0]["since"].as_u64().unwrap() > 1_700_000_000);
            assert_eq!(slot["services"][0]["version"].as_str().unwrap().len(), 12);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(listed, ["fresh", "rust-ticker"]);
    let table = Command::new(BIN)
        .args(["status"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.contains("service fresh ") && table.contains(" since 20"),
        "{table}"
    );

    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    let (acquired, line) = b.wait_for_from(0, &["acquired"]);
    b.wait_for_from(acquired, &[&tag("fresh"), "count "]);
    let loads: Vec<Line> = b
        .lines()
        .into_iter()
        .skip(acquired)
        .filter(|l| {
            [
                "service added",
                "service replaced",
                "service loaded",
                "loading",
            ]
            .iter()
            .any(|n| l.text.contains(n))
        })
        .collect();
    assert!(
        loads.is_empty(),
        "compiled or loaded after taking over at {}: {loads:?}",
        stamp(&line)
    );
    let mut b = b;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
}

/// SIGHUP re-reads `vvm.toml` with the same checks as at start: a good file's grants apply to
/// the next start of a service, a bad file keeps the old settings and the log says why.
#[test]
fn sighup_rereads_the_configuration_and_a_bad_file_keeps_the_old_settings() {
    let (dir, services) = empty_dir();
    let config = dir.path().join("vvm.toml");
    std::fs::write(&config, "").unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("hello"), "hello").unwrap();
    let mut a = host("a", dir.path());

    // The grants of a service started after the reload are the new ones. (A file written
    // again is re-read on its own too, `config_watch`: each step waits for the line its own
    // file gives, whichever re-read logs it.)
    let mark = a.mark();
    std::fs::write(
        &config,
        format!(
            "[service.late]\ndirs = [\"{}:/data\"]\nenv = [\"NOSY_FILE=/data/hello\"]\n",
            data.display()
        ),
    )
    .unwrap();
    a.signal(Signal::HUP);
    let (_, line) = a.wait_for_from(mark, &["configuration reloaded", "\"grants\":1"]);
    assert!(line.text.contains("\"grants\":1"), "{}", line.text);
    std::fs::copy(guests::guest("test/nosy"), services.join("late.wasm")).unwrap();
    let (_, line) = a.wait_for_from(mark, &[&tag("late"), "file: "]);
    assert!(
        line.text.contains("file: allowed: read 5 bytes"),
        "{}",
        line.text
    );

    let mark = a.mark();
    std::fs::write(&config, "leese = \"2s\"\n").unwrap();
    a.signal(Signal::HUP);
    let (_, line) = a.wait_for_from(mark, &["configuration not reloaded", "leese"]);
    assert!(
        line.text.contains("vvm.toml") && line.text.contains("leese"),
        "{}",
        line.text
    );

    let mark = a.mark();
    std::fs::write(&config, "[service.svc]\nenv = [\"NO-EQUALS\"]\n").unwrap();
    a.signal(Signal::HUP);
    let (_, line) = a.wait_for_from(mark, &["configuration not reloaded", "NO-EQUALS"]);
    assert!(line.text.contains("NO-EQUALS"), "{}", line.text);

    // Replaced by a directory: the reason, once.
    std::fs::remove_file(&config).unwrap();
    std::fs::create_dir(&config).unwrap();
    let mark = a.mark();
    a.signal(Signal::HUP);
    let (_, line) = a.wait_for_from(mark, &["configuration not reloaded", "not a regular file"]);
    assert_eq!(
        line.text.matches("not a regular file").count(),
        1,
        "{}",
        line.text
    );
    std::fs::remove_dir(&config).unwrap();

    let mark = a.mark();
    std::fs::write(&config, "cluster-size = 2\n").unwrap();
    a.signal(Signal::HUP);
    let (_, line) = a.wait_for_from(mark, &["configuration reloaded", "cluster-size"]);
    assert!(line.text.contains("cluster-size"), "{}", line.text);
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

/// The crash lock still works once the leader's record carries its running services: a
/// standby finds the holder's lock by the holder part of the value, and deletes the record
/// by its whole value, well before the lease (20 s) would have let it expire.
#[test]
fn a_killed_leader_whose_record_lists_its_services_is_taken_over_at_once() {
    let dir = testkit::host::cluster_dir();
    let mut a = serve("a", dir.path(), "20s");
    a.wait_for(&["tick 1:"]);
    let b = serve("b", dir.path(), "20s");
    b.wait_for(&["waiting on the holder's lock"]);
    // A's first renewal (at L/4 = 5 s) writes its services into the record.
    let mut listed = false;
    for _ in 0..100 {
        let out = Command::new(BIN)
            .args(["status", "--json"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["slots"][0]["services"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
        {
            listed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(listed, "the leader's renewal did not list its services");
    a.signal(Signal::KILL);
    a.wait_exit();
    // Deleted by compare-and-delete, which only deletes a live record: B did not wait for
    // A's record to expire.
    b.wait_for(&[
        "deleting the record of a holder that is gone",
        "\"deleted\":true",
    ]);
    b.wait_for(&["rust-ticker", "tick 1:"]);
    let mut b = b;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
}

/// The services directory is followed by its path, not by the directory it named at start:
/// a release flipped in by renaming a symlink over it (the usual atomic deploy), and a
/// directory removed and made again, are both followed within about a second.
#[test]
fn a_services_directory_swapped_or_made_again_is_followed() {
    let dir = testkit::scratch::scratch_dir();
    let release = |name: &str, services: &[&str]| {
        let path = dir.path().join("releases").join(name);
        std::fs::create_dir_all(&path).unwrap();
        for service in services {
            std::fs::copy(
                guests::guest("rust-ticker"),
                path.join(format!("{service}.wasm")),
            )
            .unwrap();
        }
        path
    };
    let services = dir.path().join("services");
    std::os::unix::fs::symlink(release("v1", &["one"]), &services).unwrap();
    let a = host("a", dir.path());
    a.wait_for(&["ticker started", &tag("one")]);

    // Flip: a new symlink renamed over the old one.
    let from = a.mark();
    let next = dir.path().join("services.next");
    std::os::unix::fs::symlink(release("v2", &["one", "two"]), &next).unwrap();
    std::fs::rename(&next, &services).unwrap();
    a.wait_for_from(from, &["ticker started", &tag("two")]);
    assert!(
        lines_with(&a, from, &["service removed"]).is_empty(),
        "`one` is in both releases"
    );

    // Gone, then made again with other contents.
    let from = a.mark();
    std::fs::remove_file(&services).unwrap();
    a.wait_for_from(from, &["service removed", &tag("two")]);
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(guests::guest("rust-ticker"), services.join("three.wasm")).unwrap();
    a.wait_for_from(from, &["ticker started", &tag("three")]);
    a.wait_for_from(from, &["service removed", &tag("one")]);
}

/// A service file that is a symlink to a file elsewhere (`services/app.wasm ->
/// /opt/app/current/app.wasm`) follows that file: replaced there, by a rename that no event
/// in the services directory reports, the new version is loaded within about a second.
#[test]
fn a_service_file_linked_from_elsewhere_follows_its_target() {
    let (dir, services) = empty_dir();
    let elsewhere = dir.path().join("builds");
    std::fs::create_dir(&elsewhere).unwrap();
    let target = elsewhere.join("app.wasm");
    std::fs::copy(guests::guest("rust-ticker"), &target).unwrap();
    std::os::unix::fs::symlink(&target, services.join("app.wasm")).unwrap();
    // The follower's looks at a file are at debug.
    let log = "info,vvm_host::elections=debug,vvm_host::runtime::live_dir=debug";
    let a = testkit::host::serve_with(BIN, "a", dir.path(), ["vvm.redb", "2s", "2s"], log);
    a.wait_for(&["ticker started", &tag("app")]);
    // Past the look at every file that follows the start, and before the first recheck of
    // the links: a change from now on is one that only following the link can see.
    a.wait_for(&["service file unchanged", &tag("app")]);

    let from = a.mark();
    let next = elsewhere.join("app.wasm.next");
    let size = usize::try_from(std::fs::metadata(&target).unwrap().len()).unwrap();
    std::fs::write(&next, padded_ticker(size + 100)).unwrap();
    std::fs::rename(&next, &target).unwrap();
    a.wait_for_from(from, &["service replaced", &tag("app")]);
}
