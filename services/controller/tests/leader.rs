//! Lease leader election on the fake API server with a manual clock: one
//! leader at a time, takeover only after expiry, release on shutdown, and
//! the controllers follow leadership.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use ic_controller::leader::LeaderElector;
use ic_controller_core::clock::{Clock, ManualClock};
use ic_fake_apiserver::FakeApi;
use k8s_openapi::api::coordination::v1::Lease;

fn elector(fake: &FakeApi, id: &str, clock: &Arc<ManualClock>) -> LeaderElector {
    let clock: Arc<dyn Clock> = clock.clone();
    LeaderElector::new(
        fake.client(),
        "sys",
        "ic-controller",
        id,
        Duration::from_secs(15),
        clock,
    )
}

fn holder(fake: &FakeApi) -> Option<String> {
    let lease: Lease = fake
        .get("coordination.k8s.io/v1", "leases", "sys", "ic-controller")
        .unwrap();
    lease.spec.unwrap().holder_identity
}

#[tokio::test]
async fn one_leader_takeover_after_expiry_and_release() {
    let fake = FakeApi::new();
    let clock = common::clock();
    let a = elector(&fake, "a", &clock);
    let b = elector(&fake, "b", &clock);

    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake).as_deref(), Some("a"));

    // a renews within the duration; b still cannot take it.
    clock.advance(Duration::from_secs(10));
    assert!(a.try_acquire_or_renew().await.unwrap());
    clock.advance(Duration::from_secs(10));
    assert!(!b.try_acquire_or_renew().await.unwrap());

    // a stops renewing: after the duration b takes over, a cannot come back.
    clock.advance(Duration::from_secs(16));
    assert!(b.try_acquire_or_renew().await.unwrap());
    assert!(!a.try_acquire_or_renew().await.unwrap());
    let lease: Lease = fake
        .get("coordination.k8s.io/v1", "leases", "sys", "ic-controller")
        .unwrap();
    assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(1));

    // Release hands over at once.
    b.release().await.unwrap();
    assert_eq!(holder(&fake), None);
    assert!(a.try_acquire_or_renew().await.unwrap());
    // Releasing a lease someone else holds is a no-op.
    b.release().await.unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("a"));
}

#[tokio::test]
async fn racing_for_an_expired_lease_elects_exactly_one() {
    for _ in 0..20 {
        let fake = FakeApi::new();
        let clock = common::clock();
        let old = elector(&fake, "old", &clock);
        assert!(old.try_acquire_or_renew().await.unwrap());
        clock.advance(Duration::from_secs(60));
        let (a, b) = (elector(&fake, "a", &clock), elector(&fake, "b", &clock));
        let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(ra ^ rb, "exactly one leader: a={ra} b={rb}");
        let expected = if ra { "a" } else { "b" };
        assert_eq!(holder(&fake).as_deref(), Some(expected));
        // And on a missing lease (create race) too.
        let fresh = FakeApi::new();
        let (a, b) = (elector(&fresh, "a", &clock), elector(&fresh, "b", &clock));
        let (ra, rb) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
        assert!(ra.unwrap() ^ rb.unwrap());
    }
}

#[tokio::test]
async fn run_publishes_leadership_and_releases_on_shutdown() {
    let fake = FakeApi::new();
    let clock = common::clock();
    let (_registry, metrics) = common::metrics();
    let a = elector(&fake, "a", &clock).with_metrics(metrics.clone());
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(a.run(Duration::from_secs(3600), tx, shutdown.clone()));
    rx.wait_for(|l| *l).await.unwrap();
    assert_eq!(metrics.leader.get(), 1);
    assert_eq!(holder(&fake).as_deref(), Some("a"));
    shutdown.cancel();
    task.await.unwrap();
    assert!(!*rx.borrow());
    assert_eq!(metrics.leader.get(), 0);
    assert_eq!(holder(&fake), None, "released on shutdown");
}
