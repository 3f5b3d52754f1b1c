//! `wasi:keyvalue@0.2.0-draft` (what wasmtime's and wasmCloud's hosts ship): the same buckets
//! as `draft2`, with numbered cursors, an unsigned increment and no `cas`.

use wasmtime::component::{HasSelf, Linker, Resource};

use super::KvError;
use super::access::Bucket;
use crate::interfaces::bindings::keyvalue_draft::wasi::keyvalue::{atomics, batch, store};
use crate::interfaces::view::{Interfaces, View};
use crate::store::KvWrite;

/// Adds `wasi:keyvalue@0.2.0-draft` to `linker`.
///
/// # Errors
/// When the linker already has it.
pub(crate) fn add_to_linker<T: View>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    store::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    atomics::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    batch::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)
}

/// The most cursors one bucket handle hands out; open the bucket again for more listings.
const MAX_CURSORS: usize = 4096;

wasi_keyvalue_common!();

impl store::HostBucket for Interfaces {
    wasi_keyvalue_bucket!();

    /// Cursor `n` continues after the last key of the page that handed it out.
    async fn list_keys(
        &mut self,
        b: Resource<Bucket>,
        cursor: Option<u64>,
    ) -> Answer<store::KeyResponse> {
        let bucket = self.table.get(&b)?;
        let after = match cursor {
            None | Some(0) => None,
            Some(n) => match usize::try_from(n - 1)
                .ok()
                .and_then(|i| bucket.cursors.get(i))
            {
                Some(after) => Some(after.clone()),
                None => return Ok(Err(KvError::Cursor(n).into())),
            },
        };
        let space = bucket.space.clone();
        let (keys, next) = match self.kv().list(&space, after.as_deref()).await {
            Ok(page) => page,
            Err(e) => return Ok(Err(e.into())),
        };
        let bucket = self.table.get_mut(&b)?;
        let cursor = match next {
            Some(last) if bucket.cursors.len() < MAX_CURSORS => {
                bucket.cursors.push(last);
                Some(bucket.cursors.len() as u64)
            }
            Some(_) => {
                let e = KvError::Cursor(MAX_CURSORS as u64 + 1);
                return Ok(Err(e.into()));
            }
            None => None,
        };
        Ok(Ok(store::KeyResponse { keys, cursor }))
    }
}

impl atomics::Host for Interfaces {
    async fn increment(&mut self, b: Resource<Bucket>, key: String, delta: u64) -> Answer<u64> {
        let space = space(self, &b)?;
        let Ok(delta) = i64::try_from(delta) else {
            return Ok(Err(KvError::Overflow(key).into()));
        };
        Ok(match self.kv().increment(&space, &key, delta).await? {
            Ok(n) => u64::try_from(n).map_err(|_| KvError::Overflow(key).into()),
            Err(e) => Err(e.into()),
        })
    }
}
