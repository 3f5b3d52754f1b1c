use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::{Behaviour, Server};

/// Reads one response (head and `content-length` body) off `stream`.
fn read_response(stream: &mut impl Read) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.parse().unwrap());
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
    (head, body)
}

fn connect(server: &Server) -> TcpStream {
    TcpStream::connect(server.addr()).unwrap()
}

#[test]
fn get() {
    let server = Server::start(Behaviour::default());
    let mut stream = connect(&server);
    stream
        .write_all(
            b"GET /hello?x=1 HTTP/1.1\r\nHost: a\r\nX-Two: 1\r\nx-two:  2 \r\n\
              Connection: close\r\n\r\n",
        )
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.ends_with("\r\n\r\nok"), "{response}");
    let [request] = &server.wait_for_requests(1)[..] else {
        panic!("{:?}", server.requests())
    };
    assert_eq!((&*request.method, &*request.path), ("GET", "/hello?x=1"));
    assert_eq!(request.header("HOST"), Some("a"));
    assert_eq!(request.header_values("X-two"), ["1", "2"]);
    assert_eq!(request.header("absent"), None);
    assert!(request.body.is_empty());
    assert_eq!((server.connections(), server.closed_early()), (1, 0));
}

#[test]
fn chunked_post() {
    let server = Server::start(Behaviour {
        status: 201,
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream
        .write_all(
            b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
              5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n",
        )
        .unwrap();
    let (head, _) = read_response(&mut stream);
    assert!(head.starts_with("HTTP/1.1 201 "), "{head}");
    let request = &server.wait_for_requests(1)[0];
    assert_eq!(request.body, b"hello world");
    assert_eq!(server.body_bytes_received(), 11);
}

#[test]
fn keep_alive() {
    let server = Server::start(Behaviour {
        // Waited for with a read timeout, which must not lose what is read meanwhile.
        head_delay: Duration::from_millis(5),
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream.write_all(b"GET /1 HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut stream).1, b"ok");
    stream
        .write_all(b"PUT /2 HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc")
        .unwrap();
    assert_eq!(read_response(&mut stream).1, b"ok");
    let requests = server.wait_for_requests(2);
    let seen: Vec<_> = requests.iter().map(|r| (&*r.path, &*r.body)).collect();
    assert_eq!(seen, [("/1", &b""[..]), ("/2", b"abc")]);
    assert_eq!(server.connections(), 1);
}

#[test]
fn malformed_requests_close_the_connection() {
    let server = Server::start(Behaviour::default());
    let long_head = vec![b'a'; 70 * 1024];
    for garbage in [
        &b"NONSENSE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n",
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        &long_head,
    ] {
        let mut stream = connect(&server);
        stream.write_all(garbage).unwrap();
        let mut rest = Vec::new();
        // Closed unanswered: at its end, or reset for the bytes the server left unread.
        let _ = stream.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }
    let mut stream = connect(&server);
    stream.write_all(b"GET /fine HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut stream).1, b"ok");
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn silent() {
    let server = Server::start(Behaviour {
        silent: true,
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream
        .write_all(b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc")
        .unwrap();
    server.wait_for_connections(1);
    drop(server);
    // Nothing was written before the server went, and nothing read.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

#[test]
fn silent_reads_nothing() {
    let server = Server::start(Behaviour {
        silent: true,
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream
        .write_all(b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc")
        .unwrap();
    server.wait_for_connections(1);
    drop(stream);
    assert_eq!(
        (server.requests().len(), server.body_bytes_received()),
        (0, 0)
    );
}

#[test]
fn a_head_delay_ends_with_the_server() {
    let server = Server::start(Behaviour {
        head_delay: Duration::from_mins(1),
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    server.wait_for_requests(1);
    let dropped = Instant::now();
    drop(server);
    assert!(
        dropped.elapsed() < Duration::from_secs(10),
        "{:?}",
        dropped.elapsed()
    );
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

#[test]
fn a_client_leaving_a_delayed_response_closed_early() {
    let server = Server::start(Behaviour {
        head_delay: Duration::from_mins(1),
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    server.wait_for_requests(1);
    drop(stream);
    server.wait_for_closed_early(1);
}

#[test]
fn a_stalled_body() {
    let server = Server::start(Behaviour {
        body: b"0123456789".to_vec(),
        stall_body_after: Some(4),
        ..Behaviour::default()
    });
    let mut stream = connect(&server);
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0];
    while !head.ends_with(b"\r\n\r\n0123") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.contains("content-length: 10\r\n"), "{head}");
    assert_eq!(server.closed_early(), 0);
    drop(stream);
    server.wait_for_closed_early(1);
}

#[test]
fn a_body_cut_short_is_counted() {
    let server = Server::start(Behaviour::default());
    let mut stream = connect(&server);
    stream
        .write_all(b"POST / HTTP/1.1\r\ncontent-length: 10\r\n\r\nabc")
        .unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    server.wait_for_closed_early(1);
    assert_eq!(
        (server.requests().len(), server.body_bytes_received()),
        (0, 3)
    );
}

/// A rustls client configuration that trusts only the CA certificate at `ca`.
fn trusting(ca: &std::path::Path) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

fn connect_tls(
    server: &Server,
    config: &Arc<ClientConfig>,
    name: &str,
) -> StreamOwned<ClientConnection, TcpStream> {
    let name = ServerName::try_from(name).unwrap().to_owned();
    let client = ClientConnection::new(Arc::clone(config), name).unwrap();
    StreamOwned::new(client, connect(server))
}

#[test]
fn tls() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = Server::start_tls(
        Behaviour {
            body: b"secure".to_vec(),
            // Waited for with read timeouts under rustls.
            head_delay: Duration::from_millis(5),
            ..Behaviour::default()
        },
        dir.path(),
    );
    assert_eq!(ca, dir.path().join("ca.pem"));
    let config = trusting(&ca);
    for name in ["localhost", "127.0.0.1"] {
        let mut stream = connect_tls(&server, &config, name);
        stream
            .write_all(b"POST /s HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi")
            .unwrap();
        let (head, body) = read_response(&mut stream);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(body, b"secure");
    }
    let requests = server.wait_for_requests(2);
    assert!(requests.iter().all(|r| r.body == b"hi"), "{requests:?}");
    assert_eq!((server.connections(), server.closed_early()), (2, 0));
}

#[test]
fn tls_closed_early_and_not() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = Server::start_tls(
        Behaviour {
            head_delay: Duration::from_mins(1),
            ..Behaviour::default()
        },
        dir.path(),
    );
    let config = trusting(&ca);
    // Handshaken, then dropped without `close_notify` before any request: not early.
    let mut idle = connect_tls(&server, &config, "localhost");
    while idle.conn.is_handshaking() {
        idle.conn.complete_io(&mut idle.sock).unwrap();
    }
    drop(idle);
    server.wait_until_idle();
    assert_eq!(server.closed_early(), 0);
    let mut stream = connect_tls(&server, &config, "localhost");
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    server.wait_for_requests(1);
    drop(stream);
    server.wait_for_closed_early(1);
    server.wait_until_idle();
    assert_eq!((server.connections(), server.closed_early()), (2, 1));
}
