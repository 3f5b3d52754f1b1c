//! A service's `route` (SPEC §10, "Incoming HTTP"): the paths of `http-addr` it answers, in
//! the form Spin users write: a prefix ending in `/...`, or an exact path. Parsing and
//! matching are pure; the runtime picks the most specific match of all the routes.

use std::borrow::Borrow;
use std::fmt;

/// Where an HTTP service is served: every path under a prefix, or one exact path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The path without the trailing `/...` of a prefix (`""` for `/...`: every path).
    base: String,
    /// Whether it is a prefix (`/api/...`) rather than an exact path (`/api`).
    prefix: bool,
}

impl Route {
    /// Parses `text`: `/...`, `/a/b/...` or an exact path `/a/b`.
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
        let (base, prefix) = match text.strip_suffix("/...") {
            Some(base) => (base, true),
            None => (text, false),
        };
        if base.contains("...") {
            return Err("has '...' other than as its final '/...'".to_owned());
        }
        if base.split('/').skip(1).any(|s| s == "." || s == "..") {
            return Err("has a '.' or '..' segment".to_owned());
        }
        Ok(Self {
            base: base.to_owned(),
            prefix,
        })
    }

    /// The default route of service `name`: `/NAME/...`.
    pub fn default_for(name: &str) -> Self {
        Self {
            base: format!("/{name}"),
            prefix: true,
        }
    }

    /// Whether request path `path` (without its query) is this route's.
    pub fn matches(&self, path: &str) -> bool {
        if !self.prefix {
            return path == self.base;
        }
        match path.strip_prefix(self.base.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }

    /// How specific it is: of two routes that match a path, the greater wins (the longer
    /// base; at equal bases, the exact path over the prefix).
    pub fn specificity(&self) -> (usize, bool) {
        (self.base.len(), !self.prefix)
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix {
            write!(f, "{}/...", self.base)
        } else {
            f.write_str(&self.base)
        }
    }
}

/// Of `routes` (route, key), the key of the one that answers `path`: the most specific match,
/// the least key among equals (the first service by name).
pub fn pick<R: Borrow<Route>, K: Ord>(
    routes: impl IntoIterator<Item = (R, K)>,
    path: &str,
) -> Option<K> {
    let mut best: Option<((usize, bool), K)> = None;
    for (route, key) in routes {
        let route = route.borrow();
        if !route.matches(path) {
            continue;
        }
        let s = route.specificity();
        if best
            .as_ref()
            .is_none_or(|(b, k)| s > *b || (s == *b && key < *k))
        {
            best = Some((s, key));
        }
    }
    best.map(|(_, key)| key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(text: &str) -> Route {
        Route::parse(text).unwrap()
    }

    #[test]
    fn a_prefix_matches_itself_and_below_and_an_exact_path_only_itself() {
        let api = route("/api/...");
        for yes in ["/api", "/api/", "/api/users", "/api/users/1"] {
            assert!(api.matches(yes), "{yes}");
        }
        for no in ["/apis", "/ap", "/", "/other/api"] {
            assert!(!api.matches(no), "{no}");
        }
        let all = route("/...");
        assert!(all.matches("/") && all.matches("/x/y"));
        let exact = route("/hello");
        assert!(exact.matches("/hello"));
        assert!(!exact.matches("/hello/") && !exact.matches("/hello/x"));
        assert_eq!(Route::default_for("svc"), route("/svc/..."));
        assert_eq!(route("/api/...").to_string(), "/api/...");
        assert_eq!(route("/hello").to_string(), "/hello");
    }

    #[test]
    fn the_most_specific_route_wins() {
        let routes = [
            (route("/..."), "all"),
            (route("/api/..."), "api"),
            (route("/api/users/..."), "users"),
            (route("/api/users"), "exact"),
        ];
        let pick = |path| pick(routes.iter().map(|(r, n)| (r, *n)), path);
        assert_eq!(pick("/"), Some("all"));
        assert_eq!(pick("/apis"), Some("all"));
        assert_eq!(pick("/api/x"), Some("api"));
        assert_eq!(pick("/api/users/1"), Some("users"));
        assert_eq!(pick("/api/users"), Some("exact"));
        let tied = [(route("/api/..."), "b"), (route("/api/..."), "a")];
        assert_eq!(
            super::pick(tied.iter().map(|(r, n)| (r, *n)), "/api/x"),
            Some("a")
        );
        let none: [(Route, &str); 1] = [(route("/api/..."), "api")];
        assert_eq!(super::pick(none.iter().map(|(r, n)| (r, *n)), "/x"), None);
    }

    #[test]
    fn what_is_no_route_is_refused_with_the_reason() {
        for (bad, why) in [
            ("api/...", "start with '/'"),
            ("", "start with '/'"),
            ("/a b", "space"),
            ("/a?x=1", "query"),
            ("/a/.../b", "'...'"),
            ("/a/../b", "'..' segment"),
        ] {
            let e = Route::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
