//! The operations endpoint as an operator's probes and Prometheus meet it (SPEC §8,
//! Operations): `/leader`, `/healthz` and `/metrics` over real HTTP from real hosts, through a
//! takeover; and the compile progress in the log of a host whose stderr is not a terminal.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::{BIN, stamp};
use testkit::guests;
use testkit::host::cluster_dir;
use testkit::host::{Host, PATIENCE};

/// `vvm-host serve` in `dir` with the endpoint on a free port; returns the host and its
/// endpoint's base URL (from its `operations endpoint listening` line).
fn serve_with_endpoint(name: &'static str, dir: &Path) -> (Host, String) {
    let cache = format!("cache-{name}");
    let host = Host::start(
        BIN,
        name,
        dir,
        &[
            "serve",
            "--lease",
            "2s",
            "--cache-dir",
            &cache,
            "--grace-period",
            "1s",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        "info",
    );
    let base = endpoint(&host);
    (host, base)
}

/// The base URL of `host`'s operations endpoint, from its `operations endpoint listening`
/// line (waited for).
pub(crate) fn endpoint(host: &Host) -> String {
    let line = host.wait_for(&["operations endpoint listening"]);
    let v: serde_json::Value = serde_json::from_str(&line.text).unwrap();
    format!("http://{}", v["fields"]["addr"].as_str().unwrap())
}

/// GET `url`: the status code and the body.
pub(crate) fn get(url: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent.get(url).call().unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap())
}

/// `/metrics`, parsed with a Prometheus text parser: sample name and labels → value.
pub(crate) fn metrics(base: &str) -> HashMap<String, f64> {
    let (status, text) = get(&format!("{base}/metrics"));
    assert_eq!(status, 200, "{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let (prometheus_parse::Value::Counter(value)
            | prometheus_parse::Value::Gauge(value)
            | prometheus_parse::Value::Untyped(value)) = s.value
            else {
                return None;
            };
            let mut labels: Vec<_> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            Some((format!("{}{{{}}}", s.metric, labels.join(",")), value))
        })
        .collect()
}

pub(crate) fn value(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("{key} missing from /metrics: {m:?}"))
}

/// Polls `/metrics` of `base` until `ok` holds (renewals and writes happen on their own time).
pub(crate) fn metrics_until(
    base: &str,
    ok: impl Fn(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let end = Instant::now() + PATIENCE;
    loop {
        let m = metrics(base);
        if ok(&m) {
            return m;
        }
        assert!(Instant::now() < end, "/metrics never got there: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn leader(base: &str) -> (u16, serde_json::Value) {
    let (status, body) = get(&format!("{base}/leader"));
    (status, serde_json::from_str(&body).unwrap())
}

#[test]
fn leader_healthz_and_metrics_follow_a_takeover() {
    let dir = cluster_dir();
    std::fs::copy(
        guests::guest("rust-counter"),
        dir.path().join("services/rust-counter.wasm"),
    )
    .unwrap();
    let (mut a, a_url) = serve_with_endpoint("a", dir.path());
    a.wait_for(&["count 1"]);
    let (b, b_url) = serve_with_endpoint("b", dir.path());
    b.wait_for(&["campaigning"]);

    // Patroni's convention: 200 with slot and term on the leader, 503 on the standby.
    let (status, a_leader) = leader(&a_url);
    assert_eq!(status, 200, "{a_leader}");
    assert_eq!(a_leader["slot"], 1);
    let a_term = a_leader["term"].as_u64().unwrap();
    let (status, body) = leader(&b_url);
    assert_eq!(status, 503, "{body}");
    for url in [&a_url, &b_url] {
        assert_eq!(get(&format!("{url}/healthz")).0, 200);
    }

    let m = metrics_until(&a_url, |m| {
        m.get("vvm_lease_renewals_total{outcome=ok}")
            .is_some_and(|n| *n >= 1.0)
            && m.get("vvm_kv_writes_total{outcome=ok,service=rust-counter}")
                .is_some_and(|n| *n >= 1.0)
    });
    assert_eq!(value(&m, "vvm_lease_held{slot=1}"), 1.0);
    assert_eq!(value(&m, "vvm_lease_term{slot=1}"), a_term as f64);
    let left = value(&m, "vvm_lease_time_left_seconds{slot=1}");
    assert!(
        left > 0.0 && left <= 1.6,
        "time left {left} s of 0.8·L = 1.6 s"
    );
    assert_eq!(value(&m, "vvm_takeovers_total{}"), 1.0);
    assert_eq!(value(&m, "vvm_killer_armed{}"), 1.0);
    assert_eq!(value(&m, "vvm_services_running{}"), 2.0);
    assert_eq!(value(&m, "vvm_lease_renewals_total{outcome=lost}"), 0.0);
    let m = metrics(&b_url);
    assert_eq!(value(&m, "vvm_takeovers_total{}"), 0.0);
    assert_eq!(value(&m, "vvm_killer_armed{}"), 0.0);
    assert_eq!(value(&m, "vvm_services_running{}"), 0.0);
    assert!(!m.contains_key("vvm_lease_held{slot=1}"), "{m:?}");

    // Take over: the values move to B.
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    b.wait_for(&["count "]);
    let (status, b_leader) = leader(&b_url);
    assert_eq!(status, 200, "{b_leader}");
    let b_term = b_leader["term"].as_u64().unwrap();
    assert!(b_term > a_term, "terms {a_term} then {b_term}");
    let m = metrics(&b_url);
    assert_eq!(value(&m, "vvm_lease_held{slot=1}"), 1.0);
    assert_eq!(value(&m, "vvm_lease_term{slot=1}"), b_term as f64);
    assert_eq!(value(&m, "vvm_takeovers_total{}"), 1.0);
    assert_eq!(value(&m, "vvm_killer_armed{}"), 1.0);
    assert_eq!(value(&m, "vvm_services_running{}"), 2.0);
    assert_eq!(get(&format!("{b_url}/healthz")).0, 200);

    let mut b = b;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
}

/// With stderr a pipe, each service's load is a start line and an end line with its duration,
/// before the host campaigns.
#[test]
fn compile_progress_is_a_log_line_per_service_start_and_end_with_its_duration() {
    let dir = cluster_dir();
    let (mut a, _) = serve_with_endpoint("a", dir.path());
    let start = a.wait_for(&["loading service", "rust-ticker"]);
    let end = a.wait_for(&["service loaded", "rust-ticker"]);
    let v: serde_json::Value = serde_json::from_str(&end.text).unwrap();
    assert!(v["fields"]["duration_ms"].is_u64(), "{}", end.text);
    assert_eq!(v["fields"]["compiled"], true, "a fresh cache: {}", end.text);
    let campaigning = a.wait_for(&["campaigning"]);
    assert!(stamp(&start) <= stamp(&end) && stamp(&end) <= stamp(&campaigning));
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
}

#[test]
fn a_metrics_addr_in_use_is_one_clear_line_naming_it() {
    let dir = cluster_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--metrics-addr", &addr])
        .current_dir(dir.path())
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("metrics-addr {addr}")), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
