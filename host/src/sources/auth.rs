//! Registry credentials (SPEC §13): Docker's `config.json` (`$DOCKER_CONFIG`, else
//! `~/.docker`) and its credential helpers, read through the `docker_credential` crate as
//! Spin and wkg read them; anonymous when none is configured. A credential is handed to the
//! client and never logged.

use oci_client::secrets::RegistryAuth;

/// The credentials for `registry` (`host:port`): a user name and password from Docker's
/// configuration or a helper, else anonymous. An identity token (an OAuth refresh token),
/// which the registry client cannot use, is anonymous too, and said.
pub fn credentials(registry: &str) -> RegistryAuth {
    use docker_credential::{CredentialRetrievalError as E, DockerCredential};
    match docker_credential::get_credential(registry) {
        Ok(DockerCredential::UsernamePassword(user, password)) => {
            RegistryAuth::Basic(user, password)
        }
        Ok(DockerCredential::IdentityToken(_)) => {
            tracing::warn!(
                registry,
                "an identity token is configured for the registry, which vvm-host cannot use: pulling anonymously"
            );
            RegistryAuth::Anonymous
        }
        Err(E::ConfigNotFound | E::NoCredentialConfigured) => RegistryAuth::Anonymous,
        // No `config.json` at all: nothing was configured.
        Err(E::ConfigReadError) if !config_file_exists() => RegistryAuth::Anonymous,
        Err(e) => {
            // The error names the helper or the file, never a secret.
            tracing::warn!(registry, error = %e, "registry credentials could not be read: pulling anonymously");
            RegistryAuth::Anonymous
        }
    }
}

/// Whether Docker's `config.json` exists where `docker_credential` looks for it.
fn config_file_exists() -> bool {
    let dir = std::env::var_os("DOCKER_CONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".docker"))
        });
    dir.is_some_and(|dir| dir.join("config.json").exists())
}

#[cfg(test)]
mod tests {
    // `get_credential` reads `DOCKER_CONFIG` from the environment; setting it in a unit test
    // would race the other tests, so credentials are tested end to end (tests/e2e/oci.rs).
}
