//! The endpoint picker's flags and what they resolve to: the pools, the
//! body limit, the request objectives and the shedding thresholds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;

use crate::EngineFamily;
use crate::epp_wire::POOL_METADATA;
use ic_index::HashScheme;

/// Envoy's default per-connection buffer (1 MiB): a BUFFERED body up to it
/// must always fit in one ext_proc message.
pub const ENVOY_DEFAULT_BUFFER_BYTES: usize = 1 << 20;

/// Room for what travels with a BUFFERED body in one ext_proc message
/// (attributes, metadata, framing), over the body itself.
pub const MESSAGE_OVERHEAD_BYTES: usize = 256 << 10;

/// `--epp-max-held-body-bytes` by default: sixteen bodies of the largest
/// size read at once.
pub const DEFAULT_MAX_HELD_BODY_BYTES: usize = 16 * crate::openai::MAX_BODY_BYTES;

/// Endpoint picker flags.
#[derive(Clone, Debug, clap::Args)]
pub struct EppFlags {
    /// Serve the Gateway API endpoint picker (Envoy ext_proc, with
    /// grpc.health.v1) on this address; off when unset.
    #[arg(long, env = "IC_EPP_ADDR")]
    pub epp_addr: Option<SocketAddr>,

    /// Namespace of the endpoint picker's pool: the index tenant its
    /// engines report under.
    #[arg(long, env = "IC_EPP_TENANT")]
    pub epp_tenant: Option<String>,

    /// The pool's ready endpoints, `ip:port` (comma-separated or repeated);
    /// for local runs, instead of --epp-pool.
    #[arg(long = "epp-endpoint", env = "IC_EPP_ENDPOINTS", value_delimiter = ',')]
    pub epp_endpoints: Vec<String>,

    /// The InferencePools whose ready pods are the endpoints, watched
    /// through the Kubernetes API: `[NAMESPACE/]NAME` (NAMESPACE defaults
    /// to --epp-tenant), repeated or comma-separated. With several, the
    /// gateway names a request's pool in the ext_proc call's
    /// `x-inferencecache-pool` gRPC metadata.
    #[arg(long = "epp-pool", env = "IC_EPP_POOL", value_delimiter = ',')]
    pub epp_pools: Vec<String>,

    /// A static endpoint of a named pool, `[NAMESPACE/]POOL=ip:port`
    /// (repeated or comma-separated): several pools without the
    /// Kubernetes API, for local runs.
    #[arg(
        long = "epp-pool-endpoint",
        env = "IC_EPP_POOL_ENDPOINTS",
        value_delimiter = ','
    )]
    pub epp_pool_endpoints: Vec<String>,

    /// Fingerprint scheme of the pool's engines.
    #[arg(long, env = "IC_EPP_HASH_SCHEME", value_enum, default_value = "vllm")]
    pub epp_hash_scheme: EngineFamily,

    /// Answer 429 to a sheddable request (its InferenceObjective's priority
    /// is negative) when even the least busy endpoint of the pool is busy
    /// with this many requests, in flight through the picker or reported
    /// by the engine (running + waiting); 0 never sheds.
    #[arg(long, env = "IC_EPP_SHED_AT_REQUESTS", default_value_t = 0)]
    pub epp_shed_at_requests: u32,

    /// The same for requests of priority 0 (and requests naming no known
    /// objective); 0 never sheds them.
    #[arg(long, env = "IC_EPP_SHED_STANDARD_AT_REQUESTS", default_value_t = 0)]
    pub epp_shed_standard_at_requests: u32,

    /// The same for critical requests (positive priority): refused last;
    /// 0 never sheds them.
    #[arg(long, env = "IC_EPP_SHED_CRITICAL_AT_REQUESTS", default_value_t = 0)]
    pub epp_shed_critical_at_requests: u32,

    /// An InferenceObjective and its priority, `NAME=PRIORITY` (repeated or
    /// comma-separated): a request naming NAME in its
    /// `x-gateway-inference-objective` header has that priority.
    #[arg(
        long = "epp-objective",
        env = "IC_EPP_OBJECTIVES",
        value_delimiter = ','
    )]
    pub epp_objectives: Vec<String>,

    /// Largest request body the picker reads, bytes. A BUFFERED body over
    /// it is answered with 413 at once; a streamed one is routed by load.
    /// The picker's gRPC message limit is this plus 256 KiB. At least
    /// Envoy's default buffer (1 MiB).
    #[arg(long, env = "IC_EPP_MAX_BODY_BYTES", default_value_t = crate::openai::MAX_BODY_BYTES)]
    pub epp_max_body_bytes: usize,

    /// Bytes of request bodies the picker holds at once across all its
    /// streams (to read them, or until the pick for a full-duplex stream).
    /// A stream whose next chunk would pass it is routed by load, counted
    /// in `epp_unread_total{reason="held_body_budget"}`; a BUFFERED body
    /// too. At least --epp-max-body-bytes.
    #[arg(long, env = "IC_EPP_MAX_HELD_BODY_BYTES", default_value_t = DEFAULT_MAX_HELD_BODY_BYTES)]
    pub epp_max_held_body_bytes: usize,

    /// Endpoints named after the pick (least busy first) in
    /// `x-gateway-destination-endpoint`, for a gateway with retries to
    /// fall back on (protocol v0.4+); 0 names the pick alone, at most
    /// [`MAX_FALLBACK_ENDPOINTS`].
    #[arg(long, env = "IC_EPP_FALLBACK_ENDPOINTS", default_value_t = 2)]
    pub epp_fallback_endpoints: usize,

    /// Largest request body whose text or chat prompt the picker renders,
    /// tokenizes and decides on the runtime thread that received it,
    /// bytes; a larger one is handed to a blocking thread and back (four
    /// context switches more a pick). 0 (the default) hands every one
    /// over: inline, a ~2,000-token chat holds its runtime thread ~1 ms
    /// (about 2 M tokens/s a core), and two streams landing on one thread
    /// then wait for each other (2 gateways on 2 cores: 1,028-1,100
    /// picks/s inline against 1,211-1,477 for the same server handing
    /// over, 9-30 % fewer, and 1,325-1,506 for an earlier server
    /// (bf2f2007) handing over, 17-32 % fewer; docs/benchmarks.md);
    /// a lone stream saves the hand-over's wake-ups. At most
    /// [`INLINE_READ_BYTES`] (a larger body is read off the runtime
    /// anyway). `inferencecache_index_epp_tokenizing_total`
    /// counts each kind by thread.
    #[arg(
        long,
        env = "IC_EPP_INLINE_TOKENIZE_BYTES",
        default_value_t = DEFAULT_INLINE_TOKENIZE_BYTES
    )]
    pub epp_inline_tokenize_bytes: usize,
}

/// `--epp-inline-tokenize-bytes`'s default: every prompt to tokenize
/// handed to a blocking thread.
pub const DEFAULT_INLINE_TOKENIZE_BYTES: usize = 0;

/// Largest body read on the runtime's thread that received it: reading
/// costs about an instruction a byte (more for token ids), so up to this
/// it delays the thread's other streams by microseconds, less than a hand
/// over to another thread costs; a larger body is read off the runtime.
/// Also the largest `--epp-inline-tokenize-bytes`.
pub const INLINE_READ_BYTES: usize = 64 * 1024;

/// Most fallback endpoints a pick may name: a gateway retries a few, and
/// each one is ranked and written into every answer.
pub const MAX_FALLBACK_ENDPOINTS: usize = 16;

/// Shedding thresholds by request priority, requests on the least busy
/// endpoint; `None` never sheds that class.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Shedding {
    /// Priority below 0.
    pub sheddable: Option<f64>,
    /// Priority 0, or no known objective.
    pub standard: Option<f64>,
    /// Priority above 0.
    pub critical: Option<f64>,
}

impl Shedding {
    /// From request counts where 0 means never; the error names what is
    /// out of order (critical traffic must never be refused before
    /// sheddable traffic).
    pub fn from_counts(sheddable: u32, standard: u32, critical: u32) -> Result<Self, String> {
        let some = |n: u32| (n > 0).then_some(f64::from(n));
        let s = Self {
            sheddable: some(sheddable),
            standard: some(standard),
            critical: some(critical),
        };
        // A class with a threshold is refused no earlier than the classes
        // below it: its threshold is at least theirs, and they shed too.
        let order = [
            ("sheddable", s.sheddable),
            ("standard", s.standard),
            ("critical", s.critical),
        ];
        for (i, (hi_name, hi)) in order.iter().enumerate() {
            let Some(hi) = hi else { continue };
            for (lo_name, lo) in &order[..i] {
                match lo {
                    None => {
                        return Err(format!(
                            "{hi_name} requests shed at {hi} while {lo_name} requests never do: \
                             lower priorities must shed first"
                        ));
                    }
                    Some(lo) if lo > hi => {
                        return Err(format!(
                            "{hi_name} requests shed at {hi}, before {lo_name} requests ({lo})"
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(s)
    }

    /// These thresholds with a namespace's CachePolicy over them (a count
    /// of 0 there: never).
    pub fn with(&self, overrides: crate::policy::ShedOverrides) -> Self {
        let pick = |o: Option<u32>, flag: Option<f64>| match o {
            Some(0) => None,
            Some(n) => Some(f64::from(n)),
            None => flag,
        };
        Self {
            sheddable: pick(overrides[0], self.sheddable),
            standard: pick(overrides[1], self.standard),
            critical: pick(overrides[2], self.critical),
        }
    }

    /// The threshold for a request of `priority`.
    pub fn at(&self, priority: i32) -> Option<f64> {
        match priority {
            p if p < 0 => self.sheddable,
            0 => self.standard,
            _ => self.critical,
        }
    }
}

/// InferenceObjective priorities by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Objectives(HashMap<String, i32>);

impl Objectives {
    /// From `NAME=PRIORITY` flags.
    pub fn parse(flags: &[String]) -> anyhow::Result<Self> {
        let mut map = HashMap::new();
        for f in flags {
            let (name, priority) = f
                .split_once('=')
                .with_context(|| format!("--epp-objective {f:?}: expected NAME=PRIORITY"))?;
            let name = name.trim();
            if name.is_empty() {
                anyhow::bail!("--epp-objective {f:?}: the name is empty");
            }
            let priority: i32 = priority.trim().parse().with_context(|| {
                format!("--epp-objective {f:?}: the priority must be an integer")
            })?;
            if map.insert(name.to_owned(), priority).is_some() {
                anyhow::bail!("--epp-objective {name:?} appears more than once");
            }
        }
        Ok(Self(map))
    }

    /// The priority of objective `name` (0 when unknown, as the inference
    /// extension treats a request without an objective).
    pub fn priority(&self, name: Option<&str>) -> i32 {
        name.and_then(|n| self.0.get(n)).copied().unwrap_or(0)
    }
}

/// Where the picker's endpoints come from and whose they are.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Namespace of the pool (the index tenant of its engines).
    pub tenant: String,
    /// The InferencePool's name (`None`: a static endpoint list).
    pub name: Option<String>,
    /// Whether the endpoints follow the named InferencePool through the
    /// Kubernetes API ([`crate::pool::watch_pool`]).
    pub watched: bool,
    /// Fingerprint domain of its engines.
    pub hash_scheme: HashScheme,
    /// Ready endpoints, `ip:port` (static, or kept current by
    /// [`crate::pool::watch_pool`]).
    pub endpoints: crate::pool::Endpoints,
    /// When to refuse a request with 429, by its priority.
    pub shedding: Shedding,
    /// The InferenceObjectives requests may name, with their priorities.
    pub objectives: Objectives,
    /// Largest request body read, bytes.
    pub max_body_bytes: usize,
    /// `--epp-max-held-body-bytes` (the picker's, the same in every pool).
    pub max_held_body_bytes: usize,
    /// Endpoints named after the pick, by load, for the gateway to retry
    /// on (0: the pick alone).
    pub fallbacks: usize,
    /// Largest body whose prompt is tokenized on the runtime's thread that
    /// received it (`--epp-inline-tokenize-bytes`).
    pub inline_tokenize_bytes: usize,
    /// What the pool's picks reuse between requests (its endpoints mapped
    /// to index replicas), shared by every clone.
    pub cache: Arc<crate::epp::PoolCache>,
}

impl PoolConfig {
    /// The priority of a request naming `objective`: the InferenceObjective
    /// the controller pushed for the pool's namespace (and pool), else
    /// `--epp-objective`'s, else 0.
    pub fn priority(&self, policies: &crate::policy::Policies, objective: Option<&str>) -> i32 {
        let Some(name) = objective else { return 0 };
        policies
            .objective_priority(&self.tenant, self.name.as_deref(), name)
            .unwrap_or_else(|| self.objectives.priority(Some(name)))
    }

    /// The shedding thresholds under the namespace's CachePolicy.
    pub fn shedding_under(&self, policies: &crate::policy::Policies) -> Shedding {
        self.shedding.with(policies.shedding(&self.tenant))
    }
}

/// The pool a stream is for: the one `selector` (`[NAMESPACE/]NAME`, the
/// call's `x-inferencecache-pool` metadata) names, or the only one.
pub fn select_pool(
    pools: &[Arc<PoolConfig>],
    selector: Option<&str>,
) -> Result<Arc<PoolConfig>, String> {
    let Some(selector) = selector.map(str::trim).filter(|s| !s.is_empty()) else {
        return match pools {
            [only] => Ok(only.clone()),
            _ => Err(format!(
                "this endpoint picker serves {} pools: name the request's pool in the \
                 ext_proc call's {POOL_METADATA} metadata",
                pools.len()
            )),
        };
    };
    let (ns, name) = match selector.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, selector),
    };
    let mut matching = pools
        .iter()
        .filter(|p| p.name.as_deref() == Some(name) && ns.is_none_or(|ns| ns == p.tenant));
    match (matching.next(), matching.next()) {
        (Some(p), None) => Ok(p.clone()),
        (Some(_), Some(_)) => Err(format!(
            "{POOL_METADATA} {selector:?} names pools of several namespaces: use NAMESPACE/NAME"
        )),
        (None, _) => Err(format!(
            "{POOL_METADATA} {selector:?}: this endpoint picker serves no such pool"
        )),
    }
}

/// `[NAMESPACE/]NAME`: the namespace (`default_ns` when left out) and name.
fn pool_ref(flag: &str, value: &str, default_ns: Option<&str>) -> anyhow::Result<(String, String)> {
    let (ns, name) = match value.trim().split_once('/') {
        Some((ns, name)) => (Some(ns.trim()), name.trim()),
        None => (None, value.trim()),
    };
    if name.is_empty() || ns.is_some_and(str::is_empty) {
        anyhow::bail!("{flag} {value:?}: expected [NAMESPACE/]NAME");
    }
    let ns = ns.or(default_ns).with_context(|| {
        format!("{flag} {value:?}: name the namespace (NAMESPACE/NAME) or set --epp-tenant")
    })?;
    Ok((ns.to_owned(), name.to_owned()))
}

/// A static endpoint, `ip:port`.
fn endpoint(flag: &str, e: &str) -> anyhow::Result<String> {
    let e = e.trim();
    e.parse::<SocketAddr>()
        .with_context(|| format!("{flag} {e:?}: expected ip:port"))?;
    Ok(e.to_owned())
}

impl EppFlags {
    /// The picker's pools from the flags (in the order given); `None` when
    /// it is off.
    pub fn pools(&self) -> anyhow::Result<Option<Vec<PoolConfig>>> {
        let sources = [
            !self.epp_pools.is_empty(),
            !self.epp_endpoints.is_empty(),
            !self.epp_pool_endpoints.is_empty(),
        ];
        if self.epp_addr.is_none() {
            if self.epp_tenant.is_some() || sources.iter().any(|s| *s) {
                anyhow::bail!(
                    "--epp-tenant, --epp-endpoint, --epp-pool and --epp-pool-endpoint need \
                     --epp-addr"
                );
            }
            return Ok(None);
        }
        let tenant = self
            .epp_tenant
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        match sources.iter().filter(|s| **s).count() {
            0 => anyhow::bail!(
                "--epp-addr needs the pool's endpoints: --epp-tenant NAMESPACE with \
                 --epp-endpoint ip:port for each ready engine, --epp-pool [NAMESPACE/]NAME \
                 (an InferencePool to watch), or --epp-pool-endpoint [NAMESPACE/]POOL=ip:port"
            ),
            1 => {}
            _ => anyhow::bail!(
                "--epp-pool, --epp-endpoint and --epp-pool-endpoint are exclusive: watch pools, \
                 list one pool's endpoints, or list named pools' endpoints"
            ),
        }
        if self.epp_max_body_bytes < ENVOY_DEFAULT_BUFFER_BYTES {
            anyhow::bail!(
                "--epp-max-body-bytes must be at least {ENVOY_DEFAULT_BUFFER_BYTES} (Envoy's \
                 default buffer; got {})",
                self.epp_max_body_bytes
            );
        }
        if self.epp_max_held_body_bytes < self.epp_max_body_bytes {
            anyhow::bail!(
                "--epp-max-held-body-bytes must be at least --epp-max-body-bytes ({}; got {}): \
                 a body of the largest size read could never be held",
                self.epp_max_body_bytes,
                self.epp_max_held_body_bytes
            );
        }
        if self.epp_fallback_endpoints > MAX_FALLBACK_ENDPOINTS {
            anyhow::bail!(
                "--epp-fallback-endpoints must be at most {MAX_FALLBACK_ENDPOINTS} (got {})",
                self.epp_fallback_endpoints
            );
        }
        if self.epp_inline_tokenize_bytes > INLINE_READ_BYTES {
            anyhow::bail!(
                "--epp-inline-tokenize-bytes must be at most {INLINE_READ_BYTES} (a \
                 larger body is read off the runtime; got {})",
                self.epp_inline_tokenize_bytes
            );
        }
        let shedding = Shedding::from_counts(
            self.epp_shed_at_requests,
            self.epp_shed_standard_at_requests,
            self.epp_shed_critical_at_requests,
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "--epp-shed-at-requests, --epp-shed-standard-at-requests, \
                 --epp-shed-critical-at-requests: {e}"
            )
        })?;
        let objectives = Objectives::parse(&self.epp_objectives)?;
        let pool =
            |tenant: String, name: Option<String>, endpoints: Vec<String>, watched| PoolConfig {
                tenant,
                name,
                watched,
                hash_scheme: self.epp_hash_scheme.hash_scheme(),
                endpoints: Arc::new(parking_lot::RwLock::new(endpoints)),
                shedding,
                objectives: objectives.clone(),
                max_body_bytes: self.epp_max_body_bytes,
                max_held_body_bytes: self.epp_max_held_body_bytes,
                fallbacks: self.epp_fallback_endpoints,
                inline_tokenize_bytes: self.epp_inline_tokenize_bytes,
                cache: Arc::default(),
            };
        // (namespace, name) -> endpoints, in the order first named.
        let mut named: Vec<((String, String), Vec<String>)> = Vec::new();
        if !self.epp_endpoints.is_empty() {
            let tenant = tenant.context(
                "--epp-endpoint needs --epp-tenant (the namespace of the pool's engines)",
            )?;
            let mut endpoints = Vec::new();
            for e in &self.epp_endpoints {
                let e = endpoint("--epp-endpoint", e)?;
                if !endpoints.contains(&e) {
                    endpoints.push(e);
                }
            }
            return Ok(Some(vec![pool(tenant.to_owned(), None, endpoints, false)]));
        }
        for p in &self.epp_pools {
            let key = pool_ref("--epp-pool", p, tenant)?;
            if named.iter().any(|(k, _)| *k == key) {
                anyhow::bail!("--epp-pool {}/{} appears more than once", key.0, key.1);
            }
            named.push((key, Vec::new()));
        }
        for f in &self.epp_pool_endpoints {
            let (p, e) = f.split_once('=').with_context(|| {
                format!("--epp-pool-endpoint {f:?}: expected [NAMESPACE/]POOL=ip:port")
            })?;
            let key = pool_ref("--epp-pool-endpoint", p, tenant)?;
            let e = endpoint("--epp-pool-endpoint", e)?;
            match named.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) if !list.contains(&e) => list.push(e),
                Some(_) => {}
                None => named.push((key, vec![e])),
            }
        }
        let watched = !self.epp_pools.is_empty();
        Ok(Some(
            named
                .into_iter()
                .map(|((ns, name), endpoints)| pool(ns, Some(name), endpoints, watched))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shedding_refuses_lower_priorities_first() {
        let s = Shedding::from_counts(4, 8, 0).unwrap();
        assert_eq!(s.at(-1), Some(4.0));
        assert_eq!(s.at(0), Some(8.0));
        assert_eq!(s.at(5), None);
        assert_eq!(Shedding::from_counts(0, 0, 0).unwrap(), Shedding::default());
        let out_of_order = Shedding::from_counts(8, 4, 0).unwrap_err();
        assert!(out_of_order.contains("before sheddable"), "{out_of_order}");
        let critical_only = Shedding::from_counts(0, 0, 3).unwrap_err();
        assert!(critical_only.contains("never do"), "{critical_only}");
    }

    fn flags(args: &[&str]) -> EppFlags {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            epp: EppFlags,
        }
        let mut all = vec!["x", "--epp-addr", "127.0.0.1:0"];
        all.extend_from_slice(args);
        <Cli as clap::Parser>::try_parse_from(all).unwrap().epp
    }

    #[test]
    fn pools_from_the_flags() {
        let one = flags(&[
            "--epp-tenant",
            "a",
            "--epp-endpoint",
            "10.0.0.1:1,10.0.0.2:1",
        ])
        .pools()
        .unwrap()
        .unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(
            (one[0].tenant.as_str(), one[0].name.as_deref()),
            ("a", None)
        );
        assert_eq!(one[0].endpoints.read().len(), 2);
        let watched = flags(&["--epp-tenant", "a", "--epp-pool", "chat,b/batch"])
            .pools()
            .unwrap()
            .unwrap();
        let names: Vec<(&str, Option<&str>, bool)> = watched
            .iter()
            .map(|p| (p.tenant.as_str(), p.name.as_deref(), p.watched))
            .collect();
        assert_eq!(
            names,
            [("a", Some("chat"), true), ("b", Some("batch"), true)]
        );
        let fixed = flags(&[
            "--epp-tenant",
            "a",
            "--epp-pool-endpoint",
            "chat=10.0.0.1:1,chat=10.0.0.2:1,b/batch=10.0.0.3:1",
        ])
        .pools()
        .unwrap()
        .unwrap();
        assert_eq!(fixed.len(), 2);
        assert_eq!(*fixed[0].endpoints.read(), ["10.0.0.1:1", "10.0.0.2:1"]);
        assert_eq!((fixed[1].tenant.as_str(), fixed[1].watched), ("b", false));
        for (args, expect) in [
            (&["--epp-pool", "chat"][..], "set --epp-tenant"),
            (
                &["--epp-tenant", "a", "--epp-pool", "a/"][..],
                "expected [NAMESPACE/]NAME",
            ),
            (
                &["--epp-tenant", "a", "--epp-pool", "x,x"][..],
                "more than once",
            ),
            (
                &[
                    "--epp-tenant",
                    "a",
                    "--epp-pool",
                    "x",
                    "--epp-endpoint",
                    "10.0.0.1:1",
                ][..],
                "exclusive",
            ),
            (
                &["--epp-tenant", "a", "--epp-pool-endpoint", "x"][..],
                "POOL=ip:port",
            ),
            (
                &["--epp-tenant", "a", "--epp-pool-endpoint", "x=nope"][..],
                "expected ip:port",
            ),
        ] {
            let e = format!("{:#}", flags(args).pools().unwrap_err());
            assert!(e.contains(expect), "{args:?}: {e}");
        }
    }

    #[test]
    fn a_stream_s_pool_is_the_one_its_metadata_names() {
        let pools: Vec<Arc<PoolConfig>> = flags(&[
            "--epp-tenant",
            "a",
            "--epp-pool-endpoint",
            "chat=10.0.0.1:1,b/chat=10.0.0.2:1,batch=10.0.0.3:1",
        ])
        .pools()
        .unwrap()
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect();
        let name = |s: Option<&str>| {
            select_pool(&pools, s).map(|p| format!("{}/{}", p.tenant, p.name.clone().unwrap()))
        };
        assert_eq!(name(Some("batch")).unwrap(), "a/batch");
        assert_eq!(name(Some("b/chat")).unwrap(), "b/chat");
        assert_eq!(name(Some(" a/chat ")).unwrap(), "a/chat");
        assert!(
            name(Some("chat"))
                .unwrap_err()
                .contains("several namespaces")
        );
        assert!(name(Some("x")).unwrap_err().contains("no such pool"));
        assert!(name(None).unwrap_err().contains("x-inferencecache-pool"));
        let one = [pools[2].clone()];
        assert_eq!(
            select_pool(&one, None).unwrap().name.as_deref(),
            Some("batch")
        );
    }

    #[test]
    fn fallback_endpoints_are_bounded() {
        let with = |n: &str| {
            flags(&[
                "--epp-tenant",
                "a",
                "--epp-endpoint",
                "10.0.0.1:1",
                "--epp-fallback-endpoints",
                n,
            ])
            .pools()
        };
        let most = with("16").unwrap().unwrap();
        assert_eq!(most[0].fallbacks, MAX_FALLBACK_ENDPOINTS);
        assert_eq!(with("0").unwrap().unwrap()[0].fallbacks, 0);
        for over in ["17", &usize::MAX.to_string()] {
            let e = with(over).unwrap_err().to_string();
            assert!(
                e.contains("--epp-fallback-endpoints must be at most 16"),
                "{over}: {e}"
            );
        }
    }

    #[test]
    fn inline_tokenizing_is_bounded_by_the_body_read_inline() {
        let with = |n: Option<&str>| {
            let mut args = vec!["--epp-tenant", "a", "--epp-endpoint", "10.0.0.1:1"];
            args.extend(
                n.map(|n| ["--epp-inline-tokenize-bytes", n])
                    .into_iter()
                    .flatten(),
            );
            flags(&args).pools()
        };
        let default = with(None).unwrap().unwrap();
        assert_eq!(
            default[0].inline_tokenize_bytes,
            DEFAULT_INLINE_TOKENIZE_BYTES
        );
        let most = with(Some("65536")).unwrap().unwrap();
        assert_eq!(most[0].inline_tokenize_bytes, INLINE_READ_BYTES);
        assert_eq!(
            with(Some("0")).unwrap().unwrap()[0].inline_tokenize_bytes,
            0
        );
        let e = with(Some("65537")).unwrap_err().to_string();
        assert!(
            e.contains("--epp-inline-tokenize-bytes must be at most 65536"),
            "{e}"
        );
    }

    #[test]
    fn a_namespace_s_shedding_overrides_the_flags() {
        let flags = Shedding::from_counts(4, 8, 0).unwrap();
        assert_eq!(flags.with([None; 3]), flags);
        let s = flags.with([Some(1), Some(0), None]);
        assert_eq!(
            (s.sheddable, s.standard, s.critical),
            (Some(1.0), None, None)
        );
    }

    #[test]
    fn objectives_parse_and_name_the_bad_flag() {
        let o = Objectives::parse(&["batch=-1".into(), "chat = 2".into()]).unwrap();
        assert_eq!(o.priority(Some("batch")), -1);
        assert_eq!(o.priority(Some("chat")), 2);
        assert_eq!(o.priority(Some("unknown")), 0);
        assert_eq!(o.priority(None), 0);
        for (bad, expect) in [
            ("batch", "expected NAME=PRIORITY"),
            ("=1", "name is empty"),
            ("a=high", "must be an integer"),
        ] {
            let e = format!("{:#}", Objectives::parse(&[bad.into()]).unwrap_err());
            assert!(e.contains(expect), "{bad}: {e}");
        }
        let dup = Objectives::parse(&["a=1".into(), "a=2".into()]).unwrap_err();
        assert!(dup.to_string().contains("more than once"), "{dup}");
    }
}
