//! `wasi:config/store` (SPEC §10): a service's `[service.NAME.config]` ([`ServiceConfig`]),
//! read-only, at `@0.2.0-draft` (upstream's; implemented here), `@0.2.0-draft-2024-09-27`
//! (the one Spin's SDKs import; implemented here) and `@0.2.0-rc.1` (wasmtime's and
//! wasmCloud's; `wasmtime-wasi-config`'s implementation over the same values). The values
//! are read when the settings are ([`ServiceConfig::resolve`]): a call never touches the
//! environment or a file, and has no effect to fence.

use std::sync::Arc;

use super::bindings::config_2024::wasi::config::store as store_2024;
use super::bindings::service::wasi::config::store;
use crate::config::{ConfigError, ConfigValue};

impl store::Host for ServiceConfig {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, store::Error>> {
        Ok(Ok(ServiceConfig::get(self, &key).map(str::to_owned)))
    }

    async fn get_all(&mut self) -> wasmtime::Result<Result<Vec<(String, String)>, store::Error>> {
        Ok(Ok(self.all().to_vec()))
    }
}

impl store_2024::Host for ServiceConfig {
    async fn get(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<Option<String>, store_2024::Error>> {
        Ok(Ok(ServiceConfig::get(self, &key).map(str::to_owned)))
    }

    async fn get_all(
        &mut self,
    ) -> wasmtime::Result<Result<Vec<(String, String)>, store_2024::Error>> {
        Ok(Ok(self.all().to_vec()))
    }
}

/// A service's configuration (`[service.NAME.config]`) with every value read: what
/// `wasi:config/store` answers. Values read from the environment or a file are secrets, so
/// `Debug` shows the keys only. Made once per settings and shared by every instance (a clone
/// is two reference counts), in the form each version's implementation reads.
#[derive(Clone, Default)]
pub struct ServiceConfig {
    /// Sorted by key: `@0.2.0-draft`'s answers.
    values: Arc<[(String, String)]>,
    /// The same, as `wasmtime-wasi-config` (`@0.2.0-rc.1`) reads them.
    variables: Arc<wasmtime_wasi_config::WasiConfigVariables>,
}

impl PartialEq for ServiceConfig {
    fn eq(&self, other: &Self) -> bool {
        self.values == other.values
    }
}

impl Eq for ServiceConfig {}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.values.iter().map(|(k, _)| k))
            .finish()
    }
}

/// The longest configuration value read from a file: a credential or a certificate, not a
/// disk image named by mistake.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

impl ServiceConfig {
    /// Reads every value of service `service`'s `table`: from the environment and from files
    /// now, so that one that cannot be read is refused with the settings (at start, or at
    /// SIGHUP, when the old settings stay) rather than at the guest's first call.
    ///
    /// # Errors
    /// Naming the service, the key and why (an unset variable, an unreadable file, text that
    /// is not UTF-8); never the value.
    pub fn resolve(
        service: &str,
        table: &std::collections::BTreeMap<String, ConfigValue>,
    ) -> Result<Self, ConfigError> {
        let mut values = Vec::with_capacity(table.len());
        for (key, value) in table {
            let invalid = |reason: String| ConfigError::Invalid {
                name: "service.*.config",
                reason: format!("service {service}: config key {key:?}: {reason}"),
            };
            let text = match value {
                ConfigValue::Plain(text) => text.clone(),
                ConfigValue::Env(var) => std::env::var(var).map_err(|e| {
                    invalid(match e {
                        std::env::VarError::NotPresent => {
                            format!("environment variable {var} is not set")
                        }
                        std::env::VarError::NotUnicode(_) => {
                            format!("environment variable {var} is not UTF-8")
                        }
                    })
                })?,
                ConfigValue::File(path) => {
                    let bytes = crate::fs::read_file(path, MAX_CONFIG_FILE_BYTES)
                        .map_err(|e| invalid(format!("file {}: {e}", path.display())))?;
                    String::from_utf8(bytes).map_err(|_| {
                        invalid(format!("file {} is not UTF-8 text", path.display()))
                    })?
                }
            };
            values.push((key.clone(), text));
        }
        let variables = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Ok(Self {
            values: values.into(),
            variables: Arc::new(variables),
        })
    }

    /// The value of `key`, if it is set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every key and value, sorted by key.
    pub fn all(&self) -> &[(String, String)] {
        &self.values
    }

    /// The values as `wasmtime-wasi-config` reads them.
    pub(crate) fn variables(&self) -> &wasmtime_wasi_config::WasiConfigVariables {
        &self.variables
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from the environment and from files are read with the settings; one that
    /// cannot be read is an error naming the service and the key, never the value, and no
    /// `Debug` shows a value.
    #[test]
    fn config_values_are_read_with_the_settings_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let secret_file = dir.path().join("key");
        std::fs::write(&secret_file, "file-secret-4242").unwrap();
        // Set by nothing: the test's own name.
        let var = "VVM_TEST_CONFIG_SECRET_5151";
        let table = |value: ConfigValue| {
            std::collections::BTreeMap::from([
                ("plain".to_owned(), ConfigValue::Plain("shown".into())),
                ("secret".to_owned(), value),
            ])
        };
        let from_file =
            ServiceConfig::resolve("s", &table(ConfigValue::File(secret_file))).unwrap();
        assert_eq!(from_file.get("secret"), Some("file-secret-4242"));
        assert_eq!(from_file.get("plain"), Some("shown"));
        assert_eq!(from_file.get("none"), None);
        assert_eq!(from_file.all().len(), 2);
        let shown = format!("{from_file:?}");
        assert!(
            !shown.contains("file-secret") && !shown.contains("shown"),
            "{shown}"
        );

        let e = ServiceConfig::resolve("s", &table(ConfigValue::Env(var.into())))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("service s") && e.contains("\"secret\"") && e.contains(var),
            "{e}"
        );
        let missing = dir.path().join("missing");
        let e = ServiceConfig::resolve("s", &table(ConfigValue::File(missing)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("service s") && e.contains("missing"), "{e}");
    }
}
