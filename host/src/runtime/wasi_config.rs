//! `wasi:config/store` (SPEC §10): a service's `[service.NAME.config]`, read-only, at
//! `@0.2.0-draft` (upstream's; implemented here) and `@0.2.0-rc.1` (wasmtime's and
//! wasmCloud's; `wasmtime-wasi-config`'s implementation over the same values). The values
//! were read when the settings were (`config::ServiceConfig`): a call never touches the
//! environment or a file, and has no effect to fence.

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi_config::WasiConfig;

use super::bindings::service::wasi::config::store;
use super::state::Host;

/// Adds both versions of `wasi:config/store` to `linker`.
///
/// # Errors
/// When the linker already has them.
pub(crate) fn add_to_linker(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    store::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    wasmtime_wasi_config::add_to_linker(linker, |h| WasiConfig::from(h.config.variables()))
}

impl store::Host for Host {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, store::Error>> {
        Ok(Ok(self.config.get(&key).map(str::to_owned)))
    }

    async fn get_all(&mut self) -> wasmtime::Result<Result<Vec<(String, String)>, store::Error>> {
        Ok(Ok(self.config.all().to_vec()))
    }
}
