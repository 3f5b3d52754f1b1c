//! The listening socket of `http-addr`, one for all the hosts of a machine (SPEC §10,
//! "Incoming HTTP").
//!
//! A listening socket belongs to the processes that hold a descriptor of it, and the kernel
//! queues each connection it completes until one of them accepts it. When each host bound the
//! address itself on taking over, a leader stopped by SIGSTOP (Ctrl-Z, `docker pause`, a
//! debugger, a frozen cgroup) or stuck in uninterruptible I/O kept the address: its successor
//! could not bind, and the kernel went on queuing connections for a process that would not
//! take them. A graceful takeover had the mirror fault: between the old leader's close and
//! the new one's bind, connections were refused.
//!
//! So the hosts of one machine that serve one `http-addr` share one socket (one open file
//! description), and only the leader accepts from it (`super::listen`): taking over is
//! starting to accept on the same queue, and stopping is ceasing to, with what is queued left
//! for the successor. A host gets the socket once, when it starts, before it ever leads:
//! 1. from systemd's socket activation (`LISTEN_PID`, `LISTEN_FDS`, as `sd_listen_fds(3)`
//!    passes them): a socket listening on `http-addr`;
//! 2. else from a host that holds it already: each holder serves it on a Unix socket in the
//!    directory of the crash locks (`http-<addr>.<pid>-<n>.sock`), and hands a duplicate of its
//!    descriptor over (`SCM_RIGHTS`) to a process of the same user (`SO_PEERCRED`);
//! 3. else it binds and listens itself, and serves the socket from then on. Of two hosts
//!    starting at once, the one that loses the bind asks the other.
//!
//! A holder that is stopped cannot hand the socket over (its Unix socket is not answered
//! within `handoff::ASK_PATIENCE`); any other holder can. A Unix socket whose process is gone is
//! removed by the next host that finds it.

mod handoff;

pub(crate) use handoff::other_addresses;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketType, sockopt};

use self::handoff::{Handoff, Place, is_listener_of};

/// How long a host that lost the bind to another host starting at the same moment keeps
/// asking for the socket before it takes the address for one held by a process that does not
/// share it.
const RACE_PATIENCE: Duration = Duration::from_secs(2);

/// Where this host's listening socket came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Passed by systemd (socket activation).
    Systemd,
    /// Handed over by the host of this process id, which holds it too.
    Peer(u32),
    /// Bound by this host, the first to serve the address.
    Bound,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Systemd => f.write_str("systemd"),
            Self::Peer(pid) => write!(f, "the host of pid {pid}"),
            Self::Bound => f.write_str("bound here"),
        }
    }
}

/// Why the socket could not be shared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShareError {
    /// The address is held by a process that does not hand it over (not a vvm-host of this
    /// machine and user, one without the crash lock directory, or one stopped that alone
    /// holds it).
    #[error("{addr} is held by a process that does not share it")]
    Taken {
        /// The address.
        addr: SocketAddr,
    },
    /// The socket or the directory failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: io::Error,
    },
}

/// The shared listening socket, and this host's service of it to the others.
pub(crate) struct SharedSocket {
    listener: TcpListener,
    source: Source,
    _handoff: Option<Handoff>,
}

impl SharedSocket {
    /// The socket of `addr` passed by systemd, if any: a socket in `LISTEN_FDS` (for this
    /// process, `LISTEN_PID`) listening on `addr`. Called once, before anything else of the
    /// process could have taken those descriptor numbers.
    pub(crate) fn from_systemd(addr: SocketAddr) -> Option<Self> {
        let pid = std::env::var("LISTEN_PID").ok()?.parse::<u32>().ok()?;
        if pid != std::process::id() {
            return None;
        }
        let count = std::env::var("LISTEN_FDS").ok()?.parse::<RawFd>().ok()?;
        // sd_listen_fds(3): the passed descriptors are 3, 4, ... (SD_LISTEN_FDS_START).
        let owned =
            (3..3_i32.saturating_add(count.clamp(0, 1024))).find_map(|raw| passed(raw, addr))?;
        let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
        let listener = TcpListener::from(owned);
        listener.set_nonblocking(true).ok()?;
        Some(Self {
            listener,
            source: Source::Systemd,
            _handoff: None,
        })
    }

    /// The socket of `addr` from a host of this machine that holds it, or bound here; served
    /// to the others from `dir` (the crash locks' directory) from now on. Blocks for at most
    /// [`RACE_PATIENCE`] and a few [`handoff::ASK_PATIENCE`]s.
    ///
    /// # Errors
    /// [`ShareError::Taken`] when the address is held by a process that does not hand it
    /// over; [`ShareError::Io`] when the socket or the directory fails.
    pub(crate) fn obtain(addr: SocketAddr, dir: &Path) -> Result<Self, ShareError> {
        let io = |what: &str| {
            let what = format!("{what} {}", dir.display());
            move |source: io::Error| ShareError::Io { what, source }
        };
        let place = Place::open(dir, addr).map_err(io("opening the directory"))?;
        let give_up = Instant::now() + RACE_PATIENCE;
        loop {
            if let Some((listener, pid)) = place.ask_holders() {
                let handoff = place
                    .serve(&listener)
                    .map_err(io("serving the socket in"))?;
                return Ok(Self {
                    listener,
                    source: Source::Peer(pid),
                    _handoff: Some(handoff),
                });
            }
            match bind(addr) {
                Ok(listener) => {
                    let handoff = place
                        .serve(&listener)
                        .map_err(io("serving the socket in"))?;
                    return Ok(Self {
                        listener,
                        source: Source::Bound,
                        _handoff: Some(handoff),
                    });
                }
                // Another host may be binding at this very moment: ask again, a little later.
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < give_up => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    return Err(ShareError::Taken { addr });
                }
                Err(e) => {
                    return Err(ShareError::Io {
                        what: format!("binding {addr}"),
                        source: e,
                    });
                }
            }
        }
    }

    /// A descriptor of the socket for one leadership's accepting (the same open file
    /// description: dropping it leaves the socket to the others).
    ///
    /// # Errors
    /// When the descriptor cannot be duplicated (out of descriptors).
    pub(crate) fn accepting(&self) -> io::Result<TcpListener> {
        self.listener.try_clone()
    }

    /// Where the socket came from.
    pub(crate) fn source(&self) -> Source {
        self.source
    }
}

/// `addr`'s listening socket, shared with the other hosts of this machine (SPEC §10): from
/// systemd, else from a host in `dir` (the crash locks') that holds it, else bound here and
/// served to the others. Where it cannot be shared, says so and gives `None`: each leadership
/// then binds the address itself, and a stopped leader keeps it from its successor. Blocks
/// (see [`SharedSocket::obtain`]).
pub(crate) fn share(addr: SocketAddr, dir: Option<&Path>) -> Option<SharedSocket> {
    let got = match (SharedSocket::from_systemd(addr), dir) {
        (Some(socket), _) => Ok(socket),
        (None, None) => {
            tracing::warn!(%addr, "http-addr not shared with the other hosts of this machine: no crash lock directory (lock-dir); a stopped leader keeps the address from its successor");
            return None;
        }
        (None, Some(dir)) => {
            for other in other_addresses(dir, addr) {
                tracing::warn!(%addr, other, "another host of this machine and store serves another http-addr: the two do not share a socket");
            }
            SharedSocket::obtain(addr, dir)
        }
    };
    match got {
        Ok(socket) => {
            tracing::info!(%addr, from = %socket.source(), "http-addr shared with the hosts of this machine");
            Some(socket)
        }
        Err(e @ ShareError::Taken { .. }) => {
            tracing::warn!(%addr, error = %e, "http-addr not shared: this host binds it when it leads, once it is free");
            None
        }
        Err(e) => {
            tracing::warn!(%addr, error = %e, "http-addr not shared: this host binds it when it leads");
            None
        }
    }
}

/// The descriptor `raw` systemd passed, owned, if it is a socket listening on `addr`.
///
/// Unavoidably `unsafe`: a descriptor inherited by number can only be borrowed or owned by
/// asserting that nothing else of the process owns it. That holds for the descriptors of
/// `LISTEN_FDS` when `LISTEN_PID` is this process: systemd passed them open to it, the kernel
/// never hands out a number that is open, and nothing of vvm-host closes a descriptor it did
/// not open, so those numbers still name what systemd passed, owned by nobody. One that is
/// not `addr`'s socket is only borrowed, and left as it is.
#[allow(unsafe_code)]
fn passed(raw: RawFd, addr: SocketAddr) -> Option<OwnedFd> {
    if raw < 0 {
        return None;
    }
    // SAFETY: see above; `raw` is open (systemd passed it) and stays open for this borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(raw) };
    if !is_listener_of(fd, addr) {
        return None;
    }
    // SAFETY: see above; `find_map` owns at most one descriptor, and this is its only owner.
    Some(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `addr` bound and listening, non-blocking, with `SO_REUSEADDR` (a former leader's
/// connections in `TIME_WAIT` must not keep the address).
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let socket = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )?;
    sockopt::set_socket_reuseaddr(&socket, true)?;
    rustix::net::bind(&socket, &addr)?;
    rustix::net::listen(&socket, 1024)?;
    Ok(TcpListener::from(socket))
}

/// How many connections wait in the queue of the listening socket `fd`: the `rx_queue` of its
/// line in `/proc/net/tcp` or `tcp6` (for a listening socket, the accept queue's length),
/// found by the socket's inode. `None` where that cannot be read.
pub(crate) fn queue_depth(fd: BorrowedFd<'_>) -> Option<u64> {
    let inode = rustix::fs::fstat(fd).ok()?.st_ino;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if fields.get(9).and_then(|i| i.parse::<u64>().ok()) == Some(inode) {
                let rx = fields.get(4)?.split(':').nth(1)?;
                return u64::from_str_radix(rx, 16).ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    use std::os::fd::AsFd as _;

    use super::handoff::file_part;
    use super::*;

    /// A loopback address with a port that was free a moment ago.
    fn free_addr() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
    }

    fn inode(listener: &TcpListener) -> u64 {
        rustix::fs::fstat(listener.as_fd()).unwrap().st_ino
    }

    /// A connection to `addr` whose `GET` the acceptor of `listener` answers; its answer.
    fn served_through(listener: &TcpListener, addr: SocketAddr) -> String {
        let mut client = TcpStream::connect(addr).unwrap();
        client.write_all(b"ping").unwrap();
        listener.set_nonblocking(false).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut got = [0; 4];
        server.read_exact(&mut got).unwrap();
        server.write_all(b"pong").unwrap();
        drop(server);
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        answer
    }

    /// The first host binds the address and serves the socket; the second gets a duplicate
    /// of the very socket (one open file description: same inode) from the first, over its
    /// Unix socket in the directory, and accepts from the same queue. When the first goes,
    /// its Unix socket goes with it, and a third host gets the socket from the second.
    #[test]
    fn hosts_of_one_machine_share_one_socket_handed_over_by_any_holder() {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let first = SharedSocket::obtain(addr, dir.path()).unwrap();
        assert_eq!(first.source(), Source::Bound);
        let second = SharedSocket::obtain(addr, dir.path()).unwrap();
        assert_eq!(second.source(), Source::Peer(std::process::id()));
        assert_eq!(inode(&first.listener), inode(&second.listener));
        assert_eq!(served_through(&second.accepting().unwrap(), addr), "pong");
        // A connection queued while nobody accepts waits for whoever accepts next.
        let mut queued = TcpStream::connect(addr).unwrap();
        queued.write_all(b"ping").unwrap();
        assert_eq!(queue_depth(first.listener.as_fd()), Some(1));
        drop(first);
        let third = SharedSocket::obtain(addr, dir.path()).unwrap();
        assert!(matches!(third.source(), Source::Peer(_)));
        let accepting = third.accepting().unwrap();
        accepting.set_nonblocking(false).unwrap();
        let (mut taken, _) = accepting.accept().unwrap();
        let mut got = [0; 4];
        taken.read_exact(&mut got).unwrap();
        assert_eq!(
            &got, b"ping",
            "the queued connection was the third host's to take"
        );
        let holders: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            holders.len(),
            2,
            "the first host's socket went with it: {holders:?}"
        );
    }

    /// The Unix socket of a holder that is gone (killed: its file stays, nobody listens) is
    /// removed by the next host, which then binds the address itself.
    #[test]
    fn a_gone_holders_socket_is_removed_and_the_address_bound() {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let stale = dir
            .path()
            .join(format!("http-{}.999999-0.sock", file_part(addr)));
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert!(stale.exists());
        let socket = SharedSocket::obtain(addr, dir.path()).unwrap();
        assert_eq!(socket.source(), Source::Bound);
        assert!(!stale.exists(), "the gone holder's socket was removed");
    }

    /// An address held by a process that does not share it (bound by another program, or by
    /// a host without the directory) is reported so, after a while of asking.
    #[test]
    fn an_address_held_by_a_process_that_does_not_share_it_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let e = SharedSocket::obtain(addr, dir.path()).err().unwrap();
        assert!(matches!(e, ShareError::Taken { .. }), "{e}");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    /// Hosts of one directory serving another address are found; the directory's own
    /// address is not one of them.
    #[test]
    fn hosts_serving_another_address_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let (one, other) = (free_addr(), free_addr());
        let _holder = SharedSocket::obtain(one, dir.path()).unwrap();
        assert_eq!(other_addresses(dir.path(), other), [file_part(one)]);
        assert!(other_addresses(dir.path(), one).is_empty());
    }
}
