//! Test guest: prepares one granted WASI effect (`EFFECT`), records `ready` in the key-value
//! store, waits to be told to stop, then performs the effect once and returns. It makes no
//! other host call after the stop, so a host that refuses the effect traps exactly there and
//! one that allows it sees `run` return.
//!
//! `EFFECT` names the effect (see [`prepare`]); the granted directory is `/data`, holding a
//! file `existing` and an empty directory `emptydir`; sockets use `EFFECT_ADDR` (`ip:port`).
//!
//! The `wasi:http` effects (see [`http::prepare`]) send to `http://EFFECT_ADDR/fx` and need
//! no directory:
//! - `http-handle`: a POST without a body is prepared; the effect is
//!   `outgoing-handler.handle`.
//! - `http-body-write`: a POST with `content-length: 16` is sent before the stop (its head
//!   may reach the server) and its body stream taken; the effect is writing the 16 bytes
//!   `fenced-body-data` (`blocking-write-and-flush`), then the body is finished.
//! - `http-pending`: a GET is sent before the stop (the server holds its response back); the
//!   effect is blocking on its `future-incoming-response` pollable, then `get`.
//!
//! After `handle` and the body write, the guest waits up to 2 s for the response, so that a
//! request allowed through is not cancelled by the guest returning first.

use vvm_guest::wasi::clocks::wall_clock::Datetime;
use vvm_guest::wasi::filesystem::preopens;
use vvm_guest::wasi::filesystem::types::{
    Descriptor, DescriptorFlags, NewTimestamp, OpenFlags, PathFlags,
};
use vvm_guest::wasi::sockets::network::{
    ErrorCode, IpAddressFamily, IpSocketAddress, Ipv4SocketAddress,
};
use vvm_guest::wasi::sockets::udp::OutgoingDatagram;
use vvm_guest::wasi::sockets::{instance_network, tcp_create_socket, udp_create_socket};
use vvm_guest::{Guest, kv, lease};

mod http;

struct Effects;

type Act = Box<dyn FnOnce() -> Result<(), String>>;

fn data_dir() -> Result<Descriptor, String> {
    preopens::get_directories()
        .into_iter()
        .find(|(_, path)| path == "/data")
        .map(|(dir, _)| dir)
        .ok_or_else(|| "no /data granted".to_owned())
}

fn open(dir: &Descriptor, name: &str, flags: OpenFlags) -> Result<Descriptor, String> {
    dir.open_at(
        PathFlags::empty(),
        name,
        flags,
        DescriptorFlags::READ | DescriptorFlags::WRITE,
    )
    .map_err(|e| format!("open {name}: {e:?}"))
}

fn addr() -> Result<IpSocketAddress, String> {
    let text = std::env::var("EFFECT_ADDR").map_err(|_| "EFFECT_ADDR not granted".to_owned())?;
    let addr: std::net::SocketAddrV4 = text.parse().map_err(|e| format!("{text}: {e}"))?;
    let [a, b, c, d] = addr.ip().octets();
    Ok(IpSocketAddress::Ipv4(Ipv4SocketAddress {
        port: addr.port(),
        address: (a, b, c, d),
    }))
}

fn any_port() -> IpSocketAddress {
    IpSocketAddress::Ipv4(Ipv4SocketAddress {
        port: 0,
        address: (127, 0, 0, 1),
    })
}

fn err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

/// Everything the effect needs is opened here, before the stop; the returned closure is the
/// effect alone.
fn prepare(effect: &str) -> Result<Act, String> {
    let dir = data_dir()?;
    let epoch = NewTimestamp::Timestamp(Datetime {
        seconds: 0,
        nanoseconds: 0,
    });
    let net = instance_network::instance_network();
    Ok(match effect {
        "write" => {
            let f = open(&dir, "existing", OpenFlags::empty())?;
            Box::new(move || f.write(b"X", 0).map(drop).map_err(err))
        }
        "set-size" => {
            let f = open(&dir, "existing", OpenFlags::empty())?;
            Box::new(move || f.set_size(0).map_err(err))
        }
        "create" => Box::new(move || open(&dir, "created", OpenFlags::CREATE).map(drop)),
        "truncate" => Box::new(move || open(&dir, "existing", OpenFlags::TRUNCATE).map(drop)),
        "rename" => Box::new(move || dir.rename_at("existing", &dir, "renamed").map_err(err)),
        "unlink" => Box::new(move || dir.unlink_file_at("existing").map_err(err)),
        "mkdir" => Box::new(move || dir.create_directory_at("newdir").map_err(err)),
        "rmdir" => Box::new(move || dir.remove_directory_at("emptydir").map_err(err)),
        "link" => Box::new(move || {
            dir.link_at(PathFlags::empty(), "existing", &dir, "hardlink")
                .map_err(err)
        }),
        "symlink" => Box::new(move || dir.symlink_at("existing", "symlink").map_err(err)),
        "set-times" => {
            let f = open(&dir, "existing", OpenFlags::empty())?;
            Box::new(move || f.set_times(epoch, epoch).map_err(err))
        }
        "set-times-at" => Box::new(move || {
            dir.set_times_at(PathFlags::empty(), "existing", epoch, epoch)
                .map_err(err)
        }),
        "stream-write" => {
            let f = open(&dir, "existing", OpenFlags::empty())?;
            let s = f.write_via_stream(0).map_err(err)?;
            s.check_write().map_err(err)?;
            Box::new(move || s.write(b"X").map_err(err))
        }
        "stream-append" => {
            let f = open(&dir, "existing", OpenFlags::empty())?;
            let s = f.append_via_stream().map_err(err)?;
            Box::new(move || s.blocking_write_and_flush(b"X").map_err(err))
        }
        "stream-flush" => {
            let f = open(&dir, "existing", OpenFlags::empty())?;
            let s = f.write_via_stream(0).map_err(err)?;
            Box::new(move || s.blocking_flush().map_err(err))
        }
        "udp-send" => {
            let sock = udp_create_socket::create_udp_socket(IpAddressFamily::Ipv4).map_err(err)?;
            sock.start_bind(&net, any_port()).map_err(err)?;
            sock.subscribe().block();
            sock.finish_bind().map_err(err)?;
            let remote = addr()?;
            let (incoming, outgoing) = sock.stream(Some(remote)).map_err(err)?;
            outgoing.check_send().map_err(err)?;
            Box::new(move || {
                let sent = outgoing.send(&[OutgoingDatagram {
                    data: b"X".to_vec(),
                    remote_address: None,
                }]);
                // Streams before their socket: a socket with live streams cannot be dropped.
                drop((outgoing, incoming));
                drop(sock);
                sent.map(drop).map_err(err)
            })
        }
        "tcp-connect" => {
            let sock = tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4).map_err(err)?;
            let remote = addr()?;
            Box::new(move || {
                sock.start_connect(&net, remote).map_err(err)?;
                sock.subscribe().block();
                let (input, output) = sock.finish_connect().map_err(err)?;
                drop((input, output));
                Ok(())
            })
        }
        "tcp-bind" => {
            let sock = tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4).map_err(err)?;
            let local = addr()?;
            Box::new(move || {
                sock.start_bind(&net, local).map_err(err)?;
                sock.finish_bind().map_err(err)
            })
        }
        "tcp-listen" => {
            let sock = tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4).map_err(err)?;
            sock.start_bind(&net, addr()?).map_err(err)?;
            sock.finish_bind().map_err(err)?;
            Box::new(move || {
                sock.start_listen().map_err(err)?;
                sock.finish_listen().map_err(err)
            })
        }
        "tcp-accept" => {
            let sock = tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4).map_err(err)?;
            sock.start_bind(&net, addr()?).map_err(err)?;
            sock.finish_bind().map_err(err)?;
            sock.start_listen().map_err(err)?;
            sock.finish_listen().map_err(err)?;
            Box::new(move || {
                // The connection is queued before the stop, but the host's listener may not
                // have heard of it yet: wait for it then (the first `accept` is the call
                // that is checked; past the deadline it traps, so nothing waits).
                let (accepted, input, output) = loop {
                    match sock.accept() {
                        Err(ErrorCode::WouldBlock) => sock.subscribe().block(),
                        other => break other.map_err(err)?,
                    }
                };
                drop((input, output));
                drop(accepted);
                Ok(())
            })
        }
        "tcp-write" => {
            let sock = tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4).map_err(err)?;
            sock.start_connect(&net, addr()?).map_err(err)?;
            sock.subscribe().block();
            let (input, output) = sock.finish_connect().map_err(err)?;
            Box::new(move || {
                let written = output.blocking_write_and_flush(b"X");
                drop((input, output));
                drop(sock);
                written.map_err(err)
            })
        }
        other => return Err(format!("unknown effect {other:?}")),
    })
}

impl Guest for Effects {
    fn run() -> Result<(), String> {
        let effect = std::env::var("EFFECT").map_err(|_| "EFFECT not granted".to_owned())?;
        let act = if effect.starts_with("http-") {
            http::prepare(&effect)?
        } else {
            prepare(&effect)?
        };
        kv::set("ready", b"1")?;
        lease::stopping().block();
        act()
    }
}

vvm_guest::export!(Effects);
