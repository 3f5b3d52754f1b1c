//! Tests of routes (`config::route`): Spin's syntax, matching and precedence, against the
//! cases of Spin's own routing tests (`crates/routes/src/lib.rs`, `mod route_tests`, at
//! spinframework/spin 94a8fc8) and of its integration test `test_http_routing`, and what
//! Spin's router was seen to do when run (the cases marked "probe").

use super::*;

fn route(text: &str) -> Route {
    Route::parse(text).unwrap()
}

/// The name of the route of `routes` (in the order written) that answers `path`, as the
/// host picks it.
fn winner<'a>(routes: &[(&'a str, &str)], path: &str) -> Option<&'a str> {
    let parsed: Vec<(Route, usize)> = routes
        .iter()
        .enumerate()
        .map(|(i, (_, text))| (route(text), i))
        .collect();
    pick(parsed.iter().map(|(r, i)| (r, *i)), path).map(|i| routes[i].0)
}

#[test]
fn a_wildcard_matches_itself_and_below_and_an_exact_path_only_itself() {
    let api = route("/api/...");
    for yes in ["/api", "/api/", "/api/users", "/api/users/1"] {
        assert!(api.matches(yes), "{yes}");
    }
    for no in ["/apis", "/ap", "/", "/other/api"] {
        assert!(!api.matches(no), "{no}");
    }
    let all = route("/...");
    assert!(all.matches("/") && all.matches("/x/y"));
    // As Spin's: slashes at either end of the path do not count.
    let exact = route("/hello");
    for yes in ["/hello", "/hello/", "//hello", "/hello//"] {
        assert!(exact.matches(yes), "{yes}");
    }
    assert!(!exact.matches("/hello/x") && !exact.matches("/hellos"));
    assert_eq!(Route::default_for("svc"), route("/svc/..."));
    assert_eq!(route("/api/...").to_string(), "/api/...");
    assert_eq!(route("/hello").to_string(), "/hello");
}

/// Spin: `test_router_exact`, `test_router_wildcard`, `test_router_exact_beats_wildcard`,
/// `test_router_respects_longest_match` (both orders).
#[test]
fn spins_routing_tests_pick_as_spin_does() {
    let exact = [("foo", "/foo"), ("foobar", "/foo/bar")];
    assert_eq!(winner(&exact, "/foo"), Some("foo"));
    assert_eq!(winner(&exact, "/foo/bar"), Some("foobar"));
    let all = [("all", "/...")];
    for path in ["/foo/bar", "/abc/", "/"] {
        assert_eq!(winner(&all, path), Some("all"), "{path}");
    }
    let one = [("one_exact", "/one"), ("wildcard", "/...")];
    assert_eq!(winner(&one, "/one"), Some("one_exact"));
    let mut longest = vec![
        ("one_wildcard", "/one/..."),
        ("onetwo_wildcard", "/one/two/..."),
        ("onetwothree_wildcard", "/one/two/three/..."),
    ];
    assert_eq!(
        winner(&longest, "/one/two/three/four"),
        Some("onetwothree_wildcard")
    );
    longest.reverse();
    assert_eq!(
        winner(&longest, "/one/two/three/four"),
        Some("onetwothree_wildcard")
    );
}

/// Spin: `trailing_wildcard_is_captured`, `trailing_wildcard_respects_trailing_slash`,
/// `named_wildcard_is_captured`, and `test_http_routing` (route `/users/:userid/...`, the
/// handler answering `{spin-path-match-userid}:{spin-path-info}`).
#[test]
fn what_a_route_takes_of_the_path_is_spins() {
    let info = |r: &str, path: &str| route(r).capture(path).unwrap().path_info;
    assert_eq!(info("/...", "/1/2/3"), "/1/2/3");
    assert_eq!(info("/1/...", "/1/2/3"), "/2/3");
    for (path, want) in [
        ("/test", ""),
        ("/test/", "/"),
        ("/test/hello", "/hello"),
        ("/test/hello/", "/hello/"),
    ] {
        assert_eq!(info("/test/...", path), want, "{path}");
    }
    for r in ["/1/:two/3", "/1/:two/..."] {
        let named = route(r).capture("/1/2/3").unwrap().named;
        assert_eq!(named, [("two".to_owned(), "2".to_owned())], "{r}");
    }
    let users = route("/users/:userid/...");
    for (path, want) in [
        ("/users/42", "42:"),
        ("/users/42/", "42:/"),
        ("/users/42/hello", "42:/hello"),
        ("/users/42/hello/", "42:/hello/"),
    ] {
        let m = users.capture(path).unwrap();
        assert_eq!(format!("{}:{}", m.named[0].1, m.path_info), want, "{path}");
    }
    assert_eq!(route("/hello").capture("/hello").unwrap().path_info, "");
}

/// Spin's router run on the same routes (probe): precedence is by segment from the left, a
/// literal over a name over the wildcard, then the shorter route.
#[test]
fn the_most_specific_route_wins_as_spins_router_picks() {
    let root = [("root", "/"), ("all", "/...")];
    assert_eq!(winner(&root, "/"), Some("root"));
    assert_eq!(winner(&root, "/x"), Some("all"));
    let foo = [("exact", "/foo"), ("wild", "/foo/...")];
    for path in ["/foo", "/foo/", "/foo//", "//foo"] {
        assert_eq!(winner(&foo, path), Some("exact"), "{path}");
    }
    assert_eq!(winner(&foo, "/foo/bar"), Some("wild"));
    assert_eq!(winner(&foo, "/foobar"), None);
    let users = [
        ("wild", "/users/..."),
        ("param", "/users/:id"),
        ("admin", "/users/admin"),
    ];
    for (path, want) in [
        ("/users", "wild"),
        ("/users/", "wild"),
        ("/users/1", "param"),
        ("/users/1/", "param"),
        ("/users/admin", "admin"),
        ("/users/1/x", "wild"),
    ] {
        assert_eq!(winner(&users, path), Some(want), "{path}");
    }
    // An earlier literal beats a later one.
    let early = [("pa", "/:a/b"), ("xw", "/x/...")];
    assert_eq!(winner(&early, "/x/b"), Some("xw"));
    assert_eq!(winner(&early, "/y/b"), Some("pa"));
    let deep = [("ab", "/a/b/..."), ("axc", "/a/:x/c")];
    assert_eq!(winner(&deep, "/a/b/c"), Some("ab"));
    assert_eq!(winner(&deep, "/a/q/c"), Some("axc"));
    let qp = [("q", "/:a/..."), ("p", "/:a/:b")];
    assert_eq!(winner(&qp, "/1"), Some("q"));
    assert_eq!(winner(&qp, "/1/2"), Some("p"));
    assert_eq!(winner(&qp, "/1/2/3"), Some("q"));
    let two = [("one", "/one/..."), ("onetwo", "/one/two/...")];
    assert_eq!(winner(&two, "/one/two"), Some("onetwo"));
    assert_eq!(winner(&two, "/one/twox"), Some("one"));
    assert_eq!(winner(&two, "/one/two/x"), Some("onetwo"));
    // A named segment is never empty, and is not decoded.
    let p = route("/users/:id");
    assert!(!p.matches("/users/") && !p.matches("/users"));
    assert_eq!(p.capture("/users/a%20b").unwrap().named[0].1, "a%20b");
    // Among equals (a clash the settings refuse), the least key.
    let tied = [(route("/api/..."), "b"), (route("/api/..."), "a")];
    assert_eq!(pick(tied.iter().map(|(r, n)| (r, *n)), "/api/x"), Some("a"));
}

#[test]
fn routes_of_one_shape_clash_and_the_names_spin_reports_are_kept() {
    assert_eq!(route("/:a"), route("/:b"));
    assert_eq!(route("/foo"), route("/foo/"));
    assert_ne!(route("/foo"), route("/foo/..."));
    assert_ne!(route("/users/:id"), route("/users/admin"));
    let r = route("/users/:id/...");
    assert_eq!(
        (r.raw(), r.matched(), r.component()),
        ("/users/:id/...", "/users/:id/...", "/users/:id")
    );
    let slash = route("/foo/");
    assert_eq!((slash.raw(), slash.matched()), ("/foo/", "/foo"));
    let star = route("/foo/*");
    assert_eq!(star, route("/foo/..."));
    assert_eq!(star.capture("/foo/bar").unwrap().path_info, "/bar");
    assert_eq!((star.matched(), star.component()), ("/foo/*", "/foo/*"));
    let root = route("/");
    assert_eq!((root.matched(), root.component()), ("", "/"));
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
        ("/a/:", "named segment"),
        ("/a/:x.json", "named segment"),
        ("/a/b:c", "whole segment"),
        ("/:x/:x", "twice"),
        ("/a//b", "empty segment"),
        ("/a/*/b", "'*'"),
    ] {
        let e = Route::parse(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}
