//! Takeover gaps with real `vvm-host serve` processes (SPEC §5), and the lease operations'
//! latency on etcd next to redb, in one run.
//!
//! Run: `cargo bench -p vvm-host --bench takeover` (etcd rows need `etcd` on PATH; without it
//! they are skipped with a message). Every host runs the rust-ticker guest with a warm compile
//! cache; gaps are measured from log timestamps (one wall clock, one machine):
//! - graceful: from sending SIGTERM to the leader to the standby's first guest output line;
//! - SIGKILL: from the kill to the standby's first guest output, next to the lease time the
//!   killed leader's record had left (its last write + L − the kill), at the default L = 20 s
//!   (the crash lock lets the standby go on at once);
//! - `etcdctl elect` (the peer to beat): two `etcdctl elect` processes on the same etcd, from
//!   SIGINT to the leader (on which it resigns) to the standby printing its proposal (read
//!   from its stdout).
//!
//! The three graceful kinds are measured round by round in turn (redb, etcd, `etcdctl
//! elect`, then again), so that the machine's drift over a run falls on all of them alike.
//! Prints median, p90 and min of each, the vvm-host / `etcdctl elect` ratios of the medians,
//! then the graceful takeover split into its steps.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use testkit::etcd::EtcdServer;
use testkit::host::{Host, Line, cluster_dir};
use vvm_host::store::{EtcdOptions, EtcdStore, RedbStore, TtlStore};

const BIN: &str = env!("CARGO_BIN_EXE_vvm-host");

/// Measured runs of each takeover kind, after one warm-up.
const RUNS: usize = 15;
/// Store operations timed per backend, after a tenth as many to warm up.
const OPS: usize = 300;
/// Lease of the graceful runs.
const LEASE: &str = "2s";
/// How long a new standby may settle into waiting before the leader is stopped.
const SETTLE: Duration = Duration::from_millis(150);
/// Lease of the SIGKILL runs on redb: the default, so waiting it out would cost up to 20 s.
const KILL_LEASE: Duration = Duration::from_secs(20);

/// The steps of a graceful takeover, each found by (host, message, target) in the logs.
const STEPS: [(Role, &str, &str); 7] = [
    (Role::Leader, "shutting down", "cli::serve"),
    (Role::Leader, "services stopped", "vvm_host::vvm"),
    (Role::Leader, "released", "elections"),
    (Role::Leader, "shut down", "vvm_host::vvm"),
    (Role::Standby, "acquired", "elections"),
    (Role::Standby, "service running", "supervisor"),
    (Role::Standby, "ticker started", "runtime::host"),
];

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Leader,
    Standby,
}

fn main() {
    let etcd = EtcdServer::start();
    let etcd_url = etcd.as_ref().map(|e| format!("etcd://{}", e.endpoint()));
    let (redb_dir, etcd_dir) = (cluster_dir(), cluster_dir());
    let Graceful {
        redb: graceful_redb,
        etcd: graceful_etcd,
        etcdctl,
    } = graceful_side_by_side(
        redb_dir.path(),
        etcd_url.as_deref().map(|url| (etcd_dir.path(), url)),
        etcd.as_ref().map(EtcdServer::endpoint).as_deref(),
    );
    let killed = sigkill_redb(cluster_dir().path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ops = runtime.block_on(store_latency(etcd.as_ref()));

    println!(
        "\nvvm-host takeover ({RUNS} runs each, release build, rust-ticker guest, temp dir {})",
        std::env::temp_dir().display()
    );
    header("measurement");
    row("graceful takeover, redb (L 2 s)", gaps(&graceful_redb));
    match &graceful_etcd {
        Some(runs) => row("graceful takeover, etcd (L 2 s)", gaps(runs)),
        None => println!("graceful takeover, etcd: skipped (no etcd)"),
    }
    match &etcdctl {
        Some(runs) => row("graceful takeover, etcdctl elect", runs.clone()),
        None => println!("graceful takeover, etcdctl elect: skipped (no etcd or etcdctl)"),
    }
    let lease_ms = KILL_LEASE.as_millis();
    row(
        &format!("SIGKILL takeover, redb (L {lease_ms} ms)"),
        killed.iter().map(|k| k.gap).collect(),
    );
    row(
        "  lease left at the kill",
        killed.iter().map(|k| k.left).collect(),
    );
    row(
        "  takeover − lease left",
        killed
            .iter()
            .map(|k| k.gap.saturating_sub(k.left))
            .collect(),
    );
    for (name, samples) in ops {
        row(&name, samples);
    }

    if let Some(peer) = &etcdctl {
        let peer = median(peer.clone());
        println!(
            "\nratio of medians to `etcdctl elect` ({:.3} ms) in this run",
            ms(peer)
        );
        let ratio = |name: &str, ours: Vec<Duration>, target: &str| {
            println!(
                "{name:<40} {:>8.2}x   (target {target})",
                median(ours).as_secs_f64() / peer.as_secs_f64()
            );
        };
        ratio("graceful takeover, redb", gaps(&graceful_redb), "<= 0.5x");
        if let Some(runs) = &graceful_etcd {
            ratio("graceful takeover, etcd", gaps(runs), "<= 1.0x");
        }
    }

    println!("\ngraceful takeover by step: median ms after SIGTERM to the leader");
    println!("{:<40} {:>10} {:>10}", "step", "redb", "etcd");
    for (i, (role, message, _)) in STEPS.iter().enumerate() {
        let who = if *role == Role::Leader {
            "leader"
        } else {
            "standby"
        };
        let median = |runs: &[Takeover]| {
            let mut v: Vec<Duration> = runs.iter().map(|r| r.steps[i]).collect();
            v.sort();
            format!("{:.2}", ms(v[v.len() / 2]))
        };
        println!(
            "{:<40} {:>10} {:>10}",
            format!("{who}: {message}"),
            median(&graceful_redb),
            graceful_etcd.as_deref().map_or("-".into(), median)
        );
    }
}

/// `vvm-host serve` with its own (reused, so warm) compile cache.
fn serve(name: &'static str, dir: &Path, store: &str, lease: &str) -> Host {
    testkit::host::serve(BIN, name, dir, store, lease)
}

/// One graceful takeover: the gap and the time of each of [`STEPS`] after the SIGTERM.
struct Takeover {
    gap: Duration,
    steps: Vec<Duration>,
}

/// The graceful takeovers of vvm-host on redb, on etcd (`etcd`: its cluster directory and
/// store URL) and of `etcdctl elect` (on the etcd at `endpoint`), interleaved round by round:
/// the machine's speed drifts over a run, and each ratio must compare like with like. One
/// warm-up round each, then [`RUNS`].
fn graceful_side_by_side(
    redb: &Path,
    etcd: Option<(&Path, &str)>,
    endpoint: Option<&str>,
) -> Graceful {
    let mut on_redb = VvmChain::start(redb, "vvm.redb");
    let mut on_etcd = etcd.map(|(dir, url)| VvmChain::start(dir, url));
    let mut elect = endpoint.and_then(ElectChain::start);
    let (mut redb_runs, mut etcd_runs, mut elect_runs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..=RUNS {
        let r = on_redb.hand_over();
        let e = on_etcd.as_mut().map(VvmChain::hand_over);
        // `etcdctl` failed mid-run: its row is left out, the others go on.
        let x = elect.as_mut().and_then(ElectChain::hand_over);
        if x.is_none()
            && let Some(chain) = elect.take()
        {
            chain.stop();
            elect_runs.clear();
        }
        if i > 0 {
            redb_runs.push(r);
            etcd_runs.extend(e);
            elect_runs.extend(x);
        }
    }
    on_redb.stop();
    Graceful {
        redb: redb_runs,
        etcd: on_etcd.map(|chain| {
            chain.stop();
            etcd_runs
        }),
        etcdctl: elect.map(|chain| {
            chain.stop();
            elect_runs
        }),
    }
}

/// The graceful takeovers of one run: vvm-host on redb, on etcd, and `etcdctl elect` (if
/// there was an etcd, and `etcdctl`).
struct Graceful {
    redb: Vec<Takeover>,
    etcd: Option<Vec<Takeover>>,
    etcdctl: Option<Vec<Duration>>,
}

/// vvm-host's lead handed back and forth between two hosts by SIGTERM, on one store.
struct VvmChain<'a> {
    dir: &'a Path,
    store: &'a str,
    leader: Host,
    handed: usize,
}

impl<'a> VvmChain<'a> {
    /// Starts the first leader and waits for its guest.
    fn start(dir: &'a Path, store: &'a str) -> Self {
        let leader = serve("a", dir, store, LEASE);
        leader.wait_for(&["ticker started"]);
        Self {
            dir,
            store,
            leader,
            handed: 0,
        }
    }

    /// Starts a standby, lets it settle, stops the leader: the gap and its steps.
    fn hand_over(&mut self) -> Takeover {
        let name = if self.handed.is_multiple_of(2) {
            "b"
        } else {
            "a"
        };
        self.handed += 1;
        let standby = serve(name, self.dir, self.store, LEASE);
        standby.wait_for(&["campaigning"]);
        std::thread::sleep(SETTLE);
        let (from_leader, from_standby) = (self.leader.mark(), standby.mark());
        let sent = SystemTime::now();
        self.leader.signal(Signal::TERM);
        let (_, first) = standby.wait_for_from(from_standby, &["ticker started"]);
        assert!(
            self.leader.wait_exit().success(),
            "the leader failed to exit"
        );
        let steps = STEPS
            .iter()
            .map(|(role, message, target)| {
                let (host, from) = match role {
                    Role::Leader => (&self.leader, from_leader),
                    Role::Standby => (&standby, from_standby),
                };
                let line = find(host, from, message, target);
                since(at(&line), sent)
            })
            .collect();
        self.leader = standby;
        Takeover {
            gap: since(at(&first), sent),
            steps,
        }
    }

    fn stop(mut self) {
        self.leader.signal(Signal::TERM);
        self.leader.wait_exit();
    }
}

/// One SIGKILL takeover: the gap, and how long the killed leader's record had left.
struct Killed {
    gap: Duration,
    left: Duration,
}

/// SIGKILLs the leader `RUNS` times at varying points of its renewal period.
fn sigkill_redb(dir: &Path) -> Vec<Killed> {
    let lease = format!("{}ms", KILL_LEASE.as_millis());
    let mut leader = serve("a", dir, "vvm.redb", &lease);
    leader.wait_for(&["ticker started"]);
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let name = if i % 2 == 0 { "b" } else { "a" };
        let standby = serve(name, dir, "vvm.redb", &lease);
        standby.wait_for(&["campaigning"]);
        // Spread the kills over a while (the renewal period, L/4, is too long to wait).
        let phase = Duration::from_millis(100) * u32::try_from(i % 5).unwrap_or(0);
        std::thread::sleep(SETTLE + phase);
        let from_standby = standby.mark();
        let sent = SystemTime::now();
        leader.signal(Signal::KILL);
        let (_, first) = standby.wait_for_from(from_standby, &["ticker started"]);
        leader.wait_exit();
        // The record expires L after its last write began; `renewed`/`acquired` is logged
        // just after the write, so this slightly overstates the time left.
        let last_write = leader
            .lines()
            .into_iter()
            .rfind(|l| l.text.contains("\"renewed\"") || l.text.contains("\"acquired\""))
            .expect("the leader wrote its lease");
        runs.push(Killed {
            gap: since(at(&first), sent),
            left: since(at(&last_write) + KILL_LEASE, sent),
        });
        leader = standby;
    }
    leader.signal(Signal::TERM);
    leader.wait_exit();
    runs
}

/// An `etcdctl elect` leadership handed back and forth on the etcd at `endpoint`: the gap from
/// SIGINT to the leader (on which it resigns) until the standby prints its proposal.
struct ElectChain {
    endpoint: String,
    leader: Elector,
    handed: usize,
}

/// One `etcdctl elect` process and the lines of its stdout, each with when it was read.
type Elector = (Child, mpsc::Receiver<(Instant, String)>);

impl ElectChain {
    /// The first leader, elected; `None` without `etcdctl` on PATH.
    fn start(endpoint: &str) -> Option<Self> {
        let leader = elect(endpoint, "a")?;
        elected(&leader.1, "a");
        Some(Self {
            endpoint: endpoint.to_owned(),
            leader,
            handed: 0,
        })
    }

    /// Starts a standby, lets it settle, stops the leader: the gap (`None` if `etcdctl`
    /// could not be run or signalled).
    fn hand_over(&mut self) -> Option<Duration> {
        let value = if self.handed.is_multiple_of(2) {
            "b"
        } else {
            "a"
        };
        self.handed += 1;
        let mut standby = elect(&self.endpoint, value)?;
        std::thread::sleep(SETTLE);
        let pid = i32::try_from(self.leader.0.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        let sent = Instant::now();
        // SIGINT: etcdctl resigns on it; SIGTERM would end it without a word, leaving its
        // session to expire.
        if pid.is_none_or(|pid| rustix::process::kill_process(pid, Signal::INT).is_err()) {
            let _ = standby.0.kill();
            let _ = standby.0.wait();
            return None;
        }
        let won = elected(&standby.1, value);
        let _ = self.leader.0.wait();
        self.leader = standby;
        Some(won.duration_since(sent))
    }

    fn stop(mut self) {
        let _ = self.leader.0.kill();
        let _ = self.leader.0.wait();
    }
}

/// `etcdctl elect` campaigning with `value` on the etcd at `endpoint`.
fn elect(endpoint: &str, value: &str) -> Option<Elector> {
    let mut child = Command::new("etcdctl")
        .args(["--endpoints", endpoint, "elect", "vvm-bench", value])
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    Some((child, rx))
}

/// When the elector printed `value`: it prints the proposal's key, then its value, once
/// elected.
fn elected(rx: &mpsc::Receiver<(Instant, String)>, value: &str) -> Instant {
    loop {
        let (at, line) = rx
            .recv_timeout(Duration::from_mins(1))
            .expect("etcdctl elect did not win");
        if line == value {
            return at;
        }
    }
}

/// Acquire (`insert_if_absent`) and renew (`compare_and_swap`) on redb and, when available,
/// etcd, interleaved round by round so both see the same machine load.
async fn store_latency(etcd: Option<&EtcdServer>) -> Vec<(String, Vec<Duration>)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let redb = RedbStore::open(dir.path().join("bench.redb"))
        .await
        .expect("open redb");
    let mut stores: Vec<(&str, Box<dyn TtlStore>)> = vec![("redb", Box::new(redb))];
    if let Some(server) = etcd {
        let options = EtcdOptions {
            endpoints: vec![server.endpoint()],
            ..EtcdOptions::default()
        };
        let store = EtcdStore::connect(options).await.expect("connect to etcd");
        stores.push(("etcd", Box::new(store)));
    }
    let ttl = Duration::from_secs(10);
    let mut acquire = vec![Vec::new(); stores.len()];
    let mut renew = vec![Vec::new(); stores.len()];
    for round in 0..OPS + OPS / 10 {
        let value = format!("holder-{round}");
        for (i, (_, store)) in stores.iter().enumerate() {
            let start = Instant::now();
            let term = store.insert_if_absent("slot/1", &value, ttl).await;
            let acquired = start.elapsed();
            assert!(matches!(term, Ok(Some(_))), "acquire failed: {term:?}");
            let start = Instant::now();
            let swapped = store.compare_and_swap("slot/1", &value, &value, ttl).await;
            let renewed = start.elapsed();
            assert!(matches!(swapped, Ok(true)), "renew failed: {swapped:?}");
            let deleted = store.compare_and_delete("slot/1", &value).await;
            assert!(matches!(deleted, Ok(true)), "release failed: {deleted:?}");
            if round >= OPS / 10 {
                acquire[i].push(acquired);
                renew[i].push(renewed);
            }
        }
    }
    let mut rows = Vec::new();
    for (i, (name, _)) in stores.iter().enumerate() {
        rows.push((
            format!("acquire (insert_if_absent), {name}"),
            std::mem::take(&mut acquire[i]),
        ));
        rows.push((
            format!("renew (compare_and_swap), {name}"),
            std::mem::take(&mut renew[i]),
        ));
    }
    rows
}

/// The first line at or after `from` whose message starts with `message` and whose target
/// contains `target`.
fn find(host: &Host, from: usize, message: &str, target: &str) -> Line {
    host.lines()
        .into_iter()
        .skip(from)
        .find(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.text).unwrap_or_default();
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
                && v["target"].as_str().is_some_and(|t| t.contains(target))
        })
        .unwrap_or_else(|| panic!("{}: no {message:?} line from {target}", host.name))
}

/// The log timestamp of a line.
fn at(line: &Line) -> SystemTime {
    let v: serde_json::Value = serde_json::from_str(&line.text).expect("a JSON log line");
    let stamp = v["timestamp"].as_str().expect("a timestamp");
    humantime::parse_rfc3339(stamp).expect("an RFC 3339 timestamp")
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

fn gaps(runs: &[Takeover]) -> Vec<Duration> {
    runs.iter().map(|r| r.gap).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn header(first: &str) {
    println!(
        "{first:<40} {:>6} {:>10} {:>10} {:>10}",
        "runs", "median", "p90", "min"
    );
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Prints median, p90 and min of `samples`, in milliseconds.
fn row(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let n = samples.len();
    let p90 = samples[(n * 9).div_ceil(10).saturating_sub(1)];
    println!(
        "{name:<40} {n:>6} {:>8.3}ms {:>8.3}ms {:>8.3}ms",
        ms(samples[n / 2]),
        ms(p90),
        ms(samples[0])
    );
}
