//! Spin's interfaces (SPEC §10), so that a component made with Spin's SDKs (Rust up to 5.2,
//! Python up to 3.4, WASI 0.2) runs unchanged:
//! - `fermyon:spin/key-value@2.0.0` over the same buckets as `wasi:keyvalue` (`keyvalue`'s
//!   `Kv`, so fenced and bounded as every write is): `open("default")` is the service's own
//!   namespace, a label granted in `kv-buckets` that shared bucket, any other label
//!   `access-denied` (as Spin answers a label its manifest does not list), the empty label
//!   `no-such-store`; a namespace at its quota (`max-keys`, `max-bytes`) or a full resource
//!   table is `store-table-full`; every other failure is `other` with the text
//!   `wasi:keyvalue` gives (`over a limit: ...` for a key or value too large, `stale term`).
//! - `fermyon:spin/variables@2.0.0` over `[service.NAME.config]`, with Spin's rules for a
//!   name (`invalid-name`) and its text for one that is not set (`undefined`). A value is
//!   never logged. (`wasi:config@0.2.0-draft-2024-09-27`, the same values, is `wasi_config`'s.)
//! - Spin's outbound interfaces (Redis, `MySQL`, `PostgreSQL`, `SQLite`, LLM, MQTT), which vvm-host
//!   does not offer ([`outbound`]): a component that imports them is linked with stubs that
//!   trap when called (`super::stubs`), since Spin's Python SDK imports them all whether the
//!   app uses them or not; `check` names them.
//! - `wasi:keyvalue@0.2.0-draft2` as Spin ships it, whose `batch.get-many` has another
//!   answer's shape than upstream's under the same version: a component built against it
//!   ([`spins_batch`]) gets Spin's `batch` over the same buckets, in a linker of its own
//!   (`super::stubs`): one name, two definitions.
//!
//! Spin's current interfaces (`spin:key-value@3.0.0`, `spin:variables@3.0.0`, WASI 0.3) are
//! `super::spin3`'s.

use wasmtime::component::types::{ComponentItem, Type};
use wasmtime::component::{HasSelf, Linker, Resource, ResourceTableError};

use super::bindings::keyvalue_spin::wasi::keyvalue::batch as spin_batch;
use super::bindings::service::wasi::keyvalue::store;
use super::bindings::spin::fermyon::spin::{key_value, variables};
use super::keyvalue::access::Bucket;
use super::keyvalue::{Kv, KvError};
use super::view::{Interfaces, View};
use crate::ops::KvLimit;
use crate::store::KvWrite;

type Answer<T> = wasmtime::Result<Result<T, key_value::Error>>;

impl From<KvError> for key_value::Error {
    fn from(e: KvError) -> Self {
        match e {
            KvError::AccessDenied(_) => Self::AccessDenied,
            // The namespace's quota: the store is full (the limit is in the log and
            // `/metrics`, as every refusal is).
            KvError::Limit {
                limit: KvLimit::Keys | KvLimit::Bytes,
                ..
            } => Self::StoreTableFull,
            e => Self::Other(e.to_string()),
        }
    }
}

/// The namespace behind a Spin store's handle.
fn space(host: &Interfaces, store: &Resource<Bucket>) -> wasmtime::Result<String> {
    Ok(host.table.get(store)?.space.clone())
}

impl key_value::Host for Interfaces {}

impl key_value::HostStore for Interfaces {
    async fn open(&mut self, label: String) -> Answer<Resource<Bucket>> {
        open_store(self, &label)
    }

    super::keyvalue::wasi_keyvalue_bucket!();

    /// Every key, page after page (a namespace holds at most `max-keys` of them).
    async fn get_keys(&mut self, store: Resource<Bucket>) -> Answer<Vec<String>> {
        let space = space(self, &store)?;
        Ok(all_keys(&self.kv(), &space).await.map_err(Into::into))
    }
}

/// Opens the Spin store `label` of the instance `host` (see the module's docs).
///
/// # Errors
/// When the resource table fails otherwise than by being full.
pub(crate) fn open_store(host: &mut Interfaces, label: &str) -> Answer<Resource<Bucket>> {
    if label.is_empty() {
        return Ok(Err(key_value::Error::NoSuchStore));
    }
    let bucket = match host.kv().open(label) {
        Ok(bucket) => bucket,
        Err(e) => return Ok(Err(e.into())),
    };
    match host.table.push(bucket) {
        Ok(store) => Ok(Ok(store)),
        Err(ResourceTableError::Full) => Ok(Err(key_value::Error::StoreTableFull)),
        Err(e) => Err(e.into()),
    }
}

/// Every key of `space`, page after page (a namespace holds at most `max-keys` of them).
pub(crate) async fn all_keys(kv: &Kv<'_>, space: &str) -> Result<Vec<String>, KvError> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let (keys, next) = kv.list(space, cursor.as_deref()).await?;
        all.extend(keys);
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(all),
        }
    }
}

impl crate::interfaces::bindings::spin_cron::fermyon::spin_cron::cron_types::Host for Interfaces {}

impl variables::Host for Interfaces {
    async fn get(&mut self, name: String) -> wasmtime::Result<Result<String, variables::Error>> {
        Ok(variable(self, &name))
    }
}

/// The variable `name` of the instance `host`'s service (see the module's docs).
pub(crate) fn variable(host: &Interfaces, name: &str) -> Result<String, variables::Error> {
    if let Err(reason) = variable_name(name) {
        return Err(variables::Error::InvalidName(format!("{name:?}: {reason}")));
    }
    host.config.get(name).map(str::to_owned).ok_or_else(|| {
        variables::Error::Undefined(format!("no variable for {:?}.{name:?}", &*host.env.name))
    })
}

/// Whether `name` is a variable's name as Spin's `variables.get` accepts it: lower-case
/// ASCII letters and digits, single underscores between them, a letter first (Spin's
/// `expressions` crate, `Key::validate`, with its reasons).
fn variable_name(name: &str) -> Result<(), String> {
    let Some(first) = name.bytes().next() else {
        return Err("must not be empty".to_owned());
    };
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        return Err(format!(
            "invalid character {bad:?}. Variable names may contain only lower-case letters, \
             numbers, and underscores."
        ));
    }
    if !first.is_ascii_lowercase() {
        return Err("must start with a lowercase ASCII letter".to_owned());
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must end with a lowercase ASCII letter or digit".to_owned());
    }
    if name.contains("__") {
        return Err("must not contain multiple consecutive underscores".to_owned());
    }
    Ok(())
}

/// What the interface `name` (`fermyon:spin/redis@2.0.0`, `spin:postgres/postgres@4.0.0`)
/// is, if it is one of Spin's outbound interfaces, which vvm-host does not offer.
pub(crate) fn outbound(name: &str) -> Option<&'static str> {
    let package = name.split_once('@').map_or(name, |(p, _)| p);
    let (namespace, rest) = package.split_once(':')?;
    // `fermyon:spin/redis`, and the newer `spin:redis/redis` alike.
    let what = match namespace {
        "fermyon" => rest.strip_prefix("spin/")?,
        "spin" => rest.split('/').next()?,
        _ => return None,
    };
    Some(match what {
        "redis" | "redis-types" => "Redis",
        "mysql" => "MySQL",
        "postgres" => "PostgreSQL",
        "rdbms-types" => "relational database",
        "sqlite" => "SQLite",
        "llm" => "LLM inferencing",
        "mqtt" => "MQTT",
        _ => return None,
    })
}

/// The name Spin's and upstream's `batch` share.
pub(crate) const BATCH: &str = "wasi:keyvalue/batch@0.2.0-draft2";

/// Defines Spin's `batch` in `linker`, in place of upstream's (for a component built against
/// Spin's: [`spins_batch`]).
///
/// # Errors
/// When a definition cannot be made.
pub(crate) fn link_spins_batch<T: View>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    spin_batch::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Whether the imported `batch` is Spin's: its `get-many` answers a list of tuples (upstream's,
/// a list of options).
pub(crate) fn spins_batch(
    batch: &wasmtime::component::types::ComponentInstance,
    engine: &wasmtime::Engine,
) -> bool {
    batch.exports(engine).any(|(name, item)| {
        let ComponentItem::ComponentFunc(get_many) = item.ty else {
            return false;
        };
        let answer = get_many.results().next();
        let listed = match answer {
            Some(Type::Result(result)) => match result.ok() {
                Some(Type::List(list)) => Some(list.ty()),
                _ => None,
            },
            _ => None,
        };
        name == "get-many" && matches!(listed, Some(Type::Tuple(_)))
    })
}

impl spin_batch::Host for Interfaces {
    async fn get_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<(String, Option<Vec<u8>>)>, store::Error>> {
        let space = space(self, &bucket)?;
        Ok(self
            .kv()
            .get_many(&space, &keys)
            .await
            .map(|values| keys.into_iter().zip(values).collect())
            .map_err(Into::into))
    }

    async fn set_many(
        &mut self,
        bucket: Resource<Bucket>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let space = space(self, &bucket)?;
        let writes: Vec<KvWrite<'_>> = key_values
            .iter()
            .map(|(key, value)| KvWrite::Set { key, value })
            .collect();
        Ok(self.kv().write(&space, &writes).await?.map_err(Into::into))
    }

    async fn delete_many(
        &mut self,
        bucket: Resource<Bucket>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<(), store::Error>> {
        let space = space(self, &bucket)?;
        let writes: Vec<KvWrite<'_>> = keys.iter().map(|key| KvWrite::Delete { key }).collect();
        Ok(self.kv().write(&space, &writes).await?.map_err(Into::into))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use key_value::HostStore as _;

    use super::*;
    use crate::interfaces::env::tests::env;
    use crate::interfaces::keyvalue::access::KvAccess;

    fn borrow(store: &Resource<Bucket>) -> Resource<Bucket> {
        Resource::new_borrow(store.rep())
    }

    /// Spin's own conformance sequence (`tests/test-components/components/key-value`), then
    /// what vvm-host adds: a granted label, the empty label, a full table, the fence.
    #[tokio::test]
    async fn key_value_answers_as_spins_conformance_component_expects() {
        let (clock, env) = env().await;
        let access = KvAccess {
            buckets: Arc::from(["shared".to_owned()]),
            ..KvAccess::default()
        };
        let mut h = crate::interfaces::view::tests::interfaces(&env, access);
        let denied = h.open("forbidden".into()).await.unwrap().unwrap_err();
        assert!(
            matches!(denied, key_value::Error::AccessDenied),
            "{denied:?}"
        );
        let s = h.open("default".into()).await.unwrap().unwrap();
        h.delete(borrow(&s), "bar".into()).await.unwrap().unwrap();
        assert!(!h.exists(borrow(&s), "bar".into()).await.unwrap().unwrap());
        assert_eq!(
            key_value::HostStore::get(&mut h, borrow(&s), "bar".into())
                .await
                .unwrap()
                .unwrap(),
            None
        );
        assert!(h.get_keys(borrow(&s)).await.unwrap().unwrap().is_empty());
        h.set(borrow(&s), "bar".into(), b"baz".to_vec())
            .await
            .unwrap()
            .unwrap();
        assert!(h.exists(borrow(&s), "bar".into()).await.unwrap().unwrap());
        let got = key_value::HostStore::get(&mut h, borrow(&s), "bar".into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.as_deref(), Some(&b"baz"[..]));
        h.set(borrow(&s), "bar".into(), b"wow".to_vec())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h.get_keys(borrow(&s)).await.unwrap().unwrap(), ["bar"]);
        h.set(borrow(&s), "qux".into(), b"yay".to_vec())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            h.get_keys(borrow(&s)).await.unwrap().unwrap(),
            ["bar", "qux"]
        );
        for key in ["bar", "bar", "qux"] {
            h.delete(borrow(&s), key.into()).await.unwrap().unwrap();
        }
        assert!(h.get_keys(borrow(&s)).await.unwrap().unwrap().is_empty());
        // The service's own namespace, as `wasi:keyvalue` and `vvm:host/kv` see it.
        h.set(borrow(&s), "k".into(), b"v".to_vec())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            env.store.kv_get("svc", "k").await.unwrap(),
            Some(b"v".to_vec())
        );

        let shared = h.open("shared".into()).await.unwrap().unwrap();
        h.set(borrow(&shared), "k".into(), b"s".to_vec())
            .await
            .unwrap()
            .unwrap();
        let in_bucket = env.store.kv_get("bucket/shared", "k").await.unwrap();
        assert_eq!(in_bucket, Some(b"s".to_vec()));
        let unknown = h.open(String::new()).await.unwrap().unwrap_err();
        assert!(
            matches!(unknown, key_value::Error::NoSuchStore),
            "{unknown:?}"
        );

        h.table.set_max_capacity(0);
        let full = h.open("default".into()).await.unwrap().unwrap_err();
        assert!(matches!(full, key_value::Error::StoreTableFull), "{full:?}");

        // Past the deadline a write traps, as every effect does, and writes nothing.
        clock.advance(Duration::from_mins(1));
        let e = h
            .set(borrow(&s), "k".into(), b"late".to_vec())
            .await
            .unwrap_err();
        assert!(e.is::<crate::interfaces::Fenced>(), "{e}");
        assert_eq!(
            env.store.kv_get("svc", "k").await.unwrap(),
            Some(b"v".to_vec())
        );
    }

    /// A write past the namespace's quota is `store-table-full`, and writes nothing.
    #[tokio::test]
    async fn a_write_past_the_quota_is_store_table_full() {
        let (_clock, env) = env().await;
        let access = KvAccess {
            limits: crate::interfaces::KvLimits {
                max_keys: 1,
                ..crate::interfaces::KvLimits::default()
            },
            ..KvAccess::default()
        };
        let mut h = crate::interfaces::view::tests::interfaces(&env, access);
        let s = h.open("default".into()).await.unwrap().unwrap();
        h.set(borrow(&s), "a".into(), b"1".to_vec())
            .await
            .unwrap()
            .unwrap();
        let full = h.set(borrow(&s), "b".into(), b"2".to_vec()).await.unwrap();
        assert!(
            matches!(full, Err(key_value::Error::StoreTableFull)),
            "{full:?}"
        );
        assert_eq!(env.store.kv_get("svc", "b").await.unwrap(), None);
    }

    /// A set variable is its value; a missing one Spin's `undefined` text; a bad name Spin's
    /// `invalid-name` with the reason.
    #[tokio::test]
    async fn variables_answer_as_spin_does() {
        let (_clock, env) = env().await;
        let mut h = crate::interfaces::view::tests::interfaces(&env, KvAccess::default());
        let table = std::collections::BTreeMap::from([(
            "api_token".to_owned(),
            crate::config::ConfigValue::Plain("t0k3n".into()),
        )]);
        h.config = crate::interfaces::ServiceConfig::resolve("svc", &table).unwrap();
        let token = variables::Host::get(&mut h, "api_token".into())
            .await
            .unwrap();
        assert_eq!(token.ok().as_deref(), Some("t0k3n"));
        let Err(variables::Error::Undefined(text)) = variables::Host::get(&mut h, "missing".into())
            .await
            .unwrap()
        else {
            panic!("not undefined")
        };
        assert_eq!(text, r#"no variable for "svc"."missing""#);
        let Err(variables::Error::InvalidName(text)) =
            variables::Host::get(&mut h, "API".into()).await.unwrap()
        else {
            panic!("not invalid")
        };
        assert!(
            text.starts_with(r#""API": invalid character 'A'"#),
            "{text}"
        );
    }

    /// Spin's own cases (`expressions` crate, `keys_good` and `keys_bad`).
    #[test]
    fn variable_names_follow_spins_rules() {
        for good in ["a", "abc", "a1b2c3", "a_1", "a_1_b_3", "api_token"] {
            assert_eq!(variable_name(good), Ok(()), "{good}");
        }
        for bad in ["", "aX", "1bc", "_x", "x.y", "x_", "a__b", "x-y", "é"] {
            assert!(variable_name(bad).is_err(), "{bad}");
        }
        assert_eq!(
            variable_name("aX"),
            Err(
                "invalid character 'X'. Variable names may contain only lower-case letters, \
                 numbers, and underscores."
                    .to_owned()
            )
        );
    }

    #[test]
    fn spins_outbound_interfaces_are_told_apart_from_the_ones_offered() {
        for (import, what) in [
            ("fermyon:spin/redis@2.0.0", "Redis"),
            ("fermyon:spin/postgres@2.0.0", "PostgreSQL"),
            ("fermyon:spin/mysql@2.0.0", "MySQL"),
            ("fermyon:spin/sqlite@2.0.0", "SQLite"),
            ("fermyon:spin/llm@2.0.0", "LLM inferencing"),
            ("fermyon:spin/mqtt@2.0.0", "MQTT"),
            ("fermyon:spin/rdbms-types@2.0.0", "relational database"),
            ("spin:postgres/postgres@4.0.0", "PostgreSQL"),
            ("spin:sqlite/sqlite@3.0.0", "SQLite"),
        ] {
            assert_eq!(outbound(import), Some(what), "{import}");
        }
        for offered in [
            "fermyon:spin/key-value@2.0.0",
            "fermyon:spin/variables@2.0.0",
            "wasi:keyvalue/store@0.2.0-draft2",
            "acme:redis/client@1.0.0",
        ] {
            assert_eq!(outbound(offered), None, "{offered}");
        }
    }
}
