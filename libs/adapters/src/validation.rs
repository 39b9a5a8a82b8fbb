//! The validating-webhook rules that need this crate (the adapter registry,
//! binding shapes, quantity parsing), run after the structural rules of
//! `ic_api::validate`, plus the admission warnings for CacheBackends.

use ic_api::CacheBackend;
use ic_api::cachebackend::{
    CacheBackendSpec, CacheType, IntegrationMode, Ownership, Runtime, StorageProvider,
};
use ic_api::consts::{annotations, kernel_check};
use ic_api::validate::{ErrorType, FieldError, Subject};

use crate::binding::{Protocol, parse_endpoint};
use crate::merge::flag_token;
use crate::registry::{Registry, pair_name};
use crate::runtime::RuntimeAdapter;
use crate::runtime::sglang_hicache::valid_ratio;

/// Field path of the kernel-check annotation.
pub const KERNEL_CHECK_FIELD: &str = "metadata.annotations[inferencecache.io/lmcache-kernel-check]";

/// A named rule of this crate.
pub type Rule = fn(&CacheBackend) -> Vec<FieldError>;

/// The adapter-backed rules, in the order they run after the structural ones.
pub const RULES: &[(&str, Rule)] = &[
    ("runtime-cache-pair", runtime_pair),
    ("binding-support", binding_support),
    ("endpoint-shape", endpoint_shape),
    ("hicache-config", hicache_config),
    ("reserved-overrides", reserved_overrides),
    ("provider-resources", provider_resources),
    ("host-memory-capacity", host_memory_capacity),
    ("kernel-check-annotation", kernel_check_annotation),
    ("mp-worker-image", mp_worker_image),
];

fn err(kind: ErrorType, field: &str, bad: Option<String>, detail: String) -> FieldError {
    FieldError {
        kind,
        field: field.to_owned(),
        bad_value: bad,
        detail,
    }
}

/// Structural rules, then this crate's rules, aggregated in a stable order.
pub fn validate_backend(backend: &CacheBackend) -> Vec<FieldError> {
    let namespace = backend.metadata.namespace.as_deref().unwrap_or_default();
    let mut out = ic_api::validate::validate(&Subject {
        namespace,
        spec: &backend.spec,
    });
    for (_, rule) in RULES {
        out.extend(rule(backend));
    }
    out
}

fn adapter(spec: &CacheBackendSpec) -> Option<&'static dyn RuntimeAdapter> {
    Registry.select(spec.runtime, spec.r#type)
}

fn runtime_pair(b: &CacheBackend) -> Vec<FieldError> {
    let spec = &b.spec;
    if adapter(spec).is_some() {
        return Vec::new();
    }
    let pair = pair_name(spec.runtime, spec.r#type);
    vec![err(
        ErrorType::NotSupported,
        "spec.type",
        Some(pair.clone()),
        format!(
            "no runtime adapter is registered for {pair}; SupportedPairs: {}",
            Registry.supported_pairs().join(", ")
        ),
    )]
}

/// An SGLang + LMCache backend whose MP-worker image cannot run the worker
/// (SGLang's own image, LMCache before 0.5): every pod it wires would wait
/// forever behind the worker's startup probe.
fn mp_worker_image(b: &CacheBackend) -> Vec<FieldError> {
    let spec = &b.spec;
    if (spec.runtime, spec.r#type) != (Runtime::SGLang, CacheType::LMCache)
        || spec.integration_mode() == IntegrationMode::EventsOnly
    {
        return Vec::new();
    }
    let Some(image) = spec
        .lm_cache
        .as_ref()
        .and_then(|l| l.worker_image.as_deref())
    else {
        return Vec::new();
    };
    match crate::runtime::sglang_lmcache::known_bad_worker_image(image) {
        Some(why) => vec![err(
            ErrorType::Invalid,
            "spec.lmCache.workerImage",
            Some(image.to_owned()),
            why,
        )],
        None => Vec::new(),
    }
}

fn binding_name(p: Option<Protocol>) -> &'static str {
    p.map_or("host-only", Protocol::name)
}

fn binding_support(b: &CacheBackend) -> Vec<FieldError> {
    let spec = &b.spec;
    // Events-only wires no connector; its remoteStorage is rejected structurally.
    if spec.integration_mode() == IntegrationMode::EventsOnly {
        return Vec::new();
    }
    let (Some(adapter), Some(rs)) = (adapter(spec), spec.remote_storage.as_ref()) else {
        return Vec::new();
    };
    let protocol = Protocol::of(rs.provider);
    if adapter.supports_binding(Some(protocol)) {
        return Vec::new();
    }
    let accepted: Vec<&str> = [
        None,
        Some(Protocol::Lm),
        Some(Protocol::Resp),
        Some(Protocol::MooncakeStore),
    ]
    .into_iter()
    .filter(|p| adapter.supports_binding(*p))
    .map(binding_name)
    .collect();
    vec![err(
        ErrorType::NotSupported,
        "spec.remoteStorage.provider",
        Some(format!("{:?}", rs.provider)),
        format!(
            "the {} adapter does not accept a {} binding (provider {:?}); it accepts: {}",
            adapter.display_name(),
            protocol.name(),
            rs.provider,
            accepted.join(", ")
        ),
    )]
}

fn endpoint_shape(b: &CacheBackend) -> Vec<FieldError> {
    let Some(rs) = &b.spec.remote_storage else {
        return Vec::new();
    };
    if rs.ownership != Ownership::External {
        return Vec::new();
    }
    let Some(endpoint) = ic_api::validate::trimmed_endpoint(&b.spec) else {
        return Vec::new();
    };
    // Embedded whitespace is already reported by the structural rules.
    if endpoint.chars().any(char::is_whitespace) {
        return Vec::new();
    }
    match parse_endpoint(rs.provider, endpoint) {
        Ok(_) => Vec::new(),
        Err(why) => vec![err(
            ErrorType::Invalid,
            "spec.remoteStorage.endpoint",
            Some(endpoint.to_owned()),
            why,
        )],
    }
}

fn hicache_config(b: &CacheBackend) -> Vec<FieldError> {
    let spec = &b.spec;
    if spec.r#type != CacheType::SGLangHiCache
        || spec.integration_mode() != IntegrationMode::Offload
    {
        return Vec::new();
    }
    let Some(hi) = &spec.hi_cache else {
        return vec![err(
            ErrorType::Required,
            "spec.hiCache",
            None,
            "type SGLangHiCache needs hiCache with exactly one of ratio and sizeGB".into(),
        )];
    };
    let mut out = Vec::new();
    match (&hi.ratio, hi.size_gb) {
        (Some(_), Some(_)) | (None, None) => out.push(err(
            ErrorType::Invalid,
            "spec.hiCache",
            None,
            "exactly one of ratio and sizeGB must be set".into(),
        )),
        (Some(r), None) if !valid_ratio(r) => out.push(err(
            ErrorType::Invalid,
            "spec.hiCache.ratio",
            Some(r.clone()),
            "must be a finite number greater than zero".into(),
        )),
        (None, Some(gb)) if gb < 1 => out.push(err(
            ErrorType::Invalid,
            "spec.hiCache.sizeGB",
            Some(gb.to_string()),
            "must be a positive integer".into(),
        )),
        _ => {}
    }
    out
}

fn override_flag(entry: &str) -> Option<String> {
    let first = entry.split_whitespace().next()?;
    flag_token(first).map(str::to_owned)
}

fn reserved_overrides(b: &CacheBackend) -> Vec<FieldError> {
    let spec = &b.spec;
    let Some(adapter) = adapter(spec) else {
        return Vec::new();
    };
    let Some(ov) = spec
        .integration
        .as_ref()
        .and_then(|i| i.engine_overrides.as_ref())
    else {
        return Vec::new();
    };
    let base = "spec.integration.engineOverrides";
    let mut out = Vec::new();
    let reject = |out: &mut Vec<FieldError>, field: String, bad: &str, what: &str, name: &str| {
        out.push(err(
            ErrorType::Forbidden,
            &field,
            Some(bad.to_owned()),
            format!(
                "{what} {name} is reserved by the {} adapter ({}): overriding or suppressing it would un-wire the integration",
                adapter.display_name(),
                adapter.id()
            ),
        ));
    };
    let reserved_args = adapter.reserved_args();
    let protocol = spec
        .remote_storage
        .as_ref()
        .map(|rs| Protocol::of(rs.provider));
    let reserved_env = adapter.reserved_env(protocol);
    for (i, entry) in ov.args.iter().enumerate() {
        if let Some(flag) = override_flag(entry).filter(|f| reserved_args.contains(&f.as_str())) {
            reject(&mut out, format!("{base}.args[{i}]"), entry, "flag", &flag);
        }
    }
    for (i, entry) in ov.suppress_args.iter().enumerate() {
        if let Some(flag) = override_flag(entry).filter(|f| reserved_args.contains(&f.as_str())) {
            reject(
                &mut out,
                format!("{base}.suppressArgs[{i}]"),
                entry,
                "flag",
                &flag,
            );
        }
    }
    for (i, var) in ov.env.iter().enumerate() {
        if reserved_env.contains(&var.name.as_str()) {
            reject(
                &mut out,
                format!("{base}.env[{i}].name"),
                &var.name,
                "env",
                &var.name,
            );
        }
    }
    for (i, name) in ov.suppress_env.iter().enumerate() {
        if reserved_env.contains(&name.trim()) {
            reject(
                &mut out,
                format!("{base}.suppressEnv[{i}]"),
                name,
                "env",
                name.trim(),
            );
        }
    }
    out
}

fn provider_resources(b: &CacheBackend) -> Vec<FieldError> {
    let Some(rs) = &b.spec.remote_storage else {
        return Vec::new();
    };
    let (name, resources) = match rs.provider {
        StorageProvider::Redis => (
            "redis",
            rs.redis.as_ref().and_then(|r| r.resources.as_ref()),
        ),
        StorageProvider::LMCacheServer => (
            "lmCacheServer",
            rs.lm_cache_server
                .as_ref()
                .and_then(|r| r.resources.as_ref()),
        ),
        StorageProvider::Mooncake => (
            "mooncake",
            rs.mooncake.as_ref().and_then(|r| r.resources.as_ref()),
        ),
    };
    resources.map_or_else(Vec::new, |res| {
        crate::resources::check(&format!("spec.remoteStorage.{name}.resources"), res)
    })
}

const HOST_MEMORY_FIELD: &str = "spec.lmCache.hostMemory.capacity";

/// The host-memory budget must be a positive quantity: injection renders
/// it in GiB, and a zero or negative one would silently become the default.
fn host_memory_capacity(b: &CacheBackend) -> Vec<FieldError> {
    let Some(capacity) = b
        .spec
        .lm_cache
        .as_ref()
        .and_then(|l| l.host_memory.as_ref())
        .and_then(|h| h.capacity.as_ref())
    else {
        return Vec::new();
    };
    let detail = match crate::quantity::parse(&capacity.0) {
        Ok(q) if q.is_positive() => return Vec::new(),
        Ok(_) => "must be a positive quantity, e.g. 4Gi".to_owned(),
        Err(e) => format!("not a quantity ({e}); e.g. 4Gi"),
    };
    vec![err(
        ErrorType::Invalid,
        HOST_MEMORY_FIELD,
        Some(capacity.0.clone()),
        detail,
    )]
}

fn kernel_check_annotation(b: &CacheBackend) -> Vec<FieldError> {
    let value = b
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::LMCACHE_KERNEL_CHECK));
    match value {
        Some(v) if !v.is_empty() && !kernel_check::ALL.contains(&v.as_str()) => vec![err(
            ErrorType::NotSupported,
            KERNEL_CHECK_FIELD,
            Some(v.clone()),
            format!(
                "supported values: {} (empty means auto)",
                kernel_check::ALL.join(", ")
            ),
        )],
        _ => Vec::new(),
    }
}

/// Admission warnings for an admitted CacheBackend.
pub fn backend_warnings(b: &CacheBackend) -> Vec<String> {
    let spec = &b.spec;
    let mut out = Vec::new();
    if !spec.fail_open() {
        out.push(
            "spec.integration.failOpen=false makes the cache a serving dependency of every wired engine pod (fail-closed)".to_owned(),
        );
    }
    if spec
        .remote_storage
        .as_ref()
        .is_some_and(|r| r.provider == StorageProvider::Mooncake)
        && spec
            .integration
            .as_ref()
            .and_then(|i| i.engine_host_network)
            != Some(true)
    {
        out.push(
            "Mooncake needs engine pods on the host network: set spec.integration.engineHostNetwork: true and roll the engine workload, otherwise the backend reports Ready while transferring zero KV".to_owned(),
        );
    }
    if spec.integration_mode() == IntegrationMode::EventsOnly && spec.lm_cache.is_some() {
        out.push(
            "spec.lmCache is ignored in EventsOnly mode (no connector or host tier is wired); omit it".to_owned(),
        );
    }
    let model = spec
        .observation
        .as_ref()
        .and_then(|o| o.model_id.as_deref())
        .is_some_and(|m| !m.trim().is_empty());
    if !model {
        out.push(
            "spec.observation.modelID is unset: no kvevent-subscriber is injected, so wired pods do not feed cache-aware routing".to_owned(),
        );
    }
    if spec
        .engine_selector
        .as_ref()
        .is_none_or(|s| s.match_labels.is_empty())
    {
        out.push(
            "spec.engineSelector.matchLabels is empty: this backend wires no engine pods"
                .to_owned(),
        );
    }
    if spec.runtime == Runtime::SGLang
        && spec.r#type == CacheType::LMCache
        && spec.integration_mode() == IntegrationMode::Offload
    {
        out.push(
            "SGLang+LMCache injects its MP worker as a native sidecar (restartPolicy: Always on an init container): engine pods need Kubernetes 1.29 or newer".to_owned(),
        );
    }
    let kernel = b
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::LMCACHE_KERNEL_CHECK))
        .is_some_and(|v| !v.is_empty() && v != kernel_check::AUTO);
    if kernel && spec.runtime == Runtime::SGLang {
        out.push(
            "inferencecache.io/lmcache-kernel-check has no effect on SGLang engine pods (the kernel check is vLLM-only)".to_owned(),
        );
    }
    out
}
