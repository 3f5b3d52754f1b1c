//! Tests of `vvm-host new`: which names it takes, what a project holds (every placeholder
//! replaced, the repository's own WIT, the guest examples' pins), and that a refused project
//! writes nothing.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::*;

const LANGS: [Lang; 3] = [Lang::Rust, Lang::Python, Lang::Js];
const KINDS: [Kind; 3] = [Kind::Service, Kind::Http, Kind::Schedule];

/// The repository's file `path` (relative to its root).
fn repo_file(path: &str) -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read(root.join(path)).unwrap()
}

fn args(dir: &Path, name: &str, lang: Lang, kind: Kind) -> NewArgs {
    NewArgs {
        name: name.to_owned(),
        lang,
        kind,
        dir: dir.to_owned(),
    }
}

/// Every file under `dir`, by path relative to it.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_str().unwrap().to_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn a_name_is_1_to_64_of_lowercase_digits_and_dashes_from_a_letter() {
    let longest = format!("a{}", "-0".repeat(31) + "z");
    assert_eq!(longest.len(), MAX_NAME);
    for good in [
        "a",
        "hello",
        "hello-world",
        "v2",
        "a--b-",
        "fn",
        "self",
        longest.as_str(),
    ] {
        assert!(check_name(good).is_ok(), "{good}");
    }
    let too_long = format!("{longest}x");
    for bad in [
        "", "1abc", "-a", "Hello", "a_b", "a.b", "a/b", "..", "a b", "é", "a\n", &too_long,
    ] {
        let e = check_name(bad).unwrap_err().to_string();
        assert!(e.starts_with("service name "), "{bad:?}: {e}");
        assert!(e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
    }
}

#[test]
fn every_project_has_its_files_with_every_placeholder_replaced() {
    for lang in LANGS {
        for kind in KINDS {
            let files: BTreeMap<String, Vec<u8>> =
                render("my-svc", lang, kind).into_iter().collect();
            for must in ["build.sh", "README.md", "wit/host.wit", ".gitignore"] {
                assert!(files.contains_key(must), "{lang:?} {kind:?}: no {must}");
            }
            for (path, bytes) in &files {
                let text = String::from_utf8_lossy(bytes);
                assert!(!text.contains("{{"), "{lang:?} {kind:?}: {path}");
            }
            let build = String::from_utf8_lossy(&files["build.sh"]);
            assert!(build.contains("my-svc.wasm"), "{build}");
            assert!(build.contains("set -euo pipefail"), "{build}");
            let readme = String::from_utf8_lossy(&files["README.md"]);
            assert!(readme.starts_with("# my-svc\n"), "{readme}");
        }
    }
    let rust = render("my-svc", Lang::Rust, Kind::Service);
    assert!(!rust.iter().any(|(p, _)| p == "wit/schedule.wit"));
    let cargo = &rust.iter().find(|(p, _)| p == "Cargo.toml").unwrap().1;
    let cargo: toml::Value = toml::from_slice(cargo).unwrap();
    assert_eq!(cargo["package"]["name"].as_str(), Some("my-svc"));
    assert_eq!(cargo["lib"]["name"].as_str(), Some("my_svc"));
}

/// A scheduled service of each language is a command for the `schedule` world, which joins
/// `vvm:host`'s WIT, reads its fire time from `VVM_FIRE_TIME`, and its README says what to put
/// in `vvm.toml`.
#[test]
fn a_scheduled_service_is_a_command_with_its_schedule_in_its_readme() {
    let wit = TEMPLATES
        .iter()
        .find(|(p, _)| *p == "schedule/wit/schedule.wit")
        .unwrap()
        .1;
    assert!(wit.contains("world schedule {"), "{wit}");
    assert!(wit.contains("include wasi:cli/command@0.2.12;"), "{wit}");
    let own_package = wit.lines().any(|l| l.starts_with("package "));
    assert!(!own_package, "it joins host.wit's package: {wit}");
    let host_wit = String::from_utf8(repo_file("wit/host.wit")).unwrap();
    assert!(host_wit.contains("package vvm:host@0.1.0;"));
    assert!(repo_file("wit/deps/cli/cli.wit").starts_with(b"package wasi:cli@0.2.12;"));
    for lang in LANGS {
        let files: BTreeMap<String, String> = render("report", lang, Kind::Schedule)
            .into_iter()
            .map(|(p, b)| (p, String::from_utf8(b).unwrap()))
            .collect();
        assert_eq!(files["wit/schedule.wit"], *wit, "{lang:?}");
        assert!(files.contains_key("wit/host.wit"), "{lang:?}");
        let readme = &files["README.md"];
        let toml = format!("[service.report]\nschedule = \"{SCHEDULE}\"");
        assert!(readme.contains(&toml), "{lang:?}: {readme}");
        let code: Vec<&String> = files
            .iter()
            .filter(|(p, _)| ["src/lib.rs", "src/app.py", "app.js"].contains(&p.as_str()))
            .map(|(_, text)| text)
            .collect();
        assert_eq!(code.len(), 1, "{lang:?}");
        assert!(code[0].contains("VVM_FIRE_TIME"), "{lang:?}");
        assert!(code[0].contains("report for fire time"), "{lang:?}");
        if lang != Lang::Rust {
            assert!(files["build.sh"].contains(" schedule "), "{lang:?}");
        }
    }
    let rust = render("report", Lang::Rust, Kind::Schedule);
    let lib = &rust.iter().find(|(p, _)| p == "src/lib.rs").unwrap().1;
    assert!(String::from_utf8_lossy(lib).contains("world: \"schedule\""));
}

/// Each template folder is one of a language's or a kind's layers: none is left unused.
#[test]
fn every_template_folder_is_used() {
    let used: Vec<String> = LANGS
        .iter()
        .flat_map(|&l| KINDS.iter().flat_map(move |&k| layers(l, k)))
        .collect();
    for (path, _) in TEMPLATES {
        let folder = path.split('/').next().unwrap();
        assert!(used.iter().any(|u| u == folder), "{path}");
    }
}

/// The WIT a project gets is the repository's, byte for byte, every file of it.
#[test]
fn the_wit_shipped_is_the_repositorys() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (table, dir) in [(WIT, "wit"), (WIT_JS_HTTP, "guest-examples/js-http/wit")] {
        let embedded: BTreeMap<String, Vec<u8>> = table
            .iter()
            .map(|(p, b)| ((*p).to_owned(), b.to_vec()))
            .collect();
        assert_eq!(embedded, tree(&root.join(dir)), "{dir}");
    }
    let js = render("x", Lang::Js, Kind::Http);
    let paths: Vec<&str> = js.iter().map(|(p, _)| p.as_str()).collect();
    assert!(paths.contains(&"wit/host.wit") && paths.contains(&"wit/http-service-js.wit"));
    let rust = render("x", Lang::Rust, Kind::Http);
    assert!(!rust.iter().any(|(p, _)| p.contains("0.2.10")));
}

/// The templates' toolchains are the guest examples' (known to build): componentize-py,
/// componentize-js, and wit-bindgen with every crate its lock file pins.
#[test]
fn the_pins_are_the_guest_examples() {
    let template = |path: &str| {
        let (_, text) = TEMPLATES.iter().find(|(p, _)| *p == path).unwrap();
        (*text).to_owned()
    };
    let text = |path: &str| String::from_utf8(repo_file(path)).unwrap();
    let pins = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    };
    let py = pins(&template("python/requirements.txt"));
    assert_eq!(py, pins(&text("guest-examples/requirements.txt")));
    assert!(py[0].starts_with("componentize-py=="), "{py:?}");

    let js = |t: &str| {
        let v: serde_json::Value = serde_json::from_str(t).unwrap();
        v["devDependencies"]["@bytecodealliance/componentize-js"].clone()
    };
    let theirs = js(&text("guest-examples/package.json"));
    assert!(theirs.is_string());
    assert_eq!(js(&template("js/package.json")), theirs);

    let toml = |t: &str| -> toml::Value { toml::from_str(t).unwrap() };
    assert_eq!(
        toml(&template("rust/Cargo.toml"))["dependencies"]["wit-bindgen"],
        toml(&text("guest-examples/Cargo.toml"))["workspace"]["dependencies"]["wit-bindgen"]
    );
    // Each crate of the registry by name, version and checksum.
    let locked = |t: &str| -> Vec<String> {
        let lock = toml(t);
        let packages = lock["package"].as_array().unwrap().iter();
        let field = |p: &toml::Value, f: &str| p.get(f).map(ToString::to_string);
        packages
            .filter_map(|p| {
                Some(format!(
                    "{} {} {}",
                    p["name"],
                    p["version"],
                    field(p, "checksum")?
                ))
            })
            .collect()
    };
    let ours = locked(&template("rust/Cargo.lock").replace("{{name}}", "x"));
    let theirs = locked(&text("guest-examples/Cargo.lock"));
    assert!(
        ours.iter().any(|p| p.starts_with("\"wit-bindgen\" ")),
        "{ours:?}"
    );
    for package in &ours {
        assert!(theirs.contains(package), "not in guest-examples: {package}");
    }
}

#[test]
fn a_project_is_written_with_an_executable_build_script() {
    let dir = tempfile::tempdir().unwrap();
    let path = create(&args(dir.path(), "hello", Lang::Python, Kind::Http)).unwrap();
    assert_eq!(path, dir.path().join("hello"));
    let written = tree(&path);
    let expected: BTreeMap<String, Vec<u8>> = render("hello", Lang::Python, Kind::Http)
        .into_iter()
        .collect();
    assert_eq!(written, expected);
    let mode = std::fs::metadata(path.join("build.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "{mode:o}");
    // Only the project: no hidden folder left beside it.
    assert_eq!(tree(dir.path()).len(), written.len());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// A bad name, an existing folder (or file) and a missing parent are refused, and nothing is
/// written.
#[test]
fn a_refused_project_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("file"), "x").unwrap();
    let before = tree(dir.path());
    let refused = |name: &str, parent: &Path| {
        create(&args(parent, name, Lang::Rust, Kind::Service))
            .unwrap_err()
            .to_string()
    };
    assert!(refused("Bad", dir.path()).contains("service name \"Bad\""));
    for taken in ["taken", "file"] {
        let e = refused(taken, dir.path());
        assert!(
            e.ends_with("already exists; choose another name or --dir"),
            "{e}"
        );
        assert!(
            e.contains(&dir.path().join(taken).display().to_string()),
            "{e}"
        );
    }
    let missing = dir.path().join("missing");
    assert!(refused("ok", &missing).starts_with(&missing.display().to_string()));
    assert!(refused("ok", &dir.path().join("file")).contains("ot a directory"));
    assert_eq!(tree(dir.path()), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// A folder made between the check and the rename is not replaced, and the hidden folder the
/// files went into is removed.
#[test]
fn a_folder_made_meanwhile_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("late");
    std::fs::create_dir(&target).unwrap();
    let files = render("late", Lang::Js, Kind::Service);
    let e = write_beside(&target, "late", &files).unwrap_err();
    assert!(matches!(e, NewError::Exists { .. }), "{e}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
}

#[test]
fn a_path_that_needs_quoting_is_quoted() {
    assert_eq!(shell_word("./hello"), "./hello");
    assert_eq!(shell_word("my dir/it's"), r"'my dir/it'\''s'");
    assert_eq!(shell_word(""), "''");
}
