//! Spin's request headers (SPEC §10, "Incoming HTTP"): what Spin tells a handler of the route
//! that matched (Spin's `crates/trigger-http/src/headers.rs`), so that a component built with
//! a Spin SDK (its `Router` reads them) runs unchanged. Every request an HTTP service gets
//! carries them; a client's own headers under any `spin-` name are removed first, so a guest
//! never reads a forged one (Spin itself appends its values after the client's).

use std::net::SocketAddr;

use hyper::HeaderMap;
use hyper::Uri;
use hyper::header::{HOST, HeaderName, HeaderValue};

use crate::config::Route;

/// What every Spin header's name begins with.
const PREFIX: &str = "spin-";

/// Replaces `headers`' `spin-*` headers with Spin's, for a request for `uri` from `client`
/// that `route` answers.
pub(super) fn set_headers(
    headers: &mut HeaderMap,
    route: &Route,
    uri: &Uri,
    client: Option<SocketAddr>,
) {
    // Looked for first: a client that sends none (every honest one) costs no allocation.
    if headers.keys().any(|name| name.as_str().starts_with(PREFIX)) {
        let forged: Vec<HeaderName> = headers
            .keys()
            .filter(|name| name.as_str().starts_with(PREFIX))
            .cloned()
            .collect();
        for name in forged {
            headers.remove(name);
        }
    }
    let Some(matched) = route.capture(uri.path()) else {
        return;
    };
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    let full_url = format!("http://{host}{path_and_query}");
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    set("spin-path-info", &matched.path_info);
    set("spin-full-url", &full_url);
    set("spin-matched-route", route.matched());
    set("spin-base-path", "/");
    set("spin-raw-component-route", route.raw());
    set("spin-component-route", route.component());
    if let Some(client) = client {
        set("spin-client-addr", &client.to_string());
    }
    for (name, value) in matched.named {
        let name = format!("{PREFIX}path-match-{}", name.replace('_', "-"));
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_for(route: &str, uri: &str, sent: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in sent {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let route = Route::parse(route).unwrap();
        let client = "127.0.0.1:8777".parse().ok();
        set_headers(&mut headers, &route, &uri.parse().unwrap(), client);
        headers
    }

    fn get<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    /// Spin's `test_default_headers` and `test_default_headers_with_named_wildcards`
    /// (`crates/trigger-http/src/headers.rs`), over plain HTTP.
    #[test]
    fn a_request_carries_spins_headers_with_spins_values() {
        let h = headers_for(
            "/foo/...",
            "/foo/bar?key1=value1&key2=value2",
            &[("host", "fermyon.dev")],
        );
        for (name, want) in [
            (
                "spin-full-url",
                "http://fermyon.dev/foo/bar?key1=value1&key2=value2",
            ),
            ("spin-path-info", "/bar"),
            ("spin-matched-route", "/foo/..."),
            ("spin-base-path", "/"),
            ("spin-raw-component-route", "/foo/..."),
            ("spin-component-route", "/foo"),
            ("spin-client-addr", "127.0.0.1:8777"),
        ] {
            assert_eq!(get(&h, name), [want], "{name}");
        }
        let h = headers_for(
            "/foo/:userid/...",
            "/foo/42/bar",
            &[("host", "fermyon.dev")],
        );
        assert_eq!(get(&h, "spin-path-info"), ["/bar"]);
        assert_eq!(get(&h, "spin-matched-route"), ["/foo/:userid/..."]);
        assert_eq!(get(&h, "spin-component-route"), ["/foo/:userid"]);
        assert_eq!(get(&h, "spin-path-match-userid"), ["42"]);
        let h = headers_for("/u/:user_id", "/u/7", &[]);
        assert_eq!(get(&h, "spin-path-match-user-id"), ["7"]);
        assert_eq!(get(&h, "spin-full-url"), ["http://localhost/u/7"]);
        assert_eq!(get(&h, "spin-path-info"), [""]);
    }

    #[test]
    fn a_clients_spin_headers_never_reach_the_guest() {
        let h = headers_for(
            "/users/:id",
            "/users/1",
            &[
                ("spin-path-info", "/forged"),
                ("spin-path-match-id", "0"),
                ("spin-path-match-admin", "yes"),
                ("spin-anything", "x"),
                ("x-other", "kept"),
            ],
        );
        assert_eq!(get(&h, "spin-path-info"), [""]);
        assert_eq!(get(&h, "spin-path-match-id"), ["1"]);
        assert!(get(&h, "spin-path-match-admin").is_empty());
        assert!(get(&h, "spin-anything").is_empty());
        assert_eq!(get(&h, "x-other"), ["kept"]);
    }
}
