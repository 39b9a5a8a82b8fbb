//! The containers the webhook adds beside the engine, independent of the
//! runtime adapter's own wiring:
//! * the `kvevent-subscriber` sidecar (routing tier), gated on the webhook's
//!   subscriber image and `spec.observation.modelID`;
//! * the `lmcache-kernel-check` init container (vLLM+LMCache only), driven
//!   by the backend's `inferencecache.io/lmcache-kernel-check` annotation.
//!
//! Both carry the [`crate::runtime::SIDECAR_MARKER_ENV`] marker so a later
//! admission converges them instead of treating them as operator squatting.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, KeyToPath, LocalObjectReference,
    ObjectFieldSelector, PodSpec, ProjectedVolumeSource, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use ic_api::CacheBackend;
use ic_api::consts::{annotations, kernel_check};

use crate::binding::Protocol;
use crate::merge::{env, upsert_container};
use crate::quantity;
use crate::runtime::{engine_image_security_context, is_injected, is_ours, marker};

/// Subscriber sidecar container name.
pub const SUBSCRIBER_CONTAINER: &str = ic_api::consts::injected::SUBSCRIBER_CONTAINER;
/// Kernel-check init container name (the controller reads its status).
pub const KERNEL_CHECK_CONTAINER: &str = kernel_check::CONTAINER_NAME;
/// Env telling the kernel check which mode it runs in.
pub const KERNEL_CHECK_MODE_ENV: &str = "LMCACHE_KERNEL_CHECK_MODE";
/// The subscriber's admin port (`/live`, `/ready`, `/metrics`).
pub const SUBSCRIBER_ADMIN_PORT: i32 = 8083;
/// Name of that port, which the chart's PodMonitor scrapes.
pub const SUBSCRIBER_METRICS_PORT_NAME: &str = "ic-metrics";
/// The non-root user the subscriber image runs as.
pub const SUBSCRIBER_UID: i64 = 65532;

/// Webhook-level settings the injection needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InjectionConfig {
    /// Image of the kvevent-subscriber sidecar; `None` injects no subscriber.
    pub subscriber_image: Option<String>,
    /// Index server gRPC URL the injected subscriber dials.
    pub index_server: String,
    /// Audience of the token the subscriber presents to the index server;
    /// `None` mounts no token (an index server without access control).
    pub index_server_audience: Option<String>,
    /// CA bundle (PEM) of an `https://` index server, handed to the
    /// subscriber inline (`IC_INDEX_SERVER_CA_PEM`): a pod cannot mount a
    /// Secret of the index server's namespace.
    pub index_server_ca_pem: Option<String>,
    /// OTLP collector the subscriber exports traces and metrics to (its
    /// `--otlp-endpoint`); `$(HOST_IP)` in it names the node, for a
    /// collector agent on every node. `None`: the sidecar exports nothing.
    pub subscriber_otlp_endpoint: Option<String>,
    /// How the subscriber finds the index-server replicas behind
    /// `index_server` (its `--index-server-discovery`).
    pub index_server_discovery: IndexServerDiscovery,
    /// Pull secrets (names of Secrets in the pod's namespace) added to every
    /// pod the webhook wires, so the injected images come from a private
    /// registry as the chart's own pods do.
    pub image_pull_secrets: Vec<String>,
    /// Set: the subscriber produces to a Kafka topic (`--transport kafka`)
    /// instead of streaming to the index server over gRPC, so it gets no
    /// `--index-server`, token or index-server CA. `None` keeps the gRPC
    /// wiring byte-identical to what it was before this setting existed.
    pub subscriber_kafka: Option<SubscriberKafka>,
}

/// The Kafka producer settings handed to every injected subscriber (its
/// `--kafka-*` flags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscriberKafka {
    /// `--kafka-brokers`: bootstrap brokers, comma-separated.
    pub brokers: String,
    /// `--kafka-topic`.
    pub topic: String,
    /// `--kafka-security-protocol`: `plaintext`, `ssl`, `sasl_plaintext`
    /// or `sasl_ssl`.
    pub security_protocol: String,
    /// `--kafka-sasl-mechanism`.
    pub sasl_mechanism: Option<String>,
    /// `--kafka-sasl-username`.
    pub sasl_username: Option<String>,
    /// The Secret, in the engine pod's own namespace (a pod cannot mount
    /// another namespace's), holding the SASL password: mounted read-only
    /// and passed as `--kafka-sasl-password-file`.
    pub sasl_password_secret: Option<SecretKeyRef>,
    /// The brokers' CA bundle (PEM), handed inline (`IC_KAFKA_CA_PEM`) for
    /// the same reason as `index_server_ca_pem`.
    pub ca_pem: Option<String>,
}

/// A key of a Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key holding the value.
    pub key: String,
}

/// The pod volume holding the subscriber's Kafka SASL password.
pub const SUBSCRIBER_KAFKA_SASL_VOLUME: &str = "inferencecache-kafka-sasl";
/// Where the subscriber reads it (`password` inside).
pub const SUBSCRIBER_KAFKA_SASL_DIR: &str = "/var/run/secrets/inferencecache.io/kafka-sasl";

impl InjectionConfig {
    /// The audience of the subscriber's index-server token, when it has
    /// one: only a subscriber streaming over gRPC presents it.
    pub fn token_audience(&self) -> Option<&str> {
        self.index_server_audience
            .as_deref()
            .filter(|_| self.subscriber_kafka.is_none())
    }

    /// The Secret the subscriber's SASL password is mounted from.
    pub fn kafka_sasl_secret(&self) -> Option<&SecretKeyRef> {
        self.subscriber_kafka
            .as_ref()
            .and_then(|k| k.sasl_password_secret.as_ref())
    }
}

/// How a subscriber turns its `--index-server` URL into destinations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IndexServerDiscovery {
    /// One destination per URL: the subscriber's own default, so nothing
    /// is injected (pods wired before replicas existed keep their args).
    #[default]
    Static,
    /// The URL's host is a headless Service, re-resolved: one destination
    /// per replica address.
    Dns,
}

impl IndexServerDiscovery {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Dns => "dns",
        }
    }
}

/// What the subscriber is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberPlan {
    /// `--model-id`.
    pub model_id: String,
    /// `--hash-scheme` (`vllm` / `sglang`).
    pub hash_scheme: &'static str,
    /// `--ignore-block-removed=true` (a lower tier keeps evicted blocks).
    pub ignore_block_removed: bool,
    /// `--engine-port`, for the reported serving address.
    pub engine_port: i32,
    /// `--engine-metrics-url`: the engine's `/metrics` (tier-2 hits, load,
    /// KV cache size).
    pub engine_metrics_url: Option<String>,
    /// Where the engine publishes (from its `--kv-events-config`).
    pub publisher: crate::kv_events::Publisher,
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_owned(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// A sidecar's resources: requests only, or limits equal to the requests
/// when the pod is Guaranteed — a container without limits would demote
/// the whole pod to Burstable (losing, e.g., exclusive CPUs under the
/// kubelet's static CPU manager and its place in the eviction order).
fn sidecar_resources(cpu: &str, memory: &str, guaranteed: bool) -> ResourceRequirements {
    let amounts = BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ]);
    ResourceRequirements {
        limits: guaranteed.then(|| amounts.clone()),
        requests: Some(amounts),
        ..ResourceRequirements::default()
    }
}

/// Whether the pod's own containers (init and regular, ours excluded) are
/// all in the Guaranteed shape: cpu and memory limits set, requests absent
/// (defaulted to the limits) or equal to them.
pub fn is_guaranteed(spec: &PodSpec) -> bool {
    let guaranteed = |c: &Container| {
        let Some(res) = &c.resources else {
            return false;
        };
        let Some(limits) = &res.limits else {
            return false;
        };
        ["cpu", "memory"].iter().all(|name| {
            let Some(limit) = limits.get(*name).and_then(|q| quantity::parse(&q.0).ok()) else {
                return false;
            };
            match res.requests.as_ref().and_then(|r| r.get(*name)) {
                None => true,
                Some(request) => quantity::parse(&request.0).is_ok_and(|r| r == limit),
            }
        })
    };
    let mut own = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| !is_injected(c))
        .peekable();
    own.peek().is_some() && own.all(guaranteed)
}

/// The subscriber sidecar. The image's entrypoint is the subscriber binary;
/// identity comes from the downward API through the env names the binary
/// reads (`POD_NAME`, `POD_NAMESPACE`, `POD_IP`).
pub fn subscriber_container(
    image: &str,
    config: &InjectionConfig,
    plan: &SubscriberPlan,
    guaranteed: bool,
) -> Container {
    use ic_api::consts::injected::{SUBSCRIBER_TOKEN_DIR, SUBSCRIBER_TOKEN_VOLUME};
    let index_server = config.index_server.trim();
    let mut args = vec![
        format!("--model-id={}", plan.model_id),
        format!("--hash-scheme={}", plan.hash_scheme),
    ];
    let kafka = config.subscriber_kafka.as_ref();
    if let Some(kafka) = kafka {
        args.extend(kafka_args(kafka));
    } else if !index_server.is_empty() {
        args.push(format!("--index-server={index_server}"));
        if config.index_server_discovery != IndexServerDiscovery::Static {
            args.push(format!(
                "--index-server-discovery={}",
                config.index_server_discovery.as_str()
            ));
        }
    }
    let token = config.token_audience().is_some();
    let sasl = config.kafka_sasl_secret().is_some();
    if token {
        args.push(format!(
            "--index-server-token-file={SUBSCRIBER_TOKEN_DIR}/token"
        ));
    }
    args.push(format!("--engine-endpoint={}", plan.publisher.endpoint));
    if let Some(replay) = &plan.publisher.replay_endpoint {
        args.push(format!("--replay-endpoint={replay}"));
    }
    if !plan.publisher.topic.is_empty() {
        args.push(format!("--topic={}", plan.publisher.topic));
    }
    args.push(format!("--engine-port={}", plan.engine_port));
    if plan.ignore_block_removed {
        args.push("--ignore-block-removed=true".to_owned());
    }
    if let Some(url) = &plan.engine_metrics_url {
        args.push(format!("--engine-metrics-url={url}"));
    }
    let otlp = config.subscriber_otlp_endpoint.as_deref();
    if let Some(endpoint) = otlp {
        args.push(format!("--otlp-endpoint={endpoint}"));
    }
    Container {
        name: SUBSCRIBER_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        args: Some(args),
        env: Some({
            let mut env = vec![
                marker(SUBSCRIBER_CONTAINER),
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                field_env("POD_IP", "status.podIP"),
            ];
            if otlp.is_some() {
                // Kubernetes expands $(HOST_IP) in args from this variable.
                env.push(field_env("HOST_IP", "status.hostIP"));
            }
            match kafka {
                None => {
                    if let Some(pem) = config.index_server_ca_pem.as_deref() {
                        env.push(EnvVar {
                            name: "IC_INDEX_SERVER_CA_PEM".to_owned(),
                            value: Some(pem.to_owned()),
                            ..EnvVar::default()
                        });
                    }
                }
                Some(kafka) => {
                    if let Some(pem) = kafka.ca_pem.as_deref() {
                        env.push(EnvVar {
                            name: "IC_KAFKA_CA_PEM".to_owned(),
                            value: Some(pem.to_owned()),
                            ..EnvVar::default()
                        });
                    }
                }
            }
            env
        }),
        ports: Some(vec![ContainerPort {
            name: Some(SUBSCRIBER_METRICS_PORT_NAME.to_owned()),
            container_port: SUBSCRIBER_ADMIN_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        resources: Some(sidecar_resources("50m", "64Mi", guaranteed)),
        security_context: Some(subscriber_security_context()),
        volume_mounts: (token || sasl).then(|| {
            let mut mounts = Vec::new();
            if token {
                mounts.push(VolumeMount {
                    name: SUBSCRIBER_TOKEN_VOLUME.to_owned(),
                    mount_path: SUBSCRIBER_TOKEN_DIR.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                });
            }
            if sasl {
                mounts.push(VolumeMount {
                    name: SUBSCRIBER_KAFKA_SASL_VOLUME.to_owned(),
                    mount_path: SUBSCRIBER_KAFKA_SASL_DIR.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                });
            }
            mounts
        }),
        ..Container::default()
    }
}

/// The subscriber's `--transport kafka` flags.
fn kafka_args(kafka: &SubscriberKafka) -> Vec<String> {
    let mut args = vec![
        "--transport=kafka".to_owned(),
        format!("--kafka-brokers={}", kafka.brokers.trim()),
        format!("--kafka-topic={}", kafka.topic.trim()),
        format!(
            "--kafka-security-protocol={}",
            kafka.security_protocol.trim()
        ),
    ];
    if let Some(mechanism) = &kafka.sasl_mechanism {
        args.push(format!("--kafka-sasl-mechanism={mechanism}"));
    }
    if let Some(user) = &kafka.sasl_username {
        args.push(format!("--kafka-sasl-username={user}"));
    }
    if kafka.sasl_password_secret.is_some() {
        args.push(format!(
            "--kafka-sasl-password-file={SUBSCRIBER_KAFKA_SASL_DIR}/password"
        ));
    }
    args
}

/// Puts the volume of the subscriber's Kafka SASL password on the pod (the
/// Secret's `key` as `password`), or takes ours away when `secret` is
/// `None`. Only a volume of that name from a Secret is ours. The Secret is
/// optional: a namespace without it still starts its engine, and the
/// subscriber stops at start naming `--kafka-sasl-password-file`.
pub fn converge_kafka_sasl_volume(
    volumes: &mut Option<Vec<Volume>>,
    secret: Option<&SecretKeyRef>,
) {
    let was_none = volumes.is_none();
    let list = volumes.get_or_insert_with(Vec::new);
    let before = list.len();
    match secret {
        Some(secret) => crate::merge::upsert_volume(
            list,
            Volume {
                name: SUBSCRIBER_KAFKA_SASL_VOLUME.to_owned(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.name.clone()),
                    items: Some(vec![KeyToPath {
                        key: secret.key.clone(),
                        path: "password".to_owned(),
                        mode: None,
                    }]),
                    optional: Some(true),
                    default_mode: None,
                }),
                ..Volume::default()
            },
        ),
        None => list.retain(|v| !(v.name == SUBSCRIBER_KAFKA_SASL_VOLUME && v.secret.is_some())),
    }
    if list.is_empty() && (was_none || before > 0) {
        *volumes = None;
    }
}

/// Seconds the subscriber's projected token is valid; the kubelet renews
/// it at 80 % of that, and the subscriber re-reads it on every reconnect.
pub const SUBSCRIBER_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// Adds each of `secrets` to the pod's `imagePullSecrets` unless the pod
/// already names it (so re-admission changes nothing); blank names are
/// ignored and the pod's own entries keep their order.
pub fn add_pull_secrets(spec: &mut PodSpec, secrets: &[String]) {
    for name in secrets.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let list = spec.image_pull_secrets.get_or_insert_with(Vec::new);
        if !list.iter().any(|r| r.name == name) {
            list.push(LocalObjectReference {
                name: name.to_owned(),
            });
        }
    }
}

/// Puts the subscriber's projected token volume (bound to `audience`) on
/// the pod, or takes ours away when `audience` is `None`. Only a volume of
/// that name holding exactly one service-account token is ours.
pub fn converge_token_volume(volumes: &mut Option<Vec<Volume>>, audience: Option<&str>) {
    use ic_api::consts::injected::SUBSCRIBER_TOKEN_VOLUME;
    let was_none = volumes.is_none();
    let list = volumes.get_or_insert_with(Vec::new);
    let before = list.len();
    match audience {
        Some(audience) => crate::merge::upsert_volume(
            list,
            Volume {
                name: SUBSCRIBER_TOKEN_VOLUME.to_owned(),
                // No mode: the kubelet gives a token file 0600 owned by the
                // only container mounting it (the subscriber's user).
                projected: Some(ProjectedVolumeSource {
                    default_mode: None,
                    sources: Some(vec![VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            audience: Some(audience.to_owned()),
                            expiration_seconds: Some(SUBSCRIBER_TOKEN_EXPIRATION_SECONDS),
                            path: "token".to_owned(),
                        }),
                        ..VolumeProjection::default()
                    }]),
                }),
                ..Volume::default()
            },
        ),
        None => list.retain(|v| {
            let ours = v.name == SUBSCRIBER_TOKEN_VOLUME
                && v.projected.as_ref().is_some_and(|p| {
                    p.sources
                        .as_ref()
                        .is_some_and(|s| s.len() == 1 && s[0].service_account_token.is_some())
                });
            !ours
        }),
    }
    // Empty because nothing was there, or because only ours was: no list
    // (as before we added it).
    if list.is_empty() && (was_none || before > 0) {
        *volumes = None;
    }
}

/// The subscriber's security context: everything the restricted Pod
/// Security level asks for, so wiring never turns an admissible pod into a
/// rejected one. The image holds one binary and runs as 65532.
pub fn subscriber_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".to_owned()]),
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(SUBSCRIBER_UID),
        run_as_group: Some(SUBSCRIBER_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// The kernel-check mode a pod is admitted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCheckMode {
    /// Injected; failures are reported, the pod starts anyway.
    ReportOnly,
    /// Injected; a failure keeps the pod in Init.
    Strict,
    /// Not injected.
    Off,
}

impl KernelCheckMode {
    /// Value recorded in the pod's `lmcache-kernel-check-mode` annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReportOnly => kernel_check::REPORT_ONLY,
            Self::Strict => kernel_check::STRICT,
            Self::Off => kernel_check::OFF,
        }
    }
}

/// Whether the engine container asks for a GPU (any `<vendor>/gpu`
/// resource with a positive quantity).
pub fn requests_gpu(engine: &Container) -> bool {
    let Some(res) = &engine.resources else {
        return false;
    };
    res.limits
        .iter()
        .chain(res.requests.iter())
        .flatten()
        .any(|(name, q)| {
            name.ends_with("/gpu") && crate::quantity::parse(&q.0).is_ok_and(|q| q.is_positive())
        })
}

/// The mode for `engine` under `backend`'s annotation. An unrecognised
/// value (which admission rejects) reads as `auto`: the pod webhook must
/// not block a pod over it.
pub fn kernel_check_mode(backend: &CacheBackend, engine: &Container) -> KernelCheckMode {
    let value = backend
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::LMCACHE_KERNEL_CHECK))
        .map(String::as_str)
        .unwrap_or_default();
    match value {
        kernel_check::REPORT_ONLY => KernelCheckMode::ReportOnly,
        kernel_check::STRICT => KernelCheckMode::Strict,
        kernel_check::OFF => KernelCheckMode::Off,
        _ if requests_gpu(engine) => KernelCheckMode::ReportOnly,
        _ => KernelCheckMode::Off,
    }
}

/// Python run by the kernel check. A small parent (no torch) runs the load
/// in a child process and writes the verdict, so a child that is killed
/// (OOM at the container's limit) or hangs is still reported, as
/// `inconclusive` rather than as a kernel failure. The child imports torch
/// (the extension links against it), then loads LMCache's compiled CUDA
/// extension straight from its shared object — a plain import falls back to
/// a shim on failure and would always "succeed". The extension's name
/// depends on the LMCache version: `cuda_ops` from 0.5, `c_ops` before.
/// With `LMCACHE_KERNEL_CHECK_REMOTE=mooncakestore` it also imports the
/// Mooncake client LMCache's connector needs (LMCache only logs a warning
/// when it is missing, and tier 2 silently does nothing).
///
/// The verdicts go to the termination message (the format the controller
/// parses): `LMCACHE_KERNELS=ok|failed|inconclusive` with the cause on the
/// next line, then, when asked, `LMCACHE_REMOTE=ok|failed` and its cause.
/// Report-only always exits 0; strict exits 1 unless everything is ok.
pub const KERNEL_CHECK_SCRIPT: &str = r#"import json, os, subprocess, sys
strict = os.environ.get("LMCACHE_KERNEL_CHECK_MODE") == "strict"
CHILD = """
import glob, importlib, importlib.machinery, importlib.util, json, os, sys
out = {}
def kernels():
    import torch
    from importlib import metadata
    try:
        version = metadata.version("lmcache")
    except metadata.PackageNotFoundError:
        version = "unknown"
    pkg = importlib.util.find_spec("lmcache")
    if pkg is None or not pkg.submodule_search_locations:
        return ["failed", "lmcache is not importable"]
    for name in ("cuda_ops", "c_ops"):
        objects = []
        for d in pkg.submodule_search_locations:
            objects += sorted(glob.glob(os.path.join(d, name + "*.so")))
        if objects:
            break
    if not objects:
        return ["failed", "lmcache %s ships no compiled CUDA extension (lmcache/cuda_ops*.so or lmcache/c_ops*.so): a CPU-only or source build" % version]
    full = "lmcache." + name
    loader = importlib.machinery.ExtensionFileLoader(full, objects[0])
    spec = importlib.util.spec_from_file_location(full, objects[0], loader=loader)
    loader.exec_module(importlib.util.module_from_spec(spec))
    return ["ok", "lmcache %s: loaded %s (torch %s)" % (version, objects[0], torch.__version__)]
for key, run in (("kernels", kernels),):
    try:
        out[key] = run()
    except MemoryError:
        out[key] = ["inconclusive", "out of memory while loading torch and the extension: raise the check's memory"]
    except BaseException as e:
        out[key] = ["failed", "%s: %s" % (type(e).__name__, e)]
if os.environ.get("LMCACHE_KERNEL_CHECK_REMOTE") == "mooncakestore":
    try:
        importlib.import_module("mooncake.store")
        out["remote"] = ["ok", "mooncake.store imports"]
    except BaseException as e:
        out["remote"] = ["failed", "the Mooncake client LMCache's mooncakestore connector needs does not import in the engine image (%s: %s); install mooncake-transfer-engine" % (type(e).__name__, e)]
print(json.dumps(out))
"""
def finish(kernels, remote=None):
    text = "LMCACHE_KERNELS=%s\n%s\n" % (kernels[0], kernels[1].strip())
    if remote:
        text += "LMCACHE_REMOTE=%s\n%s\n" % (remote[0], remote[1].strip())
    sys.stdout.write(text)
    sys.stdout.flush()
    try:
        with open("/dev/termination-log", "w") as f:
            f.write(text)
    except OSError:
        pass
    ok = kernels[0] == "ok" and (remote is None or remote[0] == "ok")
    sys.exit(0 if ok or not strict else 1)
def tail(text):
    return (text or "").strip().splitlines()[-1:] or ["no output"]
try:
    try:
        timeout = float(os.environ.get("LMCACHE_KERNEL_CHECK_TIMEOUT_SECONDS") or "240")
    except ValueError:
        timeout = 240.0
    try:
        run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        finish(["inconclusive", "the check timed out after %gs loading torch and the lmcache extension" % timeout])
    if run.returncode == -9:
        finish(["inconclusive", "the check process was killed (SIGKILL: most likely OOM-killed at the container's memory limit)"])
    if run.returncode < 0:
        # A crash while loading the extension (SIGSEGV, SIGABRT) is the
        # kernels failing, not the check.
        finish(["failed", "loading the extension crashed with signal %d: %s" % (-run.returncode, tail(run.stderr)[0])])
    try:
        result = json.loads(tail(run.stdout)[0])
        kernels = result["kernels"]
    except (ValueError, KeyError, TypeError):
        finish(["inconclusive", "the check process exited %d: %s" % (run.returncode, tail(run.stderr or run.stdout)[0])])
    finish(kernels, result.get("remote"))
except SystemExit:
    raise
except BaseException as e:
    finish(["inconclusive", "the check itself failed: %s: %s" % (type(e).__name__, e)])
"#;

/// Env naming the remote connector whose client the kernel check imports.
pub const KERNEL_CHECK_REMOTE_ENV: &str = "LMCACHE_KERNEL_CHECK_REMOTE";

/// Memory the kernel check is given: importing torch and the extension
/// peaks near 690 MiB, so 1 GiB leaves headroom. As an init container it
/// adds nothing to the pod's effective request once the engine asks for
/// more (engines ask for many GiB).
pub const KERNEL_CHECK_MEMORY: &str = "1Gi";
/// CPU the kernel check is given: importing torch takes seconds of CPU, so
/// a throttled tenth of a core (a Guaranteed pod's limit) would take
/// minutes; the engine's request subsumes a whole core.
pub const KERNEL_CHECK_CPU: &str = "1";

/// The kernel-check init container, in the engine's own image: requests
/// sized for importing torch and no limits (the shape least likely to trip
/// a LimitRange), unless the pod is Guaranteed. A Mooncake binding also
/// has it check that the engine image carries the Mooncake client.
pub fn kernel_check_container(
    engine: &Container,
    image: &str,
    mode: KernelCheckMode,
    guaranteed: bool,
    remote: Option<Protocol>,
) -> Container {
    let mut env_list = vec![
        marker(KERNEL_CHECK_CONTAINER),
        env(KERNEL_CHECK_MODE_ENV, mode.as_str()),
    ];
    if remote == Some(Protocol::MooncakeStore) {
        env_list.push(env(
            KERNEL_CHECK_REMOTE_ENV,
            Protocol::MooncakeStore.scheme(),
        ));
    }
    Container {
        name: KERNEL_CHECK_CONTAINER.to_owned(),
        image: Some(image.to_owned()),
        security_context: Some(engine_image_security_context(engine, false)),
        command: Some(vec![
            "python3".to_owned(),
            "-c".to_owned(),
            KERNEL_CHECK_SCRIPT.to_owned(),
        ]),
        env: Some(env_list),
        resources: Some(sidecar_resources(
            KERNEL_CHECK_CPU,
            KERNEL_CHECK_MEMORY,
            guaranteed,
        )),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    }
}

/// Refuses a pod whose containers squat one of our sidecar names.
pub fn check_squatting(spec: &PodSpec, name: &str) -> Result<(), String> {
    let all = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in all {
        if c.name == name && !is_ours(c, name) {
            return Err(format!(
                "container name {name:?} is reserved by the InferenceCache webhook; rename it"
            ));
        }
    }
    Ok(())
}

/// Puts our `desired` container into `list` (converging an earlier render),
/// or removes an earlier render of `name` when `desired` is `None`.
pub fn converge(list: &mut Vec<Container>, name: &str, desired: Option<Container>) {
    match desired {
        Some(c) => upsert_container(list, c),
        None => list.retain(|c| !(c.name == name && is_ours(c, name))),
    }
}

/// [`converge`] for an optional list (init containers): an absent list
/// stays absent when nothing is put in it.
pub fn converge_opt(list: &mut Option<Vec<Container>>, name: &str, desired: Option<Container>) {
    let was_none = list.is_none();
    let mut v = list.take().unwrap_or_default();
    converge(&mut v, name, desired);
    *list = if v.is_empty() && was_none {
        None
    } else {
        Some(v)
    };
}

/// Engine pods of a Mooncake binding join its transfer mesh from the host
/// network; only applied together with the connector wiring.
pub fn apply_host_network(spec: &mut PodSpec) {
    spec.host_network = Some(true);
    spec.dns_policy = Some("ClusterFirstWithHostNet".to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_check_speaks_the_controllers_result_format() {
        for verdict in [
            kernel_check::RESULT_OK,
            kernel_check::RESULT_FAILED,
            kernel_check::RESULT_INCONCLUSIVE,
        ] {
            assert!(KERNEL_CHECK_SCRIPT.contains(&format!("\"{verdict}\"")));
        }
        for key in [kernel_check::RESULT_KEY, kernel_check::REMOTE_KEY] {
            assert!(KERNEL_CHECK_SCRIPT.contains(&format!("\"{key}=%s")));
        }
        assert!(KERNEL_CHECK_SCRIPT.contains(KERNEL_CHECK_MODE_ENV));
        assert!(KERNEL_CHECK_SCRIPT.contains(KERNEL_CHECK_REMOTE_ENV));
    }
}
