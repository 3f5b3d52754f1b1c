//! Blocking outgoing HTTP over `wasi:http/outgoing-handler`, for guests that make one request
//! at a time and want the whole response.
//!
//! The host sends a request only when the service's `http` allow-list in `vvm.toml` grants its
//! origin; any other fails with [`ErrorCode::HttpRequestDenied`]. It adds the headers
//! `vvm-fencing-token` and `vvm-lease` itself, and setting either here fails with
//! [`HeaderError::Forbidden`].

use std::fmt;

use crate::wasi::http::outgoing_handler;
use crate::wasi::http::types::{
    Fields, FutureIncomingResponse, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use crate::wasi::io::streams::{InputStream, StreamError};

pub use crate::wasi::http::types::{ErrorCode, HeaderError};

/// `blocking-write-and-flush` takes at most this many bytes per call.
const WRITE_CHUNK: usize = 4096;
/// How much to ask for per read of the response body.
const READ_CHUNK: u64 = 64 * 1024;

/// A response: its status and its whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The body, read to its end.
    pub body: Vec<u8>,
}

/// Why a request failed.
#[derive(Debug)]
pub enum HttpError {
    /// The URL is not `scheme://authority[/path][?query]`.
    Url(String),
    /// A header could not be set: `Forbidden` for one the host sets itself (`vvm-fencing-token`,
    /// `vvm-lease`) or a hop-by-hop one, `InvalidSyntax` for a bad name or value.
    Header {
        /// The header's name as given.
        name: String,
        /// What the host said.
        error: HeaderError,
    },
    /// The host refused the request or the exchange failed, e.g. `HttpRequestDenied` (not in
    /// the allow-list), `ConnectionRefused`, `DnsError`.
    Request(ErrorCode),
    /// The request or response body stream failed without an HTTP error code.
    Body(String),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(text) => write!(f, "bad url: {text}"),
            Self::Header { name, error } => write!(f, "header {name}: {error:?}"),
            Self::Request(code) => write!(f, "{code:?}"),
            Self::Body(text) => write!(f, "body: {text}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// Sends one request and waits for the whole response (status and body).
///
/// `url` is `http://host[:port][/path][?query]` (or `https://`); the path defaults to `/`.
/// A non-empty `body` (or any body for a method other than GET and HEAD) is sent with a
/// `content-length`. Blocks until the response has been read to its end; the host drops the
/// exchange (and the call traps) once the service's lease deadline passes.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, HttpError> {
    let with_body = !body.is_empty() || !matches!(method, "GET" | "HEAD");
    let fields = Fields::new();
    for &(name, value) in headers {
        set_header(&fields, name, value)?;
    }
    if with_body {
        // A fixed length, so the body is not sent chunked and the host checks it at `finish`.
        set_header(&fields, "content-length", &body.len().to_string())?;
    }
    let request = new_request(method, url, fields)?;
    // Taken before `handle`, which consumes the request.
    let outgoing = if with_body {
        Some(
            request
                .body()
                .map_err(|()| body_error("request body taken"))?,
        )
    } else {
        None
    };
    let future = outgoing_handler::handle(request, None).map_err(HttpError::Request)?;
    // Written after `handle`: the host streams it to the server as it comes, so a body larger
    // than the host's buffer cannot stall before the request is on its way.
    if let Some(outgoing) = outgoing
        && let Err(e) = send_body(outgoing, body)
    {
        // The exchange's own error (refused, reset) says more than the broken stream.
        return Err(match wait(&future) {
            Err(code @ HttpError::Request(_)) => code,
            _ => e,
        });
    }
    let response = wait(&future)?;
    let status = response.status();
    let body = read_body(&response)?;
    Ok(Response { status, body })
}

/// Sets `name: value` on `fields`.
fn set_header(fields: &Fields, name: &str, value: &str) -> Result<(), HttpError> {
    fields
        .set(name, &[value.as_bytes().to_vec()])
        .map_err(|error| HttpError::Header {
            name: name.to_owned(),
            error,
        })
}

/// A request for `method` and `url`, with `fields` as its headers.
fn new_request(method: &str, url: &str, fields: Fields) -> Result<OutgoingRequest, HttpError> {
    let (scheme, authority, path) = split_url(url)?;
    let request = OutgoingRequest::new(fields);
    let bad = |what: &str| HttpError::Url(format!("{url}: {what} refused"));
    request
        .set_method(&parse_method(method))
        .map_err(|()| bad("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| bad("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| bad("authority"))?;
    request
        .set_path_with_query(Some(&path))
        .map_err(|()| bad("path"))?;
    Ok(request)
}

/// The scheme, authority and path-with-query of `url` (the fragment is not sent).
fn split_url(url: &str) -> Result<(Scheme, &str, String), HttpError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| HttpError::Url(format!("{url}: no scheme")))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_owned()),
    };
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(HttpError::Url(format!("{url}: no host")));
    }
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok((scheme, authority, path))
}

fn parse_method(method: &str) -> Method {
    match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_owned()),
    }
}

/// Writes all of `body` and finishes it.
fn send_body(outgoing: OutgoingBody, body: &[u8]) -> Result<(), HttpError> {
    let stream = outgoing
        .write()
        .map_err(|()| body_error("request body stream taken"))?;
    for chunk in body.chunks(WRITE_CHUNK) {
        // Waits until the stream can take the chunk, writes it, and flushes it.
        stream
            .blocking_write_and_flush(chunk)
            .map_err(stream_error)?;
    }
    // The stream is the body's child: it must be gone before `finish`.
    drop(stream);
    OutgoingBody::finish(outgoing, None).map_err(HttpError::Request)
}

/// Blocks until the response head has arrived (or the exchange failed).
fn wait(future: &FutureIncomingResponse) -> Result<IncomingResponse, HttpError> {
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => Ok(response),
        Some(Ok(Err(code))) => Err(HttpError::Request(code)),
        Some(Err(())) => Err(body_error("response already taken")),
        None => Err(body_error("response not ready after waiting for it")),
    }
}

/// The whole body of `response`.
fn read_body(response: &IncomingResponse) -> Result<Vec<u8>, HttpError> {
    let incoming = response
        .consume()
        .map_err(|()| body_error("response body taken"))?;
    let stream = incoming
        .stream()
        .map_err(|()| body_error("response body stream taken"))?;
    let read = read_all(&stream);
    // The stream is the body's child, the body the response's: dropped in that order.
    drop(stream);
    drop(incoming);
    read
}

fn read_all(stream: &InputStream) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(StreamError::Closed) => return Ok(body),
            Err(e) => return Err(stream_error(e)),
        }
    }
}

/// A stream error as the HTTP error code behind it, if the host gives one.
fn stream_error(e: StreamError) -> HttpError {
    match e {
        StreamError::LastOperationFailed(io) => {
            match crate::wasi::http::types::http_error_code(&io) {
                Some(code) => HttpError::Request(code),
                // E.g. `connection read timeout` (a between-bytes timeout while reading the
                // body). Its first line only: one log line per error.
                None => {
                    let text = io.to_debug_string();
                    HttpError::Body(text.lines().next().unwrap_or_default().to_owned())
                }
            }
        }
        StreamError::Closed => body_error("stream closed"),
    }
}

fn body_error(text: &str) -> HttpError {
    HttpError::Body(text.to_owned())
}
