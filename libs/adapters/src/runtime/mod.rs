//! Runtime adapters: how one (runtime, cache type) pair wires an engine pod.
//!
//! An adapter declares the args/env it reserves, the bindings it accepts,
//! and injects its engine-container config and any pod-level pieces
//! (sidecars, volumes). Admission ([`crate::admission`]) drives the
//! sequence: check the original pod, inject the engine container, apply
//! engineOverrides against the before/after diff, then the pod-level parts.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, Pod, PodSpec, SeccompProfile, SecurityContext,
};

use ic_api::CacheBackend;
use ic_api::cachebackend::{CacheType, IntegrationRole, LmCacheSpec, Runtime};

use crate::binding::{Binding, Protocol};
use crate::quantity;

pub mod sglang_hicache;
pub mod sglang_lmcache;
pub mod vllm_lmcache;

/// Env var marking a container the webhook rendered, valued with its
/// component name. It is how re-admission tells our own prior injection
/// (converge) from an operator's container squatting the name (reject).
pub const SIDECAR_MARKER_ENV: &str = ic_api::consts::injected::MARKER_ENV;

/// The fail-open mirror env every LMCache adapter injects.
pub const FAIL_OPEN_ENV: &str = "INFERENCECACHE_FAIL_OPEN";

// === SGLang flags both SGLang adapters read ===
// (LMCache MP and HiCache are exclusive: each refuses the other's switch.)

/// SGLang's LMCache switch.
pub const ENABLE_LMCACHE: &str = "--enable-lmcache";
/// SGLang's LMCache config-file flag.
pub const LMCACHE_CONFIG_FILE: &str = "--lmcache-config-file";
/// Prometheus `/metrics` on the serving port: off by default in SGLang, and
/// the subscriber reads the KV cache size and load from it.
pub const ENABLE_METRICS: &str = "--enable-metrics";
/// SGLang's HiCache switch.
pub const ENABLE_HICACHE: &str = "--enable-hierarchical-cache";

/// Defaults of the typed LMCache settings.
pub const DEFAULT_CHUNK_SIZE: i32 = 256;
/// Default host-memory budget, GiB.
pub const DEFAULT_HOST_MEMORY_GIB: i64 = 4;
/// Default loopback port of the SGLang MP worker.
pub const DEFAULT_WORKER_PORT: i32 = 5555;

/// What an adapter sees while injecting.
#[derive(Clone, Copy, Debug)]
pub struct InjectContext<'a> {
    /// The selected backend.
    pub backend: &'a CacheBackend,
    /// The resolved binding (`None` = host-only).
    pub binding: Option<&'a Binding>,
}

impl InjectContext<'_> {
    /// Effective role.
    pub fn role(&self) -> IntegrationRole {
        self.backend
            .spec
            .integration
            .as_ref()
            .map_or(IntegrationRole::ReadWrite, |i| i.role)
    }

    /// Effective failOpen.
    pub fn fail_open(&self) -> bool {
        self.backend.spec.fail_open()
    }

    /// Typed LMCache settings (absent = all defaults).
    pub fn lm_cache(&self) -> LmCacheSpec {
        self.backend.spec.lm_cache.clone().unwrap_or(LmCacheSpec {
            chunk_size_tokens: None,
            host_memory: None,
            worker_port: None,
            worker_image: None,
            remote_serde: None,
        })
    }

    /// Chunk size in tokens.
    pub fn chunk_size(&self) -> i32 {
        self.lm_cache()
            .chunk_size_tokens
            .filter(|c| *c >= 1)
            .unwrap_or(DEFAULT_CHUNK_SIZE)
    }

    /// Host-memory budget in whole GiB (rounded down, at least 1).
    pub fn host_memory_gib(&self) -> i64 {
        let gib = quantity::ParsedQuantity::from_units(1 << 30);
        self.lm_cache()
            .host_memory
            .and_then(|h| h.capacity)
            .and_then(|q| quantity::parse(&q.0).ok())
            .filter(|q| q.is_positive())
            .map_or(DEFAULT_HOST_MEMORY_GIB, |q| {
                let whole = q.nanos() / gib.nanos();
                i64::try_from(whole).unwrap_or(i64::MAX).max(1)
            })
    }

    /// Loopback port of the SGLang MP worker.
    pub fn worker_port(&self) -> i32 {
        self.lm_cache()
            .worker_port
            .filter(|p| (1..=65535).contains(p))
            .unwrap_or(DEFAULT_WORKER_PORT)
    }
}

/// A runtime adapter for one (runtime, cache type) pair.
pub trait RuntimeAdapter: std::fmt::Debug + Sync {
    /// Stable identifier, e.g. `vllm-lmcache`.
    fn id(&self) -> &'static str;
    /// Human name used in messages, e.g. `vLLM+LMCache`.
    fn display_name(&self) -> &'static str;
    /// The pair served.
    fn pair(&self) -> (Runtime, CacheType);
    /// Leading flags engineOverrides may not override or suppress.
    fn reserved_args(&self) -> &'static [&'static str];
    /// Env names engineOverrides may not override or suppress under a
    /// binding of `protocol` (`None` = host-only): exactly the names the
    /// adapter injects for it and the engine reads.
    fn reserved_env(&self, protocol: Option<Protocol>) -> Vec<&'static str>;
    /// Whether the engine wire accepts `protocol` (`None` = host-only).
    fn supports_binding(&self, protocol: Option<Protocol>) -> bool;
    /// `--hash-scheme` of the injected subscriber.
    fn hash_scheme(&self) -> &'static str;
    /// Serving port when the engine container declares none.
    fn default_engine_port(&self) -> i32;
    /// Whether the Offload wiring keeps evicted blocks in a lower tier, so
    /// the subscriber re-reports BlockRemoved at T2.
    fn retains_evicted_blocks(&self) -> bool {
        true
    }
    /// Whether the engine, as injected, serves Prometheus `/metrics` on its
    /// serving port for the subscriber to scrape (tier-2 hits, load, cache
    /// size).
    fn exports_engine_metrics(&self) -> bool {
        false
    }
    /// Whether the engine serves `/metrics` with `args` as the user wrote
    /// them (EventsOnly pods, whose engine is not touched).
    fn serves_metrics_as_written(&self, args: &[String]) -> bool {
        let _ = args;
        false
    }
    /// Whether this adapter provides the lmcache-kernel-check init container.
    fn provides_kernel_check(&self) -> bool {
        false
    }
    /// Refuses a pod before anything is mutated (reserved-name squatting,
    /// conflicting flags). `engine` indexes `spec.containers`.
    fn check_pod(&self, ctx: &InjectContext<'_>, pod: &Pod, engine: usize) -> Result<(), String> {
        let _ = (ctx, pod, engine);
        Ok(())
    }
    /// Injects the engine container's args/env (only those: engineOverrides
    /// are applied to the diff of this step).
    fn inject_engine_config(
        &self,
        ctx: &InjectContext<'_>,
        engine: &mut Container,
    ) -> Result<(), String>;
    /// Pod-level wiring besides engine args/env (sidecars, volumes, mounts).
    fn inject_pod(
        &self,
        ctx: &InjectContext<'_>,
        spec: &mut PodSpec,
        engine: usize,
    ) -> Result<(), String> {
        let _ = (ctx, spec, engine);
        Ok(())
    }
}

/// Whether `container` carries our marker for `component`.
pub fn is_ours(container: &Container, component: &str) -> bool {
    container.env.as_deref().is_some_and(|env| {
        env.iter()
            .any(|e| e.name == SIDECAR_MARKER_ENV && e.value.as_deref() == Some(component))
    })
}

/// The marker env entry for `component`.
pub fn marker(component: &str) -> EnvVar {
    crate::merge::env(SIDECAR_MARKER_ENV, component)
}

/// The security context of a container we add in the engine's image (the
/// kernel check, the SGLang MP worker): no privilege escalation, no
/// capabilities but those the engine itself adds (`keep_engine_caps`, for a
/// worker that does the engine's memory work), the engine's seccomp profile
/// or RuntimeDefault, and the engine's user, since the image's files are
/// laid out for it. It passes the restricted level whenever the engine
/// container does.
pub fn engine_image_security_context(
    engine: &Container,
    keep_engine_caps: bool,
) -> SecurityContext {
    let theirs = engine.security_context.clone().unwrap_or_default();
    let added = theirs
        .capabilities
        .as_ref()
        .and_then(|c| c.add.clone())
        .filter(|a| keep_engine_caps && !a.is_empty());
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: added,
            drop: Some(vec!["ALL".to_owned()]),
        }),
        run_as_non_root: theirs.run_as_non_root,
        run_as_user: theirs.run_as_user,
        run_as_group: theirs.run_as_group,
        seccomp_profile: Some(theirs.seccomp_profile.unwrap_or(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        })),
        ..SecurityContext::default()
    }
}

/// The canonical engine-container name of a runtime in multi-container pods.
pub fn engine_container_name(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Vllm => "vllm",
        Runtime::SGLang => "sglang",
    }
}

/// Whether `container` is one the webhook injected: it carries the
/// [`SIDECAR_MARKER_ENV`] marker, whatever its value.
pub fn is_injected(container: &Container) -> bool {
    container
        .env
        .as_deref()
        .is_some_and(|env| env.iter().any(|e| e.name == SIDECAR_MARKER_ENV))
}

/// The engine-container rule shared by the webhook and the controller:
/// among `spec.containers` that are not [`is_injected`], the only one, else
/// the first one named after one of `runtimes` ([`engine_container_name`]).
///
/// The webhook passes its CacheBackend's runtime; a caller that does not know
/// the runtime passes every runtime.
pub fn locate_engine_container(spec: &PodSpec, runtimes: &[Runtime]) -> Option<usize> {
    let candidates: Vec<usize> = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(_, c)| !is_injected(c))
        .map(|(i, _)| i)
        .collect();
    if let [only] = candidates.as_slice() {
        return Some(*only);
    }
    candidates.into_iter().find(|&i| {
        runtimes
            .iter()
            .any(|&r| spec.containers[i].name == engine_container_name(r))
    })
}

/// Index of the engine container: the only container that is not one of
/// our marked sidecars, else the one named after the runtime
/// ([`locate_engine_container`]).
pub fn find_engine_container(spec: &PodSpec, runtime: Runtime) -> Result<usize, String> {
    locate_engine_container(spec, &[runtime]).ok_or_else(|| {
        let name = engine_container_name(runtime);
        format!(
            "no engine container: a multi-container pod must name its engine container {name:?}"
        )
    })
}

/// The engine's serving port: a containerPort named `http`, else the
/// engine's `--port` argument, else its first containerPort, else the
/// runtime default.
pub fn engine_port(engine: &Container, default: i32) -> i32 {
    let ports = engine.ports.as_deref().unwrap_or_default();
    let named = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("http"))
        .map(|p| p.container_port);
    let from_args = crate::merge::flag_items(engine.args.as_deref().unwrap_or_default(), "--port")
        .first()
        .and_then(|it| it.value.as_deref()?.parse::<i32>().ok())
        .filter(|p| (1..=65535).contains(p));
    named
        .or(from_args)
        .or_else(|| ports.first().map(|p| p.container_port))
        .unwrap_or(default)
}
