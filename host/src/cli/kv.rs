//! `vvm-host kv`: operators look at the guests' key-value data without writing (SPEC §10).
//! Read-only like `status`: a redb file is opened without a write lock, and nothing here can
//! write, so it is safe while hosts serve.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::StoreArgs;
use super::status::emit;
use crate::config::check_bucket_name;
use crate::keys::bucket_space;
use crate::log_output::escaped;
use crate::store::{self, FencedKv, KvUsage, KvView};

/// `vvm-host kv` subcommands.
#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// List a namespace's keys, in byte order, and what it holds.
    List {
        /// Whose keys.
        #[command(flatten)]
        namespace: Namespace,
        /// Only keys that start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Print one JSON object instead of lines, for scripts.
        #[arg(long)]
        json: bool,
        /// Settings.
        #[command(flatten)]
        settings: StoreArgs,
    },
    /// Print the value under a key, as its bytes; exit 1 if there is none.
    Get {
        /// Whose key.
        #[command(flatten)]
        namespace: Namespace,
        /// The key.
        key: String,
        /// Settings.
        #[command(flatten)]
        settings: StoreArgs,
    },
}

/// A namespace: a service's own, or a shared bucket.
#[derive(Debug, Args)]
pub struct Namespace {
    /// The service (its file stem) whose own namespace to read; with `--bucket`, the shared
    /// bucket's name.
    name: String,
    /// NAME is a shared bucket (`kv-buckets`), not a service.
    #[arg(long)]
    bucket: bool,
}

impl Namespace {
    /// The store's name for it.
    fn space(&self) -> anyhow::Result<String> {
        let name = &self.name;
        if self.bucket {
            check_bucket_name(name)
                .map_err(|reason| anyhow::anyhow!("bucket {name:?} {reason}"))?;
            Ok(bucket_space(name))
        } else if name.is_empty() || name.contains('/') {
            anyhow::bail!("service {name:?}: not a service name")
        } else {
            Ok(name.clone())
        }
    }
}

/// Runs `vvm-host kv ...`.
pub(super) async fn kv(command: KvCommand) -> anyhow::Result<ExitCode> {
    let (KvCommand::List {
        namespace,
        settings,
        ..
    }
    | KvCommand::Get {
        namespace,
        settings,
        ..
    }) = &command;
    let space = namespace.space()?;
    let settings = settings.settings()?;
    let opened = store::open(&settings.store_settings(), true).await?;
    let store = opened.shared();
    let result = match &command {
        KvCommand::List { prefix, json, .. } => list(&*store, &space, prefix, *json).await,
        KvCommand::Get { key, .. } => get(&*store, &space, key).await,
    };
    drop(store);
    opened.close().await;
    result
}

async fn list(
    store: &dyn FencedKv,
    space: &str,
    prefix: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    // The keys and the figures from one committed state of the store.
    let KvView { keys, usage } = store.kv_view(space, prefix).await?;
    let mut out = Vec::new();
    if json {
        let KvUsage { keys: n, bytes } = usage;
        let object = serde_json::json!({
            "namespace": space,
            "keys": keys,
            "usage": { "keys": n, "bytes": bytes },
        });
        writeln!(out, "{object}")?;
    } else {
        for key in &keys {
            // A key is a guest's text: shown escaped, one per line.
            writeln!(out, "{}", escaped(key))?;
        }
        eprintln!(
            "{} keys listed; {space} holds {} keys, {} bytes",
            keys.len(),
            usage.keys,
            usage.bytes
        );
    }
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

async fn get(store: &dyn FencedKv, space: &str, key: &str) -> anyhow::Result<ExitCode> {
    let Some(value) = store.kv_get(space, key).await? else {
        eprintln!("vvm-host: no key {:?} in {space}", escaped(key));
        return Ok(ExitCode::FAILURE);
    };
    emit(&value)?;
    Ok(ExitCode::SUCCESS)
}
