//! vLLM + LMCache: the in-process `LMCacheConnectorV1` configured by
//! `--kv-transfer-config` and `LMCACHE_*` env. Every binding (host-only,
//! lm, resp, mooncakestore) runs the same connector; `LMCACHE_REMOTE_URL`
//! picks the remote connector by its scheme.
//!
//! The Mooncake connector ignores the URL's address: it configures its
//! client only from `MOONCAKE_CONFIG_PATH` or LMCache's extra config, so a
//! Mooncake binding also carries `LMCACHE_EXTRA_CONFIG` with the master
//! address and every client setting ([`mooncake_extra_config`]).

use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, ObjectFieldSelector};
use serde_json::{Map, Value, json};

use ic_api::cachebackend::{CacheType, IntegrationRole, Ownership, RemoteSerde, Runtime};

use super::{FAIL_OPEN_ENV, InjectContext, RuntimeAdapter};
use crate::binding::{Binding, Protocol};
use crate::merge::{env, remove_env, set_env_if_absent, upsert_arg_pair, upsert_env};
use crate::providers::MOONCAKE_HTTP_METADATA_PORT;

/// The connector wiring flag.
pub const KV_TRANSFER_CONFIG: &str = "--kv-transfer-config";
/// LMCache's JSON extra config (read by `LMCacheEngineConfig.from_env()`).
pub const EXTRA_CONFIG_ENV: &str = "LMCACHE_EXTRA_CONFIG";
/// The pod IP, referenced as `$(INFERENCECACHE_POD_IP)` from the extra
/// config so the Mooncake client advertises an address its peers reach.
pub const POD_IP_ENV: &str = "INFERENCECACHE_POD_IP";
/// The Mooncake client's registered segment, bytes (LMCache's own default).
pub const MOONCAKE_GLOBAL_SEGMENT_BYTES: u64 = 3_355_443_200;
/// The Mooncake client's transfer buffer, bytes (LMCache's own default).
pub const MOONCAKE_LOCAL_BUFFER_BYTES: u64 = 1 << 30;

const RESERVED_ARGS: &[&str] = &[KV_TRANSFER_CONFIG];
/// Names every binding reserves. `PYTHONHASHSEED` seeds vLLM's block-hash
/// chain (0.11 and 0.33 both read it); `INFERENCECACHE_FAIL_OPEN` is the
/// pod's record of `spec.integration.failOpen` (no engine reads it; it is
/// reserved so the record cannot disagree with the backend).
const RESERVED_ENV: &[&str] = &["PYTHONHASHSEED", FAIL_OPEN_ENV];

/// The vLLM+LMCache adapter.
#[derive(Debug, Clone, Copy, Default)]
pub struct VllmLmCache;

/// `kv_role` for an integration role.
pub fn kv_role(role: IntegrationRole) -> &'static str {
    match role {
        IntegrationRole::ReadOnly => "kv_consumer",
        IntegrationRole::WriteOnly => "kv_producer",
        IntegrationRole::ReadWrite => "kv_both",
    }
}

impl RuntimeAdapter for VllmLmCache {
    fn id(&self) -> &'static str {
        "vllm-lmcache"
    }

    fn display_name(&self) -> &'static str {
        "vLLM+LMCache"
    }

    fn pair(&self) -> (Runtime, CacheType) {
        (Runtime::Vllm, CacheType::LMCache)
    }

    fn reserved_args(&self) -> &'static [&'static str] {
        RESERVED_ARGS
    }

    fn reserved_env(&self, protocol: Option<Protocol>) -> Vec<&'static str> {
        let mut names = RESERVED_ENV.to_vec();
        if protocol.is_some() {
            names.push("LMCACHE_REMOTE_URL");
        }
        if protocol == Some(Protocol::MooncakeStore) {
            names.extend([EXTRA_CONFIG_ENV, POD_IP_ENV]);
        }
        names
    }

    fn supports_binding(&self, _protocol: Option<Protocol>) -> bool {
        // The connector takes lm://, redis:// and mooncakestore:// remotes and
        // runs host-only without one.
        true
    }

    fn hash_scheme(&self) -> &'static str {
        "vllm"
    }

    fn default_engine_port(&self) -> i32 {
        8000
    }

    fn provides_kernel_check(&self) -> bool {
        true
    }

    fn exports_engine_metrics(&self) -> bool {
        true
    }

    fn serves_metrics_as_written(&self, _args: &[String]) -> bool {
        // vLLM's API server always mounts /metrics.
        true
    }

    fn inject_engine_config(
        &self,
        ctx: &InjectContext<'_>,
        engine: &mut Container,
    ) -> Result<(), String> {
        let config = format!(
            r#"{{"kv_connector":"LMCacheConnectorV1","kv_role":"{}"}}"#,
            kv_role(ctx.role())
        );
        upsert_arg_pair(
            engine.args.get_or_insert_with(Vec::new),
            KV_TRANSFER_CONFIG,
            &config,
        );

        // Reserved env converges: the wiring cannot work with another value.
        // (VLLM_USE_V1 is not injected: 0.11 reads no such variable and 0.33
        // warns about it, refusing to start under --fail-on-environ-validation.
        // A template's own stays the operator's.)
        upsert_env(engine, env("PYTHONHASHSEED", "0"));
        upsert_env(engine, env(FAIL_OPEN_ENV, ctx.fail_open().to_string()));
        // Tunables: the pod template's own values win.
        set_env_if_absent(
            engine,
            env("LMCACHE_CHUNK_SIZE", ctx.chunk_size().to_string()),
        );
        set_env_if_absent(engine, env("LMCACHE_LOCAL_CPU", "True"));
        set_env_if_absent(
            engine,
            env(
                "LMCACHE_MAX_LOCAL_CPU_SIZE",
                ctx.host_memory_gib().to_string(),
            ),
        );
        if let Some(binding) = ctx.binding {
            upsert_env(engine, env("LMCACHE_REMOTE_URL", binding.url()));
            let serde = match ctx.lm_cache().remote_serde.unwrap_or(RemoteSerde::Naive) {
                RemoteSerde::Naive => "naive",
                RemoteSerde::Cachegen => "cachegen",
            };
            set_env_if_absent(engine, env("LMCACHE_REMOTE_SERDE", serde));
            if binding.protocol == Protocol::MooncakeStore {
                let managed = ctx
                    .backend
                    .spec
                    .remote_storage
                    .as_ref()
                    .is_some_and(|rs| rs.ownership == Ownership::Managed);
                inject_mooncake_client(engine, binding, managed)?;
            }
        }
        Ok(())
    }
}

/// The Mooncake client settings LMCache forwards to the store's `setup()`:
/// the controller-resolved master, the metadata service (the managed
/// master's embedded HTTP one, else Mooncake's peer-to-peer handshake, which
/// needs none), TCP transport, the address this client advertises, and the
/// segment/buffer sizes.
///
/// The keys carry LMCache's `mooncake_` prefix, which it strips and passes
/// through: Mooncake's dict `setup()` (0.3.x) names the master
/// `master_server_addr`, and the unprefixed `master_server_address` LMCache
/// documents reaches only its legacy positional `setup()` — alone it leaves
/// the client dialling 127.0.0.1:50051. That legacy key is kept too, for
/// Mooncake builds without the dict API.
pub fn mooncake_extra_config(binding: &Binding, managed: bool) -> Map<String, Value> {
    let metadata = if managed {
        format!(
            "http://{}:{MOONCAKE_HTTP_METADATA_PORT}/metadata",
            binding.host()
        )
    } else {
        "P2PHANDSHAKE".to_owned()
    };
    let value = json!({
        "master_server_address": binding.endpoint,
        "mooncake_master_server_addr": binding.endpoint,
        "mooncake_metadata_server": metadata,
        "mooncake_protocol": "tcp",
        "mooncake_local_hostname": format!("$({POD_IP_ENV})"),
        "mooncake_global_segment_size": MOONCAKE_GLOBAL_SEGMENT_BYTES.to_string(),
        "mooncake_local_buffer_size": MOONCAKE_LOCAL_BUFFER_BYTES.to_string(),
    });
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// Puts the pod IP and the Mooncake extra config into the env list, the pod
/// IP first (a `$(VAR)` reference only expands to a variable defined before
/// it): in place when an earlier render already has them in that order, so
/// re-admission changes nothing, else at the end. The template's own extra
/// config keeps its other keys; one that is not a literal JSON object
/// (`valueFrom`, not JSON) cannot be merged, so the pod is refused (and
/// admitted unwired) rather than losing it.
fn inject_mooncake_client(
    engine: &mut Container,
    binding: &Binding,
    managed: bool,
) -> Result<(), String> {
    let list = engine.env.get_or_insert_with(Vec::new);
    let theirs = match list.iter().find(|e| e.name == EXTRA_CONFIG_ENV) {
        None => Map::new(),
        Some(var) => var
            .value
            .as_deref()
            .filter(|_| var.value_from.is_none())
            .and_then(|v| serde_json::from_str::<Map<String, Value>>(v).ok())
            .ok_or_else(|| {
                format!(
                    "the engine sets {EXTRA_CONFIG_ENV} to something other than a literal JSON object; \
                     a Mooncake binding merges its client settings into it (write it as a JSON value)"
                )
            })?,
    };
    let mut merged = theirs;
    merged.extend(mooncake_extra_config(binding, managed));
    let pod_ip = EnvVar {
        name: POD_IP_ENV.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".to_owned(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    };
    let extra = env(EXTRA_CONFIG_ENV, Value::Object(merged).to_string());
    let position = |name: &str| list.iter().position(|e| e.name == name);
    let in_order = matches!(
        (position(POD_IP_ENV), position(EXTRA_CONFIG_ENV)),
        (Some(ip), Some(cfg)) if ip < cfg
    );
    if in_order {
        upsert_env(engine, pod_ip);
        upsert_env(engine, extra);
    } else {
        remove_env(engine, POD_IP_ENV);
        remove_env(engine, EXTRA_CONFIG_ENV);
        let list = engine.env.get_or_insert_with(Vec::new);
        list.push(pod_ip);
        list.push(extra);
    }
    Ok(())
}
