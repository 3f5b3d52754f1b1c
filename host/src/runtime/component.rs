//! Service discovery and compilation (SPEC §6, §12): every `*.wasm` file in the services
//! directory is compiled (or loaded from the on-disk cache, `cache`) before campaigning,
//! checked against the supported worlds (`vvm:host/service`, `wasi:cli/command` of WASI 0.2 or
//! 0.3, `wasi:http/proxy`: a component exporting `wasi:http/incoming-handler`, and a WASI 0.3
//! HTTP service: one exporting `wasi:http/handler@0.3.0`), and pre-instantiated once.

use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{p2, p3};
use wasmtime_wasi_http::handler::ProxyPre;

use super::RuntimeError;
use super::cache;
use super::engine::{Engines, Wasm};
use super::state::Host;
use crate::interfaces::bindings::service::ServicePre;
use crate::interfaces::bindings::spin_cron::SpinCronPre;
use crate::log_output::escaped;
use crate::sources::{Puller, SourceRef};

/// Which world a component targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// The `vvm:host/service` world: hears `stopping`, gets a grace period.
    Service,
    /// A plain `wasi:cli/command`: its `run` is the service; dropped at once on stop.
    Command,
    /// A WASI 0.3 command (`wasi:cli/run@0.3.0`): as a WASI 0.2 one.
    Command3,
    /// An HTTP service (`wasi:http/proxy`): exports `wasi:http/incoming-handler`, and is
    /// served on `http-addr` by route, one instance per request. A `wasi:cli/run` it also
    /// exports is never called (see [`classify`]).
    Http,
    /// A WASI 0.3 HTTP service: exports `wasi:http/handler@0.3.0`, served on `http-addr` by
    /// route, an instance taking several requests at once and many in its life.
    Http3,
    /// A `vvm:host/service` that also exports `wasi:http/incoming-handler`: `run` runs as a
    /// service's does, and requests are served beside it, each in its own instance.
    ServiceAndHttp,
    /// Spin's cron world (`fermyon:spin-cron@2.0.0`): exports `handle-cron-event`, called
    /// once per fire time of its `schedule`, each in its own instance.
    Cron,
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Service => "vvm:host/service",
            Self::Command => "wasi:cli/command",
            Self::Command3 => "WASI 0.3 command (wasi:cli/run@0.3.0)",
            Self::Http => "wasi:http/proxy",
            Self::Http3 => "wasi:http@0.3.0 service (wasi:http/handler@0.3.0)",
            Self::ServiceAndHttp => "vvm:host/service + wasi:http/incoming-handler",
            Self::Cron => "fermyon:spin-cron/spin-cron",
        })
    }
}

/// A service file that could not be loaded; the other services still load.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", escaped(&path.to_string_lossy()))]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// Why it was rejected.
    pub kind: LoadErrorKind,
}

/// Why a service file was rejected. Each message names the cause in full (it is all
/// `vvm-host check` prints); the error behind it, if any, is also its `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadErrorKind {
    /// The file's name has a control character (a newline, a tab), which no log line, status
    /// table or store key could carry as it is.
    #[error("the name has a control character")]
    Name,
    /// The file could not be read: missing, not a regular file, or larger than
    /// [`MAX_COMPONENT_BYTES`].
    #[error("cannot read: {0}")]
    Read(#[source] crate::fs::FileError),
    /// The file is not a WebAssembly component (empty, a core module): its header says so.
    #[error("not a valid component: {0}")]
    Invalid(String),
    /// wasmtime could not compile the component (truncated, corrupt, or it needs a feature
    /// the host does not run): in words for a user, no parser offsets.
    #[error("not a valid component: {}", compile_message(.0))]
    Compile(#[source] wasmtime::Error),
    /// The component targets neither supported world.
    #[error("unsupported world: {0}")]
    World(String),
    /// The component exports the world's entry point with the wrong type.
    #[error("unsupported world: {export} of the wrong type: {source:#}")]
    WrongType {
        /// The export: `run`, `wasi:cli/run` or `wasi:http/incoming-handler`.
        export: &'static str,
        /// wasmtime's type check.
        #[source]
        source: wasmtime::Error,
    },
    /// The component imports something the host does not provide.
    #[error("unsupported imports: {0:#}")]
    Imports(#[source] wasmtime::Error),
    /// The service's registry source could not be pulled (SPEC §13).
    #[error("cannot pull: {0}")]
    Pull(#[source] crate::sources::PullError),
}

/// How the components of one load were obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Components compiled by cranelift.
    pub compiled: usize,
    /// Components deserialized from the compile cache.
    pub cache_hits: usize,
}

/// What a service runs for as long as it runs, pre-instantiated.
pub(crate) enum Pre {
    /// `run` of the `vvm:host/service` world.
    Service(ServicePre<Host>),
    /// `wasi:cli/run` of the `wasi:cli/command` world, WASI 0.2's or 0.3's.
    Command(CommandPre),
    /// Nothing: the `wasi:http/proxy` world is only served, request by request.
    Http,
    /// `handle-cron-event` of Spin's cron world: called per fire time (`scheduler`).
    Cron(SpinCronPre<Host>),
}

/// A command's pre-instantiation: WASI 0.2's `wasi:cli/run`, or WASI 0.3's.
pub(crate) enum CommandPre {
    P2(p2::bindings::CommandPre<Host>),
    P3(p3::bindings::CommandPre<Host>),
}

/// An instance of a command.
pub(crate) enum Command {
    P2(p2::bindings::Command),
    P3(p3::bindings::Command),
}

impl CommandPre {
    /// An instance in `store`.
    pub(crate) async fn instantiate_async(
        &self,
        store: &mut Store<Host>,
    ) -> wasmtime::Result<Command> {
        Ok(match self {
            Self::P2(pre) => Command::P2(pre.instantiate_async(store).await?),
            Self::P3(pre) => Command::P3(pre.instantiate_async(store).await?),
        })
    }
}

impl Command {
    /// Calls its `run` in `store`: `Err(())` when it exits with an error. A WASI 0.3 one runs
    /// in the store's event loop (its `run` is an async export).
    pub(crate) async fn call_run(
        &self,
        store: &mut Store<Host>,
    ) -> wasmtime::Result<Result<(), ()>> {
        match self {
            Self::P2(command) => command.wasi_cli_run().call_run(store).await,
            Self::P3(command) => {
                store
                    .run_concurrent(async |accessor| {
                        command.wasi_cli_run().call_run(accessor).await
                    })
                    .await?
            }
        }
    }
}

/// One loaded service.
pub(crate) struct Loaded {
    /// The file stem.
    pub name: String,
    /// The version: the first 12 hex digits of the SHA-256 of the file (as `sha256sum`).
    pub version: String,
    /// The engine it was compiled for: its stores are made on it.
    pub engine: Engine,
    /// What it runs.
    pub pre: Pre,
    /// Its HTTP handler, if it exports one (WASI 0.2's `wasi:http/incoming-handler`, or 0.3's
    /// `wasi:http/handler`): served on `http-addr`.
    pub handler: Option<ProxyPre<Host>>,
    /// What it exports, by name (`run`, `wasi:http/incoming-handler@0.2.4`, ...).
    pub exports: Vec<String>,
    /// What it imports, by name (`wasi:http/outgoing-handler@0.2.12`, ...).
    pub imports: Vec<String>,
    /// The registry source it was pulled from, pinned to the digest pulled; `None` for a
    /// file.
    pub source: Option<SourceRef>,
}

impl Loaded {
    /// The world the service targets.
    pub fn kind(&self) -> ServiceKind {
        match (&self.pre, self.handler.is_some()) {
            (Pre::Service(_), false) => ServiceKind::Service,
            (Pre::Service(_), true) => ServiceKind::ServiceAndHttp,
            (Pre::Command(CommandPre::P2(_)), _) => ServiceKind::Command,
            (Pre::Command(CommandPre::P3(_)), _) => ServiceKind::Command3,
            (Pre::Http, _) if matches!(self.handler, Some(ProxyPre::P3(_))) => ServiceKind::Http3,
            (Pre::Http, _) => ServiceKind::Http,
            (Pre::Cron(_), _) => ServiceKind::Cron,
        }
    }

    /// Whether it is served on `http-addr`.
    pub fn serves_http(&self) -> bool {
        self.handler.is_some()
    }
}

/// The service a file of the services directory is, by its name: `NAME.wasm` is service
/// `NAME`. Hidden files (`.x.wasm`: rsync's and editors' temporary files, the compile
/// cache), `#x.wasm#` and `x.wasm~` (editors) and every other name are no service.
pub(crate) fn service_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let name = file.strip_suffix(".wasm")?;
    let temporary = file.starts_with(['.', '#']) || file.ends_with('~');
    (!name.is_empty() && !temporary).then(|| name.to_owned())
}

/// The largest service file read, 256 MiB: more than ten times the largest guest of the
/// examples (Python, ~18 MB). A larger file is refused by its size, unread, so a stray one
/// (a disk image, a sparse file) costs neither the memory nor the time of reading it.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// The bytes of service file `path` (see [`crate::fs::read_file`]).
pub(crate) fn read_service_file(path: &Path) -> Result<Vec<u8>, LoadErrorKind> {
    crate::fs::read_file(path, MAX_COMPONENT_BYTES).map_err(LoadErrorKind::Read)
}

/// The service files of `dir` (see [`service_name`]), sorted by name.
pub(crate) fn discover(dir: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    let err = |source| RuntimeError::ServicesDir {
        path: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        if service_name(&path).is_some() && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Compiles components, or loads them from a cache directory keyed by content hash and
/// engine configuration.
pub(crate) struct Compiler<'a> {
    /// The engines components are compiled for.
    pub engines: &'a Engines,
    /// The compile cache directory (created by the caller).
    pub cache_dir: &'a Path,
    /// Counts compilations and cache hits.
    pub stats: LoadStats,
}

/// A service file read once: each load reads a file once and hashes it once, and the
/// version, the cache key and the compile all come from these bytes.
pub(crate) struct ServiceFile {
    /// The file stem.
    pub name: String,
    /// Where it was read.
    pub path: PathBuf,
    /// Its contents.
    pub bytes: Vec<u8>,
    /// The SHA-256 of `bytes`.
    pub digest: [u8; 32],
    /// The registry source the bytes were pulled from, pinned; `None` for a file.
    pub source: Option<SourceRef>,
}

impl ServiceFile {
    /// Reads service file `path` (at most [`MAX_COMPONENT_BYTES`]).
    ///
    /// # Errors
    /// When its name has a control character, or it cannot be read.
    pub(crate) fn read(path: &Path) -> Result<Self, LoadError> {
        let fail = |kind| LoadError {
            path: path.to_owned(),
            kind,
        };
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.chars().any(char::is_control) {
            return Err(fail(LoadErrorKind::Name));
        }
        let bytes = read_service_file(path).map_err(fail)?;
        Ok(Self {
            name,
            path: path.to_owned(),
            digest: Sha256::digest(&bytes).into(),
            bytes,
            source: None,
        })
    }

    /// Service `name`'s component from registry `source` (SPEC §13), through `puller`'s
    /// cache. Its path, in errors and logs, is the reference. Blocks for up to the pull
    /// timeout.
    ///
    /// # Errors
    /// When it cannot be pulled: the reason names the reference.
    pub(crate) fn pull(name: &str, source: &SourceRef, puller: &Puller) -> Result<Self, LoadError> {
        let pulled = puller.pull(source).map_err(|e| LoadError {
            path: PathBuf::from(source.to_string()),
            kind: LoadErrorKind::Pull(e),
        })?;
        tracing::info!(service = name, source = %pulled.reference, from_cache = pulled.from_cache, "service pulled");
        Ok(Self {
            name: name.to_owned(),
            path: PathBuf::from(pulled.reference.to_string()),
            digest: Sha256::digest(&pulled.bytes).into(),
            bytes: pulled.bytes,
            source: Some(pulled.reference),
        })
    }

    /// The version: the first 12 hex digits of the SHA-256 (as `sha256sum` shows it).
    pub(crate) fn version(&self) -> String {
        let mut version = cache::hex(&self.digest);
        version.truncate(12);
        version
    }
}

impl Compiler<'_> {
    /// Loads `file` as a service: compile (or cache), classify its world, pre-instantiate.
    ///
    /// On the plain engine if it can be (see [`Engines`]), else on the concurrent one: a
    /// component that uses the component model's async (WASI 0.3's, or a Spin 3 app's) fails
    /// on the plain engine as it is compiled, and one that imports only WASI 0.3's synchronous
    /// functions, as it is linked. A component already in the compile cache for the
    /// concurrent engine goes there at once; a failure on both engines is reported as the
    /// concurrent engine's, which has every import the host provides.
    pub fn load(&mut self, file: &ServiceFile) -> Result<Loaded, LoadError> {
        check_header(&file.bytes).map_err(|m| LoadError {
            path: file.path.clone(),
            kind: LoadErrorKind::Invalid(m),
        })?;
        let engines = self.engines;
        let concurrent_cached =
            cache::cached(&engines.concurrent.engine, self.cache_dir, &file.digest);
        if !concurrent_cached {
            match self.load_on(&engines.plain, file) {
                Err(LoadError {
                    kind: LoadErrorKind::Compile(_) | LoadErrorKind::Imports(_),
                    ..
                }) => {}
                loaded => return loaded,
            }
        }
        self.load_on(&engines.concurrent, file)
    }

    /// Loads `file` on `wasm`'s engine, against its linker.
    fn load_on(&mut self, wasm: &Wasm, file: &ServiceFile) -> Result<Loaded, LoadError> {
        let fail = |kind| LoadError {
            path: file.path.clone(),
            kind,
        };
        let name = file.name.clone();
        let engine = &wasm.engine;
        let component = self
            .component(engine, file)
            .map_err(|e| fail(LoadErrorKind::Compile(e)))?;
        // Now rather than at the first instantiation, which is on a takeover's path: wasmtime
        // builds each memory's copy-on-write image lazily (a memfd and its data, or a mapping of
        // the cache file). Failing here only defers that work to the instantiation.
        if let Err(e) = component.initialize_copy_on_write_image() {
            tracing::debug!(service = name, error = %format!("{e:#}"),
                "no copy-on-write image ahead of the first start");
        }
        let (pre, handler) = classify(engine, &component, &wasm.linker).map_err(fail)?;
        let version = file.version();
        let ty = component.component_type();
        let exports = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
        let imports = ty.imports(engine).map(|(n, _)| n.to_owned()).collect();
        Ok(Loaded {
            name,
            version,
            engine: engine.clone(),
            pre,
            handler,
            exports,
            imports,
            source: file.source.clone(),
        })
    }

    /// The compiled component for `file` on `engine`, from the cache if it is there.
    fn component(&mut self, engine: &Engine, file: &ServiceFile) -> wasmtime::Result<Component> {
        let (component, from) = cache::fetch(engine, self.cache_dir, &file.bytes, &file.digest)?;
        match from {
            cache::From::Cache => self.stats.cache_hits += 1,
            cache::From::Compiled => self.stats.compiled += 1,
        }
        Ok(component)
    }
}

/// wasmtime's compile error `e` as a user reads it: without the parser's offset, and for a
/// WebAssembly feature the host does not run (wasmparser's "`stream` requires the component
/// model async feature (at offset 0xc)"), which feature and what to do.
fn compile_message(e: &wasmtime::Error) -> String {
    let full = format!("{e:#}");
    let mut text = full.as_str();
    if let Some(at) = text.rfind(" (at offset 0x") {
        text = &text[..at];
    }
    let text = text
        .strip_prefix("failed to parse WebAssembly module: ")
        .unwrap_or(text);
    match text.split_once("requires the ") {
        Some((what, feature)) if feature.ends_with(" feature") => {
            let what = what.trim();
            let what = if what.is_empty() {
                String::new()
            } else {
                format!("{what} of ")
            };
            format!(
                "it uses {what}the {feature}, which vvm-host does not run (it runs the \
                 components of toolchains that target WASI 0.2 or WASI 0.3)"
            )
        }
        _ => text.to_owned(),
    }
}

/// Rejects files that cannot be components with a precise reason, before wasmtime's parser.
fn check_header(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    const COMPONENT: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];
    const CORE: [u8; 4] = [0x01, 0x00, 0x00, 0x00];
    if bytes.is_empty() {
        return Err("empty file".into());
    }
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err("no WebAssembly header".into());
    }
    match &bytes[4..8] {
        v if v == COMPONENT => Ok(()),
        v if v == CORE => Err("a core WebAssembly module, not a component (build for \
             wasm32-wasip2 or wrap it with `wasm-tools component new`)"
            .into()),
        _ => Err("unknown WebAssembly version".into()),
    }
}

/// Finds the world `component` targets and pre-instantiates it against `linker`: what it
/// runs, and its HTTP handler if it exports one.
///
/// A `wasi:cli/run` beside the handler is not run, as `wasmtime serve` and Spin do not run
/// it: every Rust binary built for wasm32-wasip2 exports one, and `wstd`'s `http_server`
/// (an HTTP server as its README writes one) makes a binary whose `main` panics. Code that
/// runs for as long as the service does, beside its handler, is `run` of the `vvm:host`
/// service world.
fn classify(
    engine: &Engine,
    component: &Component,
    linker: &Linker<Host>,
) -> Result<(Pre, Option<ProxyPre<Host>>), LoadErrorKind> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    let exported = |prefix: &str| exports.iter().any(|e| e.starts_with(prefix));
    let is_service = exports.contains(&"run");
    let command = if exported("wasi:cli/run@0.3") {
        Some(3)
    } else {
        exported("wasi:cli/run@0.2").then_some(2)
    };
    let http = if exported("wasi:http/handler@0.3") {
        Some(3)
    } else {
        exported("wasi:http/incoming-handler@0.2").then_some(2)
    };
    let is_cron = exports.contains(&"handle-cron-event");
    if !is_service && command.is_none() && http.is_none() && !is_cron {
        return Err(LoadErrorKind::World(format!(
            "exports none of `run` (world vvm:host/service), `wasi:cli/run` (world \
             wasi:cli/command, WASI 0.2 or 0.3), `wasi:http/incoming-handler` (world \
             wasi:http/proxy), `wasi:http/handler@0.3.0` (a WASI 0.3 HTTP service) and \
             `handle-cron-event` (world fermyon:spin-cron/spin-cron); it exports [{}]",
            exports.join(", ")
        )));
    }
    // Imports the linker has only as stubs (Spin's outbound interfaces, WASI 0.3's files and
    // sockets), and Spin's `batch` if it has it.
    let own = crate::interfaces::stubs::for_component(linker, component)
        .map_err(LoadErrorKind::Imports)?;
    let pre = own
        .as_ref()
        .unwrap_or(linker)
        .instantiate_pre(component)
        .map_err(LoadErrorKind::Imports)?;
    let handler = match http {
        Some(3) => Some(ProxyPre::P3(
            wasmtime_wasi_http::p3::bindings::ServicePre::new(pre.clone()).map_err(|source| {
                LoadErrorKind::WrongType {
                    export: "`wasi:http/handler@0.3.0`",
                    source,
                }
            })?,
        )),
        Some(_) => Some(ProxyPre::P2(
            wasmtime_wasi_http::p2::bindings::ProxyPre::new(pre.clone()).map_err(|source| {
                LoadErrorKind::WrongType {
                    export: "`wasi:http/incoming-handler`",
                    source,
                }
            })?,
        )),
        None => None,
    };
    let runs = if is_cron {
        Pre::Cron(
            SpinCronPre::new(pre).map_err(|source| LoadErrorKind::WrongType {
                export: "`handle-cron-event`",
                source,
            })?,
        )
    } else if is_service {
        Pre::Service(
            ServicePre::new(pre).map_err(|source| LoadErrorKind::WrongType {
                export: "`run`",
                source,
            })?,
        )
    } else if let (Some(generation), None) = (command, http) {
        let wrong = |source| LoadErrorKind::WrongType {
            export: "`wasi:cli/run`",
            source,
        };
        Pre::Command(if generation == 3 {
            CommandPre::P3(p3::bindings::CommandPre::new(pre).map_err(wrong)?)
        } else {
            CommandPre::P2(p2::bindings::CommandPre::new(pre).map_err(wrong)?)
        })
    } else {
        Pre::Http
    };
    Ok((runs, handler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::FileError;

    #[test]
    fn only_plain_wasm_names_are_services() {
        let name = |f: &str| service_name(Path::new("/svc").join(f).as_path());
        assert_eq!(name("ticker.wasm"), Some("ticker".into()));
        assert_eq!(name("my.ticker.wasm"), Some("my.ticker".into()));
        for temporary in [
            ".ticker.wasm",
            ".ticker.wasm.Xy12Ab",
            "ticker.wasm~",
            "#ticker.wasm#",
            ".#ticker.wasm",
            "ticker.wasm.swp",
            ".ticker.wasm.swp",
            "ticker.wasm.tmp",
            "ticker.wasm.part",
            "ticker.wasm.crdownload",
            "ticker.wat",
            ".wasm",
            ".cache",
        ] {
            assert_eq!(name(temporary), None, "{temporary}");
        }
    }

    /// A file past the limit is refused by its size without being read (it is sparse: reading
    /// it would take 64 GiB of memory), and a FIFO without waiting for a writer.
    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let huge = dir.path().join("huge.wasm");
        std::fs::File::create(&huge)
            .unwrap()
            .set_len(64 << 30)
            .unwrap();
        let refused = read_service_file(&huge).unwrap_err();
        assert!(
            matches!(refused, LoadErrorKind::Read(FileError::TooLarge { size, max })
                if size == 64 << 30 && max == MAX_COMPONENT_BYTES),
            "{refused}"
        );
        assert!(refused.to_string().contains("too large"), "{refused}");

        let fifo = dir.path().join("fifo.wasm");
        testkit::fifo(&fifo);
        let refused = read_service_file(&fifo).unwrap_err();
        assert!(
            matches!(refused, LoadErrorKind::Read(FileError::NotAFile)),
            "{refused}"
        );

        let small = dir.path().join("small.wasm");
        std::fs::write(&small, b"\0asm").unwrap();
        assert_eq!(read_service_file(&small).unwrap(), b"\0asm");
    }

    #[test]
    fn header_check_names_the_problem() {
        assert_eq!(check_header(b""), Err("empty file".into()));
        assert!(
            check_header(b"\0asm\x01\0\0\0")
                .unwrap_err()
                .contains("core")
        );
        assert!(check_header(b"hello world").unwrap_err().contains("header"));
        assert_eq!(check_header(b"\0asm\x0d\0\x01\0"), Ok(()));
    }

    /// The engines of a default configuration for `dir`.
    fn engines(dir: &Path) -> Engines {
        crate::runtime::imports::engines(&crate::runtime::RuntimeConfig::new(dir)).unwrap()
    }

    /// How loading the file `path` (its cache beside it) fails.
    fn load_error(path: &Path) -> LoadError {
        let dir = path.parent().unwrap();
        let mut compiler = Compiler {
            engines: &engines(dir),
            cache_dir: dir,
            stats: LoadStats::default(),
        };
        match compiler.load(&ServiceFile::read(path).unwrap()) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => e,
        }
    }

    /// Loads `file` (written in a directory of its own, the compile cache beside it) twice:
    /// whether it went to the concurrent engine each time, and the second load's stats.
    fn engine_of(file: &[u8]) -> (bool, bool, LoadStats) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.wasm");
        std::fs::write(&path, file).unwrap();
        let engines = engines(dir.path());
        let on_concurrent = || {
            let mut compiler = Compiler {
                engines: &engines,
                cache_dir: dir.path(),
                stats: LoadStats::default(),
            };
            let loaded = compiler.load(&ServiceFile::read(&path).unwrap()).unwrap();
            let concurrent = Engine::same(&loaded.engine, &engines.concurrent.engine);
            assert!(concurrent || Engine::same(&loaded.engine, &engines.plain.engine));
            (concurrent, compiler.stats)
        };
        let (first, _) = on_concurrent();
        let (second, stats) = on_concurrent();
        (first, second, stats)
    }

    /// A WASI 0.2 component runs on the engine without concurrency support; one that needs
    /// the component model's async (a WASI 0.3 HTTP service, a Spin 7 app), or imports only
    /// WASI 0.3's synchronous functions, on the one with it; and from the compile cache, each
    /// goes to the same engine again without compiling.
    #[test]
    fn a_component_runs_on_the_concurrent_engine_only_when_it_needs_it() {
        let guest = |name| std::fs::read(testkit::guests::guest(name)).unwrap();
        let cached = LoadStats {
            compiled: 0,
            cache_hits: 1,
        };
        for (file, what, concurrent) in [
            (guest("test/http-hello"), "WASI 0.2 HTTP", false),
            (guest("rust-ticker"), "vvm:host service", false),
            (guest("test/p3-http"), "WASI 0.3 HTTP", true),
            (guest("test/spin7-app"), "Spin 7 app", true),
            (
                testkit::guests::importing_sync_wasi3(),
                "sync WASI 0.3 import",
                true,
            ),
        ] {
            assert_eq!(engine_of(&file), (concurrent, concurrent, cached), "{what}");
        }
    }

    #[test]
    fn a_compile_error_keeps_wasmtime_s_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("truncated.wasm");
        // A component header, then nothing: past the header check, refused by wasmtime.
        std::fs::write(&path, b"\0asm\x0d\0\x01\0\x01").unwrap();
        let e = load_error(&path);
        let LoadErrorKind::Compile(cause) = &e.kind else {
            panic!("{e}");
        };
        let source = std::error::Error::source(&e.kind).expect("a source");
        assert_eq!(source.to_string(), cause.to_string());
        let message = e.to_string();
        assert!(
            message.contains("not a valid component: unexpected end-of-file"),
            "{message}"
        );
        assert!(!message.contains("offset"), "no parser offset: {message}");
    }

    /// A component that needs a WebAssembly feature the host does not run (here the
    /// component model's stackful async) is refused in a sentence that names the feature,
    /// not with the parser's offset.
    #[test]
    fn a_component_needing_a_feature_the_host_does_not_run_says_which() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stackful.wasm");
        std::fs::write(&path, testkit::guests::stackful_async()).unwrap();
        let e = load_error(&path);
        assert_eq!(
            e.kind.to_string(),
            "not a valid component: it uses the component model async stackful feature, \
             which vvm-host does not run (it runs the components of toolchains that target \
             WASI 0.2 or WASI 0.3)"
        );
    }
}
