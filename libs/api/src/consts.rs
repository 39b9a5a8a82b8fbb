//! The shared vocabulary: every annotation, label, condition type, condition
//! reason and Event reason the components exchange, in one place so the
//! webhook, the controller and the docs can never disagree on a spelling.

/// API group of every InferenceCache kind.
pub const GROUP: &str = "inferencecache.io";
/// Served version.
pub const VERSION: &str = "v1alpha1";

/// Annotations, on CacheBackends and on pods.
pub mod annotations {
    /// Pod: `<namespace>/<name>` of the CacheBackend that wired it.
    pub const INJECTED_BY: &str = "inferencecache.io/injected-by";
    /// Pod: metadata.uid of the CacheBackend that wired it.
    pub const INJECTED_BY_UID: &str = "inferencecache.io/injected-by-uid";
    /// Pod: truthy value opts the pod out of wiring.
    pub const SKIP_INJECT: &str = "inferencecache.io/skip-inject";
    /// Pod: marker the webhook stamps when it honoured skip-inject.
    pub const INJECT_SKIPPED: &str = "inferencecache.io/inject-skipped";
    /// Value of [`INJECT_SKIPPED`].
    pub const INJECT_SKIPPED_BY_ANNOTATION: &str = "skip-inject-annotation";
    /// CacheBackend: lmcache-kernel-check mode (auto, report-only, strict, off).
    pub const LMCACHE_KERNEL_CHECK: &str = "inferencecache.io/lmcache-kernel-check";
    /// Pod: the kernel-check mode the webhook admitted the pod with.
    pub const LMCACHE_KERNEL_CHECK_MODE: &str = "inferencecache.io/lmcache-kernel-check-mode";
    /// CacheBackend: "false" opts out of the KV-event readiness gate.
    pub const REQUIRE_KV_EVENTS: &str = "inferencecache.io/require-kv-events";
    /// CacheBackend: truthy skips the functional probe (ProbeBypassed).
    pub const SKIP_FUNCTIONAL_PROBE: &str = "inferencecache.io/skip-functional-probe";
    /// Engine Deployment pod template: bumped to cascade-restart engines
    /// after the cache server was replaced.
    pub const CACHE_SERVER_RESTART_TRIGGER: &str = "inferencecache.io/cache-server-restart-trigger";
}

/// Values of the `inferencecache.io/lmcache-kernel-check` annotation
/// (case-sensitive; empty means unset, i.e. auto).
pub mod kernel_check {
    /// Inject in report-only mode when the engine requests a GPU.
    pub const AUTO: &str = "auto";
    /// Always inject; failures are reported, never block.
    pub const REPORT_ONLY: &str = "report-only";
    /// Always inject; failures keep the pod in Init and downgrade Ready.
    pub const STRICT: &str = "strict";
    /// Never inject.
    pub const OFF: &str = "off";
    /// Every accepted value.
    pub const ALL: [&str; 4] = [AUTO, REPORT_ONLY, STRICT, OFF];
    /// Name of the injected kernel-check init container.
    pub const CONTAINER_NAME: &str = "lmcache-kernel-check";
    /// Key of the result line the detector writes to its termination message
    /// (`LMCACHE_KERNELS=ok` or `LMCACHE_KERNELS=failed`, the cause on the
    /// following lines).
    pub const RESULT_KEY: &str = "LMCACHE_KERNELS";
    /// Result value: the native kernels loaded.
    pub const RESULT_OK: &str = "ok";
    /// Result value: the native kernels did not load.
    pub const RESULT_FAILED: &str = "failed";
    /// Key of the optional second result line: whether the client library
    /// of the bound remote tier imports in the engine image
    /// (`LMCACHE_REMOTE=ok|failed`, the cause on the following lines).
    pub const REMOTE_KEY: &str = "LMCACHE_REMOTE";
    /// Result value: the check itself could not finish (killed at its
    /// memory limit, timed out, out of memory); the cause follows.
    pub const RESULT_INCONCLUSIVE: &str = "inconclusive";
}

/// Containers the pod webhook adds to engine pods, and the env marker that
/// identifies them (so the engine container can be told apart from ours).
pub mod injected {
    /// The kvevent-subscriber sidecar (a regular container).
    pub const SUBSCRIBER_CONTAINER: &str = "kvevent-subscriber";
    /// The subscriber's projected, audience-bound service-account token for
    /// the index server (a pod volume).
    pub const SUBSCRIBER_TOKEN_VOLUME: &str = "inferencecache-index-token";
    /// Where the subscriber reads that token (`token` inside).
    pub const SUBSCRIBER_TOKEN_DIR: &str = "/var/run/secrets/inferencecache.io/index-server";
    /// The SGLang LMCache MP worker (a native-sidecar init container).
    pub const MP_WORKER_CONTAINER: &str = "lmcache-mp-worker";
    /// Env var set on every container the webhook renders, valued with the
    /// container's name.
    pub const MARKER_ENV: &str = "INFERENCECACHE_INJECTED";
}

/// Finalizers the controller puts on objects.
pub mod finalizers {
    /// On every CacheTenant while the coordinator holds its quota and pins:
    /// removed only after they are released, so a tenant deleted while the
    /// controller is down is still released when it comes back.
    pub const TENANT_RELEASE: &str = "inferencecache.io/coordinator-release";
}

/// Labels the controller puts on what it renders.
pub mod labels {
    /// Name of the owning CacheBackend.
    pub const CACHE_BACKEND: &str = "inferencecache.io/cachebackend";
    /// Provider component (redis, lmcache-server, mooncake-master).
    pub const COMPONENT: &str = "inferencecache.io/component";
    /// Standard managed-by label.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// Value of [`MANAGED_BY`].
    pub const MANAGED_BY_VALUE: &str = "inferencecache";
    /// Standard name label.
    pub const NAME: &str = "app.kubernetes.io/name";
    /// Standard instance label.
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    /// On every pod the webhook wired (value `true`): what the chart's
    /// PodMonitor and NetworkPolicies select engine pods by.
    pub const WIRED: &str = "inferencecache.io/wired";
}

/// Condition types.
pub mod conditions {
    /// The backend serves and the cache plane is fed (per the gates).
    pub const READY: &str = "Ready";
    /// A terminal unhealthy state.
    pub const DEGRADED: &str = "Degraded";
    /// The controller is still converging.
    pub const PROGRESSING: &str = "Progressing";
    /// Outcome of the last functional probe.
    pub const FUNCTIONAL_PROBE_OK: &str = "FunctionalProbeOK";
    /// lmcache native kernels loaded on the engine pods.
    pub const ENGINE_KERNELS_HEALTHY: &str = "EngineKernelsHealthy";
    /// Tier 2 exercised but never hit.
    pub const T2_DEGRADED: &str = "T2Degraded";
    /// Injected engines crash-looping after connector injection.
    pub const ENGINE_COMPATIBILITY: &str = "EngineCompatibility";
    /// CachePolicy: this policy is the namespace's resolved policy.
    pub const ACTIVE: &str = "Active";
    /// CacheTenant: the coordinator holds the tenant's quota and pins.
    pub const SYNCED: &str = "Synced";
    /// CacheIndex: the last scrape succeeded.
    pub const AVAILABLE: &str = "Available";
}

/// Condition reasons.
pub mod reasons {
    // Ready / Progressing (managed workload).
    /// Workload available, both gates disabled.
    pub const BACKEND_READY: &str = "BackendReady";
    /// Rollout of the current generation in flight.
    pub const ROLLOUT_IN_PROGRESS: &str = "RolloutInProgress";
    /// replicas is 0.
    pub const SCALED_TO_ZERO: &str = "ScaledToZero";
    /// Rolled out but not enough replicas available.
    pub const REPLICAS_UNAVAILABLE: &str = "ReplicasUnavailable";
    /// Converged.
    pub const SYNCED: &str = "Synced";
    /// Degraded=False.
    pub const NOT_DEGRADED: &str = "NotDegraded";
    /// Host-only base Ready reason.
    pub const HOST_ONLY_ACTIVE: &str = "HostOnlyActive";
    /// Events-only base Ready reason.
    pub const EVENTS_ONLY_ACTIVE: &str = "EventsOnlyActive";
    // KV-event gate.
    /// Up, no event yet, within the window.
    pub const AWAITING_FIRST_KV_EVENT: &str = "AwaitingFirstKVEvent";
    /// At least one event ever observed.
    pub const KV_EVENTS_OBSERVED: &str = "KVEventsObserved";
    /// Window elapsed with no event.
    pub const NO_KV_EVENTS_OBSERVED: &str = "NoKVEventsObserved";
    // Functional probe.
    /// Every enabled stage round-tripped.
    pub const PROBE_OK: &str = "ProbeOK";
    /// Probe skipped by annotation.
    pub const PROBE_BYPASSED: &str = "ProbeBypassed";
    /// Ingest stage failed.
    pub const PROBE_INGEST_FAILED: &str = "ProbeIngestFailed";
    /// Routing stage failed.
    pub const PROBE_ROUTING_FAILED: &str = "ProbeRoutingFailed";
    /// Tier-2 stage failed.
    pub const PROBE_T2_FAILED: &str = "ProbeT2Failed";
    /// /probe unreachable with no prior stage failure.
    pub const PROBE_ERROR: &str = "ProbeError";
    // Engine kernels.
    /// Kernels loaded on every reporting pod.
    pub const KERNELS_HEALTHY: &str = "KernelsHealthy";
    /// A kernel check failed.
    pub const KERNEL_LOAD_FAILED: &str = "KernelLoadFailed";
    /// A check ended without a recognised result.
    pub const KERNEL_CHECK_ERROR: &str = "KernelCheckError";
    /// A check is still running.
    pub const KERNEL_CHECK_PENDING: &str = "KernelCheckPending";
    /// Strict-mode kernel failure downgrading Ready.
    pub const ENGINE_KERNEL_DEGRADED: &str = "EngineKernelDegraded";
    // Tier 2.
    /// Queried, zero reloads.
    pub const T2_ZERO_HIT_RATE: &str = "T2ZeroHitRate";
    /// Serving reloads.
    pub const T2_SERVING: &str = "T2Serving";
    // Engine compatibility.
    /// An injected engine container is in CrashLoopBackOff.
    pub const INJECTED_ENGINE_CRASH_LOOPING: &str = "InjectedEngineCrashLooping";
    /// The engine image lacks the client library of the bound remote tier
    /// (e.g. the `mooncake` package for a Mooncake binding).
    pub const REMOTE_CLIENT_MISSING: &str = "RemoteClientMissing";
    // External ownership.
    /// Endpoint present and valid for the provider.
    pub const EXTERNAL_ENDPOINT_ACCEPTED: &str = "ExternalEndpointAccepted";
    /// Endpoint empty.
    pub const EXTERNAL_ENDPOINT_MISSING: &str = "ExternalEndpointMissing";
    /// Endpoint fails the provider's shape check.
    pub const EXTERNAL_ENDPOINT_INVALID: &str = "ExternalEndpointInvalid";
    /// The (runtime, type) pair has no installed adapter (stored before
    /// admission rejected it); nothing is reconciled.
    pub const UNSUPPORTED_RUNTIME_CACHE_PAIR: &str = "UnsupportedRuntimeCachePair";
    /// The provider objects of the current spec could not be rendered, or
    /// the API server refused them (a policy webhook, a quota, an invalid
    /// field); what the last good spec made keeps running.
    pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
    // CachePolicy.
    /// Resolved policy of its namespace.
    pub const POLICY_ACTIVE: &str = "PolicyActive";
    /// An older CachePolicy in the namespace wins.
    pub const SUPERSEDED: &str = "Superseded";
    // CacheTenant / CacheIndex.
    /// Pushed to the coordinator / scraped from the index server.
    pub const PUSHED: &str = "Pushed";
    /// The remote service could not be reached or refused the request.
    pub const REMOTE_ERROR: &str = "RemoteError";
}

/// Kubernetes Event reasons.
pub mod events {
    /// Warning: Degraded=True with ReplicasUnavailable.
    pub const BACKEND_DEGRADED: &str = "BackendDegraded";
    /// Normal: back to Ready=True.
    pub const BACKEND_RECOVERED: &str = "BackendRecovered";
    /// Warning: failOpen set to false.
    pub const FAIL_CLOSED_ENABLED: &str = "FailClosedEnabled";
    /// Normal: failOpen back to true.
    pub const FAIL_OPEN_RESTORED: &str = "FailOpenRestored";
    /// Normal: up and waiting for the first KV event.
    pub const AWAITING_FIRST_KV_EVENT: &str = "AwaitingFirstKVEvent";
    /// Normal: first KV event observed.
    pub const KV_EVENTS_OBSERVED: &str = "KVEventsObserved";
    /// Warning: first-event window elapsed.
    pub const NO_KV_EVENTS_OBSERVED: &str = "NoKVEventsObserved";
    /// Normal: selector matches no pod while pods are expected.
    pub const ENGINE_SELECTOR_UNMATCHED: &str = "EngineSelectorUnmatched";
    /// Warning: an injected engine is crash-looping.
    pub const INJECTED_ENGINE_CRASH_LOOPING: &str = "InjectedEngineCrashLooping";
    /// Warning: the provider objects could not be rendered or applied.
    pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
    /// Normal, on the pod: wired by a CacheBackend (UID verified).
    pub const INJECTED_BY_CACHE_BACKEND: &str = "InjectedByCacheBackend";
    /// Normal, on the pod: opted out with skip-inject.
    pub const SKIPPED_BY_OPERATOR: &str = "SkippedByOperator";
}

/// The boolean-parse set used for truthy annotation values.
pub fn is_truthy(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthy_set_is_exact() {
        for v in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(is_truthy(v), "{v}");
        }
        for v in ["", "yes", "on", "tRuE", " true", "0", "false"] {
            assert!(!is_truthy(v), "{v}");
        }
    }

    #[test]
    fn annotations_share_the_group_prefix() {
        for a in [
            annotations::INJECTED_BY,
            annotations::INJECTED_BY_UID,
            annotations::SKIP_INJECT,
            annotations::INJECT_SKIPPED,
            annotations::LMCACHE_KERNEL_CHECK,
            annotations::LMCACHE_KERNEL_CHECK_MODE,
            annotations::REQUIRE_KV_EVENTS,
            annotations::SKIP_FUNCTIONAL_PROBE,
            annotations::CACHE_SERVER_RESTART_TRIGGER,
        ] {
            assert!(a.starts_with(&format!("{GROUP}/")), "{a}");
        }
    }
}
