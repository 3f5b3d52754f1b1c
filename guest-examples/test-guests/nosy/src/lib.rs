//! Test guest: tries to read a file and to open a TCP connection, records in the key-value
//! store (`file`, `socket`) whether each was allowed or denied, then waits to be stopped.
//!
//! The file path is `NOSY_FILE` (default `/etc/hostname`); the address is `NOSY_ADDR`
//! (default `127.0.0.1:9`): both readable only if the operator grants environment variables.

use vvm_guest::wasi::sockets::{instance_network, network, tcp_create_socket};
use vvm_guest::{Guest, info, kv, lease};

struct Nosy;

fn try_file() -> String {
    let path = std::env::var("NOSY_FILE").unwrap_or_else(|_| "/etc/hostname".to_owned());
    match std::fs::read_to_string(&path) {
        Ok(text) => format!("allowed: read {} bytes", text.len()),
        Err(e) => format!("denied: {e}"),
    }
}

fn try_socket() -> String {
    let addr: std::net::SocketAddrV4 = std::env::var("NOSY_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::net::SocketAddrV4::new([127, 0, 0, 1].into(), 9));
    let net = instance_network::instance_network();
    let socket = match tcp_create_socket::create_tcp_socket(network::IpAddressFamily::Ipv4) {
        Ok(s) => s,
        Err(e) => return format!("denied: create: {e:?}"),
    };
    let [a, b, c, d] = addr.ip().octets();
    let remote = network::IpSocketAddress::Ipv4(network::Ipv4SocketAddress {
        port: addr.port(),
        address: (a, b, c, d),
    });
    if let Err(e) = socket.start_connect(&net, remote) {
        return format!("denied: connect: {e:?}");
    }
    socket.subscribe().block();
    match socket.finish_connect() {
        Ok(_) => "allowed: connected".to_owned(),
        Err(e) => format!("failed: {e:?}"),
    }
}

impl Guest for Nosy {
    fn run() -> Result<(), String> {
        let file = try_file();
        info(&format!("file: {file}"));
        kv::set("file", file.as_bytes())?;
        let socket = try_socket();
        info(&format!("socket: {socket}"));
        kv::set("socket", socket.as_bytes())?;
        lease::stopping().block();
        Ok(())
    }
}

vvm_guest::export!(Nosy);
