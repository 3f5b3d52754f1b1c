//! `wasi:keyvalue@0.2.0-draft2` (upstream's and Spin's): store, atomics with `cas`, batch.

use wasmtime::component::Resource;

use super::KvError;
use super::access::{Bucket, Cas};
use crate::interfaces::bindings::service::wasi::keyvalue::{atomics, batch, store};
use crate::interfaces::view::Interfaces;
use crate::store::KvWrite;

wasi_keyvalue_common!();

impl store::HostBucket for Interfaces {
    wasi_keyvalue_bucket!();

    /// The cursor is the last key of the page before: the next page starts after it.
    async fn list_keys(
        &mut self,
        b: Resource<Bucket>,
        cursor: Option<String>,
    ) -> Answer<store::KeyResponse> {
        let space = space(self, &b)?;
        Ok(self
            .kv()
            .list(&space, cursor.as_deref())
            .await
            .map(|(keys, cursor)| store::KeyResponse { keys, cursor })
            .map_err(Into::into))
    }
}

impl atomics::Host for Interfaces {
    async fn increment(&mut self, b: Resource<Bucket>, key: String, delta: i64) -> Answer<i64> {
        let space = space(self, &b)?;
        Ok(self
            .kv()
            .increment(&space, &key, delta)
            .await?
            .map_err(Into::into))
    }

    async fn swap(
        &mut self,
        cas: Resource<Cas>,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), atomics::CasError>> {
        let c = self.table.delete(cas)?;
        match self
            .kv()
            .swap(&c.space, &c.key, c.current.as_deref(), &value)
            .await?
        {
            Ok(true) => Ok(Ok(())),
            // Lost the race: a fresh handle with the value now there, to try again with.
            Ok(false) => {
                let current = match self.kv().get(&c.space, &c.key).await {
                    Ok(current) => current,
                    Err(e) => return Ok(Err(atomics::CasError::StoreError(e.into()))),
                };
                let again = self.table.push(Cas { current, ..c })?;
                Ok(Err(atomics::CasError::CasFailed(again)))
            }
            Err(e) => Ok(Err(atomics::CasError::StoreError(e.into()))),
        }
    }
}

impl atomics::HostCas for Interfaces {
    async fn new(&mut self, b: Resource<Bucket>, key: String) -> Answer<Resource<Cas>> {
        let space = space(self, &b)?;
        let current = match self.kv().get(&space, &key).await {
            Ok(current) => current,
            Err(e) => return Ok(Err(e.into())),
        };
        let cas = Cas {
            space,
            key,
            current,
        };
        Ok(Ok(self.table.push(cas)?))
    }

    async fn current(&mut self, cas: Resource<Cas>) -> Answer<Option<Vec<u8>>> {
        Ok(Ok(self.table.get(&cas)?.current.clone()))
    }

    async fn drop(&mut self, cas: Resource<Cas>) -> wasmtime::Result<()> {
        self.table.delete(cas)?;
        Ok(())
    }
}
