//! The settings: parsing, resolution and bounds.

use super::*;

pub(super) fn parse(text: &str) -> Result<FileConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vvm.toml");
    std::fs::write(&path, text).unwrap();
    FileConfig::load(&path, true)
}

#[test]
fn the_crash_lock_directory_is_beside_a_redb_store_and_off_for_etcd_unless_set() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vvm.toml");
    std::fs::write(&file, "").unwrap();
    let resolve = |store: &str, lock_dir: Option<&str>| {
        let flags = FileConfig {
            store: Some(store.into()),
            lock_dir: lock_dir.map(PathBuf::from),
            ..FileConfig::default()
        };
        Settings::resolve(flags, Some(&file)).unwrap().lock_dir
    };
    assert_eq!(
        resolve("/srv/vvm.redb", None),
        Some(PathBuf::from("/srv/vvm.redb.holders"))
    );
    assert_eq!(resolve("etcd://127.0.0.1:2379", None), None);
    assert_eq!(
        resolve("etcd://127.0.0.1:2379", Some("/run/vvm")),
        Some(PathBuf::from("/run/vvm"))
    );
    std::fs::write(&file, "lock-dir = \"/run/vvm-file\"\n").unwrap();
    assert_eq!(
        resolve("etcd://127.0.0.1:2379", None),
        Some(PathBuf::from("/run/vvm-file"))
    );
}

#[test]
fn full_file_parses() {
    let cfg = parse(
        r#"
services = "svc"
store = "etcd://127.0.0.1:2379"
cluster-size = 3
lease = "2s"
acquisition-timeout = "1m"
grace-period = "500ms"
memory-limit-mib = 32
metrics-addr = "127.0.0.1:9464"
[service.ticker]
env = ["A=1"]
"#,
    )
    .unwrap();
    assert_eq!(cfg.cluster_size, Some(3));
    assert_eq!(cfg.lease, Some(Duration::from_secs(2)));
    assert_eq!(cfg.acquisition_timeout, Some(Duration::from_mins(1)));
    assert_eq!(cfg.grace_period, Some(Duration::from_millis(500)));
    assert_eq!(cfg.service["ticker"].env, ["A=1"]);
    assert_eq!(cfg.metrics_addr, Some(([127, 0, 0, 1], 9464).into()));
    let err = parse("metrics-addr = \"localhost\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("metrics-addr \"localhost\" is not"), "{err}");
}

#[test]
fn unknown_key_is_named() {
    let err = parse("leese = \"2s\"").unwrap_err().to_string();
    assert!(err.contains("unknown field `leese`"), "{err}");
    assert!(err.contains("vvm.toml"), "{err}");
}

#[test]
fn negative_and_zero_durations_are_rejected() {
    let err = parse("lease = \"-5s\"").unwrap_err().to_string();
    assert!(err.contains("negative"), "{err}");
    assert!(parse_duration("0s").unwrap_err().contains("zero"));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn missing_default_file_is_empty_but_missing_explicit_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    assert!(FileConfig::load(&path, false).unwrap().store.is_none());
    let err = FileConfig::load(&path, true).unwrap_err().to_string();
    assert!(err.contains("absent.toml"), "{err}");
}

#[test]
fn placement_names_parse_from_the_file() {
    #[derive(serde::Deserialize)]
    struct File {
        placement: Placement,
    }
    let f: File = toml::from_str("placement = \"spread\"").unwrap();
    assert_eq!(f.placement, Placement::Spread);
    assert!(toml::from_str::<File>("placement = \"apart\"").is_err());
    assert_eq!(Placement::default().to_string(), "together");
}

fn bounded(lease: Duration) -> Bounded {
    Bounded {
        cluster_size: 1,
        lease,
        acquisition_timeout: DEFAULT_ACQUISITION_TIMEOUT,
        grace_period: DEFAULT_GRACE_PERIOD,
        memory_limit_mib: DEFAULT_MEMORY_LIMIT_MIB,
        handle_limit: DEFAULT_HANDLE_LIMIT,
        restart_backoff_max: DEFAULT_RESTART_BACKOFF_MAX,
    }
}

#[test]
fn relations_and_bounds_are_checked() {
    let ok = bounded(DEFAULT_LEASE);
    assert!(validate(&ok).is_ok());
    assert!(validate(&bounded(Duration::from_millis(10))).is_err());
    let cases = [
        (
            "cluster-size",
            Bounded {
                cluster_size: 0,
                ..ok
            },
        ),
        (
            "cluster-size",
            Bounded {
                cluster_size: MAX_CLUSTER_SIZE + 1,
                ..ok
            },
        ),
        ("lease", bounded(MAX_LEASE + Duration::from_secs(1))),
        (
            "acquisition-timeout",
            Bounded {
                acquisition_timeout: Duration::MAX,
                ..ok
            },
        ),
        (
            "grace-period",
            Bounded {
                grace_period: Duration::MAX,
                ..ok
            },
        ),
    ];
    for (name, v) in cases {
        let err = validate(&v).unwrap_err().to_string();
        assert!(err.contains(name), "{v:?}: {err}");
    }
}

/// The bounds of the sizes and the restart backoff, each refused by its name.
#[test]
fn size_and_backoff_bounds_are_checked() {
    let ok = bounded(DEFAULT_LEASE);
    let cases = [
        (
            "memory-limit-mib",
            Bounded {
                memory_limit_mib: 0,
                ..ok
            },
        ),
        (
            "memory-limit-mib",
            Bounded {
                memory_limit_mib: u64::MAX,
                ..ok
            },
        ),
        (
            "handle-limit",
            Bounded {
                handle_limit: MIN_HANDLE_LIMIT - 1,
                ..ok
            },
        ),
        (
            "handle-limit",
            Bounded {
                handle_limit: MAX_HANDLE_LIMIT + 1,
                ..ok
            },
        ),
        (
            "restart-backoff-max",
            Bounded {
                restart_backoff_max: Duration::from_millis(99),
                ..ok
            },
        ),
        (
            "restart-backoff-max",
            Bounded {
                restart_backoff_max: Duration::MAX,
                ..ok
            },
        ),
    ];
    for (name, v) in cases {
        let err = validate(&v).unwrap_err().to_string();
        assert!(err.contains(name), "{v:?}: {err}");
    }
}

/// `[kv]`, `[service.NAME.kv]`, `kv-buckets` and `[service.NAME.config]` parse, and each bad
/// value is refused naming the service, the setting and why.
#[test]
fn key_value_and_config_settings_parse_and_are_bounded() {
    let file = parse(
        r#"
[kv]
max-keys = 50000

[service.orders]
kv-buckets = ["shared", "audit.log"]
[service.orders.kv]
max-value-bytes = 4096
writes-per-second = 10
[service.orders.config]
greeting = "hello"
port = 8080
debug = true
token = { env = "ORDERS_TOKEN" }
key = { file = "/run/credentials/orders/key" }
"#,
    )
    .unwrap();
    assert_eq!(file.kv.unwrap().max_keys, Some(50_000));
    let orders = &file.service["orders"];
    assert_eq!(orders.kv_buckets, ["shared", "audit.log"]);
    assert_eq!(orders.kv.max_value_bytes, Some(4096));
    assert_eq!(orders.kv.writes_per_second, Some(10));
    let config = &orders.config;
    assert_eq!(config["greeting"], ConfigValue::Plain("hello".into()));
    assert_eq!(config["port"], ConfigValue::Plain("8080".into()));
    assert_eq!(config["debug"], ConfigValue::Plain("true".into()));
    assert_eq!(config["token"], ConfigValue::Env("ORDERS_TOKEN".into()));
    assert_eq!(
        config["key"],
        ConfigValue::File("/run/credentials/orders/key".into())
    );

    for (text, reason) in [
        ("[kv]\nmax-keys = 0\n", "max-keys"),
        ("[kv]\nmax-value-bytes = 1073741824\n", "max-value-bytes"),
        ("[service.s.kv]\nmax-key-bytes = 100000\n", "service s"),
        ("[service.s]\nkv-buckets = [\"default\"]\n", "own namespace"),
        ("[service.s]\nkv-buckets = [\"a/b\"]\n", "letters, digits"),
        ("[service.s.config]\nk = { nope = \"x\" }\n", "env"),
        ("[service.s.config]\nk = [1, 2]\n", "k"),
        ("[service.s.config]\n\"\" = \"x\"\n", "is empty"),
    ] {
        let e = parse(text)
            .and_then(|f| {
                bounds::check_services(&f.service)?;
                if let Some(kv) = &f.kv {
                    bounds::check_kv_limits("kv", "", kv)?;
                }
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains(reason), "{text}: {e}");
    }
}

/// Incoming HTTP is off by default; `http-addr` (the flag over the file), a service's `route`
/// and `[incoming-http]` are read, and a value that cannot work is refused naming its setting.
#[test]
fn incoming_http_settings_are_read_and_bad_values_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vvm.toml");
    let resolve = |text: &str, flag: Option<&str>| {
        std::fs::write(&file, text).unwrap();
        let flags = FileConfig {
            http_addr: flag.map(|a| parse_http_addr(a).unwrap()),
            ..FileConfig::default()
        };
        Settings::resolve(flags, Some(&file))
    };
    let off = resolve("", None).unwrap();
    assert_eq!(off.http_addr, None);
    assert_eq!(off.incoming_http, IncomingHttpConfig::default());
    let on = resolve(
        "http-addr = \"0.0.0.0:8080\"\n[incoming-http]\nmax-concurrent = 10\n\
         request-timeout = \"5s\"\n[service.api]\nroute = \"/api/...\"\n",
        None,
    )
    .unwrap();
    assert_eq!(on.http_addr, Some("0.0.0.0:8080".parse().unwrap()));
    assert_eq!(on.incoming_http.max_concurrent, Some(10));
    assert_eq!(
        on.incoming_http.request_timeout,
        Some(Duration::from_secs(5))
    );
    assert_eq!(on.grants["api"].route.as_deref(), Some("/api/..."));
    let limits = resolve(
        "[incoming-http]\nmax-body-bytes = 1000\nmax-header-bytes = 16384\n\
         idle-timeout = \"2s\"\n",
        None,
    )
    .unwrap()
    .incoming_http;
    assert_eq!(
        (
            limits.max_body_bytes,
            limits.max_header_bytes,
            limits.idle_timeout
        ),
        (Some(1000), Some(16384), Some(Duration::from_secs(2)))
    );
    // Two services with one route (a table without `route` has `/NAME/...`).
    for (text, names) in [
        (
            "[service.a]\nroute = \"/x/...\"\n[service.b]\nroute = \"/x/...\"\n",
            "service b: route \"/x/...\" is already service a's",
        ),
        (
            "[service.a]\nroute = \"/b/...\"\n[service.b]\nenv = []\n",
            "service b: route \"/b/...\" is already service a's",
        ),
    ] {
        let e = resolve(text, None).unwrap_err().to_string();
        assert!(e.contains(names), "{text}: {e}");
    }
    resolve(
        "[service.a]\nroute = \"/x\"\n[service.b]\nroute = \"/x/...\"\n",
        None,
    )
    .unwrap();
    let flag = resolve("http-addr = \"0.0.0.0:8080\"\n", Some("127.0.0.1:9000")).unwrap();
    assert_eq!(flag.http_addr, Some("127.0.0.1:9000".parse().unwrap()));

    let e = resolve("http-addr = \"8080\"\n", None).unwrap_err();
    assert!(e.to_string().contains("http-addr \"8080\""), "{e}");
    let e = resolve("[service.api]\nroute = \"api\"\n", None).unwrap_err();
    assert!(
        e.to_string().contains("service.*.route: service api"),
        "{e}"
    );
    for bad in [
        "max-concurrent = 0",
        "max-concurrent = 100001",
        "request-timeout = \"2h\"",
        "idle-timeout = \"2h\"",
        "max-body-bytes = 0",
        "max-header-bytes = 1024",
        "max-header-bytes = 2000000",
    ] {
        let e = resolve(&format!("[incoming-http]\n{bad}\n"), None).unwrap_err();
        assert!(
            e.to_string().starts_with("setting incoming-http:"),
            "{bad}: {e}"
        );
    }
    assert!(parse_http_addr("localhost:80").is_err());
}

#[test]
fn a_registry_source_and_the_registry_settings_are_read_and_a_bad_one_names_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vvm.toml");
    let digest = format!("sha256:{}", "ab".repeat(32));
    std::fs::write(
        &file,
        format!(
            "insecure-registries = [\"127.0.0.1:5000\"]\nregistry-ca-file = \"/etc/ca.pem\"\n\
             pull-timeout = \"30s\"\n[service.hello]\nsource = \"oci://127.0.0.1:5000/hello@{digest}\"\n"
        ),
    )
    .unwrap();
    let settings = Settings::resolve(FileConfig::default(), Some(&file)).unwrap();
    let source = settings.grants["hello"].source.as_ref().unwrap();
    assert_eq!(source.digest.as_deref(), Some(digest.as_str()));
    assert_eq!(settings.registry.insecure, ["127.0.0.1:5000"]);
    assert_eq!(
        settings.registry.ca_file,
        Some(PathBuf::from("/etc/ca.pem"))
    );
    assert_eq!(settings.registry.timeout, Duration::from_secs(30));
    // Flags win over the file.
    let flags = FileConfig {
        insecure_registries: Some(vec!["reg:5000".into()]),
        ..FileConfig::default()
    };
    let settings = Settings::resolve(flags, Some(&file)).unwrap();
    assert_eq!(settings.registry.insecure, ["reg:5000"]);

    let err = parse("[service.hello]\nsource = \"ghcr.io/acme/hello:v1\"\n").unwrap_err();
    assert!(err.to_string().contains("oci://"), "{err}");
    std::fs::write(
        &file,
        format!("[service.\"a/b\"]\nsource = \"oci://ghcr.io/a/b@{digest}\"\n"),
    )
    .unwrap();
    let err = Settings::resolve(FileConfig::default(), Some(&file)).unwrap_err();
    assert!(
        err.to_string().contains("a name a file could have"),
        "{err}"
    );
}

/// The advertised address is `advertise-addr`, else a concrete `http-addr`; a wildcard or port
/// 0 is no address to reach a host at, and is refused as `advertise-addr` by name.
#[test]
fn the_advertised_address_defaults_to_a_concrete_http_addr_only() {
    let addr = |s: &str| Some(s.parse::<std::net::SocketAddr>().unwrap());
    assert_eq!(
        advertised(None, addr("10.0.0.7:8080")),
        addr("10.0.0.7:8080")
    );
    assert_eq!(advertised(None, addr("0.0.0.0:8080")), None);
    assert_eq!(advertised(None, addr("127.0.0.1:0")), None);
    assert_eq!(
        advertised(addr("10.0.0.7:80"), addr("0.0.0.0:8080")),
        addr("10.0.0.7:80")
    );
    for bad in ["0.0.0.0:8080", "[::]:8080", "10.0.0.7:0", "host:80"] {
        let e = parse_advertise_addr(bad).unwrap_err();
        assert!(e.starts_with("advertise-addr "), "{e}");
    }
}
