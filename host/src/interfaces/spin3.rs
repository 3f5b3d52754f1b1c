//! Spin's current interfaces (SPEC §12), so that a component made with Spin's current SDKs
//! (Rust 7, Python 5: WASI 0.3) runs unchanged, on the same buckets and settings as their
//! 2.0.0 versions (`super::spin`):
//! - `spin:key-value@3.0.0`: the same stores and answers as `fermyon:spin/key-value@2.0.0`
//!   (the service's own namespace for `default`, a granted shared bucket, `access-denied`,
//!   `no-such-store`, `store-table-full`, `other`), every write through the one `Kv`, so
//!   fenced by the term in the store's transaction, bounded and group-committed;
//! - `spin:variables@3.0.0`: the same values, names and texts as `fermyon:spin/variables`.
//!
//! Their functions are async, called in the store's event loop with an `Accessor`: each
//! takes what it needs from the instance's state at its start (the fence's check first: a
//! call made past the deadline does nothing), then awaits the store without holding it, so
//! the instance's other requests go on meanwhile.

use std::sync::Arc;

use wasmtime::component::{Accessor, FutureReader, HasData, Resource, StreamReader};

use super::bindings::spin::fermyon::spin::{key_value as kv2, variables as vars2};
use super::bindings::spin3::spin::key_value::key_value as kv;
use super::bindings::spin3_variables::spin::variables::variables as vars;
use super::env::ServiceEnv;
use super::keyvalue::access::{Bucket, KvAccess};
use super::keyvalue::{Kv, KvError};
use super::view::{Interfaces, View};
use crate::store::KvWrite;

/// The host of Spin's 3.x interfaces: what its async functions reach in a store, the
/// instance's [`Interfaces`].
pub(crate) struct Spin3;

impl HasData for Spin3 {
    type Data<'a> = &'a mut Interfaces;
}

/// Adds `spin:key-value@3.0.0` and `spin:variables@3.0.0` to `linker`.
///
/// # Errors
/// When the linker already has them.
pub(crate) fn add_to_linker<T: View>(
    linker: &mut wasmtime::component::Linker<T>,
) -> wasmtime::Result<()> {
    kv::add_to_linker::<_, Spin3>(linker, T::interfaces)?;
    vars::add_to_linker::<_, Spin3>(linker, T::interfaces)
}

type Answer<T> = wasmtime::Result<Result<T, kv::Error>>;

impl From<kv2::Error> for kv::Error {
    fn from(e: kv2::Error) -> Self {
        match e {
            kv2::Error::StoreTableFull => Self::StoreTableFull,
            kv2::Error::NoSuchStore => Self::NoSuchStore,
            kv2::Error::AccessDenied => Self::AccessDenied,
            kv2::Error::Other(text) => Self::Other(text),
        }
    }
}

impl From<KvError> for kv::Error {
    fn from(e: KvError) -> Self {
        kv2::Error::from(e).into()
    }
}

/// What a call on the store `bucket` takes from the instance at its start, after the
/// fence's check: the service's environment, its key-value access, and the namespace.
fn reach<T>(
    accessor: &Accessor<T, Spin3>,
    bucket: &Resource<Bucket>,
    what: &'static str,
) -> wasmtime::Result<(Arc<ServiceEnv>, KvAccess, String)> {
    accessor.with(|mut access| {
        let host = access.get();
        host.env.fence(what)?;
        let space = host.table.get(bucket)?.space.clone();
        Ok((Arc::clone(&host.env), host.kv.clone(), space))
    })
}

impl kv::Host for Interfaces {}

impl kv::HostStore for Interfaces {
    fn drop(&mut self, store: Resource<Bucket>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}

impl<T> kv::HostStoreWithStore<T> for Spin3 {
    async fn open(accessor: &Accessor<T, Self>, label: String) -> Answer<Resource<Bucket>> {
        accessor.with(|mut access| {
            let host = access.get();
            host.env.fence("key-value open")?;
            Ok(super::spin::open_store(host, &label)?.map_err(Into::into))
        })
    }

    async fn get(
        accessor: &Accessor<T, Self>,
        store: Resource<Bucket>,
        key: String,
    ) -> Answer<Option<Vec<u8>>> {
        let (env, access, space) = reach(accessor, &store, "key-value read")?;
        Ok(Kv::of(&env, &access)
            .get(&space, &key)
            .await
            .map_err(Into::into))
    }

    async fn set(
        accessor: &Accessor<T, Self>,
        store: Resource<Bucket>,
        key: String,
        value: Vec<u8>,
    ) -> Answer<()> {
        let (env, access, space) = reach(accessor, &store, "key-value write")?;
        let writes = [KvWrite::Set {
            key: &key,
            value: &value,
        }];
        Ok(Kv::of(&env, &access)
            .write(&space, &writes)
            .await?
            .map_err(Into::into))
    }

    async fn delete(
        accessor: &Accessor<T, Self>,
        store: Resource<Bucket>,
        key: String,
    ) -> Answer<()> {
        let (env, access, space) = reach(accessor, &store, "key-value write")?;
        let writes = [KvWrite::Delete { key: &key }];
        Ok(Kv::of(&env, &access)
            .write(&space, &writes)
            .await?
            .map_err(Into::into))
    }

    async fn exists(
        accessor: &Accessor<T, Self>,
        store: Resource<Bucket>,
        key: String,
    ) -> Answer<bool> {
        let (env, access, space) = reach(accessor, &store, "key-value read")?;
        Ok(Kv::of(&env, &access)
            .get(&space, &key)
            .await
            .map(|v| v.is_some())
            .map_err(Into::into))
    }

    /// Every key, page after page (a namespace holds at most `max-keys` of them), as a
    /// stream; its future says whether they all came.
    async fn get_keys(
        accessor: &Accessor<T, Self>,
        store: Resource<Bucket>,
    ) -> wasmtime::Result<(StreamReader<String>, FutureReader<Result<(), kv::Error>>)> {
        let (env, access, space) = reach(accessor, &store, "key-value read")?;
        let listed = super::spin::all_keys(&Kv::of(&env, &access), &space).await;
        let (keys, outcome) = match listed {
            Ok(keys) => (keys, Ok(())),
            Err(e) => (Vec::new(), Err(kv::Error::from(e))),
        };
        accessor.with(|mut access| {
            let keys = StreamReader::new(&mut access, keys)?;
            let outcome =
                FutureReader::new(
                    &mut access,
                    async move { Ok::<_, wasmtime::Error>(outcome) },
                )?;
            Ok((keys, outcome))
        })
    }
}

impl vars::Host for Interfaces {}

impl<T> vars::HostWithStore<T> for Spin3 {
    async fn get(
        accessor: &Accessor<T, Self>,
        name: String,
    ) -> wasmtime::Result<Result<String, vars::Error>> {
        accessor.with(|mut access| {
            let answer = super::spin::variable(access.get(), &name);
            Ok(answer.map_err(|e| match e {
                vars2::Error::InvalidName(text) => vars::Error::InvalidName(text),
                vars2::Error::Undefined(text) => vars::Error::Undefined(text),
                vars2::Error::Provider(text) => vars::Error::Provider(text),
                vars2::Error::Other(text) => vars::Error::Other(text),
            }))
        })
    }
}
