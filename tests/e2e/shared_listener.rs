//! One listening socket for the hosts of a machine (SPEC §10, issue 43): two hosts sharing
//! one store and one `--http-addr` hold the same socket, only the leader accepts, and a leader
//! stopped (SIGSTOP) keeps nothing from its successor; under systemd the socket comes from
//! socket activation.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use testkit::host::Host;

use crate::BIN;
use crate::incoming_http::{free_addr, get, hello_dir, serve_with};

/// Clients asking at once, each on a connection of its own per request.
const CLIENTS: usize = 4;
/// How long a client waits for an answer: longer than the leader is stopped, so that one
/// held by the stopped leader is answered when it resumes (503: its deadline passed).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The lease, and the stop: four leases.
const LEASE: Duration = Duration::from_secs(1);

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// 200, under this term.
    Ok(u64),
    /// 503 with `Retry-After`.
    Unavailable,
    /// The connection was refused: nobody held the socket.
    Refused,
    /// The connection ended with no whole answer: the host that held it cut the response
    /// (a response still running when its lease deadline passed is never completed).
    Cut,
    /// No answer within [`CLIENT_TIMEOUT`].
    Hung,
    /// Anything else.
    Other(String),
}

/// One GET of `path` on a new connection.
pub(crate) fn ask(addr: SocketAddr, path: &str) -> Answer {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return Answer::Refused;
    };
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes());
    let mut out = Vec::new();
    let read = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let lower = text.to_ascii_lowercase();
    let token = lower
        .lines()
        .find_map(|l| l.strip_prefix("vvm-fencing-token:"))
        .and_then(|t| t.trim().parse().ok());
    match read {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Answer::Hung
        }
        _ if text.starts_with("HTTP/1.1 200") && text.ends_with("0\r\n\r\n") => {
            token.map_or_else(|| Answer::Other(text.clone()), Answer::Ok)
        }
        _ if text.starts_with("HTTP/1.1 503") && lower.contains("\r\nretry-after:") => {
            Answer::Unavailable
        }
        _ if !text.contains("\r\n\r\n") || text.starts_with("HTTP/1.1 200") => Answer::Cut,
        _ => Answer::Other(text),
    }
}

/// Sets its flag when dropped: at the end of a scenario, or when an assertion in it fails
/// (so the clients' threads end, and the test fails rather than hangs).
pub(crate) struct StopOnDrop<'a>(pub(crate) &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Every answer, with the moment it ended.
#[derive(Default)]
struct Answers(Mutex<Vec<(Instant, Answer)>>, Mutex<Vec<(Instant, Answer)>>);

impl Answers {
    /// Records `answer` to a request sent at `sent`.
    fn push(&self, sent: Instant, answer: Answer) {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), answer.clone()));
        self.1.lock().unwrap().push((sent, answer));
    }

    /// Every answer, with the moment its request was sent.
    fn by_sending(&self) -> Vec<(Instant, Answer)> {
        self.1.lock().unwrap().clone()
    }

    fn all(&self) -> Vec<(Instant, Answer)> {
        self.0.lock().unwrap().clone()
    }

    /// Waits for a 200 under `term`; when it came.
    fn first_ok_under(&self, term: u64) -> Instant {
        let end = Instant::now() + testkit::host::PATIENCE;
        loop {
            if let Some((at, _)) = self.all().into_iter().find(|(_, a)| *a == Answer::Ok(term)) {
                return at;
            }
            assert!(Instant::now() < end, "no 200 under term {term}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A leader stopped (SIGSTOP) for four leases under steady requests keeps nothing from its
/// successor: the standby holds the same socket, takes over once the lease has run out and
/// accepts from the queue while the leader is still stopped. No request is refused and none
/// hangs; each is answered 200, or 503 (with `Retry-After`) by the leader resumed past its
/// deadline, or cut by it (one it held mid-response when stopped). The resumed leader answers
/// nothing with 200, and stops accepting at once (or its killer ends it). Before, the stopped leader kept the address
/// bound: every request timed out until it resumed.
#[test]
fn a_stopped_leader_keeps_nothing_from_its_successor() {
    stopped_leader_keeps_nothing("");
}

/// The same with instance reuse (issue 47): the resumed leader's pooled instances, dropped
/// at its deadline, serve nothing.
#[test]
fn with_instance_reuse_a_stopped_leader_answers_nothing_from_its_pooled_instances() {
    stopped_leader_keeps_nothing("[service.hello]\nmax-instance-reuse-count = 128\n");
}

/// The scenario above, with `toml` as `vvm.toml`.
fn stopped_leader_keeps_nothing(toml: &str) {
    let _heavy = crate::one_heavy_test_at_a_time();
    let addr = free_addr();
    let dir = hello_dir(&["hello"], toml);
    let lease = format!("{}s", LEASE.as_secs());
    let a = serve_with("a", dir.path(), addr, &["--lease", &lease]);
    a.wait_for(&["http listening"]);
    let b = serve_with("b", dir.path(), addr, &["--lease", &lease]);
    b.wait_for(&["campaigning"]);
    let answers = Answers::default();
    let done = AtomicBool::new(false);
    let (stopped_at, resumed_at, taken_over_at) = std::thread::scope(|s| {
        let client = || {
            while !done.load(Ordering::SeqCst) {
                let sent = Instant::now();
                answers.push(sent, ask(addr, "/hello/n"));
            }
        };
        for _ in 0..CLIENTS {
            s.spawn(client);
        }
        // The clients stop when the scenario ends, or when it fails.
        let _done = StopOnDrop(&done);
        answers.first_ok_under(1);
        a.stop();
        let stopped_at = Instant::now();
        // Each client may be held by the stopped leader, which had accepted its request: one
        // more, from now on, asks what the machine answers while the leader is stopped.
        s.spawn(client);
        // The leader stays stopped for four leases: the scenario, not a wait for an event.
        std::thread::sleep((stopped_at + 4 * LEASE).saturating_duration_since(Instant::now()));
        let mark = a.mark();
        a.signal(Signal::CONT);
        let resumed_at = Instant::now();
        // Resumed, it stops accepting, or its killer (long past due) ends it first.
        a.wait_for_any_from(
            mark,
            &[
                &["http accepting stopped: the lease deadline passed"],
                &["killer fired"],
            ],
        );
        let taken_over_at = answers.first_ok_under(2);
        let count = answers.all().len();
        while answers.all().len() < count + 50 {
            std::thread::sleep(Duration::from_millis(5));
        }
        (stopped_at, resumed_at, taken_over_at)
    });
    let all = answers.all();
    let count = |want: fn(&Answer) -> bool| all.iter().filter(|(_, a)| want(a)).count();
    eprintln!(
        "stopped for {:?}: the standby's first 200 {:?} after the stop; {} answered 200, {} \
         503, {} cut, {} refused, {} hung",
        resumed_at - stopped_at,
        taken_over_at - stopped_at,
        count(|a| matches!(a, Answer::Ok(_))),
        count(|a| *a == Answer::Unavailable),
        count(|a| *a == Answer::Cut),
        count(|a| *a == Answer::Refused),
        count(|a| *a == Answer::Hung),
    );
    assert!(
        taken_over_at < resumed_at,
        "the standby answered while the leader was stopped"
    );
    let bad: Vec<_> = all
        .iter()
        .filter(|(_, a)| matches!(a, Answer::Refused | Answer::Hung | Answer::Other(_)))
        .collect();
    assert!(
        bad.is_empty(),
        "{} requests went wrong: {:#?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(
        count(|a| *a == Answer::Cut) + count(|a| *a == Answer::Unavailable) <= CLIENTS,
        "more requests cut or refused than the stopped leader could hold"
    );
    // A response the leader had finished before it was stopped may reach its client only
    // once it runs again (the last bytes were still to be written): that is no answer of the
    // resumed leader. One to a request sent after the stop would be.
    let late: Vec<_> = answers
        .by_sending()
        .into_iter()
        .filter(|(sent, a)| *sent > stopped_at && *a == Answer::Ok(1))
        .collect();
    assert!(
        late.is_empty(),
        "the stopped leader answered 200 to a request sent after the stop: {late:?}"
    );
    let shared = b.wait_for(&["http-addr shared with the hosts of this machine"]);
    assert!(shared.text.contains("the host of pid"), "{}", shared.text);
    let mut b = b;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
}

/// Under systemd the socket comes from socket activation (`LISTEN_FDS`): two hosts started
/// with the same socket serve it, only the leader accepting; the leader killed, the standby
/// answers on the same socket, and no connection is refused meanwhile (the socket is
/// systemd's: here, the test's).
#[test]
fn hosts_started_with_a_socket_from_systemd_serve_it() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // systemd passes its sockets without close-on-exec.
    rustix::io::fcntl_setfd(&listener, rustix::io::FdFlags::empty()).unwrap();
    let dir = hello_dir(&["hello"], "");
    let addr_arg = addr.to_string();
    let start = |name: &'static str| {
        let cache = format!("cache-{name}");
        let args = [
            "serve",
            "--store",
            "vvm.redb",
            "--lease",
            "2s",
            "--grace-period",
            "1s",
            "--cache-dir",
            &cache,
            "--http-addr",
            &addr_arg,
        ];
        Host::start_socket_activated(BIN, listener.as_fd(), name, dir.path(), &args, "info")
    };
    let mut a = start("a");
    let from = a.wait_for(&["http-addr shared with the hosts of this machine"]);
    assert!(from.text.contains("systemd"), "{}", from.text);
    a.wait_for(&["http listening"]);
    let b = start("b");
    b.wait_for(&["campaigning"]);
    let (status, tokens, _) = get(addr, "/hello/x");
    assert_eq!((status, tokens), (200, vec!["1".to_owned()]));
    a.signal(Signal::KILL);
    a.wait_exit();
    // The socket stays open (the test holds it): a request is queued, not refused, and the
    // standby answers it once it has taken over.
    let (status, tokens, _) = get(addr, "/hello/x");
    assert_eq!((status, tokens), (200, vec!["2".to_owned()]));
    let shared = b.wait_for(&["http-addr shared with the hosts of this machine"]);
    assert!(shared.text.contains("systemd"), "{}", shared.text);
    let mut b = b;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().success());
}
