//! A service's outgoing HTTP allow-list (`[service.NAME] http = [...]`, SPEC §10), in the
//! syntax Spin users know: `scheme://host[:port]`, where the host may start with a wildcard
//! label (`*.slack.com`) or be `*` alone, and a port left out is the scheme's own (80, 443).
//! No path: an entry grants a destination, not a resource on it. Pure: parsed once with the
//! settings, asked once per request before anything touches the network.

use std::net::IpAddr;

/// The destinations a service may send requests to. Empty (the default) denies everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Allowed>,
}

/// One entry: a scheme, a host pattern and a port.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Allowed {
    https: bool,
    host: HostPattern,
    port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    /// This host only (lower case; an IP address in its canonical text, without brackets).
    Exact(String),
    /// Any host ending in this suffix, which starts with a dot (`*.slack.com`: `.slack.com`).
    Suffix(String),
    /// Any host (`*`).
    Any,
}

/// Why a request may go: through an entry naming its host exactly (`literal`), or through a
/// wildcard. Only a literal entry lets a name resolve to a loopback or link-local address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllowedBy {
    /// The entry names the host exactly.
    pub literal: bool,
}

impl AllowList {
    /// True if it names no origin.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Parses the entries of a service's `http` list.
    ///
    /// # Errors
    /// Naming the first entry that is not `scheme://host[:port]`, and why.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|entry| parse_entry(entry).map_err(|why| format!("http entry {entry:?} {why}")))
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// Whether a request to `host` on `port` over `https` (or plain http) may go, and how.
    /// `host` is as the request names it: any case, an IPv6 address with or without brackets.
    pub fn check(&self, https: bool, host: &str, port: u16) -> Option<AllowedBy> {
        let host = canonical_host(host)?;
        let mut found = None;
        for entry in &self.entries {
            if entry.https != https || entry.port != port {
                continue;
            }
            match &entry.host {
                HostPattern::Exact(h) if *h == host => return Some(AllowedBy { literal: true }),
                HostPattern::Suffix(suffix) if host.ends_with(suffix.as_str()) => {
                    found = Some(AllowedBy { literal: false });
                }
                HostPattern::Any => found = Some(AllowedBy { literal: false }),
                _ => {}
            }
        }
        found
    }
}

/// The port a scheme uses when a URL names none.
pub fn default_port(https: bool) -> u16 {
    if https { 443 } else { 80 }
}

fn parse_entry(entry: &str) -> Result<Allowed, &'static str> {
    let (scheme, rest) = entry
        .split_once("://")
        .ok_or("has no scheme: write it as https://host or http://host:port")?;
    let https = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        _ => return Err("has a scheme other than http or https"),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@']) {
        return Err("has a path, query or user: name only scheme://host[:port]");
    }
    let (host, port) = split_port(rest)?;
    let port = match port {
        None => default_port(https),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("has a port that is not 1 to 65535")?,
    };
    let host = if host == "*" {
        HostPattern::Any
    } else if let Some(suffix) = host.strip_prefix("*.") {
        let suffix = canonical_host(suffix).ok_or("has an invalid host after '*.'")?;
        if suffix.parse::<IpAddr>().is_ok() {
            return Err("has a wildcard over an IP address");
        }
        HostPattern::Suffix(format!(".{suffix}"))
    } else {
        HostPattern::Exact(canonical_host(host).ok_or(
            "has an invalid host: a name, an IP address, '*', or a leading wildcard label",
        )?)
    };
    Ok(Allowed { https, host, port })
}

/// Splits `host[:port]`, where an IPv6 host is in brackets.
fn split_port(text: &str) -> Result<(&str, Option<&str>), &'static str> {
    if let Some(inner) = text.strip_prefix('[') {
        let (host, after) = inner.split_once(']').ok_or("has an unclosed '['")?;
        return match after {
            "" => Ok((text, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((&text[..host.len() + 2], Some(port))),
                None => Err("has text after an IPv6 address"),
            },
        };
    }
    Ok(match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    })
}

/// A host as entries and requests are compared: lower case, no trailing dot, an IP address
/// in its canonical text without brackets; `None` if it is not a valid host.
pub(super) fn canonical_host(host: &str) -> Option<String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(ip.to_string());
    }
    let name = bare.strip_suffix('.').unwrap_or(bare).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|&e| e.to_owned()).collect::<Vec<_>>()).unwrap()
    }

    /// Spin's syntax: a scheme, a host (exact, `*.` wildcard, or `*`), an optional port that
    /// defaults to the scheme's; the scheme and the port must match too.
    #[test]
    fn entries_match_scheme_host_and_port() {
        let l = list(&[
            "https://api.example.com",
            "https://*.slack.com:443",
            "http://127.0.0.1:8080",
            "http://[::1]:9000/",
        ]);
        let literal = Some(AllowedBy { literal: true });
        let wildcard = Some(AllowedBy { literal: false });
        assert_eq!(l.check(true, "api.example.com", 443), literal);
        assert_eq!(l.check(true, "API.Example.COM.", 443), literal);
        assert_eq!(l.check(false, "api.example.com", 443), None, "scheme");
        assert_eq!(l.check(true, "api.example.com", 8443), None, "port");
        assert_eq!(l.check(true, "example.com", 443), None);
        assert_eq!(l.check(true, "hooks.slack.com", 443), wildcard);
        assert_eq!(l.check(true, "a.b.slack.com", 443), wildcard);
        assert_eq!(
            l.check(true, "slack.com", 443),
            None,
            "a wildcard needs a label"
        );
        assert_eq!(l.check(true, "evilslack.com", 443), None);
        assert_eq!(l.check(false, "127.0.0.1", 8080), literal);
        assert_eq!(l.check(false, "[::1]", 9000), literal);
        assert_eq!(l.check(false, "0:0:0:0:0:0:0:1", 9000), literal);
        assert_eq!(l.check(false, "localhost", 8080), None);

        let any = list(&["http://*:8080"]);
        assert_eq!(any.check(false, "localhost", 8080), wildcard);
        assert_eq!(any.check(false, "localhost", 8081), None);
        assert_eq!(AllowList::default().check(true, "example.com", 443), None);
    }

    /// An entry that is not `scheme://host[:port]` is refused, naming it and why.
    #[test]
    fn malformed_entries_are_refused_with_the_reason() {
        let cases = [
            ("example.com", "no scheme"),
            ("ftp://example.com", "other than http"),
            ("https://example.com/path", "path"),
            ("https://user@example.com", "user"),
            ("https://example.com:0", "port"),
            ("https://example.com:99999", "port"),
            ("https://example.com:x", "port"),
            ("https://exa mple.com", "invalid host"),
            ("https://a.*.com", "invalid host"),
            ("https://*.10.0.0.1", "wildcard over an IP"),
            ("https://", "invalid host"),
            ("https://[::1", "unclosed"),
        ];
        for (entry, why) in cases {
            let e = AllowList::parse(&[entry.to_owned()]).unwrap_err();
            assert!(e.contains(entry) && e.contains(why), "{entry}: {e}");
        }
    }
}
