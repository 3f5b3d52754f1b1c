//! The state of one store (SPEC §6, §7): [`Host`], one instance of one service: its WASI
//! context, its memory cap, and its share of the interfaces' state ([`Interfaces`], which
//! holds its service's [`ServiceEnv`] and its resource table). The imports (`imports`), the
//! fence (`fence`) and the triggers (`supervisor`, `scheduler`) read it; the interfaces,
//! incoming HTTP's requests among them (their stores made by `http`), see only their own
//! part, through [`View`].

use std::sync::Arc;

use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use crate::interfaces::{Interfaces, ServiceEnv, View};

/// The state of one store: one instance of one service.
pub(crate) struct Host {
    /// The WASI context: only what the service's grants allow.
    pub(super) wasi: WasiCtx,
    /// The memory cap.
    pub(super) limits: StoreLimits,
    /// What the interfaces it imports read and change.
    pub(super) interfaces: Interfaces,
}

impl Host {
    /// What this instance's service shares with its other instances.
    pub(crate) fn env(&self) -> &Arc<ServiceEnv> {
        &self.interfaces.env
    }

    /// The store's resources.
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.interfaces.table
    }
}

impl View for Host {
    fn interfaces(&mut self) -> &mut Interfaces {
        &mut self.interfaces
    }
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.interfaces.table,
        }
    }
}

impl WasiHttpView for Host {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        let Interfaces {
            table,
            http,
            http_ctx,
            ..
        } = &mut self.interfaces;
        WasiHttpCtxView {
            hooks: http,
            table,
            ctx: http_ctx,
        }
    }
}
