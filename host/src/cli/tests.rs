//! Tests of the command line: every command's help has examples, which commands log, and
//! that no setting, by flag or by file, can make the host panic or hang.

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

/// Duration texts a user might type, from sensible to absurd.
fn duration_text() -> impl Strategy<Value = String> {
    let unit = prop::sample::select(vec!["ns", "ms", "s", "m", "h", "d", "w", "y", ""]);
    prop_oneof![
        (any::<u64>(), unit.clone()).prop_map(|(n, u)| format!("{n}{u}")),
        (0u64..100_000, unit).prop_map(|(n, u)| format!("{n}{u}")),
        "[-0-9a-z. ]{0,12}",
    ]
}

/// Resolves settings from `vvm.toml` text and then from flags; returns both outcomes.
fn resolve_both(file: &str, flags: &[&str]) -> [Result<Settings, String>; 2] {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vvm.toml");
    std::fs::write(&path, file).unwrap();
    let from_file = {
        let args = ["vvm-host", "serve", "--config", path.to_str().unwrap()];
        let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else {
            unreachable!()
        };
        serve.settings().map_err(|e| e.to_string())
    };
    let from_flags = {
        let none = dir.path().join("empty.toml");
        std::fs::write(&none, "").unwrap();
        let mut args = vec!["vvm-host", "serve", "--config", none.to_str().unwrap()];
        args.extend_from_slice(flags);
        match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Command::Serve(serve),
                ..
            }) => serve.settings().map_err(|e| e.to_string()),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.to_string()),
        }
    };
    [from_file, from_flags]
}

#[test]
fn every_command_has_examples_in_its_help() {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    for (name, needles) in [
        (
            "serve",
            &["--store etcd://", "[service.ticker]", "dirs = ", "standby"][..],
        ),
        ("status", &["vvm-host status --json"][..]),
        ("check", &["vvm-host check"][..]),
        (
            "new",
            &["vvm-host new hello", "--kind http", "--kind schedule"][..],
        ),
    ] {
        let help = cli
            .find_subcommand_mut(name)
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("Examples:"), "{name}: {help}");
        for needle in needles {
            assert!(help.contains(needle), "{name} lacks {needle:?}: {help}");
        }
    }
}

#[test]
fn new_makes_a_rust_service_in_the_current_folder_by_default() {
    let parse = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
        Command::New(args) => (args.name, args.lang, args.kind, args.dir),
        other => panic!("{other:?}"),
    };
    let here = PathBuf::from(".");
    let default = parse(&["vvm-host", "new", "hello"]);
    assert_eq!(default, ("hello".into(), Lang::Rust, Kind::Service, here));
    let args = [
        "vvm-host", "new", "--lang", "js", "--kind", "http", "--dir", "p", "api",
    ];
    let given = parse(&args);
    assert_eq!(
        given,
        ("api".into(), Lang::Js, Kind::Http, PathBuf::from("p"))
    );
    let scheduled = parse(&["vvm-host", "new", "--kind", "schedule", "report"]);
    assert_eq!(
        scheduled,
        (
            "report".into(),
            Lang::Rust,
            Kind::Schedule,
            PathBuf::from(".")
        )
    );
}

#[test]
fn colour_only_on_a_terminal_without_no_color() {
    assert!(use_colour(true, None));
    assert!(
        use_colour(true, Some("".as_ref())),
        "an empty NO_COLOR is unset"
    );
    assert!(!use_colour(true, Some("1".as_ref())));
    assert!(!use_colour(false, None));
}

#[test]
fn tools_log_only_with_verbose_and_serve_always() {
    let logs = |args: &[&str]| Cli::try_parse_from(args).unwrap().command.logs();
    assert!(logs(&["vvm-host", "serve"]));
    assert!(!logs(&["vvm-host", "status"]));
    assert!(logs(&["vvm-host", "status", "-v"]));
    assert!(!logs(&["vvm-host", "check", "dir"]));
    assert!(logs(&["vvm-host", "check", "--verbose", "dir"]));
    assert!(!logs(&["vvm-host", "new", "hello"]));
}

fn within_bounds(s: &Settings) -> bool {
    (1..=config::MAX_CLUSTER_SIZE).contains(&s.cluster_size)
        && (config::MIN_LEASE..=config::MAX_LEASE).contains(&s.lease)
        && s.acquisition_timeout <= config::MAX_ACQUISITION_TIMEOUT
        && s.grace_period <= config::MAX_GRACE_PERIOD
        && (1..=config::mib_to_bytes(config::MAX_MEMORY_LIMIT_MIB)).contains(&s.memory_limit)
        && (config::MIN_HANDLE_LIMIT..=config::MAX_HANDLE_LIMIT).contains(&s.handle_limit)
        && (config::RESTART_BACKOFF_INITIAL..=config::MAX_RESTART_BACKOFF_MAX)
            .contains(&s.restart_backoff_max)
        && s.metrics_addr.is_some()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// SPEC §8: no setting can make the host panic or hang. Whatever a flag or the file
    /// says, resolving either refuses it with a message naming the setting, or gives
    /// values within every bound. (The environment goes through the same parsers as the
    /// flags, by clap; it is process-wide, so not varied in parallel tests.)
    #[test]
    fn any_setting_is_refused_by_name_or_within_bounds(
        lease in duration_text(),
        acquisition in duration_text(),
        grace in duration_text(),
        cluster in any::<u32>(),
        memory in any::<u64>(),
        handles in any::<u32>(),
        backoff in duration_text(),
        metrics_addr in prop_oneof![
            "[0-9a-z.:\\[\\] ]{0,24}",
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, port)| std::net::SocketAddr::from((ip, port)).to_string()),
        ],
    ) {
        let file = format!(
            "lease = \"{lease}\"\nacquisition-timeout = \"{acquisition}\"\n\
             grace-period = \"{grace}\"\ncluster-size = {cluster}\n\
             memory-limit-mib = {memory}\nhandle-limit = {handles}\n\
             restart-backoff-max = \"{backoff}\"\nmetrics-addr = \"{metrics_addr}\"\n"
        );
        let (cluster, memory, handles) =
            (cluster.to_string(), memory.to_string(), handles.to_string());
        let flags = [
            "--lease", &lease, "--acquisition-timeout", &acquisition,
            "--grace-period", &grace, "--cluster-size", &cluster,
            "--memory-limit-mib", &memory, "--handle-limit", &handles,
            "--restart-backoff-max", &backoff, "--metrics-addr", &metrics_addr,
        ];
        for outcome in resolve_both(&file, &flags) {
            match outcome {
                Ok(settings) => prop_assert!(within_bounds(&settings), "{settings:?}"),
                Err(message) => prop_assert!(
                    ["lease", "acquisition", "grace", "cluster", "memory", "handle", "restart-backoff-max", "duration", "metrics-addr"]
                        .iter()
                        .any(|name| message.contains(name)),
                    "{message}"
                ),
            }
        }
    }
}

#[test]
fn the_registry_clients_debug_lines_are_kept_out_of_every_log() {
    use tracing_subscriber::filter::{Directive, EnvFilter};
    let directive: Directive = NO_REGISTRY_TOKENS.parse().unwrap();
    // Over `RUST_LOG=debug`, the registry client's target is at info at most.
    let filter = EnvFilter::new("debug").add_directive(directive);
    assert_eq!(
        filter.max_level_hint(),
        Some(tracing::level_filters::LevelFilter::DEBUG)
    );
    assert!(filter.to_string().contains("oci_client=info"), "{filter}");
}
