//! The functional probe behind `POST /probe`: a deterministic synthetic
//! round trip through the real ingest and routing code, so a backend that
//! looks healthy but cannot actually route (key skew, a broken ingest
//! path) is caught.
//!
//! The synthetic replica lives under [`PROBE_TENANT`], which no request
//! can name, and is removed when the probe ends: it never
//! affects real lookups or `/snapshot`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ic_index::{Fingerprint, HashScheme, LookupOutcome, ReplicaKey, Scope};
use ic_kvevents::chain_fingerprints;
use ic_proto::index_v1 as pb;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::convert::reason_to_pb;
use crate::convert::{PROBE_TENANT, is_namespace_name};
use crate::index_core::{IndexCore, Prompt, Purpose, RouteRequest, Routed};
use crate::ingest::IngestStream;
use crate::metrics::StageLabels;

/// Blocks in the synthetic prompt.
const PROBE_BLOCKS: usize = 4;
/// Tokens per synthetic block.
const PROBE_BLOCK_SIZE: u32 = 16;

/// `POST /probe` body.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProbeRequest {
    /// The CacheBackend's namespace.
    pub namespace: String,
    /// The CacheBackend's name.
    pub backend: String,
}

impl ProbeRequest {
    /// Checks the names (the error names the field).
    pub fn validate(&self) -> Result<(), String> {
        if !is_namespace_name(&self.namespace) {
            return Err(format!(
                "namespace: {:?} is not a Kubernetes namespace name",
                self.namespace
            ));
        }
        let name_ok = !self.backend.is_empty()
            && self.backend.len() <= 253
            && self
                .backend
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.');
        if !name_ok {
            return Err(format!(
                "backend: {:?} is not a Kubernetes object name",
                self.backend
            ));
        }
        Ok(())
    }
}

/// Outcome of one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StageOutcome {
    /// The stage round-tripped.
    Ok,
    /// The stage ran and failed; the message says where.
    Failed,
    /// The stage did not run.
    Skipped,
}

impl StageOutcome {
    fn as_str(self) -> &'static str {
        match self {
            StageOutcome::Ok => "ok",
            StageOutcome::Failed => "failed",
            StageOutcome::Skipped => "skipped",
        }
    }
}

/// One stage's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StageReport {
    /// `ingest`, `routing` or `t2`.
    pub stage: &'static str,
    /// What happened.
    pub outcome: StageOutcome,
    /// Diagnostic for the operator.
    pub message: String,
}

/// `POST /probe` response body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeReport {
    /// Echoed.
    pub namespace: String,
    /// Echoed.
    pub backend: String,
    /// Whether no stage failed.
    pub ok: bool,
    /// Every stage, in order: ingest, routing, t2.
    pub stages: Vec<StageReport>,
    /// Wall time of the probe.
    pub duration_micros: u64,
}

/// Runs probes against a server's in-process ingest and routing paths.
#[derive(Clone, Debug)]
pub struct Prober {
    core: Arc<IndexCore>,
    runs: Arc<AtomicU64>,
}

fn stage(stage: &'static str, outcome: StageOutcome, message: impl Into<String>) -> StageReport {
    StageReport {
        stage,
        outcome,
        message: message.into(),
    }
}

impl Prober {
    /// A prober over `core`.
    pub fn new(core: Arc<IndexCore>) -> Self {
        Self {
            core,
            runs: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Runs every stage for one backend (the request must be valid).
    pub fn run(&self, req: &ProbeRequest, now_ms: i64) -> ProbeReport {
        let started = Instant::now();
        let run = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        let scope = Scope {
            tenant: PROBE_TENANT.to_owned(),
            model: format!("{}/{}", req.namespace, req.backend),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        };
        let key = ReplicaKey {
            tenant: PROBE_TENANT.to_owned(),
            replica_id: format!("probe-{run}"),
            dp_rank: 0,
        };
        let tokens = probe_tokens(req, run);
        let ingest = self.ingest_stage(&scope, &key, &tokens, run, now_ms);
        let routing = if ingest.outcome == StageOutcome::Ok {
            self.routing_stage(&scope, &key, &tokens)
        } else {
            stage(
                "routing",
                StageOutcome::Skipped,
                "not run: the ingest stage failed",
            )
        };
        // Always leave nothing behind, whatever failed.
        self.core.index().remove_replica(&key);
        let t2 = stage(
            "t2",
            StageOutcome::Skipped,
            "no tier-2 prober is registered in this server",
        );
        let stages = vec![ingest, routing, t2];
        for s in &stages {
            self.core
                .metrics()
                .probe_stages
                .get_or_create(&StageLabels {
                    stage: s.stage,
                    outcome: s.outcome.as_str(),
                })
                .inc();
        }
        let ok = stages.iter().all(|s| s.outcome != StageOutcome::Failed);
        tracing::info!(
            namespace = %req.namespace,
            backend = %req.backend,
            ok,
            "functional probe finished"
        );
        ProbeReport {
            namespace: req.namespace.clone(),
            backend: req.backend.clone(),
            ok,
            stages,
            duration_micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// Sends a synthetic batch through the IngestEvents state machine and
    /// index application, then checks the index holds it.
    fn ingest_stage(
        &self,
        scope: &Scope,
        key: &ReplicaKey,
        tokens: &[u32],
        run: u64,
        now_ms: i64,
    ) -> StageReport {
        let fingerprints = chain_fingerprints(None, tokens, PROBE_BLOCK_SIZE as usize);
        let Some(&last) = fingerprints.last() else {
            return stage("ingest", StageOutcome::Failed, "no synthetic blocks");
        };
        let batch = pb::IngestBatch {
            replica: Some(pb::ReplicaIdentity {
                scope: Some(scope_pb(scope)),
                replica_id: key.replica_id.clone(),
                address: "probe".into(),
                dp_rank: 0,
                incarnation: run,
            }),
            seq: 1,
            resync_begin: true,
            resync_end: true,
            events: vec![pb::IndexEvent {
                kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
                    parent_fingerprint: 0,
                    start_depth: 0,
                    fingerprints: Fingerprint::to_raw(fingerprints),
                    block_size: PROBE_BLOCK_SIZE,
                    tier: pb::Tier::T1 as i32,
                    at_unix_ms: now_ms,
                })),
            }],
            tier2_stats: None,
            engine_load: None,
            engine_cache: None,
            history_incomplete: false,
            sent_at_unix_ms: now_ms,
            trace_context: std::collections::HashMap::new(),
        };
        let step = match IngestStream::for_probe().accept(batch) {
            Ok(step) => step,
            Err(e) => {
                return stage(
                    "ingest",
                    StageOutcome::Failed,
                    format!("synthesized batch rejected by the ingest path: {e}"),
                );
            }
        };
        if let Err(end) = self.core.ingest(step, None) {
            return stage(
                "ingest",
                StageOutcome::Failed,
                format!("ingest path ended a fresh stream: {end:?}"),
            );
        }
        let held = match self
            .core
            .index()
            .lookup_prefix_hash(scope, last, None, None)
        {
            LookupOutcome::Matches(m) => m
                .iter()
                .any(|c| c.replica == *key && c.matched_blocks as usize == PROBE_BLOCKS),
            LookupOutcome::NoEntry | LookupOutcome::UnknownScope | LookupOutcome::TimedOut => false,
        };
        if held {
            stage(
                "ingest",
                StageOutcome::Ok,
                format!("synthesized {PROBE_BLOCKS}-block event found in the index"),
            )
        } else {
            stage(
                "ingest",
                StageOutcome::Failed,
                "synthesized event not in index: the in-process ingest path is broken",
            )
        }
    }

    /// Routes the synthetic prompt (as token ids, through the core's own
    /// key derivation) and expects the synthetic replica back.
    fn routing_stage(&self, scope: &Scope, key: &ReplicaKey, tokens: &[u32]) -> StageReport {
        let routed = self.core.route(&RouteRequest {
            scope,
            prompt: Prompt::Tokens(tokens),
            candidates: None,
            extras: None,
            received: Instant::now(),
            // The probe's own lookups must not count as routed requests.
            purpose: Purpose::Hint { record_pick: false },
        });
        let decision = match routed {
            Ok(Routed::Hint(decision)) => decision,
            Ok(_) => {
                return stage(
                    "routing",
                    StageOutcome::Failed,
                    "the core answered another purpose",
                );
            }
            Err(e) => {
                return stage(
                    "routing",
                    StageOutcome::Failed,
                    format!("LookupRoute refused the synthetic prompt: {e}"),
                );
            }
        };
        match (&decision.no_hint, decision.best()) {
            (None, Some(b))
                if b.replica.replica_id == key.replica_id
                    && b.matched_blocks as usize == PROBE_BLOCKS =>
            {
                stage(
                    "routing",
                    StageOutcome::Ok,
                    format!("LookupRoute matched all {PROBE_BLOCKS} synthetic blocks"),
                )
            }
            (None, Some(b)) => stage(
                "routing",
                StageOutcome::Failed,
                format!(
                    "LookupRoute matched {} of {PROBE_BLOCKS} blocks on {:?}: routing or key \
                     derivation disagrees with ingest",
                    b.matched_blocks,
                    Some(b.replica.replica_id.as_str())
                ),
            ),
            (no_hint, _) => {
                let (reason, detail) = no_hint
                    .as_ref()
                    .map_or(("NO_ENTRY", "no replica to route to"), |(r, d)| {
                        (reason_to_pb(*r).as_str_name(), d.as_str())
                    });
                stage(
                    "routing",
                    StageOutcome::Failed,
                    format!(
                        "LookupRoute answered NO_HINT ({reason}: {detail}) for a prompt the \
                         index holds: routing or key derivation is broken"
                    ),
                )
            }
        }
    }
}

fn scope_pb(scope: &Scope) -> pb::IndexScope {
    pb::IndexScope {
        tenant: scope.tenant.clone(),
        model: scope.model.clone(),
        hash_scheme: match scope.hash_scheme {
            HashScheme::Vllm => pb::HashScheme::Vllm as i32,
            HashScheme::Sglang => pb::HashScheme::Sglang as i32,
        },
        adapter: scope.adapter.clone(),
    }
}

/// Deterministic per backend and run, so concurrent probes never share blocks.
fn probe_tokens(req: &ProbeRequest, run: u64) -> Vec<u32> {
    let mut out = Vec::with_capacity(PROBE_BLOCKS * PROBE_BLOCK_SIZE as usize);
    let mut counter = 0u32;
    while out.len() < PROBE_BLOCKS * PROBE_BLOCK_SIZE as usize {
        let digest = Sha256::new()
            .chain_update(req.namespace.as_bytes())
            .chain_update([0])
            .chain_update(req.backend.as_bytes())
            .chain_update(run.to_be_bytes())
            .chain_update(counter.to_be_bytes())
            .finalize();
        out.extend(
            digest
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) % 200_000),
        );
        counter += 1;
    }
    out.truncate(PROBE_BLOCKS * PROBE_BLOCK_SIZE as usize);
    out
}
