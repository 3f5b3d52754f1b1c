//! Embeds what `vvm-host new` writes (`src/cli/new.rs`) in the binary: the project templates
//! (`templates/`) and the WIT the projects build against, the repository's own (`../wit`, and
//! `../guest-examples/js-http/wit` for a JavaScript HTTP service). Writes
//! `$OUT_DIR/templates.rs`: one table of (path relative to its folder, contents) per folder,
//! sorted by path, text with `include_str!` and WIT with `include_bytes!`.

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let tables = [
        (
            "TEMPLATES",
            "str",
            "include_str",
            manifest.join("templates"),
        ),
        ("WIT", "[u8]", "include_bytes", manifest.join("../wit")),
        (
            "WIT_JS_HTTP",
            "[u8]",
            "include_bytes",
            manifest.join("../guest-examples/js-http/wit"),
        ),
    ];
    let mut out = String::new();
    for (table, ty, include, dir) in tables {
        let dir = dir.canonicalize()?;
        println!("cargo::rerun-if-changed={}", dir.display());
        let mut files = Vec::new();
        walk(&dir, &dir, &mut files)?;
        files.sort();
        writeln!(out, "static {table}: &[(&str, &{ty})] = &[")?;
        for (relative, absolute) in files {
            writeln!(out, "    ({relative:?}, {include}!({absolute:?})),")?;
        }
        writeln!(out, "];")?;
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("templates.rs"), out)?;
    Ok(())
}

/// Every file under `dir`, as (its path relative to `root`, joined by '/'; its full path).
fn walk(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) -> Result<(), Box<dyn Error>> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(root, &path, files)?;
            continue;
        }
        let text = |p: &Path| {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("{}: not UTF-8", p.display()))
        };
        let relative = path.strip_prefix(root)?;
        let parts: Vec<String> = relative
            .components()
            .map(|c| text(c.as_os_str().as_ref()))
            .collect::<Result<_, _>>()?;
        files.push((parts.join("/"), text(&path)?));
    }
    Ok(())
}
