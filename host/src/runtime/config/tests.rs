//! Tests of the runtime's configuration (`runtime::config`): grants and limits.

#![allow(clippy::unwrap_used)]

use super::*;

fn grant(dirs: &[String], env: &[&str]) -> GrantConfig {
    GrantConfig {
        dirs: dirs.to_vec(),
        env: env.iter().map(|&e| e.to_owned()).collect(),
        ..GrantConfig::default()
    }
}

/// A grant that cannot work is refused when the settings are read, naming the service, the
/// grant and the reason, rather than failing the service's every start under the lease.
#[test]
fn a_grant_that_cannot_work_is_refused_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let missing = dir.path().join("missing");

    let good = grants(
        "s",
        &grant(&[format!("{}:/data:ro", dir.path().display())], &["A=1"]),
        OutgoingLimits::default(),
    )
    .unwrap();
    assert!(good.dirs[0].read_only);
    assert_eq!(good.env, [("A".to_owned(), "1".to_owned())]);

    let cases = [
        (grant(&[missing.display().to_string()], &[]), "No such file"),
        (grant(&[file.display().to_string()], &[]), "not a directory"),
        (grant(&[String::new()], &[]), "is not host[:guest][:ro]"),
        (grant(&[], &["=x"]), "has no NAME"),
        (grant(&[], &["NOEQUALS"]), "is not NAME=value"),
        (
            GrantConfig {
                http: vec!["example.com".into()],
                ..GrantConfig::default()
            },
            "http entry \"example.com\" has no scheme",
        ),
        (
            GrantConfig {
                http: vec!["https://example.com".into()],
                http_ca: Some(missing.clone()),
                ..GrantConfig::default()
            },
            "http-ca",
        ),
    ];
    for (grant, reason) in cases {
        let e = grants("s", &grant, OutgoingLimits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("service s") && e.contains(reason), "{e}");
    }
    let e = grants(
        "s",
        &grant(&[missing.display().to_string()], &[]),
        OutgoingLimits::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
}

/// The epoch ticks at a fiftieth of the lease, so a guest is interrupted within a tenth of
/// the margin between the deadline and the record's expiry; never faster than 1 ms, never
/// slower than 10 ms.
#[test]
fn the_epoch_ticks_at_a_fiftieth_of_the_lease_from_1_to_10_ms() {
    let ms = Duration::from_millis;
    let ticks: Vec<Duration> = [ms(20), ms(100), ms(250), ms(500), ms(1000), ms(5000)]
        .into_iter()
        .map(epoch_tick)
        .collect();
    assert_eq!(ticks, [ms(1), ms(2), ms(5), ms(10), ms(10), ms(10)]);
    for lease in [crate::config::MIN_LEASE, ms(1000), crate::config::MAX_LEASE] {
        assert!(epoch_tick(lease) * 10 <= lease / 5, "{lease:?}");
    }
}
