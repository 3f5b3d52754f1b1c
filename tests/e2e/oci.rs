//! Components by digest (SPEC §13, issue 49): a real registry on loopback (Debian's
//! `docker-registry`, distribution 2.8), components pushed by `vvm-host push` and by oras-py
//! (a third-party client), and real hosts pulling them: served by digest, started from the
//! cache with the registry down, replaced on SIGHUP and on a rewritten `vvm.toml`; a tampered
//! blob, a tag naming something that is no component, and a 401 each refused with the
//! reason, nothing cached, the other services running; credentials from Docker's
//! `config.json`, never logged.

use std::path::Path;
use std::process::Command;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::registry::{self, Registry, pinned};

use crate::BIN;
use crate::incoming_http::{free_addr, get};
use crate::live_dir::padded_ticker;
use crate::ops::{endpoint, metrics_until};

/// `vvm-host push FILE REF --insecure-registries ADDR`: the pinned reference it prints.
fn push(file: &Path, reference: &str, registry: &Registry) -> String {
    let addr = registry.addr();
    pinned(registry::push(BIN, file, reference).args(["--insecure-registries", &addr]))
}

/// The digest of a pinned reference.
fn digest(pinned: &str) -> &str {
    &pinned[pinned.rfind('@').unwrap() + 1..]
}

/// `NAME` in the JSON log lines.
fn tag(service: &str) -> String {
    format!("\"service\":\"{service}\"")
}

/// A host serving `dir` (its `vvm.toml`) with HTTP on `http` and the operations endpoint on.
fn host(name: &'static str, dir: &Path, http: std::net::SocketAddr) -> Host {
    host_with(Command::new(BIN), name, dir, http)
}

/// Like [`host`], running `command`.
fn host_with(command: Command, name: &'static str, dir: &Path, http: std::net::SocketAddr) -> Host {
    let (http, cache) = (http.to_string(), format!("cache-{name}"));
    let args = [
        "serve",
        "--store",
        "vvm.redb",
        "--lease",
        "5s",
        "--grace-period",
        "1s",
        "--cache-dir",
        &cache,
        "--http-addr",
        &http,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    Host::start_command(command, name, dir, &args, "info")
}

/// A services directory with the ticker, and `vvm.toml` with `sources` (`[service.NAME]`
/// tables, whole) and the registries listed as insecure.
fn write_config(dir: &Path, insecure: &[String], tables: &str) {
    let insecure: Vec<String> = insecure.iter().map(|a| format!("{a:?}")).collect();
    let text = format!("insecure-registries = [{}]\n{tables}", insecure.join(", "));
    std::fs::write(dir.join("vvm.toml"), text).unwrap();
}

#[test]
fn a_pinned_component_serves_starts_from_the_cache_with_the_registry_down_and_is_replaced_on_sighup()
 {
    let Some(mut registry) = Registry::start() else {
        return;
    };
    let dir = testkit::host::cluster_dir();
    let addr = registry.addr();
    let v1 = push(
        &guests::guest("rust-http"),
        &format!("oci://{addr}/e2e/hello:v1"),
        &registry,
    );
    // The same file pushed again: the same digest (`created` is fixed).
    let again = push(
        &guests::guest("rust-http"),
        &format!("oci://{addr}/e2e/hello:v1"),
        &registry,
    );
    assert_eq!(v1, again);
    let hello = |pinned: &str| format!("[service.hello]\nsource = \"{pinned}\"\n");
    write_config(dir.path(), std::slice::from_ref(&addr), &hello(&v1));
    let http = free_addr();
    let mut a = host("a", dir.path(), http);
    let pulled = a.wait_for(&["service pulled", &tag("hello")]);
    assert!(
        pulled.text.contains(&v1) && pulled.text.contains("\"from_cache\":false"),
        "{}",
        pulled.text
    );
    a.wait_for(&["service running", &tag("hello")]);
    let (status, _, body) = get(http, "/hello/");
    assert_eq!(status, 200, "{body}");

    // The registry gone: a host with the digest cached starts and serves it.
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    registry.stop();
    let a = host("a", dir.path(), http);
    let pulled = a.wait_for(&["service pulled", &tag("hello")]);
    assert!(
        pulled.text.contains("\"from_cache\":true"),
        "{}",
        pulled.text
    );
    a.wait_for(&["service running", &tag("hello")]);
    let (status, _, body) = get(http, "/hello/");
    assert_eq!(status, 200, "{body}");

    // A new version pushed and pinned: SIGHUP swaps it in.
    registry.restart();
    let v2_file = dir.path().join("hello-v2.wasm");
    std::fs::write(&v2_file, padded_http(4096)).unwrap();
    let v2 = push(&v2_file, &format!("oci://{addr}/e2e/hello:v2"), &registry);
    assert_ne!(digest(&v1), digest(&v2));
    write_config(dir.path(), std::slice::from_ref(&addr), &hello(&v2));
    let mark = a.mark();
    a.signal(Signal::HUP);
    let (_, pulled) = a.wait_for_from(mark, &["service pulled", &tag("hello")]);
    assert!(pulled.text.contains(&v2), "{}", pulled.text);
    a.wait_for_from(mark, &["service replaced", &tag("hello")]);
    let (status, _, body) = get(http, "/hello/");
    assert_eq!(status, 200, "{body}");

    // `vvm.toml` written again, no signal: re-read, and v1 (cached) swapped back in.
    let mark = a.mark();
    write_config(dir.path(), std::slice::from_ref(&addr), &hello(&v1));
    a.wait_for_from(mark, &["the configuration file changed"]);
    let (_, pulled) = a.wait_for_from(mark, &["service pulled", &tag("hello")]);
    assert!(
        pulled.text.contains(&v1) && pulled.text.contains("\"from_cache\":true"),
        "{}",
        pulled.text
    );
    a.wait_for_from(mark, &["service replaced", &tag("hello")]);
}

/// rust-http with a custom section: a valid component, other bytes.
fn padded_http(size: usize) -> Vec<u8> {
    let ticker = padded_ticker(size);
    let plain = std::fs::read(guests::guest("rust-ticker")).unwrap();
    let mut bytes = std::fs::read(guests::guest("rust-http")).unwrap();
    bytes.extend_from_slice(&ticker[plain.len()..]);
    bytes
}

#[test]
fn a_tampered_blob_a_tag_that_is_no_component_and_a_401_are_refused_with_the_reason() {
    let Some(registry) = Registry::start() else {
        return;
    };
    let Some(locked) = Registry::start_htpasswd() else {
        return;
    };
    let dir = testkit::host::cluster_dir();
    let addr = registry.addr();
    let good = push(
        &guests::guest("rust-http"),
        &format!("oci://{addr}/e2e/good:v1"),
        &registry,
    );
    // Its layer's bytes changed in the registry's storage: served under the old digest.
    let bad = push(
        &guests::guest("rust-command"),
        &format!("oci://{addr}/e2e/bad:v1"),
        &registry,
    );
    let layer = sha256(&std::fs::read(guests::guest("rust-command")).unwrap());
    let blob = registry.blob_path(&layer);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    // A tag naming an image (a tar layer), not a Wasm component.
    let not_wasm = push_image(&addr, "e2e/image", "v1");
    let tables = format!(
        "[service.good]\nsource = \"{good}\"\n\
         [service.bad]\nsource = \"{bad}\"\n\
         [service.image]\nsource = \"{not_wasm}\"\n\
         [service.tagged]\nsource = \"oci://{addr}/e2e/good:v1\"\n\
         [service.locked]\nsource = \"oci://{}/e2e/secret@{}\"\n",
        locked.addr(),
        // Not a digest any host here has cached (a cached one would need no request).
        sha256(b"secret")
    );
    write_config(dir.path(), &[addr.clone(), locked.addr()], &tables);
    // A bad file beside them: refused the same way.
    std::fs::write(dir.path().join("services/broken.wasm"), b"not a component").unwrap();

    // `check` says the tag is not pinned, and why each is refused.
    let out = Command::new(BIN)
        .arg("check")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    for needle in [
        "names a tag, not a digest",
        "is not a Wasm component",
        "refused access (401",
    ] {
        assert!(said.contains(needle), "{needle}: {said}");
    }

    let http = free_addr();
    let a = host("a", dir.path(), http);
    let refused = |service: &str, reason: &str| {
        let line = a.wait_for(&["service rejected", &tag(service)]);
        assert!(line.text.contains(reason), "{service}: {}", line.text);
    };
    refused("bad", "does not match its digest");
    refused("image", "is not a Wasm component");
    refused("locked", "refused access (401");
    a.wait_for(&["service running", &tag("good")]);
    a.wait_for(&["service running", &tag("tagged")]);
    a.wait_for(&["tick 2", "rust-ticker"]);
    let (status, _, body) = get(http, "/good/");
    assert_eq!(status, 200, "{body}");
    // Nothing of the refused ones is cached: only good's manifest and layer.
    let cached: Vec<String> = std::fs::read_dir(dir.path().join("cache-a/oci/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(cached.len(), 2, "{cached:?}");
    assert!(
        cached.contains(&digest(&good)["sha256:".len()..].to_owned()),
        "{cached:?}"
    );
    let base = endpoint(&a);
    metrics_until(&base, |m| {
        ["bad", "image", "locked", "broken"]
            .iter()
            .all(|s| m.get(&format!("vvm_service_rejected{{service={s}}}")) == Some(&1.0))
            && m.get("vvm_service_rejected{service=good}") == Some(&0.0)
    });

    // The sources taken out of vvm.toml: a loaded one is removed, the refused ones' series go.
    let mark = a.mark();
    let only_good = format!("[service.good]\nsource = \"{good}\"\n");
    write_config(dir.path(), &[addr.clone(), locked.addr()], &only_good);
    a.wait_for_from(mark, &["service source removed", &tag("tagged")]);
    // And the bad file taken away: its series goes too.
    std::fs::remove_file(dir.path().join("services/broken.wasm")).unwrap();
    metrics_until(&base, |m| {
        ["bad", "image", "locked", "tagged", "broken"]
            .iter()
            .all(|s| !m.contains_key(&format!("vvm_service_rejected{{service={s}}}")))
            && m.get("vvm_service_rejected{service=good}") == Some(&0.0)
    });
}

/// The SHA-256 of `bytes` as `sha256:<hex>`.
fn sha256(bytes: &[u8]) -> String {
    vvm_host::sources::sha256_digest(bytes)
}

/// Pushes a one-layer container image (not a Wasm artifact) as `repo:tag` with oci-client
/// directly, and returns its reference by tag.
fn push_image(addr: &str, repo: &str, tag: &str) -> String {
    use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = oci_client::Client::try_from(ClientConfig {
            protocol: ClientProtocol::Http,
            ..ClientConfig::default()
        })
        .unwrap();
        let reference = oci_client::Reference::with_tag(addr.into(), repo.into(), tag.into());
        let layer = ImageLayer::oci_v1(b"not a component".to_vec(), None);
        let config = Config::oci_v1(b"{}".to_vec(), None);
        client
            .push(
                &reference,
                &[layer],
                config,
                &oci_client::secrets::RegistryAuth::Anonymous,
                None,
            )
            .await
            .unwrap();
    });
    format!("oci://{addr}/{repo}:{tag}")
}

/// Docker's `config.json` in `dir/docker` giving `user:password` for `registry`, and the
/// directory to set as `DOCKER_CONFIG`.
fn docker_config(dir: &Path, registry: &str, user: &str, password: &str) -> std::path::PathBuf {
    let config = dir.join("docker");
    std::fs::create_dir_all(&config).unwrap();
    let json =
        serde_json::json!({ "auths": { registry: { "username": user, "password": password } } });
    std::fs::write(config.join("config.json"), json.to_string()).unwrap();
    config
}

#[test]
fn credentials_from_docker_config_push_and_pull_and_are_never_logged() {
    let Some(locked) = Registry::start_htpasswd() else {
        return;
    };
    let password = locked
        .password()
        .expect("the registry logs the password it made");
    let dir = testkit::host::cluster_dir();
    let addr = locked.addr();
    let good = docker_config(dir.path(), &addr, "docker", &password);
    let reference = format!("oci://{addr}/e2e/private:v1");
    let guest = guests::guest("rust-http");
    let push = |docker_config: &Path| {
        let mut push = registry::push(BIN, &guest, &reference);
        push.env("DOCKER_CONFIG", docker_config)
            .args(["--insecure-registries", &addr]);
        push
    };
    let pinned = pinned(&mut push(&good));
    // Without credentials the push is refused, and says what to do.
    let out = push(&dir.path().join("none")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("refused access (401"),
        "{stderr}"
    );

    let tables = format!("[service.private]\nsource = \"{pinned}\"\n");
    write_config(dir.path(), std::slice::from_ref(&addr), &tables);
    let http = free_addr();
    let mut command = Command::new(BIN);
    command.env("DOCKER_CONFIG", &good);
    let a = host_with(command, "a", dir.path(), http);
    a.wait_for(&["service running", &tag("private")]);
    let (status, _, body) = get(http, "/private/");
    assert_eq!(status, 200, "{body}");
    a.signal(Signal::TERM);
    // A wrong password: refused with the reason; the password is in no log line.
    let wrong = docker_config(&dir.path().join("w"), &addr, "docker", "not-the-password");
    let mut command = Command::new(BIN);
    command.env("DOCKER_CONFIG", &wrong);
    let b = host_with(command, "b", dir.path(), free_addr());
    let line = b.wait_for(&["service rejected", &tag("private")]);
    assert!(line.text.contains("refused access (401"), "{}", line.text);
    b.wait_for(&["services loaded"]);
    for host in [&a, &b] {
        for line in host.lines() {
            assert!(
                !line.text.contains(&password),
                "a password in the log: {}",
                line.text
            );
            assert!(
                !line.text.contains("not-the-password"),
                "a password in the log: {}",
                line.text
            );
        }
    }
}

/// oras-py's Python (`target/.venv-oras`, made by `run.sh test`), or `None` (said) outside CI.
fn oras_python() -> Option<std::path::PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/.venv-oras/bin/python");
    if python.is_file() {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "oras-py is not installed, and CI is set: run.sh test installs it"
    );
    eprintln!("SKIPPED: oras-py is not in target/.venv-oras (run.sh test installs it)");
    None
}

/// Pushes `file` as `repo:tag` with oras-py, in the CNCF Wasm layout's media types: the
/// pinned reference.
fn oras_push(python: &Path, file: &Path, registry: &Registry, repo_tag: &str) -> String {
    const SCRIPT: &str = r#"
import json, os, sys, oras.client
host, target, wasm = sys.argv[1], sys.argv[2], sys.argv[3]
os.chdir(os.path.dirname(wasm))
with open("config.json", "w") as f:
    json.dump({"architecture": "wasm", "os": "wasip2"}, f)
client = oras.client.OrasClient(hostname=host, insecure=True)
r = client.push(files=[os.path.basename(wasm) + ":application/wasm"], target=target,
                manifest_config="config.json:application/vnd.wasm.config.v0+json",
                disable_path_validation=True)
print(r.headers["Docker-Content-Digest"])
"#;
    let addr = registry.addr();
    let target = format!("{addr}/{repo_tag}");
    let out = Command::new(python)
        .args(["-c", SCRIPT, &addr, &target])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oras-py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    format!("oci://{target}@{digest}")
}

#[test]
fn a_component_pushed_by_oras_is_served_by_digest() {
    let Some(python) = oras_python() else {
        return;
    };
    let Some(registry) = Registry::start() else {
        return;
    };
    let dir = testkit::host::cluster_dir();
    let wasm = dir.path().join("upload/hello.wasm");
    std::fs::create_dir(wasm.parent().unwrap()).unwrap();
    std::fs::copy(guests::guest("rust-http"), &wasm).unwrap();
    let pinned = oras_push(&python, &wasm, &registry, "oras/hello:v1");
    let tables = format!("[service.hello]\nsource = \"{pinned}\"\n");
    write_config(dir.path(), &[registry.addr()], &tables);
    let http = free_addr();
    let a = host("a", dir.path(), http);
    let pulled = a.wait_for(&["service pulled", &tag("hello")]);
    assert!(pulled.text.contains(&pinned), "{}", pulled.text);
    a.wait_for(&["service running", &tag("hello")]);
    let (status, _, body) = get(http, "/hello/");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_private_registry_over_https_is_trusted_with_registry_ca_file_and_refused_without() {
    let Some(registry) = Registry::start_tls() else {
        return;
    };
    let dir = testkit::host::cluster_dir();
    let addr = registry.addr();
    let ca = registry.ca();
    let reference = format!("oci://{addr}/e2e/private:v1");
    // HTTPS by default: no insecure-registries, the CA file given.
    let guest = guests::guest("rust-http");
    let pinned = pinned(
        registry::push(BIN, &guest, &reference)
            .arg("--registry-ca-file")
            .arg(&ca),
    );
    let tables = format!("[service.private]\nsource = \"{pinned}\"\n");
    let with_ca = format!(
        "registry-ca-file = {:?}\n{tables}",
        ca.display().to_string()
    );
    std::fs::write(dir.path().join("vvm.toml"), &with_ca).unwrap();
    let http = free_addr();
    let mut a = host("a", dir.path(), http);
    a.wait_for(&["service running", &tag("private")]);
    let (status, _, body) = get(http, "/private/");
    assert_eq!(status, 200, "{body}");
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    // Without the CA: the certificate is not trusted, and the reason says so.
    std::fs::write(dir.path().join("vvm.toml"), tables).unwrap();
    let b = host("b", dir.path(), free_addr());
    let line = b.wait_for(&["service rejected", &tag("private")]);
    assert!(
        line.text.contains("TLS certificate is not trusted"),
        "{}",
        line.text
    );
    // The CA file given by a reload: the next pull trusts it.
    let mark = b.mark();
    std::fs::write(dir.path().join("vvm.toml"), with_ca).unwrap();
    b.wait_for_from(mark, &["service added", &tag("private")]);
}

/// Two hosts on etcd, each with its own (empty) services directory and cache, serving one
/// digest-pinned component: `status` shows both with the same version (the SHA-256 of the
/// component's bytes, as for a file), no difference; after the leader stops, the standby
/// serves the same digest.
#[test]
fn two_hosts_on_etcd_serve_one_pinned_digest_and_the_same_after_a_takeover() {
    let Some(etcd) = testkit::etcd::EtcdServer::start() else {
        return;
    };
    let Some(registry) = Registry::start() else {
        return;
    };
    let dir = testkit::scratch::scratch_dir();
    let addr = registry.addr();
    let file = guests::guest("rust-http");
    let pinned = push(&file, &format!("oci://{addr}/e2e/hello:v1"), &registry);
    write_config(
        dir.path(),
        std::slice::from_ref(&addr),
        &format!("[service.hello]\nsource = \"{pinned}\"\n"),
    );
    let store = format!("etcd://{}", etcd.endpoint());
    let serve = |name: &'static str, http: std::net::SocketAddr| {
        std::fs::create_dir(dir.path().join(name)).unwrap();
        let (cache, http) = (format!("cache-{name}"), http.to_string());
        let args = [
            "serve",
            "--store",
            &store,
            "--services",
            name,
            "--cache-dir",
            &cache,
            "--http-addr",
            &http,
            "--lease",
            "2s",
            "--grace-period",
            "1s",
        ];
        Host::start(BIN, name, dir.path(), &args, "info")
    };
    let (http_a, http_b) = (free_addr(), free_addr());
    let mut a = serve("a", http_a);
    a.wait_for(&["service running", &tag("hello")]);
    let b = serve("b", http_b);
    b.wait_for(&["service pulled", &tag("hello"), &pinned]);
    let version = &sha256(&std::fs::read(&file).unwrap())["sha256:".len()..][..12];
    let end = std::time::Instant::now() + testkit::host::PATIENCE;
    loop {
        let out = Command::new(BIN)
            .args(["status", "--json", "--store", &store])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let hosts = status["hosts"].as_array().cloned().unwrap_or_default();
        let versions: Vec<&serde_json::Value> =
            hosts.iter().map(|h| &h["services"]["hello"]).collect();
        if versions.len() == 2 && versions.iter().all(|v| v.as_str() == Some(version)) {
            assert_eq!(
                status["differences"].as_array().map(Vec::len),
                Some(0),
                "{status}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "never both {version}: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (status, _, body) = get(http_a, "/hello/");
    assert_eq!(status, 200, "{body}");
    a.signal(Signal::TERM);
    assert!(a.wait_exit().success());
    b.wait_for(&["leading"]);
    b.wait_for(&["service running", &tag("hello")]);
    let (status, _, body) = get(http_b, "/hello/");
    assert_eq!(status, 200, "{body}");
    assert!(
        b.lines().iter().all(|l| !l.text.contains("differ")),
        "the takeover ran other bits"
    );
}

/// A registry that takes the connection and never answers holds a pull for its read timeout
/// (30 s, three times); a host told to stop meanwhile gives the pull up and exits at once.
#[test]
fn a_host_stopped_during_a_pull_from_a_silent_registry_exits_at_once() {
    // Connections queue in the backlog, and the requests on them go unread.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let dir = testkit::host::cluster_dir();
    let tables = format!("[service.hello]\nsource = \"oci://{addr}/e2e/hello:v1\"\n");
    write_config(dir.path(), std::slice::from_ref(&addr), &tables);
    let mut a = host("a", dir.path(), free_addr());
    a.wait_for(&["loading service", "hello"]);
    a.signal(Signal::TERM);
    let exited = a.wait_exit_or(std::time::Duration::from_secs(20));
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    assert!(
        a.lines()
            .iter()
            .all(|l| !l.text.contains("service rejected"))
    );
    drop(silent);
}
