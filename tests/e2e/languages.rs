//! The Python and JavaScript example services (`guest-examples/`) under the real
//! `vvm-host serve` (SPEC §6, §7, §9, §10): they see the lease, read their configuration
//! (`wasi:config`), count in the fenced key-value store (`wasi:keyvalue`), return when told
//! to stop, and a restart loads them from the compile cache. The Rust one is in `keyvalue`.
//! The HTTP examples, in all three languages, answer requests with a count they keep there.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::Value;

use testkit::guests;
use testkit::host::{Host, Line};

use crate::BIN;
use crate::incoming_http::{free_addr, get};

/// The compile cache must make the second load at least this many times faster.
const CACHE_SPEEDUP: u32 = 10;

/// `vvm-host serve` with a 5 s lease, a 2 s grace period and its compile cache in `cache`.
const SERVE: [&str; 7] = [
    "serve",
    "--lease",
    "5s",
    "--cache-dir",
    "cache",
    "--grace-period",
    "2s",
];

/// A directory with `services/<example>.wasm` and a config granting it a 50 ms tick and a
/// greeting.
fn example_dir(example: &str) -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(
        guests::guest(example),
        services.join(format!("{example}.wasm")),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("vvm.toml"),
        format!(
            "[service.{example}]\nenv = [\"TICK_MS=50\"]\n\
             [service.{example}.config]\ngreeting = \"greetings from vvm.toml\"\n"
        ),
    )
    .unwrap();
    dir
}

/// The structured fields of a JSON log line.
fn fields(line: &Line) -> Value {
    let v: Value = serde_json::from_str(&line.text).unwrap();
    v["fields"].clone()
}

/// The message of a guest log line, e.g. `tick 3: term 1 count 3`.
fn message(line: &Line) -> String {
    fields(line)["message"].as_str().unwrap().to_owned()
}

/// The number after `word ` in `text`.
fn number_after(text: &str, word: &str) -> u64 {
    let rest = &text[text.find(&format!("{word} ")).unwrap() + word.len() + 1..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap()
}

/// Waits until `host` has loaded each of `services`. It loads them one at a time in name
/// order, and compiling a Python or JavaScript one can take tens of seconds on a busy machine
/// (more than a wait's patience for two): a wait each, in that order.
fn wait_loaded(host: &Host, services: &[&str]) {
    let mut services = services.to_vec();
    services.sort_unstable();
    for service in services {
        host.wait_for(&["service loaded", &format!("\"service\":\"{service}\"")]);
    }
}

/// What one run of `vvm-host serve` showed.
struct Run {
    /// From spawning the host to its `services loaded` line.
    load: Duration,
    term: u64,
    /// The counts the guest wrote, in order.
    counts: Vec<u64>,
}

/// Serves `example` in `dir` until it has ticked three times, then stops the host with
/// SIGTERM; checks the guest logged the host's term, counted in the kv store and returned.
fn serve_once(name: &'static str, dir: &Path, example: &str, cached: bool) -> Run {
    let spawned = Instant::now();
    let mut host = Host::start(BIN, name, dir, &SERVE, "info");
    let loaded = host.wait_for(&["services loaded"]);
    let (compiled, hits) = if cached { (0, 1) } else { (1, 0) };
    assert_eq!(fields(&loaded)["compiled"], compiled, "{}", loaded.text);
    assert_eq!(fields(&loaded)["cache_hits"], hits, "{}", loaded.text);
    let load = loaded.at.duration_since(spawned);

    let service = format!("\"service\":\"{example}\"");
    let term = fields(&host.wait_for(&["\"acquired\""]))["term"]
        .as_u64()
        .unwrap();
    let started = message(&host.wait_for(&[&service, "ticker started"]));
    assert_eq!(number_after(&started, "term"), term, "{started}");
    assert!(started.ends_with("; greetings from vvm.toml"), "{started}");
    host.wait_for(&[&service, "tick 3:"]);

    host.signal(Signal::TERM);
    host.wait_for(&[&service, "ticker stopping"]);
    assert!(
        host.wait_exit().success(),
        "{name} did not exit 0 on SIGTERM"
    );

    // It returned in time: no failure, no restart, no instance dropped after the grace.
    let complaints: Vec<String> = host
        .lines()
        .into_iter()
        .filter(|l| l.text.contains(&service) && !l.text.contains("\"level\":\"INFO\""))
        .map(|l| l.text)
        .collect();
    assert!(complaints.is_empty(), "{complaints:#?}");

    let ticks: Vec<String> = host
        .lines()
        .iter()
        .filter(|l| l.text.contains(&service) && l.text.contains("tick "))
        .map(message)
        .collect();
    for tick in &ticks {
        assert_eq!(number_after(tick, "term"), term, "{tick}");
    }
    let counts = ticks.iter().map(|t| number_after(t, "count")).collect();
    Run { load, term, counts }
}

/// Two leaderships of `example` in one directory (store and cache): the counter goes on
/// where the first left it, under a newer term, and the second load hits the cache,
/// `speedup` times faster than compiling.
fn example_runs_under_serve(example: &str, speedup: u32) {
    let dir = example_dir(example);
    let first = serve_once("first", dir.path(), example, false);
    assert_eq!(first.counts[..3], [1, 2, 3], "{example} must count from 1");
    assert!(
        first.counts.windows(2).all(|w| w[1] == w[0] + 1),
        "{:?}",
        first.counts
    );

    let second = serve_once("second", dir.path(), example, true);
    assert!(
        second.term > first.term,
        "a new leadership has a newer term"
    );
    let last = *first.counts.last().unwrap();
    assert_eq!(
        second.counts[0],
        last + 1,
        "{example} must go on from the count the first leadership stored"
    );

    eprintln!(
        "{example}: first load (compile) {:?}, second load (cache) {:?}",
        first.load, second.load
    );
    assert!(
        first.load >= second.load * speedup,
        "{example}: loading from the cache ({:?}) is not {speedup}x faster than \
         compiling ({:?})",
        second.load,
        first.load
    );
}

#[test]
fn python_example_counts_under_its_term_stops_on_sigterm_and_restarts_from_cache() {
    example_runs_under_serve("python-ticker", CACHE_SPEEDUP);
}

#[test]
fn js_example_counts_under_its_term_stops_on_sigterm_and_restarts_from_cache() {
    example_runs_under_serve("js-ticker", CACHE_SPEEDUP);
}

/// The three examples make an outgoing call (SPEC §10): with `notify-url` set and its origin
/// granted, each POSTs its count to a local server after every count (JavaScript with a plain
/// `fetch()`), carrying the host's fencing token and lease; and each logs the answer.
#[test]
fn each_example_tells_its_notify_url_with_the_fencing_token() {
    const EXAMPLES: [&str; 3] = ["rust-counter", "python-ticker", "js-ticker"];
    // Compiling the Python and JavaScript components at once takes both cores for seconds:
    // not beside a test that holds a 1 s lease.
    let _heavy = crate::one_heavy_test_at_a_time();
    let server = testkit::http::Server::start(testkit::http::Behaviour::default());
    let origin = format!("http://127.0.0.1:{}", server.port());
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    let mut toml = String::new();
    for example in EXAMPLES {
        std::fs::copy(
            guests::guest(example),
            services.join(format!("{example}.wasm")),
        )
        .unwrap();
        writeln!(
            toml,
            "[service.{example}]\nenv = [\"TICK_MS=50\"]\nhttp = [\"{origin}\"]\n\
             [service.{example}.config]\nnotify-url = \"{origin}/counts\""
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("vvm.toml"), toml).unwrap();
    let mut host =
        testkit::host::serve_with(BIN, "a", dir.path(), ["vvm.redb", "5s", "2s"], "info");
    wait_loaded(&host, &EXAMPLES);
    for example in EXAMPLES {
        host.wait_for(&[&format!("\"service\":\"{example}\""), "notify: status 200"]);
    }
    let requests = server.requests();
    for example in EXAMPLES {
        let from: Vec<_> = requests
            .iter()
            .filter(|r| String::from_utf8_lossy(&r.body).starts_with(&format!("{example} count ")))
            .collect();
        assert!(!from.is_empty(), "{example}: {requests:?}");
        for r in from {
            assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/counts"));
            assert!(
                String::from_utf8_lossy(&r.body).ends_with(" term 1"),
                "{r:?}"
            );
            assert_eq!(r.header_values("vvm-fencing-token"), ["1"], "{r:?}");
            assert_eq!(r.header_values("vvm-lease"), ["slot/1"], "{r:?}");
        }
    }
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

/// The HTTP examples (SPEC §10, "Incoming HTTP") under `serve --http-addr`: each answers a GET
/// on its default route `/NAME/` with its hit count, incremented in its own fenced key-value
/// bucket, and the term of its lease; the host adds exactly one `vvm-fencing-token`.
#[test]
fn each_http_example_answers_with_its_hit_count_and_token() {
    const EXAMPLES: [&str; 3] = ["rust-http", "python-http", "js-http"];
    // Compiling the Python and JavaScript components takes both cores for seconds.
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    guests::install(&services, &EXAMPLES.map(|e| (e, e)));
    let addr = free_addr();
    let http_addr = addr.to_string();
    let args = [&SERVE[..], &["--http-addr", &http_addr]].concat();
    let mut host = Host::start(BIN, "a", dir.path(), &args, "info");
    wait_loaded(&host, &EXAMPLES);
    // Every HTTP service is routed before `services started`.
    host.wait_for(&["services started"]);
    host.wait_for(&["http listening"]);
    for example in EXAMPLES {
        for hits in 1..=2 {
            let (status, tokens, body) = get(addr, &format!("/{example}/"));
            let expected = format!("hits {hits} (term 1)\n");
            assert_eq!((status, &*body), (200, &*expected), "{example}");
            assert_eq!(tokens, ["1"], "{example}");
        }
    }
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}
