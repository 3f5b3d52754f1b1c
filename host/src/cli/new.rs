//! `vvm-host new`: a ready guest project, in Rust, Python or JavaScript, of one of three kinds:
//! a service (world `service`: the lease, its stop signal, `wasi:keyvalue`, `wasi:config`), an
//! HTTP service (world `http-service`: a handler that counts hits and calls an upstream over
//! `wasi:http`) or a scheduled service (world `schedule`: a `wasi:cli` command, run once per
//! fire time with the fire time in `VVM_FIRE_TIME`, that counts its runs). The project holds
//! its code, the WIT it builds against (the repository's own, embedded by `build.rs` with the
//! templates of `templates/`), a README and `build.sh`, which installs the pinned toolchain on
//! first use and writes `NAME.wasm`. A scheduled service's `schedule` goes in the host's
//! `vvm.toml`, which `new` does not write: it prints the lines.
//!
//! A template is up to three layers of `templates/`: `<lang>/` (what every kind shares: the
//! build script, the toolchain's pins), `<kind>/` if there is one (what every language shares:
//! the `schedule` world's WIT) and `<lang>-<kind>/` (the code and the README). In their text
//! `{{name}}` is the service name, `{{crate}}` the Rust crate name (`-` as `_`), `{{world}}`
//! the WIT world and `{{schedule}}` the schedule `new` suggests.

use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use super::status::emit;

include!(concat!(env!("OUT_DIR"), "/templates.rs"));

/// The longest service name `new` accepts.
const MAX_NAME: usize = 64;

/// The schedule suggested for a scheduled service: every ten seconds (cron, seconds first).
const SCHEDULE: &str = "*/10 * * * * *";

/// `vvm-host new` arguments.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The service name: the project's folder, and the stem of the .wasm it builds, which is
    /// the service's name in the host (1 to 64 of a-z, 0-9 and '-', starting with a letter).
    pub name: String,
    /// The language.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// A service, run while the host leads; an HTTP service, a handler for each request; or a
    /// scheduled service, a command run once per fire time of its schedule.
    #[arg(long, value_enum, default_value_t = Kind::Service)]
    pub kind: Kind,
    /// The folder to make the project folder NAME in.
    #[arg(long, value_name = "PARENT", default_value = ".")]
    pub dir: PathBuf,
}

/// The guest languages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust with wit-bindgen.
    Rust,
    /// Python with componentize-py.
    Python,
    /// JavaScript with componentize-js.
    Js,
}

/// What a project builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// A service: `run`, called once per leadership, until the lease's stop signal.
    Service,
    /// An HTTP service: a `wasi:http` handler, served on the host's `--http-addr`.
    Http,
    /// A scheduled service: a `wasi:cli` command, run once per fire time of the `schedule` in
    /// its `[service.NAME]` of vvm.toml, the fire time in `VVM_FIRE_TIME`.
    Schedule,
}

/// Why no project was made. Nothing is left behind in any case.
#[derive(Debug, thiserror::Error)]
pub enum NewError {
    /// The name cannot name a service.
    #[error(
        "service name {name:?}: {why}; a service name is 1 to {MAX_NAME} of a-z, 0-9 and '-', \
         starting with a letter"
    )]
    BadName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The project's folder is there already.
    #[error("{}: already exists; choose another name or --dir", path.display())]
    Exists {
        /// The project's folder.
        path: PathBuf,
    },
    /// A file or folder could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// What could not be written.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

pub(super) const EXAMPLES: &str = "\
Examples:
  # A Rust service in ./hello, built and run
  vvm-host new hello
  cd hello && ./build.sh && cp hello.wasm ../services/

  # A Python HTTP service in ./projects/api, served at /api/ (vvm-host serve --http-addr ...)
  vvm-host new --lang python --kind http --dir projects api

  # A JavaScript service
  vvm-host new --lang js ticker

  # A Rust scheduled service, run every ten seconds with this in vvm.toml:
  #   [service.report]
  #   schedule = \"*/10 * * * * *\"
  vvm-host new --kind schedule report";

/// Checks that `name` can name a service and a project: 1 to 64 of a-z, 0-9 and '-', starting
/// with a letter. (The host takes any file stem; this is stricter, so that the name is also a
/// valid package name in each language and needs no quoting in a shell or a `vvm.toml` key.)
///
/// # Errors
/// [`NewError::BadName`] saying what is wrong.
pub fn check_name(name: &str) -> Result<(), NewError> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let why = if name.is_empty() {
        "it is empty".to_owned()
    } else if name.len() > MAX_NAME {
        format!("it is {} bytes long", name.len())
    } else if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        format!("it has {c:?}")
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        "it does not start with a letter".to_owned()
    } else {
        return Ok(());
    };
    Err(NewError::BadName {
        name: name.to_owned(),
        why,
    })
}

/// The WIT world a project builds for.
fn world(lang: Lang, kind: Kind) -> &'static str {
    match (lang, kind) {
        (_, Kind::Service) => "service",
        // componentize-js answers `fetch` events on WASI 0.2.10's handler (see js-http's WIT).
        (Lang::Js, Kind::Http) => "http-service-js",
        (_, Kind::Http) => "http-service",
        // A command with vvm:host's imports, in the `schedule/` layer's `wit/schedule.wit`.
        (_, Kind::Schedule) => "schedule",
    }
}

/// The templates' folder names, in the order they are written (a folder that is not there
/// adds nothing).
fn layers(lang: Lang, kind: Kind) -> [String; 3] {
    let lang = match lang {
        Lang::Rust => "rust",
        Lang::Python => "python",
        Lang::Js => "js",
    };
    let kind = match kind {
        Kind::Service => "service",
        Kind::Http => "http",
        Kind::Schedule => "schedule",
    };
    [lang.to_owned(), kind.to_owned(), format!("{lang}-{kind}")]
}

/// The files of project `name`: (path in the project, contents).
fn render(name: &str, lang: Lang, kind: Kind) -> Vec<(String, Vec<u8>)> {
    let crate_name = name.replace('-', "_");
    let mut wit: Vec<&(&str, &[u8])> = WIT.iter().collect();
    if (lang, kind) == (Lang::Js, Kind::Http) {
        wit.extend(WIT_JS_HTTP);
    }
    let mut files: Vec<(String, Vec<u8>)> = wit
        .into_iter()
        .map(|(path, bytes)| (format!("wit/{path}"), bytes.to_vec()))
        .collect();
    for layer in layers(lang, kind) {
        let prefix = format!("{layer}/");
        for (path, text) in TEMPLATES {
            if let Some(path) = path.strip_prefix(&prefix) {
                let text = text
                    .replace("{{name}}", name)
                    .replace("{{crate}}", &crate_name)
                    .replace("{{world}}", world(lang, kind))
                    .replace("{{schedule}}", SCHEDULE);
                files.push((path.to_owned(), text.into_bytes()));
            }
        }
    }
    files
}

/// Makes project `args.name` in `args.dir` and returns its folder. The files are written into
/// a hidden folder beside it, which is then renamed into place: on an error nothing is left.
///
/// # Errors
/// A bad name, a project folder that exists, or a file that cannot be written.
pub fn create(args: &NewArgs) -> Result<PathBuf, NewError> {
    check_name(&args.name)?;
    let parent = std::fs::metadata(&args.dir).and_then(|m| {
        m.is_dir()
            .then_some(())
            .ok_or_else(|| io::ErrorKind::NotADirectory.into())
    });
    parent.map_err(|source| NewError::Write {
        path: args.dir.clone(),
        source,
    })?;
    let target = args.dir.join(&args.name);
    if target.symlink_metadata().is_ok() {
        return Err(NewError::Exists { path: target });
    }
    let files = render(&args.name, args.lang, args.kind);
    write_beside(&target, &args.name, &files)?;
    Ok(target)
}

/// Writes `files` into a new hidden folder beside `target` and renames it to `target`, which
/// must not exist. On an error, removes the hidden folder.
fn write_beside(target: &Path, name: &str, files: &[(String, Vec<u8>)]) -> Result<(), NewError> {
    let staging = target.with_file_name(format!(".{name}.new-{}", std::process::id()));
    std::fs::create_dir(&staging).map_err(|source| NewError::Write {
        path: target.parent().unwrap_or(target).to_owned(),
        source,
    })?;
    let written = files
        .iter()
        .try_for_each(|(path, bytes)| write_file(&staging.join(path), bytes))
        .and_then(|()| rename_new(&staging, target));
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}

/// Writes one file, making its folder; `build.sh` executable.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), NewError> {
    let fail = |source| NewError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::write(path, bytes).map_err(fail)?;
    if path.file_name().is_some_and(|f| f == "build.sh") {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    }
    Ok(())
}

/// Renames `from` to `to` unless `to` exists (at that moment: not replacing a folder made since
/// it was checked).
fn rename_new(from: &Path, to: &Path) -> Result<(), NewError> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    let renamed = match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        // A file system without RENAME_NOREPLACE: check, then rename.
        Err(Errno::INVAL) if to.symlink_metadata().is_err() => std::fs::rename(from, to),
        Err(Errno::INVAL) => Err(io::Error::from(Errno::EXIST)),
        other => other.map_err(io::Error::from),
    };
    renamed.map_err(|source| match source.kind() {
        io::ErrorKind::AlreadyExists => NewError::Exists {
            path: to.to_owned(),
        },
        _ => NewError::Write {
            path: to.to_owned(),
            source,
        },
    })
}

/// `vvm-host new`: makes the project and says what to do next.
pub(super) fn new(args: &NewArgs) -> anyhow::Result<ExitCode> {
    let path = create(args)?;
    let (name, dir) = (&args.name, shell_word(&path.to_string_lossy()));
    let lang = match args.lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    };
    let mut out = Vec::new();
    match args.kind {
        Kind::Service => writeln!(out, "created {dir}: a {lang} service")?,
        Kind::Http => writeln!(out, "created {dir}: a {lang} HTTP service")?,
        Kind::Schedule => writeln!(out, "created {dir}: a {lang} scheduled service")?,
    }
    writeln!(
        out,
        "next:\n  cd {dir} && ./build.sh && cp {name}.wasm ../services/"
    )?;
    if args.kind == Kind::Http {
        writeln!(out, "  vvm-host serve --http-addr 127.0.0.1:8080")?;
        writeln!(out, "  curl -i 127.0.0.1:8080/{name}/")?;
    }
    if args.kind == Kind::Schedule {
        writeln!(
            out,
            "  and in the host's vvm.toml, its schedule (every ten seconds):\n    \
             [service.{name}]\n    schedule = \"{SCHEDULE}\""
        )?;
    }
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// `text` as one shell word: as it is if it needs no quoting, else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests;
