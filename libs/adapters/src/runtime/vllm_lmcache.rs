//! vLLM + LMCache: the in-process `LMCacheConnectorV1` configured by
//! `--kv-transfer-config` and `LMCACHE_*` env. Every binding (host-only,
//! lm, resp, mooncakestore) runs the same connector; only
//! `LMCACHE_REMOTE_URL` changes with the binding's protocol.

use k8s_openapi::api::core::v1::Container;

use ic_api::cachebackend::{CacheType, IntegrationRole, RemoteSerde, Runtime};

use super::{FAIL_OPEN_ENV, InjectContext, RuntimeAdapter};
use crate::binding::Protocol;
use crate::merge::{env, set_env_if_absent, upsert_arg_pair, upsert_env};

/// The connector wiring flag.
pub const KV_TRANSFER_CONFIG: &str = "--kv-transfer-config";

const RESERVED_ARGS: &[&str] = &[KV_TRANSFER_CONFIG];
const RESERVED_ENV: &[&str] = &[
    "VLLM_USE_V1",
    "LMCACHE_REMOTE_URL",
    FAIL_OPEN_ENV,
    "PYTHONHASHSEED",
];

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

    fn reserved_env(&self) -> &'static [&'static str] {
        RESERVED_ENV
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

    fn exports_tier2_metrics(&self) -> bool {
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
        upsert_env(engine, env("VLLM_USE_V1", "1"));
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
        }
        Ok(())
    }
}
