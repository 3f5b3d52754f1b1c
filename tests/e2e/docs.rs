//! The pages (`README.md`, `docs/*.md`, `guest-examples/README.md`) kept true by the real
//! binary (issue 33):
//!
//! - **Commands.** Every command of a ` ```sh ` block that runs vvm-host (`vvm-host ARGS`,
//!   `cargo run ... -- ARGS`, `./run.sh serve ARGS`; a line is split at `&&`, `||`, `|`, `;`
//!   and `&`, and ends at `#`) parses: `vvm-host ARGS --help` exits 0, and clap checks every
//!   subcommand, flag and value before it reaches `--help`. Then `status`, `check` and `kv`
//!   run for real in a fixture (example guests in `services/`, and the `vvm.redb` a short
//!   `serve` of them left; a directory a `check` names is that `services/`) and must exit 0;
//!   a `serve` line's settings are written as a `vvm.toml` and pass `vvm-host check
//!   --config`, which resolves and bounds them as `serve` does, without serving; and `new`
//!   runs in an empty directory.
//! - **Settings.** Every ` ```toml ` block passes `vvm-host check --config FILE EMPTY_DIR`: the
//!   settings loader and every grant, with the paths it names made (`dirs`, `http-ca`,
//!   `{ file = ... }`) and the variables it names set (`{ env = ... }`). A block whose next
//!   block is ` ```text ` starting `vvm-host: error:` is a deliberately bad example: it must
//!   fail with exactly that line.
//! - **The settings table** of `docs/configuration.md` names every flag and environment
//!   variable of `serve --help`, nothing else, and only `vvm.toml` keys the loader knows.
//! - **Links.** Every relative link points at a file that exists, and its `#anchor` at a
//!   heading there.
//!
//! A command not meant to run as written (a placeholder, another machine's address) goes in a
//! ` ```text ` block, which nothing here reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;

use crate::BIN;
use crate::tools::tool;

/// A page of the documentation.
struct Page {
    /// Relative to the repository, for messages.
    name: String,
    path: PathBuf,
    text: String,
}

/// A fenced block of a page.
struct Block {
    /// What follows the opening fence: `sh`, `toml`, `text`, or nothing.
    lang: String,
    /// The line number of the opening fence, for messages.
    line: usize,
    body: String,
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn pages() -> Vec<Page> {
    let root = repository();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut paths = vec![
        root.join("README.md"),
        root.join("guest-examples/README.md"),
    ];
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| Page {
            name: path.strip_prefix(&root).unwrap().display().to_string(),
            text: std::fs::read_to_string(&path).unwrap(),
            path,
        })
        .collect()
}

impl Page {
    fn blocks(&self) -> Vec<Block> {
        let mut blocks = Vec::new();
        let mut open: Option<Block> = None;
        for (i, line) in self.text.lines().enumerate() {
            let Some(fence) = line.trim_start().strip_prefix("```") else {
                if let Some(block) = &mut open {
                    block.body.push_str(line);
                    block.body.push('\n');
                }
                continue;
            };
            match open.take() {
                Some(block) => blocks.push(block),
                None => {
                    open = Some(Block {
                        lang: fence.trim().to_owned(),
                        line: i + 1,
                        body: String::new(),
                    });
                }
            }
        }
        assert!(
            open.is_none(),
            "{}: a fenced block is never closed",
            self.name
        );
        blocks
    }

    /// The text outside fenced blocks.
    fn unfenced(&self) -> String {
        let mut text = String::new();
        let mut fenced = false;
        for line in self.text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if !fenced {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// The text outside fenced blocks, with inline code removed (it is not markdown). Code
    /// spans may run over a line break; outside fences their backticks pair up.
    fn prose(&self) -> String {
        self.unfenced().split('`').step_by(2).collect()
    }

    /// Where `block` is, for messages.
    fn at(&self, block: &Block) -> String {
        format!("{}:{}", self.name, block.line)
    }
}

// ---------------------------------------------------------------------------------------------
// Commands

/// A command line split into words as a shell would for what the pages show (quotes,
/// backslashes, `#` comments), then into the simple commands between `&&`, `||`, `|`, `;`
/// and `&`.
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '#' if word.is_none() => break,
            '&' | '|' | ';' => {
                commands.last_mut().unwrap().extend(word.take());
                commands.push(Vec::new());
                // `&&` and `||` are one operator each.
                let _ = chars.next_if(|&n| n == c && c != ';');
            }
            c if c.is_whitespace() => commands.last_mut().unwrap().extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    commands.last_mut().unwrap().extend(word);
    commands.retain(|c| !c.is_empty());
    commands
}

/// vvm-host's arguments, if `words` runs vvm-host.
fn vvm_host_args(words: &[String]) -> Option<Vec<String>> {
    let first = words.first()?;
    if first == "vvm-host" || first.ends_with("/vvm-host") {
        return Some(words[1..].to_vec());
    }
    if first == "cargo" && words.get(1).is_some_and(|w| w == "run") {
        let dashes = words.iter().position(|w| w == "--");
        return Some(dashes.map_or_else(Vec::new, |i| words[i + 1..].to_vec()));
    }
    if first.ends_with("run.sh") && words.get(1).is_some_and(|w| w == "serve") {
        return Some(words[1..].to_vec());
    }
    None
}

/// Every vvm-host command of the page's `sh` blocks, with where it is.
fn commands(page: &Page) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for block in page.blocks().iter().filter(|b| b.lang == "sh") {
        let joined = block.body.replace("\\\n", " ");
        for line in joined.lines() {
            for words in simple_commands(line) {
                if let Some(args) = vvm_host_args(&words) {
                    found.push((format!("{}: {line}", page.at(block)), args));
                }
            }
        }
    }
    found
}

/// A directory of example guests and the store a short `serve` of them wrote: where the
/// pages' read-only commands run.
fn fixture() -> tempfile::TempDir {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    guests::install(
        &services,
        &[("rust-counter", "rust-counter"), ("rust-http", "rust-http")],
    );
    let mut host = Host::start(BIN, "docs", dir.path(), &["serve"], "info");
    // rust-counter has written `count` in its namespace.
    host.wait_for(&["rust-counter", "count 1"]);
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
    dir
}

/// The subcommand of `args` (after the global `--log-format`), and its arguments.
fn subcommand(args: &[String]) -> (&str, &[String]) {
    let mut i = 0;
    while args.get(i).is_some_and(|a| a.starts_with("--log-format")) {
        i += if args[i].contains('=') { 1 } else { 2 };
    }
    match args.get(i) {
        Some(name) => (name.as_str(), &args[i + 1..]),
        None => ("", &[]),
    }
}

/// The positional arguments of a `status`, `check` or `kv` command: every flag but
/// `-v`/`--verbose`, `--json` and `--bucket` takes a value.
fn positionals(args: &[String]) -> Vec<&str> {
    let mut found = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if ["-v", "--verbose", "--json", "--bucket"].contains(&arg.as_str()) || arg.contains('=') {
            continue;
        }
        if arg.starts_with('-') {
            args.next();
        } else {
            found.push(arg.as_str());
        }
    }
    found
}

/// The `vvm.toml` that says what the flags of a `serve` line say.
fn serve_flags_as_toml(at: &str, args: &[String]) -> String {
    let mut top = toml::Table::new();
    let mut etcd = toml::Table::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag, value.to_owned()),
            None => (
                arg.as_str(),
                args.next()
                    .unwrap_or_else(|| panic!("{at}: {arg} has no value"))
                    .clone(),
            ),
        };
        let key = flag
            .strip_prefix("--")
            .unwrap_or_else(|| panic!("{at}: {flag} is not a serve flag"));
        if key == "log-format" {
            continue;
        }
        let value = if ["cluster-size", "memory-limit-mib", "handle-limit"].contains(&key) {
            toml::Value::Integer(value.parse().unwrap_or_else(|e| panic!("{at}: {e}")))
        } else {
            toml::Value::String(value)
        };
        match key.strip_prefix("etcd-") {
            Some(key) => etcd.insert(key.to_owned(), value),
            None => top.insert(key.to_owned(), value),
        };
    }
    if !etcd.is_empty() {
        top.insert("etcd".to_owned(), toml::Value::Table(etcd));
    }
    top.to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks one command of a page: it parses, and what it does succeeds.
fn check_command(fixture: &Path, at: &str, args: &[String]) {
    assert!(
        !args.iter().any(|a| a.contains('$')),
        "{at}: a placeholder: put lines not meant to run in a ```text block"
    );
    let (name, rest) = subcommand(args);
    let parsed = Command::new(BIN).args(args).arg("--help").output().unwrap();
    assert!(
        parsed.status.success(),
        "{at}: vvm-host does not take {args:?}:\n{}",
        text(&parsed.stderr)
    );
    let out = match name {
        "status" | "kv" => tool(fixture, &strs(args)),
        "check" => {
            if let Some(dir) = positionals(rest).first() {
                let dir = fixture.join(dir);
                if !dir.exists() {
                    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
                    std::os::unix::fs::symlink(fixture.join("services"), &dir).unwrap();
                }
            }
            tool(fixture, &strs(args))
        }
        "serve" => settings_check(&serve_flags_as_toml(at, rest), &BTreeMap::new()),
        "new" => tool(testkit::scratch::scratch_dir().path(), &strs(args)),
        other => panic!("{at}: no check for the subcommand {other:?}: add one here"),
    };
    assert!(
        out.status.success(),
        "{at}: {args:?} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn every_command_in_the_pages_parses_and_runs() {
    let fixture = fixture();
    let mut checked = 0;
    for page in pages() {
        for (at, args) in commands(&page) {
            check_command(fixture.path(), &at, &args);
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} commands found in the pages");
}

// ---------------------------------------------------------------------------------------------
// Settings

/// `vvm-host check --config FILE EMPTY_DIR` on `toml`, with the environment variables `env`:
/// the settings loader and the grants, as at the start of `serve`, and no component.
fn settings_check(toml: &str, env: &BTreeMap<String, String>) -> Output {
    let dir = testkit::scratch::scratch_dir();
    let file = dir.path().join("vvm.toml");
    std::fs::write(&file, toml).unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    Command::new(BIN)
        .args(["check", "--config"])
        .args([&file, &empty])
        .current_dir(dir.path())
        .envs(env)
        .output()
        .unwrap()
}

/// `toml` with every path it names made in `dir` (`dirs`, `http-ca`, `{ file = ... }` of
/// each `[service.NAME]`), and the variables its `{ env = ... }` values name.
fn with_paths_made(at: &str, toml: &str, dir: &Path) -> (String, BTreeMap<String, String>) {
    let mut table: toml::Table = toml.parse().unwrap_or_else(|e| panic!("{at}: {e}"));
    let mut env = BTreeMap::new();
    let made = |name: String| dir.join(name).display().to_string();
    let services = table.get_mut("service").and_then(toml::Value::as_table_mut);
    for (service, grant) in services.into_iter().flatten() {
        let grant = grant.as_table_mut().unwrap();
        if let Some(dirs) = grant.get_mut("dirs").and_then(toml::Value::as_array_mut) {
            for (i, spec) in dirs.iter_mut().enumerate() {
                let text = spec.as_str().unwrap();
                let (rest, ro) = match text.strip_suffix(":ro") {
                    Some(rest) => (rest, ":ro"),
                    None => (text, ""),
                };
                // The guest path stays; the host's is made.
                let guest = rest.split_once(':').map_or(rest, |(_, guest)| guest);
                let host_dir = made(format!("{service}-dir-{i}"));
                std::fs::create_dir(&host_dir).unwrap();
                *spec = format!("{host_dir}:{guest}{ro}").into();
            }
        }
        if let Some(ca) = grant.get_mut("http-ca") {
            let pem = made(format!("{service}-ca.pem"));
            let cert = rcgen::generate_simple_self_signed(["ca.example".to_owned()]).unwrap();
            std::fs::write(&pem, cert.cert.pem()).unwrap();
            *ca = pem.into();
        }
        let config = grant.get_mut("config").and_then(toml::Value::as_table_mut);
        for (key, value) in config.into_iter().flatten() {
            let Some(source) = value.as_table_mut() else {
                continue;
            };
            if let Some(var) = source.get("env").and_then(toml::Value::as_str) {
                env.insert(var.to_owned(), format!("{service} {key}"));
            }
            if let Some(file) = source.get_mut("file") {
                let path = made(format!("{service}-{key}"));
                std::fs::write(&path, format!("{service} {key}")).unwrap();
                *file = path.into();
            }
        }
    }
    (table.to_string(), env)
}

#[test]
fn every_settings_snippet_passes_the_settings_check_or_fails_as_shown() {
    let mut checked = 0;
    for page in pages() {
        let blocks = page.blocks();
        for (i, block) in blocks.iter().enumerate() {
            if block.lang != "toml" {
                continue;
            }
            let at = page.at(block);
            let paths = testkit::scratch::scratch_dir();
            let (toml, env) = with_paths_made(&at, &block.body, paths.path());
            let out = settings_check(&toml, &env);
            let expected_error = blocks
                .get(i + 1)
                .filter(|next| next.lang == "text" && next.body.starts_with("vvm-host: error:"));
            match expected_error {
                Some(error) => {
                    assert!(!out.status.success(), "{at}: the bad example passed");
                    assert_eq!(
                        text(&out.stderr).trim(),
                        error.body.trim(),
                        "{at}: the error the page shows ({})",
                        page.at(error)
                    );
                }
                None => assert!(
                    out.status.success(),
                    "{at}: the settings check failed:\n{}\n{toml}",
                    text(&out.stderr)
                ),
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} toml blocks found in the pages"
    );
}

/// The flags (`--name`) and environment variables (`VVM_NAME`) of `serve --help`.
fn serve_help() -> (BTreeSet<String>, BTreeSet<String>) {
    let help = tool(Path::new("."), &["serve", "--help"]);
    assert!(help.status.success());
    let help = text(&help.stdout);
    let mut flags = BTreeSet::new();
    let mut envs = BTreeSet::new();
    for line in help.lines() {
        if line.trim_start().starts_with('-')
            && let Some(flag) = line.split([' ', ',']).find(|w| w.starts_with("--"))
        {
            flags.insert(flag.to_owned());
        }
        if let Some((_, env)) = line.split_once("[env: ") {
            envs.insert(env.split(['=', ']']).next().unwrap().to_owned());
        }
    }
    flags.remove("--help");
    (flags, envs)
}

/// The rows of the settings table of `docs/configuration.md`: its cells.
fn settings_table() -> Vec<Vec<String>> {
    let page = pages()
        .into_iter()
        .find(|p| p.name == "docs/configuration.md")
        .unwrap();
    let rows: Vec<Vec<String>> = page
        .text
        .lines()
        .skip_while(|l| !l.starts_with("| flag | env |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.replace("\\|", "/")
                .split('|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect();
    assert!(
        rows.len() > 10,
        "no settings table in docs/configuration.md"
    );
    rows
}

/// The code spans of a table cell.
fn spans(cell: &str) -> impl Iterator<Item = &str> {
    cell.split('`').skip(1).step_by(2)
}

#[test]
fn the_settings_table_is_serves_flags_and_the_loaders_keys() {
    let (help_flags, help_envs) = serve_help();
    let (mut flags, mut envs) = (BTreeSet::new(), BTreeSet::new());
    let mut keys = Vec::new();
    for row in settings_table() {
        for span in spans(&row[1]) {
            flags.extend(
                span.split([' ', ','])
                    .filter(|w| w.starts_with("--"))
                    .map(str::to_owned),
            );
        }
        envs.extend(spans(&row[2]).map(str::to_owned));
        // `[etcd] user`, `password`: a key after a table's is in that table.
        let mut table = "";
        for span in spans(&row[3]) {
            let key = match span.strip_prefix('[').and_then(|s| s.split_once("] ")) {
                Some((t, key)) => {
                    table = t;
                    key
                }
                None => span,
            };
            keys.push((table.to_owned(), key.to_owned()));
        }
    }
    assert_eq!(flags, help_flags, "the table's flags and serve --help's");
    assert_eq!(
        envs, help_envs,
        "the table's environment variables and serve --help's"
    );
    for (table, key) in keys {
        // A value of the wrong type (an array of arrays: no key takes one, a list of
        // strings such as `insecure-registries` neither): refused, but not as an unknown key.
        let toml = if table.is_empty() {
            format!("{key} = [[]]\n")
        } else {
            format!("[{table}]\n{key} = [[]]\n")
        };
        let out = settings_check(&toml, &BTreeMap::new());
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{toml}: an array was taken");
        assert!(
            !stderr.contains("unknown field"),
            "{table} {key}: not a key of vvm.toml: {stderr}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Links

/// The anchors GitHub gives the headings of a page: lower case, spaces as `-`, punctuation
/// but `-` and `_` dropped, `-1`, `-2`... after repeats.
fn anchors(page: &Page) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in page.unfenced().lines() {
        let title = line.trim_start_matches('#');
        if !line.starts_with('#') || !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let repeats = seen.entry(slug.clone()).or_default();
        anchors.insert(match *repeats {
            0 => slug,
            n => format!("{slug}-{n}"),
        });
        *repeats += 1;
    }
    anchors
}

/// The targets of a page's links: `[text](target)` and `[label]: target`.
fn link_targets(page: &Page) -> Vec<String> {
    let prose = page.prose();
    let mut targets: Vec<String> = prose
        .split("](")
        .skip(1)
        .map(|rest| rest.split(')').next().unwrap().to_owned())
        .collect();
    for line in prose.lines() {
        if line.starts_with('[')
            && let Some((_, target)) = line.split_once("]: ")
        {
            targets.push(target.trim().to_owned());
        }
    }
    targets
}

#[test]
fn every_relative_link_points_at_a_file_and_a_heading() {
    let pages = pages();
    let mut checked = 0;
    for page in &pages {
        for target in link_targets(page) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let path = if file.is_empty() {
                page.path.clone()
            } else {
                page.path.parent().unwrap().join(file)
            };
            assert!(path.exists(), "{}: {target}: no such file", page.name);
            if !anchor.is_empty() {
                let path = path.canonicalize().unwrap();
                let linked = pages.iter().find(|p| p.path == path).unwrap_or_else(|| {
                    panic!(
                        "{}: {target}: an anchor in a file that is not a page",
                        page.name
                    )
                });
                assert!(
                    anchors(linked).contains(anchor),
                    "{}: {target}: no such heading; there are {:?}",
                    page.name,
                    anchors(linked)
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} links found in the pages");
}
