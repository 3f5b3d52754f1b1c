//! Placement (SPEC §6 "Placement"): which host runs which service.
//!
//! - [`Placement::Together`] (the default, a setting of [`crate::config`]): a leader on slot k runs every service
//!   ([`crate::vvm`]).
//! - [`Placement::Spread`]: each service is a claim of its own, and the hosts of a group
//!   share the services out between them ([`spread`]).

pub mod spread;

pub use spread::{Spread, SpreadConfig};

use crate::config::Placement;
use crate::store::Store;

/// A host would join a group whose hosts place services the other way.
#[derive(Debug, thiserror::Error)]
#[error(
    "placement {wanted}: the store is in use by hosts with placement {live} ({key} is live); \
     every host of a group must use the same placement"
)]
pub struct MixedPlacement {
    /// This host's placement.
    pub wanted: Placement,
    /// The placement the live record belongs to.
    pub live: Placement,
    /// The live record found.
    pub key: String,
}

/// Refuses to serve with `placement` on a store whose live records belong to the other
/// placement: hosts of both kinds on one store would each run the services, unaware of the
/// others' leases. A store that cannot be read is let through (logged): the check is at start
/// only, and the campaign handles a failing store anyway.
///
/// # Errors
/// [`MixedPlacement`], naming a live record of the other placement.
pub async fn refuse_mixed(store: &dyn Store, placement: Placement) -> Result<(), MixedPlacement> {
    let (live, prefix) = match placement {
        Placement::Together => (Placement::Spread, crate::keys::MEMBER_PREFIX),
        Placement::Spread => (Placement::Together, crate::keys::SLOT_PREFIX),
    };
    match store.list(prefix).await {
        Ok(records) => match records.into_iter().next() {
            Some((key, _)) => Err(MixedPlacement {
                wanted: placement,
                live,
                key,
            }),
            None => Ok(()),
        },
        Err(e) => {
            tracing::warn!(error = %e, "could not check the placement of the other hosts");
            Ok(())
        }
    }
}

/// How many services the member `me` should run: `services` split over `members` (holder,
/// services it holds now) so that the counts differ by at most one. The largest share is
/// ceil(services / members); the members holding most now get the larger shares, so reaching
/// rest moves as few services as possible (ties by holder, so every host computes the same).
/// `me` counts as a member even if its record is missing from `members`.
///
/// The issue asks for "up to ceil(services / members)" alone; that leaves 3/3/1 of 7 services
/// on 3 hosts at rest (nobody is above the ceiling, and nothing is free). Exact shares do not.
pub fn fair_share(services: usize, members: &[(String, usize)], me: &str) -> usize {
    let mut ranked: Vec<(&str, usize)> = members.iter().map(|(h, n)| (h.as_str(), *n)).collect();
    if !ranked.iter().any(|(h, _)| *h == me) {
        ranked.push((me, 0));
    }
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    ranked.dedup_by(|a, b| a.0 == b.0);
    let n = ranked.len();
    let (base, extra) = (services / n, services % n);
    let rank = ranked.iter().position(|(h, _)| *h == me).unwrap_or(n);
    base + usize::from(rank < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_host_refuses_a_store_in_use_by_the_other_placement() {
        use crate::store::{MemStore, TtlStore};
        let clock = crate::clock::ManualClock::default();
        let store = MemStore::new(std::sync::Arc::new(clock));
        let l = std::time::Duration::from_secs(20);
        assert!(refuse_mixed(&store, Placement::Together).await.is_ok());
        assert!(refuse_mixed(&store, Placement::Spread).await.is_ok());
        store.insert_if_absent("member/h1", "h1", l).await.unwrap();
        let e = refuse_mixed(&store, Placement::Together).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "placement together: the store is in use by hosts with placement spread \
             (member/h1 is live); every host of a group must use the same placement"
        );
        assert!(refuse_mixed(&store, Placement::Spread).await.is_ok());
        store.insert_if_absent("slot/1", "h2", l).await.unwrap();
        let e = refuse_mixed(&store, Placement::Spread).await.unwrap_err();
        assert_eq!((e.live, e.key.as_str()), (Placement::Together, "slot/1"));
    }

    fn members(list: &[(&str, usize)]) -> Vec<(String, usize)> {
        list.iter().map(|(h, n)| ((*h).to_owned(), *n)).collect()
    }

    fn shares(services: usize, list: &[(&str, usize)]) -> Vec<usize> {
        let m = members(list);
        list.iter()
            .map(|(h, _)| fair_share(services, &m, h))
            .collect()
    }

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for services in 0..20 {
            for hosts in 1..6 {
                let list: Vec<(String, usize)> =
                    (0..hosts).map(|i| (format!("h{i}"), (i * 7) % 4)).collect();
                let shares: Vec<usize> = list
                    .iter()
                    .map(|(h, _)| fair_share(services, &list, h))
                    .collect();
                assert_eq!(shares.iter().sum::<usize>(), services, "{list:?}");
                let (min, max) = (shares.iter().min(), shares.iter().max());
                assert!(max.unwrap() - min.unwrap() <= 1, "{shares:?}");
                assert_eq!(*max.unwrap(), services.div_ceil(hosts), "the ceiling");
            }
        }
    }

    #[test]
    fn seven_services_on_three_hosts_then_four() {
        assert_eq!(shares(7, &[("a", 0), ("b", 0), ("c", 0)]), [3, 2, 2]);
        // Whoever holds most keeps the larger share: 3/3/1 settles as 3/2/2 with one move.
        assert_eq!(shares(7, &[("a", 1), ("b", 3), ("c", 3)]), [2, 3, 2]);
        assert_eq!(
            shares(7, &[("a", 3), ("b", 2), ("c", 2), ("d", 0)]),
            [2, 2, 2, 1]
        );
    }

    #[test]
    fn a_host_without_its_record_still_counts_itself() {
        let m = members(&[("a", 2), ("b", 2)]);
        assert_eq!(fair_share(6, &m, "c"), 2);
        assert_eq!(fair_share(3, &[], "c"), 3, "alone");
        assert_eq!(fair_share(0, &m, "a"), 0);
    }
}
