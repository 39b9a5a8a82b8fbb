//! Small helpers over kube-rs shared by the loops.

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// Field manager of the CacheBackend reconciler (status and children).
pub const MANAGER: &str = "ic-controller";
/// Field manager of the CacheIndex poller. Distinct from [`MANAGER`] on
/// purpose: under server-side apply a manager that omits a field it owned
/// deletes it, so the reconciler (which never writes indexParticipation)
/// and the poller (which writes nothing else) must not share a manager.
pub const POLLER_MANAGER: &str = "ic-controller-index-poller";
/// Field manager of the CachePolicy pusher.
pub const POLICY_MANAGER: &str = "ic-controller-policy";
/// Field manager of the CacheTenant pusher.
pub const TENANT_MANAGER: &str = "ic-controller-tenant";

/// Server-side applies `status` onto `name`'s status subresource as `manager`.
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: &impl Serialize,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// A fixed error-reason label for a kube error.
pub fn reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(s) if s.code == 404 => "not_found",
        kube::Error::Api(s) if s.code == 409 => "conflict",
        kube::Error::Api(_) => "kube_api",
        _ => "kube_transport",
    }
}

/// Whether `error` is a 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

/// How long a pusher waits after a watch event before its pass, so a burst
/// of edits (or the status writes of its own last pass) costs one pass.
pub const CHANGE_DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Runs `pass` every `every` and shortly after each change signalled on
/// `changes` (none once its sender is gone: then on the timer only), until
/// `shutdown`. The pushers are event-driven with the timer as a resync for
/// remote state (a restarted index server); the poller runs on the timer.
pub async fn run_on_change<T, E, Fut>(
    every: std::time::Duration,
    changes: tokio::sync::watch::Receiver<u64>,
    shutdown: tokio_util::sync::CancellationToken,
    what: &'static str,
    mut pass: impl FnMut() -> Fut,
) where
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut changes = Some(changes);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = async {
            match changes.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            open = changed => {
                if !open {
                    // The watch ended (shutdown is near): the timer remains.
                    changes = None;
                    continue;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(CHANGE_DEBOUNCE) => {}
                }
                if let Some(rx) = changes.as_mut() {
                    rx.borrow_and_update();
                }
                tick.reset();
            }
        }
        if let Err(e) = pass().await {
            tracing::warn!(error = %e, pass = what, "sync pass failed");
        }
    }
}
