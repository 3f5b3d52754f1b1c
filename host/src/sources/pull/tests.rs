//! The pull's own checks: the artifact's shape, digests, caps, retries, the stop, the cache.

#![allow(clippy::unwrap_used)]

use super::*;

fn manifest(config: &str, layers: &[(&str, &str)]) -> Vec<u8> {
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|(media_type, digest)| {
            serde_json::json!({"mediaType": media_type, "digest": digest, "size": 3})
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": config, "digest": sha256_digest(b"{}"), "size": 2},
        "layers": layers,
    }))
    .unwrap()
}

#[test]
fn only_a_cncf_wasm_artifact_with_one_component_layer_is_taken() {
    let wasm = sha256_digest(b"abc");
    let config = oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE;
    let good = manifest(config, &[("application/wasm", &wasm)]);
    let layer = checked_manifest(&good, &sha256_digest(&good)).unwrap();
    assert_eq!(layer.digest, wasm);
    for (bad, says) in [
        (
            manifest(
                "application/vnd.oci.image.config.v1+json",
                &[("application/wasm", &wasm)],
            ),
            "its config is",
        ),
        (
            manifest(config, &[("application/vnd.oci.image.layer.v1.tar", &wasm)]),
            "its layer is",
        ),
        (manifest(config, &[]), "0 layers"),
        (
            manifest(config, &[("application/wasm", "sha512:00")]),
            "not sha256",
        ),
        (b"not json".to_vec(), "not an OCI image manifest"),
    ] {
        let err = checked_manifest(&bad, &sha256_digest(&bad)).unwrap_err();
        assert!(matches!(err, PullError::NotAComponent { .. }), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[test]
fn a_manifest_that_does_not_hash_to_its_digest_or_is_too_large_is_refused() {
    let good = manifest(oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE, &[]);
    let other = sha256_digest(b"other");
    let err = checked_manifest(&good, &other).unwrap_err();
    assert!(
        matches!(
            err,
            PullError::DigestMismatch {
                what: "manifest",
                ..
            }
        ),
        "{err}"
    );
    let huge = vec![b' '; usize::try_from(MAX_MANIFEST_BYTES).unwrap() + 1];
    let err = checked_manifest(&huge, &sha256_digest(&huge)).unwrap_err();
    assert!(
        matches!(
            err,
            PullError::TooLarge {
                what: "manifest",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn the_layer_writer_stops_at_the_cap() {
    use tokio::io::AsyncWriteExt as _;
    let mut out = Capped {
        bytes: Vec::new(),
        cap: 4,
    };
    out.write_all(b"abcd").await.unwrap();
    let err = out.write_all(b"e").await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
    assert_eq!(out.bytes, b"abcd");
}

#[test]
fn registry_answers_are_named_for_a_user_and_only_failures_that_may_pass_are_retried() {
    let r = "127.0.0.1:5000";
    let e = classify(
        r,
        OciDistributionError::UnauthorizedError { url: "u".into() },
    );
    assert!(
        matches!(e, PullError::Unauthorized { .. }) && !e.is_transient(),
        "{e}"
    );
    assert!(e.to_string().contains("docker login"), "{e}");
    let server = |code| OciDistributionError::ServerError {
        code,
        url: "u".into(),
        message: "<html>\nbusy</html>".into(),
    };
    assert!(matches!(
        classify(r, server(404)),
        PullError::NotFound { .. }
    ));
    assert!(matches!(
        classify(r, server(403)),
        PullError::Unauthorized { .. }
    ));
    let busy = classify(r, server(503));
    assert!(busy.is_transient(), "{busy}");
    assert!(!busy.to_string().contains('\n'), "{busy}");
    assert!(!classify(r, server(400)).is_transient());
    let unreachable = PullError::Unreachable {
        registry: r.into(),
        reason: "refused".into(),
    };
    assert!(unreachable.is_transient());
}

#[test]
fn a_pull_is_given_up_once_the_host_stops() {
    // A listener that accepts and never answers: the pull would wait for its timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let options = RegistryOptions {
        insecure: vec![addr.to_string()],
        ..RegistryOptions::default()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let puller = Puller::new(options, BlobCache::beside(tmp.path())).until(Arc::new(move || {
        flag.load(std::sync::atomic::Ordering::Relaxed)
    }));
    let source: SourceRef = format!("oci://{addr}/hello:v1").parse().unwrap();
    let pulling = std::thread::spawn(move || puller.pull(&source));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let err = pulling.join().unwrap().unwrap_err();
    assert!(matches!(err, PullError::Stopped), "{err}");
    drop(silent);
}

#[test]
fn an_unreachable_registry_is_tried_three_times_and_then_named() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A registry that hangs up on every connection.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    std::thread::spawn({
        let accepted = Arc::clone(&accepted);
        move || {
            for stream in listener.incoming() {
                accepted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let options = RegistryOptions {
        insecure: vec![addr.to_string()],
        ..RegistryOptions::default()
    };
    let puller = Puller::new(options, BlobCache::beside(tmp.path()));
    let source: SourceRef = format!("oci://{addr}/hello:v1").parse().unwrap();
    let err = puller.pull(&source).unwrap_err();
    assert!(matches!(err, PullError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        usize::try_from(ATTEMPTS).unwrap()
    );
}

#[test]
fn a_pinned_digest_in_the_cache_is_taken_without_a_request() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = BlobCache::beside(tmp.path());
    let wasm = cache.put(b"\0asm component").unwrap();
    let config = oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE;
    let m = cache
        .put(&manifest(config, &[("application/wasm", &wasm)]))
        .unwrap();
    // No registry listens on this address: a request would fail.
    let source: SourceRef = format!("oci://127.0.0.1:9/hello@{m}").parse().unwrap();
    let puller = Puller::new(RegistryOptions::default(), cache);
    let pulled = puller.pull(&source).unwrap();
    assert!(pulled.from_cache);
    assert_eq!(pulled.bytes, b"\0asm component");
    assert_eq!(pulled.reference, source);
}
