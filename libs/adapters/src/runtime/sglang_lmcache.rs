//! SGLang + LMCache in multiprocess (MP) mode.
//!
//! SGLang reads LMCache settings only from `--lmcache-config-file` and talks
//! to a node-local MP worker over loopback ZMQ plus a `/dev/shm` data path.
//! The adapter therefore renders, besides the engine flags:
//! * the worker as a native sidecar (init container, `restartPolicy:
//!   Always`) that writes the config file and runs the MP server, with an
//!   exec startup probe on the loopback port so the engine starts after it;
//! * a shared `lmcache-config` emptyDir mounted at `/etc/lmcache`;
//! * `/dev/shm`: the engine's own volume when it already mounts one (a second
//!   mount at the same path would be an invalid pod), else a sized
//!   `lmcache-dshm` memory emptyDir.
//!
//! The reserved names (container `lmcache-mp-worker`, volumes
//! `lmcache-config` / `lmcache-dshm`, mount path `/etc/lmcache`) are adopted
//! only when they are our own earlier render; anything else squatting them
//! makes the adapter refuse the pod (the webhook then admits it unwired).

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, ExecAction, Pod, PodSpec, Probe, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use ic_api::cachebackend::{CacheType, Runtime};

use super::{
    ENABLE_HICACHE, ENABLE_LMCACHE, ENABLE_METRICS, FAIL_OPEN_ENV, InjectContext,
    LMCACHE_CONFIG_FILE, RuntimeAdapter, engine_image_security_context, is_ours, marker,
};
use crate::binding::{Binding, Protocol};
use crate::merge::{
    env, flag_items, upsert_arg_pair, upsert_container, upsert_env, upsert_flag,
    upsert_mount_by_name, upsert_volume,
};

/// Native-sidecar MP worker container name.
pub const WORKER_CONTAINER: &str = ic_api::consts::injected::MP_WORKER_CONTAINER;
/// Shared config volume.
pub const CONFIG_VOLUME: &str = "lmcache-config";
/// Fallback shared-memory volume.
pub const DSHM_VOLUME: &str = "lmcache-dshm";
/// Where the config volume is mounted.
pub const CONFIG_DIR: &str = "/etc/lmcache";
/// The config file the worker writes and the engine reads.
pub const CONFIG_FILE: &str = "/etc/lmcache/lmcache.yaml";
/// Shared-memory mount path.
pub const SHM_PATH: &str = "/dev/shm";

const RESERVED_ARGS: &[&str] = &[ENABLE_LMCACHE, LMCACHE_CONFIG_FILE];
/// SGLang's KV page size in tokens (default 1).
const PAGE_SIZE: &str = "--page-size";
/// `INFERENCECACHE_FAIL_OPEN` is the pod's record of
/// `spec.integration.failOpen`. (`LMCACHE_USE_EXPERIMENTAL` is not injected:
/// only LMCache 0.3.x read it, and SGLang's MP path never did.)
const RESERVED_ENV: &[&str] = &[FAIL_OPEN_ENV];
/// L1 eviction policy of the MP worker (LMCache requires one with
/// `--l1-size-gb`).
pub const WORKER_EVICTION_POLICY: &str = "LRU";

/// The SGLang+LMCache (MP mode) adapter.
#[derive(Debug, Clone, Copy, Default)]
pub struct SglangLmCache;

fn is_our_config_volume(v: &Volume) -> bool {
    v.empty_dir
        .as_ref()
        .is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty())
        && only_empty_dir(v)
}

fn is_our_dshm_volume(v: &Volume) -> bool {
    v.empty_dir
        .as_ref()
        .is_some_and(|e| e.medium.as_deref() == Some("Memory"))
        && only_empty_dir(v)
}

fn only_empty_dir(v: &Volume) -> bool {
    let bare = Volume {
        name: v.name.clone(),
        empty_dir: v.empty_dir.clone(),
        ..Volume::default()
    };
    &bare == v
}

/// The engine's existing `/dev/shm` mount, if any.
fn engine_shm_mount(engine: &Container) -> Option<&VolumeMount> {
    engine
        .volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|m| m.mount_path.trim_end_matches('/') == SHM_PATH)
}

impl SglangLmCache {
    fn worker(
        &self,
        ctx: &InjectContext<'_>,
        engine: &Container,
        image: String,
        shm_volume: &str,
    ) -> Container {
        let port = ctx.worker_port();
        let chunk = ctx.chunk_size();
        let server = worker_command_line(ctx);
        // An image without LMCache's MP server would restart forever behind
        // its startup probe and keep the engine from starting: say why.
        let script = format!(
            "set -e\n{IMPORT_CHECK}\nprintf '%s\\n' 'chunk_size: {chunk}' 'mp_host: 127.0.0.1' 'mp_port: {port}' > {CONFIG_FILE}\n{server}\n"
        );
        let probe = format!(
            "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
        );
        Container {
            name: WORKER_CONTAINER.to_owned(),
            image: Some(image),
            restart_policy: Some("Always".to_owned()),
            command: Some(vec!["/bin/sh".into(), "-c".into(), script]),
            env: Some(vec![
                marker(WORKER_CONTAINER),
                // CUDA-IPC needs the engine's device visible; the worker holds
                // no device-plugin allocation of its own.
                env("NVIDIA_VISIBLE_DEVICES", "all"),
            ]),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: CONFIG_VOLUME.to_owned(),
                    mount_path: CONFIG_DIR.to_owned(),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: shm_volume.to_owned(),
                    mount_path: SHM_PATH.to_owned(),
                    ..VolumeMount::default()
                },
            ]),
            startup_probe: Some(Probe {
                exec: Some(ExecAction {
                    command: Some(vec!["python3".into(), "-c".into(), probe]),
                }),
                period_seconds: Some(2),
                timeout_seconds: Some(2),
                failure_threshold: Some(150),
                ..Probe::default()
            }),
            // The worker pins host memory for the engine: it keeps the
            // capabilities the engine adds, nothing more.
            security_context: Some(engine_image_security_context(engine, true)),
            // The import check's message becomes the container's status.
            termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
            ..Container::default()
        }
    }

    fn worker_image(ctx: &InjectContext<'_>, engine: &Container) -> Option<String> {
        ctx.lm_cache()
            .worker_image
            .filter(|i| !i.trim().is_empty())
            .or_else(|| engine.image.clone().filter(|i| !i.trim().is_empty()))
    }
}

/// First line of the worker's script: finds LMCache's MP server module
/// (LMCache 0.5 and later; 0.3.x and 0.4.x have none) without starting it.
pub const IMPORT_CHECK: &str = "python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"lmcache.v1.multiprocess.server\") is None)' || { echo 'lmcache-mp-worker: this image has no lmcache.v1.multiprocess.server: the SGLang LMCache worker needs LMCache 0.5 or later (set spec.lmCache.workerImage)' >&2; exit 1; }";

/// Why `image` cannot run the MP worker, when its name says so: SGLang's
/// own images ship no LMCache, and LMCache's images before 0.5 have no MP
/// server. An image we cannot judge by name passes (the worker's import
/// check catches the rest at start).
pub fn known_bad_worker_image(image: &str) -> Option<String> {
    let image = image.trim();
    let name = image.split('@').next().unwrap_or(image);
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (name, None),
    };
    let mut parts: Vec<&str> = repo.split('/').collect();
    // Drop a registry host (docker.io, ghcr.io, localhost:5000, ...).
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        parts.remove(0);
    }
    if parts.first() == Some(&"library") {
        parts.remove(0);
    }
    let path = parts.join("/");
    if path == "lmsysorg/sglang" {
        return Some(format!(
            "the MP worker image {image:?} is SGLang's, which does not ship LMCache: set spec.lmCache.workerImage to an image with LMCache 0.5 or later"
        ));
    }
    let version = tag?.trim_start_matches('v');
    let mut numbers = version.split(['.', '-']);
    let old = numbers.next() == Some("0")
        && numbers
            .next()
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|minor| minor < 5);
    (path.starts_with("lmcache/") && old).then(|| {
        format!(
            "the MP worker image {image:?} carries LMCache {version}, which has no multiprocess server (lmcache.v1.multiprocess, LMCache 0.5 and later)"
        )
    })
}

/// The MP server's launch line, in the form LMCache's own parser takes:
/// L1 sized from the backend's host memory, an eviction policy, and the L2
/// adapter as the JSON object `--l2-adapter` expects. Hosts and ports are
/// validated endpoint parts, so single quotes are enough for the shell.
pub fn worker_command_line(ctx: &InjectContext<'_>) -> String {
    let mut line = format!(
        "exec python3 -m lmcache.v1.multiprocess.server --host 127.0.0.1 --port {} --chunk-size {} --l1-size-gb {} --eviction-policy {WORKER_EVICTION_POLICY}",
        ctx.worker_port(),
        ctx.chunk_size(),
        ctx.host_memory_gib()
    );
    if let Some(adapter) = ctx.binding.and_then(l2_adapter) {
        line.push_str(&format!(" --l2-adapter '{adapter}'"));
    }
    line
}

/// `--l2-adapter` JSON for a binding the MP path runs.
pub fn l2_adapter(binding: &Binding) -> Option<String> {
    match binding.protocol {
        Protocol::Resp => Some(
            serde_json::json!({
                "type": "resp",
                "host": binding.bare_host(),
                "port": binding.port(),
            })
            .to_string(),
        ),
        Protocol::Lm | Protocol::MooncakeStore => None,
    }
}

impl RuntimeAdapter for SglangLmCache {
    fn id(&self) -> &'static str {
        "sglang-lmcache"
    }

    fn display_name(&self) -> &'static str {
        "SGLang+LMCache"
    }

    fn pair(&self) -> (Runtime, CacheType) {
        (Runtime::SGLang, CacheType::LMCache)
    }

    fn reserved_args(&self) -> &'static [&'static str] {
        RESERVED_ARGS
    }

    fn reserved_env(&self, _protocol: Option<Protocol>) -> Vec<&'static str> {
        RESERVED_ENV.to_vec()
    }

    fn supports_binding(&self, protocol: Option<Protocol>) -> bool {
        // The MP server has no L2 adapter for an LMCache server, and its
        // `mooncake_store` adapter needs a native extension the published
        // LMCache wheels do not build; RESP is the one remote it runs.
        matches!(protocol, None | Some(Protocol::Resp))
    }

    fn hash_scheme(&self) -> &'static str {
        "sglang"
    }

    fn exports_engine_metrics(&self) -> bool {
        true
    }

    fn serves_metrics_as_written(&self, args: &[String]) -> bool {
        !flag_items(args, ENABLE_METRICS).is_empty()
    }

    fn default_engine_port(&self) -> i32 {
        30000
    }

    fn check_pod(&self, ctx: &InjectContext<'_>, pod: &Pod, engine: usize) -> Result<(), String> {
        let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
        let engine_c = &spec.containers[engine];
        for c in spec.init_containers.as_deref().unwrap_or_default() {
            if c.name == WORKER_CONTAINER && !is_ours(c, WORKER_CONTAINER) {
                return Err(format!(
                    "init container {WORKER_CONTAINER:?} is reserved by the SGLang+LMCache adapter; rename it"
                ));
            }
        }
        if spec.containers.iter().any(|c| c.name == WORKER_CONTAINER) {
            return Err(format!(
                "container name {WORKER_CONTAINER:?} is reserved by the SGLang+LMCache adapter; rename it"
            ));
        }
        for v in spec.volumes.as_deref().unwrap_or_default() {
            let squatted = (v.name == CONFIG_VOLUME && !is_our_config_volume(v))
                || (v.name == DSHM_VOLUME && !is_our_dshm_volume(v));
            if squatted {
                return Err(format!(
                    "volume name {:?} is reserved by the SGLang+LMCache adapter; rename it",
                    v.name
                ));
            }
        }
        for m in engine_c.volume_mounts.as_deref().unwrap_or_default() {
            if m.mount_path.trim_end_matches('/') == CONFIG_DIR && m.name != CONFIG_VOLUME {
                return Err(format!(
                    "mount path {CONFIG_DIR} is reserved by the SGLang+LMCache adapter (engine mounts volume {:?} there)",
                    m.name
                ));
            }
        }
        if let Some(shm) = engine_shm_mount(engine_c).filter(|m| m.name != DSHM_VOLUME) {
            if shm.read_only == Some(true) {
                return Err(
                    "the engine mounts /dev/shm read-only; the LMCache MP data path writes there"
                        .into(),
                );
            }
            let volume = spec
                .volumes
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|v| v.name == shm.name)
                .ok_or_else(|| format!("/dev/shm mounts unknown volume {:?}", shm.name))?;
            if volume.config_map.is_some()
                || volume.secret.is_some()
                || volume.downward_api.is_some()
                || volume.projected.is_some()
            {
                return Err(format!(
                    "the engine's /dev/shm comes from a read-only volume type ({:?}); the LMCache MP data path writes there",
                    shm.name
                ));
            }
        }
        let args = engine_c.args.as_deref().unwrap_or_default();
        if !flag_items(args, ENABLE_HICACHE).is_empty() {
            return Err(
                "the engine already enables SGLang HiCache; LMCache MP and HiCache are exclusive"
                    .into(),
            );
        }
        let Some(image) = Self::worker_image(ctx, engine_c) else {
            return Err(
                "no MP-worker image: the engine container has no image and lmCache.workerImage is unset"
                    .into(),
            );
        };
        if let Some(why) = known_bad_worker_image(&image) {
            return Err(why);
        }
        // LMCache's SGLang connector refuses a chunk that is not a whole
        // number of SGLang pages (at engine start, after the pod is wired).
        let page = flag_items(args, PAGE_SIZE)
            .last()
            .and_then(|it| it.value.as_deref()?.trim().parse::<i32>().ok())
            .unwrap_or(1);
        let chunk = ctx.chunk_size();
        if page > 0 && chunk % page != 0 {
            return Err(format!(
                "spec.lmCache.chunkSizeTokens {chunk} is not a multiple of the engine's {PAGE_SIZE} {page}: LMCache's SGLang connector refuses to start"
            ));
        }
        Ok(())
    }

    fn inject_engine_config(
        &self,
        ctx: &InjectContext<'_>,
        engine: &mut Container,
    ) -> Result<(), String> {
        let args = engine.args.get_or_insert_with(Vec::new);
        upsert_flag(args, ENABLE_LMCACHE);
        upsert_arg_pair(args, LMCACHE_CONFIG_FILE, CONFIG_FILE);
        upsert_flag(args, ENABLE_METRICS);
        upsert_env(engine, env(FAIL_OPEN_ENV, ctx.fail_open().to_string()));
        Ok(())
    }

    fn inject_pod(
        &self,
        ctx: &InjectContext<'_>,
        spec: &mut PodSpec,
        engine: usize,
    ) -> Result<(), String> {
        let image = Self::worker_image(ctx, &spec.containers[engine])
            .ok_or("no MP-worker image".to_owned())?;
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        upsert_volume(
            volumes,
            Volume {
                name: CONFIG_VOLUME.to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
        );
        let reused = engine_shm_mount(&spec.containers[engine])
            .map(|m| m.name.clone())
            .filter(|n| n != DSHM_VOLUME);
        let shm_volume = match reused {
            Some(name) => name,
            None => {
                // L1 plus 1Gi headroom, so the engine's own /dev/shm users
                // (NCCL, tokenizer workers) still fit beside the L1 tier.
                let size = format!("{}Gi", ctx.host_memory_gib().saturating_add(1));
                upsert_volume(
                    volumes,
                    Volume {
                        name: DSHM_VOLUME.to_owned(),
                        empty_dir: Some(EmptyDirVolumeSource {
                            medium: Some("Memory".to_owned()),
                            size_limit: Some(Quantity(size)),
                        }),
                        ..Volume::default()
                    },
                );
                upsert_mount_by_name(
                    &mut spec.containers[engine],
                    VolumeMount {
                        name: DSHM_VOLUME.to_owned(),
                        mount_path: SHM_PATH.to_owned(),
                        ..VolumeMount::default()
                    },
                );
                DSHM_VOLUME.to_owned()
            }
        };
        upsert_mount_by_name(
            &mut spec.containers[engine],
            VolumeMount {
                name: CONFIG_VOLUME.to_owned(),
                mount_path: CONFIG_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        );
        let worker = self.worker(ctx, &spec.containers[engine], image, &shm_volume);
        upsert_container(spec.init_containers.get_or_insert_with(Vec::new), worker);
        Ok(())
    }
}
