//! The guest components of `guest-examples/`, built once per test binary by
//! running `guest-examples/build.sh` (cargo makes that a quick no-op when nothing changed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `guest-examples/out`, after building every guest once in this process.
pub fn out_dir() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-examples");
        let output = Command::new("bash")
            .arg(examples.join("build.sh"))
            // The host's target dir is for another target; build.sh uses its own.
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("run guest-examples/build.sh");
        assert!(
            output.status.success(),
            "guest-examples/build.sh failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        examples.join("out")
    })
}

/// The built guest `name` (`rust-ticker`, or `test/spin` for a test guest).
pub fn guest(name: &str) -> PathBuf {
    out_dir().join(format!("{name}.wasm"))
}

/// Copies guests into `dir` under new names: `(guest, service name)`.
pub fn install(dir: &Path, guests: &[(&str, &str)]) {
    for (guest_name, service) in guests {
        std::fs::copy(guest(guest_name), dir.join(format!("{service}.wasm")))
            .unwrap_or_else(|e| panic!("copy guest {guest_name}: {e}"));
    }
}

/// A plain WASI command component (`wasi:cli/run`) whose core module has a start function
/// that never returns: it spins while it is being *instantiated*, before any export is called.
/// No guest toolchain emits one; the component model allows it.
pub fn spinning_at_instantiation() -> Vec<u8> {
    use wasm_encoder::{BlockType, Function, Instruction};
    let mut spin = Function::new([]);
    spin.instruction(&Instruction::Loop(BlockType::Empty))
        .instruction(&Instruction::Br(0))
        .instruction(&Instruction::End)
        .instruction(&Instruction::End);
    let mut component = running_core(&run_module(true, Some(spin)));
    export_cli_run(&mut component, 0, 0);
    component.finish()
}

/// A WASI command (`wasi:cli/run@0.2.0`, whose `run` returns at once) that imports WASI 0.3's
/// `wasi:clocks/monotonic-clock@0.3.0` (its synchronous `now`) and uses nothing of the
/// component model's async: it loads only where the host links WASI 0.3.
pub fn importing_sync_wasi3() -> Vec<u8> {
    use wasm_encoder::{
        ComponentImportSection, ComponentTypeRef, ComponentTypeSection, ComponentValType,
        InstanceType, PrimitiveValType,
    };
    let mut component = running_core(&run_module(true, None));
    let mut clock = InstanceType::new();
    clock
        .ty()
        .function()
        .params(Vec::<(&str, ComponentValType)>::new())
        .result(Some(ComponentValType::Primitive(PrimitiveValType::U64)));
    clock.export("now", ComponentTypeRef::Func(0));
    let mut component_types = ComponentTypeSection::new();
    component_types.instance(&clock);
    component.section(&component_types);
    let mut imports = ComponentImportSection::new();
    imports.import(
        "wasi:clocks/monotonic-clock@0.3.0",
        ComponentTypeRef::Instance(0),
    );
    component.section(&imports);
    export_cli_run(&mut component, 1, 1);
    component.finish()
}

/// A core module that exports `run`: `() -> i32` answering 0 if `result`, else `() -> ()`;
/// with `start`, a start function (of type `() -> ()`) besides.
fn run_module(result: bool, start: Option<wasm_encoder::Function>) -> wasm_encoder::Module {
    use wasm_encoder::{
        CodeSection, ExportKind, ExportSection, Function, FunctionSection, Instruction, Module,
        StartSection, TypeSection, ValType,
    };
    let mut types = TypeSection::new();
    types.ty().function([], []);
    types.ty().function([], [ValType::I32]);
    let mut functions = FunctionSection::new();
    let mut code = CodeSection::new();
    let start_index = start.map(|start| {
        functions.function(0);
        code.function(&start);
        0
    });
    let mut run = Function::new([]);
    if result {
        run.instruction(&Instruction::I32Const(0));
    }
    run.instruction(&Instruction::End);
    functions.function(u32::from(result));
    code.function(&run);
    let mut exports = ExportSection::new();
    exports.export("run", ExportKind::Func, u32::from(start_index.is_some()));
    let mut module = Module::new();
    module.section(&types).section(&functions).section(&exports);
    if let Some(function_index) = start_index {
        module.section(&StartSection { function_index });
    }
    module.section(&code);
    module
}

/// Lifts core function 0 (`run` of [`running_core`], `() -> i32`) as `run: func() ->
/// result` and exports it in instance `wasi:cli/run@0.2.0`, after `types` component types and
/// `instances` component instances defined before.
fn export_cli_run(component: &mut wasm_encoder::Component, types: u32, instances: u32) {
    use wasm_encoder::{
        CanonicalFunctionSection, ComponentExportKind, ComponentExportSection,
        ComponentInstanceSection, ComponentTypeSection, ComponentValType,
    };
    let mut component_types = ComponentTypeSection::new();
    component_types.defined_type().result(None, None);
    component_types
        .function()
        .params(Vec::<(&str, ComponentValType)>::new())
        .result(Some(ComponentValType::Type(types)));
    component.section(&component_types);
    let mut canonical = CanonicalFunctionSection::new();
    canonical.lift(0, types + 1, []);
    component.section(&canonical);
    let mut run_instance = ComponentInstanceSection::new();
    run_instance.export_items([("run", ComponentExportKind::Func, 0)]);
    component.section(&run_instance);
    let mut component_exports = ComponentExportSection::new();
    component_exports.export(
        "wasi:cli/run@0.2.0",
        ComponentExportKind::Instance,
        instances,
        None,
    );
    component.section(&component_exports);
}

/// A component that instantiates `module` (no imports) and aliases its core function `run` as
/// core function 0, to be lifted.
fn running_core(module: &wasm_encoder::Module) -> wasm_encoder::Component {
    use wasm_encoder::{
        Alias, Component, ComponentAliasSection, ExportKind, InstanceSection, ModuleSection,
    };
    let mut component = Component::new();
    component.section(&ModuleSection(module));
    let mut instances = InstanceSection::new();
    instances.instantiate(0, Vec::<(&str, wasm_encoder::ModuleArg)>::new());
    component.section(&instances);
    let mut aliases = ComponentAliasSection::new();
    aliases.alias(Alias::CoreInstanceExport {
        instance: 0,
        kind: ExportKind::Func,
        name: "run",
    });
    component.section(&aliases);
    component
}

/// A component that exports `run` lifted `async` without a callback: it needs the component
/// model's *stackful* async, which wasmtime 48 does not enable by default (no toolchain that
/// targets WASI 0.2 or 0.3 emits it).
pub fn stackful_async() -> Vec<u8> {
    use wasm_encoder::{
        CanonicalFunctionSection, CanonicalOption, ComponentExportKind, ComponentExportSection,
        ComponentTypeSection, ComponentValType,
    };
    let mut component = running_core(&run_module(false, None));
    let mut component_types = ComponentTypeSection::new();
    component_types
        .function()
        .params(Vec::<(&str, ComponentValType)>::new())
        .result(None);
    component.section(&component_types);
    let mut canonical = CanonicalFunctionSection::new();
    canonical.lift(0, 0, [CanonicalOption::Async]);
    component.section(&canonical);
    let mut component_exports = ComponentExportSection::new();
    component_exports.export("run", ComponentExportKind::Func, 0, None);
    component.section(&component_exports);
    component.finish()
}
