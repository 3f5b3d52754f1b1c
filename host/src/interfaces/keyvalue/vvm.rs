//! `vvm:host/kv`, vvm-host's own key-value interface: `get` and `set` on the service's own
//! namespace (the bucket `wasi:keyvalue`'s `open("")` opens), errors as text.

use crate::interfaces::bindings::service::vvm::host::kv;
use crate::interfaces::view::Interfaces;
use crate::store::KvWrite;

impl kv::Host for Interfaces {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, String>> {
        let space = self.kv().open("")?.space;
        Ok(self.kv().get(&space, &key).await.map_err(|e| e.to_string()))
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), String>> {
        let space = self.kv().open("")?.space;
        let writes = [KvWrite::Set {
            key: &key,
            value: &value,
        }];
        Ok(self
            .kv()
            .write(&space, &writes)
            .await?
            .map_err(|e| e.to_string()))
    }
}
