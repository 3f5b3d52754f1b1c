//! Imports a component may have that vvm-host does not offer, linked as stubs that trap when
//! called, naming what they are (SPEC §10, §12), so that a component that imports but never
//! calls them loads:
//! - Spin's outbound interfaces (Redis, `MySQL`, `PostgreSQL`, `SQLite`, MQTT, LLM), of
//!   `fermyon:spin@2.0.0` and of `spin:*@3.x` ([`super::spin::outbound`]), which Spin's SDKs
//!   import whether the app uses them or not;
//! - WASI 0.3's files and sockets (`wasi:filesystem@0.3.0`, `wasi:sockets@0.3.0`, and their
//!   release candidates): their writes and sends happen in the store's event loop, after the
//!   host call that began them returned, where the per-call fence does not see them; WASI 0.2's,
//!   which a grant gives (and the fence covers), stay.
//!
//! A Spin SDK's component built against Spin's own `wasi:keyvalue` `batch` gets it here too.
//! Each needs a linker of the component's own ([`for_component`]); the shared linker is left
//! as it is, and a component that needs none of this uses it.

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceType};

use super::spin::{BATCH, link_spins_batch, outbound, spins_batch};
use super::view::View;

/// What the import `name` is, if vvm-host links it as a stub: the reason for the trap.
pub(crate) fn stubbed(name: &str) -> Option<String> {
    if let Some(what) = outbound(name) {
        return Some(format!(
            "Spin's outbound {what}, which vvm-host does not offer"
        ));
    }
    let (package, version) = name.split_once('@')?;
    let files_or_sockets =
        package.starts_with("wasi:filesystem/") || package.starts_with("wasi:sockets/");
    (files_or_sockets && version.starts_with("0.3.0")).then(|| {
        "WASI 0.3's files and sockets, which vvm-host does not offer (a granted service has \
         WASI 0.2's)"
            .to_owned()
    })
}

/// A resource of a stubbed interface: never made, since every function that would make one
/// traps.
struct NotOffered;

/// `linker` as `component` needs it, if it needs more than `linker` has: each import
/// [`stubbed`] defined with functions that trap, saying what they are, and Spin's `batch` in
/// place of upstream's if it was built against Spin's. `None` when it needs none of this
/// (then `linker` serves as it is). Any other import the linker lacks still fails the
/// instantiation, by name.
///
/// A resource is defined once, where it first appears: a later import of it (`use`, an
/// alias) needs no definition, and a second one would not match (WASI 0.3's
/// `wasi:http/types` aliases `headers` to `fields`).
///
/// # Errors
/// When a definition cannot be made (a name defined twice).
pub(crate) fn for_component<T: View>(
    linker: &Linker<T>,
    component: &Component,
) -> wasmtime::Result<Option<Linker<T>>> {
    let engine = component.engine();
    let ty = component.component_type();
    let mut own: Option<Linker<T>> = None;
    let mut seen: Vec<ResourceType> = Vec::new();
    for (name, item) in ty.imports(engine) {
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        if name == BATCH && spins_batch(&instance, engine) {
            link_spins_batch(own.get_or_insert_with(|| linker.clone()))?;
            continue;
        }
        let Some(what) = stubbed(name) else {
            // Its resources are defined by the linker.
            seen.extend(
                instance
                    .exports(engine)
                    .filter_map(|(_, item)| match item.ty {
                        ComponentItem::Resource(resource) => Some(resource),
                        _ => None,
                    }),
            );
            continue;
        };
        let linker = own.get_or_insert_with(|| linker.clone());
        let mut stub = linker.instance(name)?;
        for (export, item) in instance.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(func) => {
                    let message = format!("`{name}#{export}` is {what}");
                    if func.async_() {
                        stub.func_new_concurrent(export, move |_, _, _, _| {
                            let message = message.clone();
                            Box::pin(async move { Err(wasmtime::format_err!("{message}")) })
                        })?;
                    } else {
                        stub.func_new(export, move |_, _, _, _| {
                            Err(wasmtime::format_err!("{message}"))
                        })?;
                    }
                }
                ComponentItem::Resource(resource) if !seen.contains(&resource) => {
                    seen.push(resource);
                    stub.resource(export, ResourceType::host::<NotOffered>(), |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(own)
}
