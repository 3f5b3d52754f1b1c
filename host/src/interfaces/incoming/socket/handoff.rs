//! Handing the shared listening socket from host to host (`super`): each holder serves it
//! on a Unix socket in the crash locks' directory, `http-<addr>.<pid>-<n>.sock`, and hands a
//! duplicate of its descriptor over (`SCM_RIGHTS`) to a process of the same user
//! (`SO_PEERCRED`); a host asks each holder in turn, and takes only a socket listening on its
//! address.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType, sockopt,
};

/// How long a host waits for a holder's answer: a holder answers within microseconds, so
/// one that does not is stopped (or gone).
pub(super) const ASK_PATIENCE: Duration = Duration::from_millis(200);

/// Whether `fd` is a TCP socket listening on `addr`.
pub(super) fn is_listener_of(fd: BorrowedFd<'_>, addr: SocketAddr) -> bool {
    let listening = sockopt::socket_acceptconn(fd).unwrap_or(false)
        && sockopt::socket_type(fd).is_ok_and(|t| t == SocketType::STREAM);
    let bound = rustix::net::getsockname(fd)
        .ok()
        .and_then(|a| SocketAddr::try_from(a).ok());
    listening && bound == Some(addr)
}

/// The Unix sockets of one address's holders, in the crash locks' directory.
pub(super) struct Place {
    /// The directory, opened `O_PATH`: its sockets are named through `/proc/self/fd`, so a
    /// long directory path never meets the 108 bytes of a socket's address.
    dir: OwnedFd,
    addr: SocketAddr,
}

impl Place {
    pub(super) fn open(dir: &Path, addr: SocketAddr) -> io::Result<Self> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::open(dir, flags, Mode::empty())?;
        Ok(Self { dir, addr })
    }

    /// The names of the holders' sockets in the directory, with the address each serves.
    fn holders(&self) -> Vec<(String, String)> {
        let dir = format!("/proc/self/fd/{}", self.dir.as_raw_fd());
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| holder_of(&n).map(|served| (served.to_owned(), n.clone())))
            .collect()
    }

    /// Whether a live process answers at the socket `name` (it then hands the socket over,
    /// and what it hands is dropped).
    fn answers(&self, name: &str) -> bool {
        let Ok(stream) = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        ) else {
            return false;
        };
        self.unix_addr(name)
            .is_ok_and(|addr| rustix::net::connect(&stream, &addr).is_ok())
    }

    /// A name for a socket of this process in the directory: its process id, and a count of
    /// its sockets (one in a host; tests make several).
    fn own_name(&self) -> String {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!(
            "http-{}.{}-{n}.sock",
            file_part(self.addr),
            std::process::id()
        )
    }

    /// The address of the socket file `name` in the directory.
    fn unix_addr(&self, name: &str) -> io::Result<SocketAddrUnix> {
        let path = format!("/proc/self/fd/{}/{name}", self.dir.as_raw_fd());
        Ok(SocketAddrUnix::new(path)?)
    }

    /// The socket from a holder that answers, and its process id; `None` if none does.
    /// The sockets of processes that are gone are removed on the way.
    pub(super) fn ask_holders(&self) -> Option<(TcpListener, u32)> {
        let ours = file_part(self.addr);
        let names: Vec<String> = self
            .holders()
            .into_iter()
            .filter(|(served, _)| *served == ours)
            .map(|(_, name)| name)
            .collect();
        for name in names {
            match self.ask(&name) {
                Ok(got) => return Some(got),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    // Nobody listens: its process is gone.
                    let _ = rustix::fs::unlinkat(
                        &self.dir,
                        name.as_str(),
                        rustix::fs::AtFlags::empty(),
                    );
                }
                Err(e) => {
                    tracing::debug!(socket = name, error = %e, "a holder of http-addr did not hand it over");
                }
            }
        }
        None
    }

    /// Asks the holder at `name` for the socket.
    fn ask(&self, name: &str) -> io::Result<(TcpListener, u32)> {
        let stream = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        sockopt::set_socket_timeout(&stream, sockopt::Timeout::Recv, Some(ASK_PATIENCE))?;
        sockopt::set_socket_timeout(&stream, sockopt::Timeout::Send, Some(ASK_PATIENCE))?;
        rustix::net::connect(&stream, &self.unix_addr(name)?)?;
        let peer = sockopt::socket_peercred(&stream)?;
        if !same_user(peer.uid) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the socket is another user's",
            ));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut bytes = [0_u8; 64];
        let mut iov = [IoSliceMut::new(&mut bytes)];
        let got = rustix::net::recvmsg(&stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
        let said = &bytes[..got.bytes.min(bytes.len())];
        let mut fds: Vec<OwnedFd> = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        let fd = fds
            .into_iter()
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no descriptor came"))?;
        if said != self.addr.to_string().as_bytes() || !is_listener_of(fd.as_fd(), self.addr) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "what came is not a socket listening on the address",
            ));
        }
        let listener = TcpListener::from(fd);
        listener.set_nonblocking(true)?;
        Ok((listener, peer.pid.as_raw_nonzero().get().unsigned_abs()))
    }

    /// Serves `listener` to the hosts that ask, from now until the returned [`Handoff`] is
    /// dropped.
    pub(super) fn serve(&self, listener: &TcpListener) -> io::Result<Handoff> {
        let name = self.own_name();
        let socket = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            None,
        )?;
        // A socket of an earlier process with this id is gone with it.
        let _ = rustix::fs::unlinkat(&self.dir, name.as_str(), rustix::fs::AtFlags::empty());
        rustix::net::bind(&socket, &self.unix_addr(&name)?)?;
        // Only this user may connect; the peer's credentials are checked as well.
        let path = format!("/proc/self/fd/{}/{name}", self.dir.as_raw_fd());
        rustix::fs::chmod(path.as_str(), Mode::from_raw_mode(0o600))?;
        rustix::net::listen(&socket, 64)?;
        let (dir, held, said) = (
            self.dir.try_clone()?,
            listener.as_fd().try_clone_to_owned()?,
            self.addr.to_string(),
        );
        let thread = crate::fs::WatchThread::spawn("vvm-http-handoff", socket, move |waker| {
            while let Ok(crate::fs::Wake::Events) = waker.wait_readable(None) {
                hand_over(waker.watched(), &held, said.as_bytes());
            }
        })?;
        Ok(Handoff {
            dir,
            name,
            _thread: thread,
        })
    }
}

/// `addr` as the name of a holder's socket has it: `:`, `[` and `]` made `_`.
pub(super) fn file_part(addr: SocketAddr) -> String {
    addr.to_string().replace([':', '[', ']'], "_")
}

/// The address part of `name` if it names a holder's socket, `http-<addr>.<pid>-<n>.sock`.
fn holder_of(name: &str) -> Option<&str> {
    let (served, id) = name
        .strip_prefix("http-")?
        .strip_suffix(".sock")?
        .rsplit_once('.')?;
    let (pid, n) = id.split_once('-')?;
    (pid.parse::<u32>().is_ok() && n.parse::<u32>().is_ok()).then_some(served)
}

/// Whether `uid` is this process's user (or root, who may do anything anyway).
fn same_user(uid: rustix::process::Uid) -> bool {
    uid == rustix::process::geteuid() || uid.is_root()
}

/// Accepts every host waiting on `socket` and hands each a duplicate of `held`, with `said`
/// (the address) beside it; a process of another user gets nothing.
fn hand_over(socket: BorrowedFd<'_>, held: &OwnedFd, said: &[u8]) {
    while let Ok(stream) = rustix::net::accept_with(socket, rustix::net::SocketFlags::CLOEXEC) {
        let peer = sockopt::socket_peercred(&stream);
        if !peer.is_ok_and(|p| same_user(p.uid)) {
            continue;
        }
        let fds = [held.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let sent = rustix::net::sendmsg(
            &stream,
            &[IoSlice::new(said)],
            &mut control,
            SendFlags::NOSIGNAL,
        );
        if let Err(e) = sent {
            tracing::debug!(error = %e, "handing http-addr's socket over failed");
        }
    }
}

/// This host's service of the socket: a thread answering on its Unix socket, which is
/// removed when this is dropped.
pub(super) struct Handoff {
    dir: OwnedFd,
    name: String,
    _thread: crate::fs::WatchThread,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let _ = rustix::fs::unlinkat(&self.dir, self.name.as_str(), rustix::fs::AtFlags::empty());
    }
}

/// The addresses other than `addr` that live hosts serve from `dir` (each answers on its Unix
/// socket there): hosts of one store and machine that do not share a socket.
pub(crate) fn other_addresses(dir: &Path, addr: SocketAddr) -> Vec<String> {
    let Ok(place) = Place::open(dir, addr) else {
        return Vec::new();
    };
    let ours = file_part(addr);
    let mut others: Vec<String> = place
        .holders()
        .into_iter()
        .filter(|(served, name)| *served != ours && place.answers(name))
        .map(|(served, _)| served)
        .collect();
    others.sort();
    others.dedup();
    others
}
