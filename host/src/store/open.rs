//! Opening the configured store (SPEC §3): an etcd cluster for an `etcd://` URL, else a redb
//! file; read-only for the tools that only look, else behind one group commit
//! ([`GroupCommit`]); and closing it once its users have ended.

use std::sync::Arc;
use std::time::Duration;

use super::{
    BatchReport, EtcdOptions, EtcdStore, EtcdTls, GroupCommit, RedbStore, Store, StoreError,
};

/// What [`open`] needs to know of the settings: where the store is and how to reach it.
/// Its `Debug` leaves the password out.
#[derive(Clone, Default)]
pub struct StoreSettings {
    /// A redb file path, or `etcd://host:port[,host:port...]`.
    pub location: String,
    /// etcd user name, if the cluster authenticates.
    pub user: Option<String>,
    /// etcd password.
    pub password: Option<String>,
    /// TLS to the etcd cluster, if any file of it is given.
    pub tls: Option<EtcdTls>,
    /// Key prefix of every etcd record, if not the default.
    pub prefix: Option<String>,
    /// How long one wait for a lock of the redb file may last: a bound well inside the
    /// renewal's retries (SPEC §8).
    pub lock_patience: Duration,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("location", &self.location)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "(hidden)"))
            .field("tls", &self.tls)
            .field("prefix", &self.prefix)
            .field("lock_patience", &self.lock_patience)
            .finish()
    }
}

/// Opens the configured store: etcd for an `etcd://` URL, else a redb file. With
/// `read_only` (the tools that only look), a redb file must exist and is opened without
/// any lock a writer waits for, so a paused tool cannot stall the hosts serving from it.
/// Otherwise its fenced key-value writes are group-committed ([`GroupCommit`]).
///
/// # Errors
/// The store's error, naming the path or endpoints.
pub async fn open(settings: &StoreSettings, read_only: bool) -> Result<OpenedStore, StoreError> {
    let location = &settings.location;
    let backend = if location.starts_with("etcd://") {
        let mut options = EtcdOptions::from_url(location)
            .map_err(|e| StoreError::permanent(format!("store {location}"), e))?;
        options.user.clone_from(&settings.user);
        options.password.clone_from(&settings.password);
        options.tls.clone_from(&settings.tls);
        if let Some(prefix) = &settings.prefix {
            options.prefix.clone_from(prefix);
        }
        let store = EtcdStore::connect(options).await?;
        Backend::Etcd(Arc::new(store))
    } else if read_only {
        let store = RedbStore::open_read_only(location).await?;
        Backend::Redb(Arc::new(store))
    } else {
        let store = RedbStore::open_with_patience(location, settings.lock_patience).await?;
        Backend::Redb(Arc::new(store))
    };
    let group = (!read_only).then(|| GroupCommit::new(backend.shared()));
    Ok(OpenedStore { backend, group })
}

/// A store opened by [`open`], owned by whoever opened it: [`OpenedStore::shared`] hands it
/// to the tasks that use it, and [`OpenedStore::close`] ends it once they have ended.
pub struct OpenedStore {
    backend: Backend,
    /// The group commit in front of it, unless it was opened read-only.
    group: Option<GroupCommit>,
}

/// Which store an [`OpenedStore`] is.
enum Backend {
    /// A redb file.
    Redb(Arc<RedbStore>),
    /// An etcd cluster.
    Etcd(Arc<EtcdStore>),
}

impl Backend {
    fn shared(&self) -> Arc<dyn Store> {
        match self {
            Self::Redb(store) => Arc::clone(store) as Arc<dyn Store>,
            Self::Etcd(store) => Arc::clone(store) as Arc<dyn Store>,
        }
    }
}

impl OpenedStore {
    /// A handle for a task that uses the store; drop it before [`OpenedStore::close`]. Every
    /// handle shares one group commit.
    pub fn shared(&self) -> Arc<dyn Store> {
        match &self.group {
            Some(group) => Arc::new(group.clone()),
            None => self.backend.shared(),
        }
    }

    /// Tells `observer` of every batch of key-value writes the store commits (for metrics).
    /// Call it before handing out any handle: the handles from before keep their queue.
    pub fn observe_batches(&mut self, observer: impl Fn(BatchReport) + Send + Sync + 'static) {
        if self.group.is_some() {
            self.group = Some(GroupCommit::observed(self.backend.shared(), observer));
        }
    }

    /// Closes the store, once the group commit's last batch has ended: a redb file is closed
    /// on the blocking pool (closing may write and sync it), an etcd client is dropped. A
    /// handle from [`OpenedStore::shared`] still alive keeps the store open until it is
    /// dropped; that is logged.
    pub async fn close(self) {
        if let Some(group) = self.group {
            group.close().await;
        }
        match self.backend {
            Backend::Redb(store) => match Arc::try_unwrap(store) {
                Ok(store) => store.close().await,
                Err(store) => {
                    let handles = Arc::strong_count(&store) - 1;
                    tracing::warn!(
                        handles,
                        "redb store still in use; it closes with its last handle"
                    );
                }
            },
            Backend::Etcd(store) => {
                let handles = Arc::strong_count(&store) - 1;
                drop(store);
                if handles == 0 {
                    tracing::info!("etcd client closed");
                } else {
                    tracing::warn!(
                        handles,
                        "etcd store still in use; it closes with its last handle"
                    );
                }
            }
        }
    }
}
