//! The crate's structure (issue 29): no import cycle between the files of `host/src`, and no
//! import up the layers that `lib.rs`'s map declares. A move that breaks either fails here,
//! with the files and the names that tie them, so the house cannot drift again.
//!
//! An edge A → B is any `crate::` or `super::` path in A (a `use`, or a path in code, test
//! modules included) that resolves to the module of file B. A module's own `mod` declarations
//! and its `pub use` of its own children (a facade) are not edges: they expose, not use.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A module path, `[]` for the crate root.
type Module = Vec<String>;

/// Every `.rs` file under `host/src`, by module path.
fn files(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.first().is_some_and(|m| m == "bin") {
                continue;
            }
            if module.last().is_some_and(|m| m == "mod" || m == "lib") {
                module.pop();
            }
            out.insert(module, path);
        }
    }
    out
}

/// The file module that `path` (a full module path) lies in: its longest prefix that is a file.
fn owner(path: &[String], files: &BTreeMap<Module, PathBuf>) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|m| files.contains_key(m))
        .unwrap_or_default()
}

/// The source without comments (line comments, doc comments) and string literals' contents,
/// so that a path in prose or in a message is not an import.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if !in_str && c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && prev != '\'' {
                in_str = !in_str;
                out.push('"');
            } else if !in_str {
                out.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.push('\n');
    }
    out
}

/// The full paths a `use` tree names, as segment lists (`crate::{a, b::{c, d}}` gives
/// `crate::a`, `crate::b::c`, `crate::b::d`).
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = tree[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let mut base = prefix.to_vec();
            base.extend(head);
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        } else {
            let tree = tree.split(" as ").next().unwrap_or("");
            let mut path = prefix.to_vec();
            path.extend(
                tree.split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    expand(&[], tree, &mut out);
    out
}

/// `path` (starting with `crate`, `super` or `self`) made absolute from module `at`.
fn absolute(path: &[String], at: &[String]) -> Option<Module> {
    let mut base: Module = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => at.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
    }
    base.extend(rest.iter().filter(|s| *s != "*").cloned());
    Some(base)
}

/// The edges of one file at module `module`: target file module → the names it takes.
fn edges(
    module: &[String],
    text: &str,
    files: &BTreeMap<Module, PathBuf>,
) -> BTreeMap<Module, BTreeSet<String>> {
    let code = code_only(text);
    let mut out: BTreeMap<Module, BTreeSet<String>> = BTreeMap::new();
    // Inline modules (`mod tests { .. }`) by the brace depth they open at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut statement = String::new();
    for line in code.lines() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed
            .strip_prefix("pub(crate) mod ")
            .or_else(|| trimmed.strip_prefix("pub(super) mod "))
            .or_else(|| trimmed.strip_prefix("pub mod "))
            .or_else(|| trimmed.strip_prefix("mod "))
            .and_then(|rest| rest.strip_suffix('{'))
        {
            inline.push((name.trim().to_owned(), depth));
        }
        let here: Module = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        statement.push_str(line);
        statement.push(' ');
        let complete = !trimmed.starts_with("use ")
            && !trimmed.starts_with("pub use ")
            && !trimmed.starts_with("pub(crate) use ")
            && !trimmed.starts_with("pub(super) use ")
            || line.contains(';');
        if complete {
            let stmt = std::mem::take(&mut statement);
            let s = stmt.trim_start();
            let (is_use, facade) = if let Some(t) = s.strip_prefix("use ") {
                (Some(t), false)
            } else if let Some(t) = s
                .strip_prefix("pub use ")
                .or_else(|| s.strip_prefix("pub(crate) use "))
                .or_else(|| s.strip_prefix("pub(super) use "))
            {
                (Some(t), true)
            } else {
                (None, false)
            };
            let paths: Vec<Vec<String>> = match is_use {
                Some(tree) => use_paths(tree.split(';').next().unwrap_or("")),
                None => inline_paths(&stmt),
            };
            for mut path in paths {
                // A `use` of a child file module by its own name (`use body::x;` in a module
                // with a `body.rs`) is a use of that file, as `self::body::x` would be.
                let first = path.first().cloned().unwrap_or_default();
                let child: Module = here.iter().cloned().chain([first.clone()]).collect();
                if !matches!(first.as_str(), "crate" | "super" | "self")
                    && files.contains_key(&child)
                {
                    path.insert(0, "self".to_owned());
                }
                let Some(abs) = absolute(&path, &here) else {
                    continue;
                };
                let target = owner(&abs, files);
                let own_child = facade && target.len() > module.len() && target.starts_with(module);
                if target.as_slice() == module || own_child {
                    continue;
                }
                let name = abs.last().cloned().unwrap_or_default();
                out.entry(target).or_default().insert(name);
            }
        }
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The `crate::a::b` and `super::a` paths written in code (not in a `use`).
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let segments: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            out.push(segments);
        }
    }
    out
}

/// The graph of `host/src`: file module → file module → names.
type Graph = BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>>;

/// The source tree checked: `host/src`, or `$STRUCTURE_SRC` (to look at another checkout's,
/// e.g. to see the check fail on a tree that has cycles).
fn src() -> PathBuf {
    std::env::var_os("STRUCTURE_SRC").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        PathBuf::from,
    )
}

fn graph() -> Graph {
    let files = files(&src());
    files
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            (module.clone(), edges(module, &text, &files))
        })
        .collect()
}

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "lib".to_owned()
    } else {
        m.join("/")
    }
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Module) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flat_map(BTreeMap::keys) {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

/// The layers `lib.rs` declares, top first: the numbered lines of its map after `Layers, top
/// first` (up to the first blank doc line), each a list of top-level modules in backticks.
fn layers() -> Vec<Vec<String>> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut out = Vec::new();
    let mut inside = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        if doc.contains("Layers, top first") {
            inside = true;
            continue;
        }
        if inside {
            if doc.trim().is_empty() {
                break;
            }
            if !doc.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
                continue;
            }
            let names: Vec<String> = doc
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            out.push(names);
        }
    }
    out
}

#[test]
fn no_import_cycle_between_files() {
    let graph = graph();
    // The check sees the crate: the command line serves, the runtime reads the fence's state.
    let edges: usize = graph.values().map(BTreeMap::len).sum();
    assert!(edges > 60, "only {edges} edges read: the parser is broken");
    let has = |a: &str, b: &str| {
        let m = |s: &str| s.split('/').map(str::to_owned).collect::<Module>();
        graph.get(&m(a)).is_some_and(|t| t.contains_key(&m(b)))
    };
    assert!(has("cli/serve", "server") && has("runtime/fence", "runtime/state"));
    let found = cycles(&graph);
    let mut report = String::new();
    for component in &found {
        report.push_str("cycle:\n");
        for a in component {
            for (b, names) in &graph[a] {
                if component.contains(b) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    let _ = writeln!(report, "  {} -> {}: {}", show(a), show(b), names.join(", "));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "import cycles between files of host/src:\n{report}"
    );
}

#[test]
fn no_import_up_the_layers() {
    let layers = layers();
    assert!(layers.len() > 3, "lib.rs declares its layers: {layers:?}");
    let layer_of = |m: &Module| -> Option<usize> {
        let top = m.first()?;
        layers.iter().position(|l| l.contains(top))
    };
    let graph = graph();
    let mut undeclared = BTreeSet::new();
    let mut up = Vec::new();
    for (a, targets) in &graph {
        let Some(la) = layer_of(a) else {
            if !a.is_empty() {
                undeclared.insert(show(a));
            }
            continue;
        };
        for (b, names) in targets {
            if a.first() == b.first() {
                continue;
            }
            match layer_of(b) {
                // Layers are numbered from the top: a file may use only what is below it.
                Some(lb) if lb > la => {}
                Some(_) => up.push(format!(
                    "{} -> {}: {}",
                    show(a),
                    show(b),
                    names.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                None => {
                    undeclared.insert(show(b));
                }
            }
        }
    }
    assert!(
        undeclared.is_empty(),
        "modules missing from lib.rs's layers: {undeclared:?}"
    );
    assert!(
        up.is_empty(),
        "imports up (or across) the layers:\n{}",
        up.join("\n")
    );
}

/// The parsing this check relies on, on the forms the crate uses.
#[test]
fn use_trees_and_paths_are_read_as_written() {
    assert_eq!(
        use_paths("crate::{a::B, b::{c, d::E as F}, self}"),
        [
            vec!["crate", "a", "B"],
            vec!["crate", "b", "c"],
            vec!["crate", "b", "d", "E"],
            vec!["crate", "self"],
        ]
        .map(|p| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    );
    let at: Module = vec!["runtime".into(), "host".into(), "tests".into()];
    assert_eq!(
        absolute(&["super".into(), "super".into(), "env".into()], &at),
        Some(vec!["runtime".to_owned(), "env".to_owned()])
    );
    assert_eq!(
        inline_paths("let x = crate::ops::Ops::global(); \"crate::no\"; y::crate::z"),
        [vec!["crate", "ops", "Ops", "global"], vec!["crate", "no"]]
            .map(|p| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    );
    assert_eq!(code_only("a // crate::b\n\"crate::c\" d"), "a \n\"\" d\n");
    // A module's `use` of its own child file by name is an edge to it; its facade is not.
    let module: Module = vec!["outgoing".into()];
    let files: BTreeMap<Module, PathBuf> = [
        (module.clone(), PathBuf::new()),
        (vec!["outgoing".into(), "body".into()], PathBuf::new()),
    ]
    .into();
    let used = edges(&module, "use body::fenced;\nuse tokio::x;\n", &files);
    assert_eq!(
        used.keys().collect::<Vec<_>>(),
        [&vec!["outgoing".to_owned(), "body".to_owned()]]
    );
    assert!(edges(&module, "pub(crate) use body::fenced;\n", &files).is_empty());
}
