//! A service's `route` (SPEC §10, "Incoming HTTP"): the paths of `http-addr` it answers, in
//! Spin's syntax (spin-docs, "HTTP Trigger Routes"; Spin's `crates/routes`, on the matcher
//! `routefinder` 0.5): an exact path (`/cart`), `:NAME` segments that match any one
//! non-empty segment (`/users/:id/edit`), and a trailing wildcard `/...` that matches the
//! path and everything below it (`/users/...`; `/...` is every path). Parsing and matching are
//! pure; the runtime picks the most specific match of all the routes.
//!
//! As Spin's, leading and trailing slashes of the path are not significant (`/cart/` is
//! `/cart`), and of two routes that match a path the more specific wins: compared segment by
//! segment from the left, at the first that differs a literal beats a `:NAME`, which beats
//! the wildcard; where one route is the start of the other, the shorter (`/foo` beats
//! `/foo/...` for `/foo`). Two routes of one shape (`/:a` and `/:b`, `/foo` and `/foo/`)
//! clash: the settings refuse them.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

/// One segment of a route between slashes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    /// This text exactly.
    Literal(String),
    /// Any one non-empty segment, captured under this name.
    Named(String),
}

/// Where an HTTP service is served.
#[derive(Clone, Debug)]
pub struct Route {
    /// As written in the settings (Spin's `raw_route`).
    raw: String,
    segments: Vec<Segment>,
    /// Whether it ends in the trailing wildcard `/...`.
    wildcard: bool,
}

/// What a route took of a request's path, as Spin tells its handlers (`spin-*` headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteMatch {
    /// What the trailing wildcard matched, with its leading slash, and a trailing one if the
    /// path had it (`spin-path-info`); empty for a route without one.
    pub path_info: String,
    /// Each `:NAME` segment and the text it matched (`spin-path-match-NAME`), in order.
    pub named: Vec<(String, String)>,
}

impl Route {
    /// Parses `text`: an exact path, `:NAME` segments, a trailing `/...`.
    ///
    /// # Errors
    /// Why `text` is no route, as words that follow it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if !text.starts_with('/') {
            return Err("does not start with '/'".to_owned());
        }
        if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err("has a space or control character".to_owned());
        }
        if text.contains(['?', '#']) {
            return Err("has a query or fragment ('?' or '#'); a route is a path".to_owned());
        }
        // `/*` is Spin's older spelling of the wildcard, still accepted there.
        let (base, wildcard) = match text.strip_suffix("/...").or(text.strip_suffix("/*")) {
            Some(base) => (base, true),
            None => (text, false),
        };
        if base.contains("...") {
            return Err("has '...' other than as its final '/...'".to_owned());
        }
        let mut segments = Vec::new();
        let mut names = Vec::new();
        let inner = base.trim_matches('/');
        for segment in inner.split('/').filter(|_| !inner.is_empty()) {
            if segment.is_empty() {
                return Err("has an empty segment ('//'): no path reaches it".to_owned());
            }
            if segment == "." || segment == ".." {
                return Err("has a '.' or '..' segment".to_owned());
            }
            if segment.contains('*') {
                return Err(
                    "has a '*' other than as a final '/*': a wildcard is a final '/...'".to_owned(),
                );
            }
            match segment.strip_prefix(':') {
                Some(name) => {
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    {
                        return Err(format!(
                            "has the segment {segment:?}: a named segment is ':' and a name of \
                             letters, digits, '_' and '-'"
                        ));
                    }
                    if names.contains(&name) {
                        return Err(format!("names the segment ':{name}' twice"));
                    }
                    names.push(name);
                    segments.push(Segment::Named(name.to_owned()));
                }
                None if segment.contains(':') => {
                    return Err(format!(
                        "has the segment {segment:?}: a ':' begins a named segment, which is \
                         the whole segment"
                    ));
                }
                None => segments.push(Segment::Literal(segment.to_owned())),
            }
        }
        Ok(Self {
            raw: text.to_owned(),
            segments,
            wildcard,
        })
    }

    /// The default route of service `name`: `/NAME/...`.
    pub fn default_for(name: &str) -> Self {
        Self {
            raw: format!("/{name}/..."),
            segments: vec![Segment::Literal(name.to_owned())],
            wildcard: true,
        }
    }

    /// As written in the settings (`spin-raw-component-route`).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The route as Spin names the one that matched (`spin-matched-route`): as written, less
    /// one trailing slash.
    pub fn matched(&self) -> &str {
        self.raw.strip_suffix('/').unwrap_or(&self.raw)
    }

    /// The route without its trailing `/...` (`spin-component-route`; a `/*` stays, as in
    /// Spin).
    pub fn component(&self) -> &str {
        self.raw.strip_suffix("/...").unwrap_or(&self.raw)
    }

    /// Whether request path `path` (without its query) is this route's.
    pub fn matches(&self, path: &str) -> bool {
        self.capture(path).is_some()
    }

    /// What this route takes of `path` (without its query), if it matches it.
    pub fn capture(&self, path: &str) -> Option<RouteMatch> {
        let trimmed = path.trim_start_matches('/').trim_end_matches('/');
        let mut rest = if trimmed.is_empty() {
            Vec::new()
        } else {
            trimmed.split('/').collect()
        };
        if rest.len() < self.segments.len() || (!self.wildcard && rest.len() > self.segments.len())
        {
            return None;
        }
        let tail = rest.split_off(self.segments.len());
        let mut named = Vec::new();
        for (segment, text) in self.segments.iter().zip(rest) {
            match segment {
                Segment::Literal(literal) if literal == text => {}
                Segment::Named(name) if !text.is_empty() => {
                    named.push((name.clone(), text.to_owned()));
                }
                _ => return None,
            }
        }
        let path_info = if self.wildcard {
            let tail = tail.join("/");
            match (tail.is_empty(), path.ends_with('/')) {
                (true, false) => String::new(),
                (true, true) => "/".to_owned(),
                (false, false) => format!("/{tail}"),
                (false, true) => format!("/{tail}/"),
            }
        } else {
            String::new()
        };
        Some(RouteMatch { path_info, named })
    }

    /// The route's shape as Spin's matcher orders it: each segment's kind (a literal 3, a
    /// named segment 2) with a separator (0) between, and the wildcard (1) last.
    fn kinds(&self) -> Vec<u8> {
        let mut kinds = Vec::new();
        for segment in &self.segments {
            if !kinds.is_empty() {
                kinds.push(0);
            }
            kinds.push(match segment {
                Segment::Literal(_) => 3,
                Segment::Named(_) => 2,
            });
        }
        if self.wildcard {
            if !kinds.is_empty() {
                kinds.push(0);
            }
            kinds.push(1);
        }
        kinds
    }

    /// Of two routes that match one path, how much more specific this is than `other`
    /// (`Greater`: this one wins; `Equal`: one shape, a clash).
    pub fn specificity(&self, other: &Self) -> Ordering {
        let (mine, theirs) = (self.kinds(), other.kinds());
        mine.iter()
            .zip(&theirs)
            .map(|(a, b)| a.cmp(b))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| theirs.len().cmp(&mine.len()))
    }

    /// The route with its names taken out: two routes of one shape match the same paths.
    fn shape(&self) -> (Vec<Option<&str>>, bool) {
        let segments = self
            .segments
            .iter()
            .map(|s| match s {
                Segment::Literal(text) => Some(text.as_str()),
                Segment::Named(_) => None,
            })
            .collect();
        (segments, self.wildcard)
    }
}

/// Routes of one shape are equal (they match the same paths, in the same way): a clash.
impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        self.shape() == other.shape()
    }
}

impl Eq for Route {}

impl Hash for Route {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.shape().hash(state);
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// Of `routes` (route, key), the key of the one that answers `path`: the most specific match,
/// the least key among equals (the first service by name).
pub fn pick<R: Borrow<Route>, K: Ord>(
    routes: impl IntoIterator<Item = (R, K)>,
    path: &str,
) -> Option<K> {
    let mut best: Option<(R, K)> = None;
    for (route, key) in routes {
        if !route.borrow().matches(path) {
            continue;
        }
        let better =
            best.as_ref()
                .is_none_or(|(b, k)| match route.borrow().specificity(b.borrow()) {
                    Ordering::Greater => true,
                    Ordering::Equal => key < *k,
                    Ordering::Less => false,
                });
        if better {
            best = Some((route, key));
        }
    }
    best.map(|(_, key)| key)
}

#[cfg(test)]
mod tests;
