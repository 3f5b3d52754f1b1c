//! Multi-machine for real (issue 14): a 3-member etcd cluster, and hosts in network
//! namespaces of their own, each reaching etcd over a veth link that a test can cut.
//!
//! Needs root (`ip netns add`); where namespaces cannot be made the tests say so and skip,
//! and under `CI=true` they fail instead.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rustix::process::Signal;

use testkit::etcd::EtcdCluster;
use testkit::host::Host;

use crate::BIN;
use crate::fencing::{journal, journal_dir, log_overlaps, logged, term_drops};

/// One network namespace with a veth link to the root namespace: `10.<net>.0.1` on the root
/// side, `10.<net>.0.2` inside. Deleted (with its link) on drop.
struct Netns {
    name: String,
    root_link: String,
    root_address: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn create(tag: &str, net: u8) -> Result<Self, String> {
        let pid = std::process::id();
        let name = format!("vvm-{pid}-{tag}");
        let (root_link, inner_link) = (format!("v{pid}{tag}0"), format!("v{pid}{tag}1"));
        let root_address = format!("10.{net}.0.1");
        ip(&["netns", "add", &name])?;
        let ns = Self {
            name,
            root_link,
            root_address,
        };
        let inner_address = format!("10.{net}.0.2/24");
        ip(&[
            "link",
            "add",
            &ns.root_link,
            "type",
            "veth",
            "peer",
            "name",
            &inner_link,
        ])?;
        ip(&["link", "set", &inner_link, "netns", &ns.name])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", ns.root_address),
            "dev",
            &ns.root_link,
        ])?;
        ip(&["link", "set", &ns.root_link, "up"])?;
        for args in [
            vec!["addr", "add", &inner_address, "dev", &inner_link],
            vec!["link", "set", &inner_link, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["netns", "exec", &ns.name, "ip"];
            full.extend(args);
            ip(&full)?;
        }
        Ok(ns)
    }

    /// Cuts (or restores) the link between this namespace and the root namespace.
    fn link(&self, up: bool) {
        ip(&[
            "link",
            "set",
            &self.root_link,
            if up { "up" } else { "down" },
        ])
        .unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.root_link]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Two namespaces for the test numbered `test` (tests run in parallel: names and subnets are
/// their own), or `None` (said on stderr) where they cannot be made; under `CI` that is a
/// failure.
fn two_namespaces(test: u8) -> Option<(Netns, Netns)> {
    let net = 200 + 2 * test;
    let made = Netns::create(&format!("{test}a"), net)
        .and_then(|a| Ok((a, Netns::create(&format!("{test}b"), net + 1)?)));
    match made {
        Ok(both) => Some(both),
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "network namespaces cannot be made here, and CI is set: {e}"
            );
            eprintln!("SKIPPED: network namespaces cannot be made here: {e}");
            None
        }
    }
}

fn serve_in(ns: &Netns, name: &'static str, dir: &Path, etcd: &EtcdCluster) -> Host {
    let store = format!("etcd://{}", etcd.endpoints_at(&ns.root_address));
    let cache = format!("cache-{name}");
    Host::start_in(
        BIN,
        Some(&ns.name),
        name,
        dir,
        &[
            "serve",
            "--store",
            &store,
            "--lease",
            "2s",
            "--cache-dir",
            &cache,
            "--grace-period",
            "1s",
        ],
        "info",
    )
}

/// The set-up of each test: namespaces `a` and `b`, a 3-member etcd reachable from both,
/// the journal guest's directory, and host `a` leading (its guest writing) with host `b`
/// standing by.
struct Cluster {
    ns_a: Netns,
    ns_b: Netns,
    etcd: EtcdCluster,
    dir: tempfile::TempDir,
    a: Host,
    b: Host,
}

impl Cluster {
    /// `None` (said on stderr) where namespaces or etcd are missing, outside CI.
    fn start(test: u8) -> Option<Self> {
        let (ns_a, ns_b) = two_namespaces(test)?;
        let etcd = EtcdCluster::start(&[&ns_a.root_address, &ns_b.root_address])?;
        let dir = journal_dir();
        let a = serve_in(&ns_a, "a", dir.path(), &etcd);
        a.wait_for(&["journal "]);
        let b = serve_in(&ns_b, "b", dir.path(), &etcd);
        b.wait_for(&["campaigning"]);
        Some(Self {
            ns_a,
            ns_b,
            etcd,
            dir,
            a,
            b,
        })
    }
}

/// The leader is cut off from etcd (its link goes down). The standby takes over once the
/// lease expires, and the old leader has no guest effect after the new leader's first: the
/// terms in the shared journal file never go down, nor in the logs.
#[test]
fn a_leader_cut_off_from_etcd_has_no_effect_after_the_new_leaders_first() {
    let Some(Cluster {
        ns_a,
        ns_b: _ns_b,
        etcd: _etcd,
        dir,
        mut a,
        mut b,
    }) = Cluster::start(1)
    else {
        return;
    };
    ns_a.link(false);
    // B leads once A's lease has expired in etcd.
    b.wait_for(&["journal "]);
    std::thread::sleep(Duration::from_secs(2));
    ns_a.link(true);
    std::thread::sleep(Duration::from_millis(500));
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
    // A ended itself (killer, 75) or campaigns again as a standby.
    if a.wait_exit_or(Duration::ZERO).is_none() {
        a.signal(Signal::TERM);
        let _ = a.wait_exit_or(Duration::from_secs(10));
    }
    let lines = journal(dir.path());
    assert_eq!(term_drops(&lines), vec![], "a term went down in the file");
    assert_eq!(
        log_overlaps(&[&a, &b]),
        0,
        "the old leader logged after the new one"
    );
    let last_a = logged(&a).last().map(|l| l.0.clone()).unwrap();
    let first_b = logged(&b).first().map(|l| l.0.clone()).unwrap();
    let gap = humantime::parse_rfc3339(&first_b)
        .unwrap()
        .duration_since(humantime::parse_rfc3339(&last_a).unwrap())
        .unwrap_or_default();
    println!(
        "partition: the old leader's last guest output {last_a}, the new leader's first \
         {first_b}: gap {gap:?} (L = 2 s)"
    );
}

/// One etcd member is killed under a leader: the other two keep quorum, and leadership
/// continues with no takeover.
#[test]
fn killing_one_etcd_member_under_a_leader_causes_no_takeover() {
    let Some(Cluster {
        ns_a: _ns_a,
        ns_b: _ns_b,
        mut etcd,
        dir: _dir,
        mut a,
        mut b,
    }) = Cluster::start(2)
    else {
        return;
    };
    etcd.kill(0);
    // Three leases' worth: any loss would have shown by then.
    std::thread::sleep(Duration::from_secs(6));
    let lost = a.lines().iter().any(|l| l.text.contains("lost"));
    assert!(!lost, "the leader lost its lease:\n{}", etcd.log());
    assert!(logged(&b).is_empty(), "the standby took over");
    let before = logged(&a).len();
    std::thread::sleep(Duration::from_millis(500));
    assert!(logged(&a).len() > before, "the leader's guest still runs");
    for h in [&mut a, &mut b] {
        h.signal(Signal::TERM);
        assert!(h.wait_exit().success());
    }
}
