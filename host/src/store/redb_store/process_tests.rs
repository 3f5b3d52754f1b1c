//! Real processes on one store file: the test binary runs itself again as children (see
//! [`child_main`]) that hammer compare-and-swap on a shared counter record.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::RedbStore;
use crate::store::TtlStore;

/// Tells the test binary to act as a child: the role, then the store path.
const ROLE_ENV: &str = "VVM_REDB_CHILD_ROLE";
const PATH_ENV: &str = "VVM_REDB_CHILD_PATH";
/// The counter every child increments by compare-and-swap.
const COUNTER: &str = "counter";
const TTL: Duration = Duration::from_hours(1);
/// Bounds a test that would otherwise hang on a stuck child.
const CHILD_DEADLINE: Duration = Duration::from_mins(1);

/// Starts this test binary as a child running [`child_main`] with `role` on `path`.
fn spawn_child(role: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "store::redb_store::process_tests::child_main",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, role)
        .env(PATH_ENV, path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Forwards the child's report lines (`@@ <n>`: its n-th increment committed) to a channel.
fn reports(child: &mut Child) -> mpsc::Receiver<u64> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("@@ ").and_then(|n| n.parse().ok())
                && tx.send(n).is_err()
            {
                break;
            }
        }
    });
    rx
}

/// Waits for `child` to exit, killing it at the deadline; true if it succeeded.
fn wait_success(child: &mut Child, deadline: Instant) -> bool {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Entry point of the child processes; does nothing in an ordinary test run.
#[test]
#[ignore = "run by the tests of this module as their child processes"]
fn child_main() {
    let (Ok(role), Some(path)) = (std::env::var(ROLE_ENV), std::env::var_os(PATH_ENV)) else {
        return;
    };
    let path = PathBuf::from(path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedbStore::open(&path).await.unwrap();
        // `increment N` stops after N increments, `increment` runs until killed.
        let count: Option<u64> = role.strip_prefix("increment ").map(|n| n.parse().unwrap());
        let mut done = 0;
        while count.is_none_or(|n| done < n) {
            increment(&store).await;
            done += 1;
            println!("@@ {done}");
        }
    });
}

/// Adds one to the counter by read + compare-and-swap, retrying until the swap wins.
async fn increment(store: &RedbStore) {
    loop {
        let current = match store.get(COUNTER).await {
            Ok(record) => record.expect("the counter exists").value,
            Err(e) if e.is_transient() => continue,
            Err(e) => panic!("{e}"),
        };
        let next = (current.parse::<u64>().unwrap() + 1).to_string();
        match store.compare_and_swap(COUNTER, &current, &next, TTL).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
    }
}

async fn counter(store: &RedbStore) -> u64 {
    store
        .get(COUNTER)
        .await
        .unwrap()
        .unwrap()
        .value
        .parse()
        .unwrap()
}

async fn new_counter(path: &Path) -> RedbStore {
    let store = RedbStore::open(path).await.unwrap();
    store
        .insert_if_absent(COUNTER, "0", TTL)
        .await
        .unwrap()
        .unwrap();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_hammering_cas_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = new_counter(&path).await;
    let mut children = [
        spawn_child("increment 150", &path),
        spawn_child("increment 150", &path),
    ];
    let deadline = Instant::now() + CHILD_DEADLINE;
    for child in &mut children {
        assert!(wait_success(child, deadline), "a child failed");
    }
    assert_eq!(
        counter(&store).await,
        300,
        "every committed increment is there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_killed_mid_run_leaves_the_file_usable_and_the_other_working() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = new_counter(&path).await;
    let mut victim = spawn_child("increment", &path);
    let mut survivor = spawn_child("increment 300", &path);
    let victim_reports = reports(&mut victim);
    let deadline = Instant::now() + CHILD_DEADLINE;

    // Kill the victim in the middle of its run, while both write.
    let mut victim_done = 0;
    while victim_done < 30 {
        victim_done = victim_reports
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the victim makes progress");
    }
    assert!(
        survivor.try_wait().unwrap().is_none(),
        "the survivor was still writing"
    );
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    // Increments it committed after the last line we read, and at most one it committed
    // without living to report.
    victim_done = victim_reports.try_iter().last().unwrap_or(victim_done);

    assert!(
        wait_success(&mut survivor, deadline),
        "the survivor went on after the kill"
    );
    assert_eq!(store.get(COUNTER).await.unwrap().unwrap().term, 1);
    store.close().await;

    // The file reopened afterwards holds the last committed state and takes writes.
    let reopened = RedbStore::open(&path).await.unwrap();
    let total = counter(&reopened).await;
    assert!(
        total == 300 + victim_done || total == 300 + victim_done + 1,
        "counter {total}: survivor 300 + victim {victim_done} (+1 unreported)"
    );
    increment(&reopened).await;
    assert_eq!(counter(&reopened).await, total + 1);
    let term = reopened
        .insert_if_absent("new", "x", TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(reopened.compare_and_delete("new", "x").await.unwrap());
    assert!(
        reopened
            .insert_if_absent("new", "y", TTL)
            .await
            .unwrap()
            .unwrap()
            > term
    );
}
