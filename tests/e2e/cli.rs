//! The command line as an operator meets it: `status` beside a serving host, `check`, and
//! signals during shutdown (SPEC §8).

use std::io::{Read, Seek};
use std::path::Path;
use std::process::Command;

use rustix::process::Signal;

use testkit::guests;
use testkit::host::{Host, cluster_dir};

use crate::{BIN, serve};

/// Runs the binary in `dir` to its end: whether it succeeded, and its stdout and stderr. A
/// run that has not ended after 30 s is killed and fails the test: no input may hang it.
fn run(dir: &Path, args: &[&str]) -> (bool, String) {
    let mut out = tempfile::tempfile().unwrap();
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "off")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out.try_clone().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{args:?}: no exit within 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    out.rewind().unwrap();
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    (status.success(), text)
}

#[test]
fn status_shows_the_holder_and_term_while_a_host_serves_the_same_file() {
    let dir = cluster_dir();
    let mut host = serve("a", dir.path(), "20s");
    let leading = host.wait_for(&["leading"]);
    let v: serde_json::Value = serde_json::from_str(&leading.text).unwrap();
    let term = v["fields"]["term"].as_u64().unwrap();
    let holder_line = host.wait_for(&["\"holder\""]);
    let h: serde_json::Value = serde_json::from_str(&holder_line.text).unwrap();
    let holder = h["fields"]["holder"].as_str().unwrap().to_owned();

    let (ok, text) = run(dir.path(), &["status", "--cluster-size", "2"]);
    assert!(ok, "{text}");
    let slot1 = text.lines().find(|l| l.starts_with("1 ")).unwrap();
    assert!(slot1.contains(&holder), "{text}");
    assert!(slot1.contains(&format!(" {term} ")), "{text}");
    let slot2 = text.lines().find(|l| l.starts_with("2 ")).unwrap();
    assert!(slot2.contains("(free)"), "{text}");

    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
    let (_, text) = run(dir.path(), &["status"]);
    let slot1 = text.lines().find(|l| l.starts_with("1 ")).unwrap();
    assert!(slot1.contains("(free)"), "released on shutdown: {text}");
}

#[test]
fn check_names_every_bad_file_and_exits_non_zero() {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(guests::guest("rust-ticker"), services.join("ticker.wasm")).unwrap();
    std::fs::copy(guests::guest("rust-command"), services.join("cmd.wasm")).unwrap();
    let (ok, text) = run(dir.path(), &["check"]);
    assert!(ok, "{text}");
    assert!(text.contains("ticker (vvm:host/service)"), "{text}");
    assert!(text.contains("cmd (wasi:cli/command)"), "{text}");

    std::fs::copy(
        guests::guest("test/truncated"),
        services.join("broken.wasm"),
    )
    .unwrap();
    std::fs::copy(
        guests::guest("test/other-world"),
        services.join("alien.wasm"),
    )
    .unwrap();
    // A name no log line, status table or store key can carry as it is.
    std::fs::copy(
        guests::guest("rust-ticker"),
        services.join("new\nline.wasm"),
    )
    .unwrap();
    let (ok, text) = run(dir.path(), &["check", "services"]);
    assert!(!ok, "{text}");
    assert!(text.contains("broken.wasm"), "{text}");
    assert!(text.contains("alien.wasm"), "{text}");
    assert!(
        text.contains("new\\nline.wasm: the name has a control character"),
        "{text}"
    );
    assert!(text.contains("2 ok, 3 bad"), "{text}");
    // What to change, below the error it is about.
    let alien = text.lines().position(|l| l.contains("alien.wasm")).unwrap();
    let help = text.lines().nth(alien + 1).unwrap();
    assert!(
        help.starts_with("  help: target the `service` world"),
        "{text}"
    );
}

/// `check` says what to change, the way rustc's `help:` lines do: for a component importing
/// what the host does not provide, which import; for a service whose imports need a grant it
/// lacks, which grant (and nothing once it has it).
#[test]
fn check_says_what_to_change_for_a_foreign_import_and_a_missing_grant() {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(
        guests::guest("test/foreign-import"),
        services.join("foreign.wasm"),
    )
    .unwrap();
    std::fs::copy(
        guests::guest("test/http-client"),
        services.join("caller.wasm"),
    )
    .unwrap();
    let (ok, text) = run(dir.path(), &["check"]);
    assert!(!ok, "{text}");
    assert!(text.contains("error "), "{text}");
    assert!(
        text.contains("  help: remove the import of `acme:db/query@1.0.0`"),
        "{text}"
    );
    assert!(text.contains("ok    caller (vvm:host/service)"), "{text}");
    assert!(
        text.contains("  note: it imports wasi:http/outgoing-handler, but no origin is granted"),
        "{text}"
    );
    assert!(
        text.contains("  help: add the origins it may call to [service.caller] in vvm.toml"),
        "{text}"
    );

    std::fs::remove_file(services.join("foreign.wasm")).unwrap();
    std::fs::write(
        dir.path().join("vvm.toml"),
        "[service.caller]\nhttp = [\"https://api.example.com\"]\n",
    )
    .unwrap();
    let (ok, text) = run(dir.path(), &["check"]);
    assert!(ok, "{text}");
    assert!(!text.contains("note:"), "{text}");
}

/// Bad input gets one line that names the thing and gives the reason once. The error types
/// carry their cause in their own message (log fields show only that), so the causes printed
/// after it must not say it again.
#[test]
fn bad_input_is_one_line_that_gives_each_reason_once() {
    let dir = testkit::scratch::scratch_dir();
    std::fs::write(dir.path().join("garbage.redb"), "not a database\n").unwrap();
    // Sparse: far past any configuration file, taking no disk.
    std::fs::File::create(dir.path().join("huge.toml"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    testkit::fifo(&dir.path().join("fifo.toml"));
    std::fs::write(
        dir.path().join("unset.toml"),
        "[service.s.config]\ntoken = { env = \"VVM_E2E_NEVER_SET\" }\n",
    )
    .unwrap();
    let etcd_ca = [
        "serve",
        "--store",
        "etcd://127.0.0.1:1",
        "--etcd-ca",
        "/dev/zero",
    ];
    let cases: [(&[&str], &str); 17] = [
        (&["serve", "--store", "/"], "Is a directory"),
        (&["serve", "--lock-dir", "/proc/none"], "setting lock-dir"),
        (&["serve", "--services", "new\nline"], "new\\nline"),
        (&["serve", "--store", ""], "is empty"),
        (
            &["status", "--store", "garbage.redb"],
            "Not a redb database",
        ),
        (&["serve", "--services", "/dev/null"], "Not a directory"),
        (&["check", "missing"], "No such file or directory"),
        (
            &["serve", "--config", "missing.toml"],
            "No such file or directory",
        ),
        (&["serve", "--store", "etcd://"], "names no endpoint"),
        // Files that never end, or never answer: refused, unread.
        (&["serve", "--config", "/dev/zero"], "not a regular file"),
        (&["serve", "--config", "fifo.toml"], "not a regular file"),
        (&["serve", "--config", "huge.toml"], "too large"),
        (&etcd_ca, "not a regular file"),
        (
            &["serve", "--config", "unset.toml"],
            "service s: config key \"token\": environment variable VVM_E2E_NEVER_SET is not set",
        ),
        (&["kv", "list", "default", "--bucket"], "own namespace"),
        (&["kv", "get", "a/b", "k"], "not a service name"),
        (
            &["kv", "list", "svc", "--store", "missing.redb"],
            "No such file",
        ),
    ];
    for (args, reason) in cases {
        let (ok, text) = run(dir.path(), args);
        assert!(!ok, "{args:?} succeeded: {text}");
        let errors: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("vvm-host: error: "))
            .collect();
        assert_eq!(errors.len(), 1, "{args:?}: {text}");
        assert_eq!(errors[0].matches(reason).count(), 1, "{args:?}: {text}");
    }
}

/// A log reader that goes away (a closed pipe: a log shipper restarted, `| head`) costs the
/// host its log lines, not its life: it still leads, and shuts down in order on SIGTERM.
#[test]
fn a_closed_log_pipe_does_not_end_the_host() {
    use std::io::BufRead;

    let dir = cluster_dir();
    let mut host = Command::new(BIN)
        .args(["serve", "--lease", "1s"])
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = std::io::BufReader::new(host.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("tick 1") {
        line.clear();
        assert_ne!(log.read_line(&mut line).unwrap(), 0, "the log ended early");
    }
    drop(log);
    // The ticker logs every second: two lines at least meet the closed pipe.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    leads_then_stops_in_order(dir.path(), host);
}

/// `host`, serving in `dir`, still runs and leads; on SIGTERM it shuts down in order.
fn leads_then_stops_in_order(dir: &Path, mut host: std::process::Child) {
    assert_eq!(host.try_wait().unwrap(), None, "the host ended");
    let (_, text) = run(dir, &["status"]);
    let slot1 = text.lines().find(|l| l.starts_with("1 ")).unwrap();
    assert!(!slot1.contains("(free)"), "still leads: {text}");
    let pid = rustix::process::Pid::from_child(&host);
    rustix::process::kill_process(pid, Signal::TERM).unwrap();
    assert!(host.wait().unwrap().success());
    let (_, text) = run(dir, &["status"]);
    assert!(text.contains("(free)"), "released on shutdown: {text}");
}

/// A log reader that stalls (a pipe nobody reads: a stuck shipper, a `| tee` to a hung disk)
/// costs the host the lines it cannot write, not its lease. Writing them blocked whatever
/// thread logged, the renewals stalled, and the killer ended the leader once the pipe was
/// full: at L = 1 s with debug logs into 4 KiB, within seconds.
#[test]
fn a_stalled_log_reader_does_not_cost_the_lease() {
    let dir = cluster_dir();
    let (reader, writer) = std::io::pipe().unwrap();
    rustix::pipe::fcntl_setpipe_size(&writer, 4096).unwrap();
    let host = Command::new(BIN)
        .args(["serve", "--lease", "1s"])
        .current_dir(dir.path())
        .env("RUST_LOG", "debug,wasmtime=info,cranelift=info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(writer)
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(10));
    leads_then_stops_in_order(dir.path(), host);
    drop(reader);
}

/// `status` and `check` into a pipe whose reader is gone (`| head -1`) end quietly, with
/// success: the reader has what it wanted.
#[test]
fn status_and_check_into_a_closed_pipe_end_quietly() {
    let dir = cluster_dir();
    let mut host = serve("a", dir.path(), "20s");
    host.wait_for(&["leading"]);
    for args in [&["status"][..], &["check"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

#[test]
fn a_second_signal_during_shutdown_exits_at_once() {
    let dir = cluster_dir();
    std::fs::copy(
        guests::guest("test/spin"),
        dir.path().join("services/spinner.wasm"),
    )
    .unwrap();
    // A spinning guest holds the shutdown in its 60 s grace period.
    let mut host = Host::start(
        BIN,
        "a",
        dir.path(),
        &["serve", "--grace-period", "60s", "--cache-dir", "cache"],
        "info",
    );
    host.wait_for(&["tick 1:"]);
    host.signal(Signal::TERM);
    host.wait_for(&["shutting down"]);
    host.signal(Signal::INT);
    let status = host.wait_exit_or(std::time::Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(130));
}

/// A signal while the services compile before serving (minutes, for a directory of large
/// guests on a cold cache) stops the host after the file being compiled, not after them all.
#[test]
fn a_signal_while_the_services_compile_stops_after_the_one_being_compiled() {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    // Each a new version, so each one compiles.
    let ticker_len = std::fs::metadata(guests::guest("rust-ticker"))
        .unwrap()
        .len();
    let first = usize::try_from(ticker_len).unwrap() + 64;
    for i in 0..60 {
        let bytes = crate::live_dir::padded_ticker(first + i);
        std::fs::write(services.join(format!("s{i:02}.wasm")), bytes).unwrap();
    }
    let mut host = Host::start(BIN, "a", dir.path(), &["serve"], "info");
    host.wait_for(&["service loaded"]);
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
    let loaded = host
        .lines()
        .iter()
        .filter(|l| l.text.contains("service loaded"))
        .count();
    // Not all of them (on main: 60). Each takes tens of ms in a debug build, so a busy
    // machine that is slow to deliver the signal still leaves a wide margin.
    assert!(
        loaded < 30,
        "{loaded} of 60 services loaded after the signal"
    );
    assert!(
        !host.lines().iter().any(|l| l.text.contains("campaigning")),
        "it campaigned"
    );
}

/// A store that goes bad while serving (its file overwritten: "DB corrupted") is a problem
/// that retrying at once cannot fix: the host stops its services, then backs off (L, 2·L,
/// ...) between campaigns instead of campaigning thousands of times a second.
///
/// The overwrite lands right after a renewal, with the next one L/4 = 5 s away, so no commit
/// of the host's is under way to write over the garbage (one that is makes it a valid file
/// again, which every reader then reads alike: nothing to notice). The host notices within a
/// second either way: its store reads the file afresh (`redb_store/scrub.rs`); before that,
/// redb alone noticed only at the next write, and only if no commit had written the header
/// back meanwhile (3 runs in 5 it had not noticed within 60 s).
#[test]
fn a_store_gone_bad_while_serving_is_retried_with_backoff_not_in_a_loop() {
    let dir = cluster_dir();
    let mut host = serve("a", dir.path(), "20s");
    let (started, _) = host.wait_for_from(0, &["ticker started"]);
    host.wait_for_from(started, &["\"renewed\""]);
    let from = host.mark();
    let store = dir.path().join("vvm.redb");
    let garbage = vec![0x5a_u8; usize::try_from(std::fs::metadata(&store).unwrap().len()).unwrap()];
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&store)
        .unwrap();
    std::io::Write::write_all(&mut file, &garbage).unwrap();
    drop(file);
    let (noticed, _) = host.wait_for_from(from, &["DB corrupted"]);
    // The lease is lost at the next renewal; the campaign that follows meets the store's
    // error, a problem of this host's own: it backs off for L before the next.
    let (backing_off, _) = host.wait_for_from(noticed, &["local problem: backing off"]);
    std::thread::sleep(std::time::Duration::from_secs(4));
    let campaigns = host
        .lines()
        .iter()
        .skip(backing_off)
        .filter(|l| l.text.contains("\"campaigning\""))
        .count();
    assert!(
        campaigns <= 1,
        "{campaigns} campaigns within 4 s of backing off from the store going bad"
    );
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

#[test]
fn after_a_problem_the_host_shuts_down_and_campaigns_again() {
    let dir = cluster_dir();
    std::fs::copy(
        guests::guest("test/trap"),
        dir.path().join("services/trapper.wasm"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("vvm.toml"),
        "[service.trapper]\non-failure = \"hand-over\"\n",
    )
    .unwrap();
    let mut host = serve("a", dir.path(), "20s");
    let (first, _) = host.wait_for_from(0, &["leading"]);
    // The trapping guest's failure hands the lease over: a problem.
    let (problem, _) = host.wait_for_from(first, &["shutting down, then standing by"]);
    let (again, line) = host.wait_for_from(problem, &["leading"]);
    assert!(again > problem);
    let term = |text: &str| {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["fields"]["term"].as_u64().unwrap()
    };
    assert!(term(&line.text) > term(&host.lines()[first].text));
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// SPEC §8: no process can stall another. While a leader serves with L = 1 s, a standby is
/// paused (SIGSTOP, as Ctrl-Z does) at random moments for up to L, and resumed for up to
/// 300 ms. The leader never loses its lease: every lock wait in the store is bounded. A
/// standby is a writer too (its candidacy is rewritten every quarter of its life, and its
/// campaign looks at the slot when the lease would run out): stopped inside one of its own
/// transactions it holds the store file's lock, and costs the leader its lease by design
/// (docs/guarantees.md, "No process stalls another"). Such a stop is let go at once and not
/// counted. (The read-only commands, which take no lock a writer waits for, have a test of
/// their own below.)
#[test]
fn a_stopped_standby_never_costs_the_leader_its_lease() {
    use std::time::{Duration, Instant};

    let _heavy = crate::one_heavy_test_at_a_time();

    let trials: usize = std::env::var("VVM_STOP_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let dir = cluster_dir();
    let leader = serve("leader", dir.path(), "1s");
    leader.wait_for(&["tick 1:"]);
    let standby = serve("standby", dir.path(), "1s");
    // Its campaign's writes are done: from here on it only waits. (A host stopped inside a
    // write holds the file's write lock, and costs the leader its lease by design.)
    standby.wait_for(&["standing as a candidate"]);
    let mut random = Xorshift::seeded("stop trials");
    let started = Instant::now();
    let mut inside = 0;
    let mut trial = 0;
    while trial < trials {
        standby.stop();
        if standby.holds_lock_on("vvm.redb") {
            // Inside a transaction of its own: let it run until the transaction ends (its
            // commit may wait long for the disk), and stop it again.
            standby.signal(Signal::CONT);
            inside += 1;
            let end = Instant::now() + testkit::host::PATIENCE;
            while standby.holds_lock_on("vvm.redb") {
                assert!(
                    Instant::now() < end,
                    "the standby held the store file's lock for {:?}; its last lines:\n{}",
                    testkit::host::PATIENCE,
                    tail(&standby.lines()),
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        trial += 1;
        std::thread::sleep(Duration::from_millis(random.below(1000)));
        standby.signal(Signal::CONT);
        // It runs a while between two stops, as a paused process does.
        std::thread::sleep(Duration::from_millis(random.below(300)));
        let lines = leader.lines();
        assert!(
            !lines.iter().any(|l| l.text.contains("lost")),
            "trial {trial}: the leader lost its lease; its last lines:\n{}\nthe standby's:\n{}",
            tail(&lines),
            tail(&standby.lines()),
        );
    }
    println!(
        "stop trials: {trials} in {:?} ({inside} more stopped inside a transaction of the \
         standby's own, let go); the leader kept its lease",
        started.elapsed()
    );
    let acquired: Vec<String> = leader
        .lines()
        .into_iter()
        .filter(|l| l.text.contains("\"acquired\""))
        .map(|l| l.text)
        .collect();
    assert_eq!(
        acquired.len(),
        1,
        "the leader held one lease throughout: {acquired:#?}"
    );
    let mut leader = leader;
    leader.signal(Signal::TERM);
    assert!(leader.wait_exit().success(), "the leader was never killed");
}

/// Issue 39: the read-only commands, stopped (SIGSTOP, as Ctrl-Z does) at random moments of
/// their reads for random times up to 2·L, never cost a leader at L = 1 s its lease, while a
/// guest writes to the store as fast as it may: `status`, `kv list`, `kv get` and `check`.
/// They run in waves of [`READERS`] at once. Each is stopped at a random moment within
/// 3 ms of opening the store file (watched for in `/proc`), where it reads (`check`, which
/// never opens it, within its first 12 ms), and continued at its own random time; each must
/// then still answer. A reader that held the store file's header lock while stopped stalled
/// every commit of the leader, which lost its lease (`renewal failed ... held a lock on the
/// store file`).
#[test]
fn stopped_readers_never_cost_the_leader_its_lease() {
    use std::time::{Duration, Instant};

    const READERS: usize = 8;
    let _heavy = crate::one_heavy_test_at_a_time();
    let waves: usize = std::env::var("VVM_READER_WAVES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let dir = cluster_dir();
    let flood = guests::guest("test/kv-flood");
    std::fs::copy(flood, dir.path().join("services/flood.wasm")).unwrap();
    let leader = serve("leader", dir.path(), "1s");
    leader.wait_for(&["tick 1:"]);
    leader.wait_for(&["flood: "]);
    let commands: [&[&str]; 4] = [
        &["status"],
        &["kv", "list", "flood"],
        &["kv", "get", "flood", "n"],
        &["check"],
    ];
    let mut random = Xorshift::seeded("stopped readers");
    let started = Instant::now();
    for wave in 0..waves {
        let readers: Vec<_> = (0..READERS)
            .map(|i| {
                let args = commands[(wave * READERS + i) % commands.len()];
                let child = Command::new(BIN)
                    .args(args)
                    .current_dir(dir.path())
                    .env("RUST_LOG", "off")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                let into_read = Duration::from_micros(random.below(3000));
                let stopped_for = Duration::from_millis(random.below(2000));
                std::thread::spawn(move || {
                    let child = child;
                    let opened = Instant::now() + Duration::from_millis(12);
                    let stop_at = if args[0] == "check" {
                        opened
                    } else {
                        store_opened_by(&child).unwrap_or(opened)
                    };
                    std::thread::sleep(
                        (stop_at + into_read).saturating_duration_since(Instant::now()),
                    );
                    if kill(&child, Signal::STOP).is_ok() {
                        std::thread::sleep(stopped_for);
                        let _ = kill(&child, Signal::CONT);
                    }
                    let out = child.wait_with_output().unwrap();
                    (
                        out.status,
                        String::from_utf8_lossy(&out.stderr).into_owned(),
                        args,
                    )
                })
            })
            .collect();
        for reader in readers {
            let (exit, stderr, args) = reader.join().unwrap();
            assert!(
                exit.success(),
                "wave {wave}: {args:?} failed: {exit}: {stderr}"
            );
        }
        let lines = leader.lines();
        assert!(
            !lines.iter().any(|l| l.text.contains("lost")),
            "wave {wave}: the leader lost its lease; its last lines:\n{}",
            tail(&lines),
        );
    }
    println!(
        "stopped readers: {waves} waves of {READERS} in {:?}; the leader kept its lease",
        started.elapsed()
    );
    let acquired = leader
        .lines()
        .iter()
        .filter(|l| l.text.contains("\"acquired\""))
        .count();
    assert_eq!(acquired, 1, "the leader held one lease throughout");
    let mut leader = leader;
    leader.signal(Signal::TERM);
    assert!(leader.wait_exit().success(), "the leader was never killed");
}

/// When `child` opened the store file (`vvm.redb`), watched for in `/proc/PID/fd` every
/// 200 µs; `None` if it ended first or took more than 2 s.
fn store_opened_by(child: &std::process::Child) -> Option<std::time::Instant> {
    let fds = std::path::PathBuf::from(format!("/proc/{}/fd", child.id()));
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < give_up {
        let entries = std::fs::read_dir(&fds).ok()?;
        let open = entries.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target.ends_with("vvm.redb"))
        });
        if open {
            return Some(std::time::Instant::now());
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    None
}

/// Sends `signal` to `child`; an error if it has ended already.
fn kill(child: &std::process::Child, signal: Signal) -> rustix::io::Result<()> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, signal)
}

/// A small xorshift generator: random moments, reproducible from the printed seed.
struct Xorshift(u64);

impl Xorshift {
    /// Seeded from the clock; the seed is printed under `what`.
    fn seeded(what: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let seed = u64::from(nanos) | 1;
        println!("{what}: seed {seed}");
        Self(seed)
    }

    /// A number below `n`.
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The last 40 lines of a host's log, for a failure message.
fn tail(lines: &[testkit::host::Line]) -> String {
    let from = lines.len().saturating_sub(40);
    lines[from..]
        .iter()
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
