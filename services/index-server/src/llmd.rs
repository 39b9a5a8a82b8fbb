//! llm-d's remote indexer API, `indexer.v1.IndexerService/GetPodScores`,
//! on the gRPC port: an llm-d router that scores remotely (its precise
//! prefix-cache scorer pointed at a remote indexer) reads our index. A thin
//! adapter: it validates, asks the core for the prefix matches
//! ([`IndexCore::route`] with [`Purpose::Scores`]: the model's tokenizer,
//! the tenant's policy) and converts with [`ic_index::pod_scores`].
//!
//! Answers are what llm-d's own server gives: one entry per pod (a
//! data-parallel pod's best rank unless the caller names a rank), each
//! block weighted by its own tier, pods named `ip:port` when the caller
//! names none.
//!
//! The scores are prefix scores only, as llm-d's indexer gives them: the
//! router weighs them against its own load scorers, and the call is not a
//! pick (nothing is counted in our load board or speculation).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ic_index::pod_scores::{TierWeights, block_by_block_score, pod_scores, uniform_score};
use ic_index::{Candidate, HashScheme, LookupOutcome, Scope, Tier};
use ic_proto::llmd_indexer_v1 as pb;
use ic_proto::llmd_indexer_v1::indexer_service_server::IndexerService;
use tonic::{Request, Response, Status};

use crate::grpc::IndexServer;
use crate::index_core::{IndexCore, Prompt, Purpose, RouteError, RouteRequest, Routed};
use crate::tokenize::EncodeError;

/// Whose engines the API scores.
#[derive(Clone, Debug)]
pub struct IndexerConfig {
    /// The index tenant (namespace) of the scored engines: the API has no
    /// tenant field, so one server answers it for one namespace.
    pub tenant: String,
    /// Fingerprint domain of those engines.
    pub hash_scheme: HashScheme,
    /// Weight of a block by tier.
    pub weights: TierWeights,
}

/// The `IndexerService` implementation.
#[derive(Clone, Debug)]
pub struct LlmdIndexer {
    /// The gRPC front end whose callers this API shares (access control).
    server: IndexServer,
    core: Arc<IndexCore>,
    config: Arc<IndexerConfig>,
}

impl LlmdIndexer {
    /// The API beside `server` (its core and access control) for
    /// `config`'s tenant.
    pub fn new(server: IndexServer, config: IndexerConfig) -> Self {
        Self {
            core: server.core().clone(),
            server,
            config: Arc::new(config),
        }
    }

    /// GetPodScores without gRPC; the outcome word is for the metric.
    fn score(
        &self,
        req: &pb::GetPodScoresRequest,
    ) -> Result<(pb::GetPodScoresResponse, &'static str), (Status, &'static str)> {
        let started = Instant::now();
        let invalid = |m: String| (Status::invalid_argument(m), "invalid");
        if req.model_name.trim().is_empty() {
            return Err(invalid("model_name: required".into()));
        }
        if req.prompt.is_empty() {
            return Err(invalid("prompt: required".into()));
        }
        let text_max = self.server.limits.max_prompt_text_bytes;
        if req.prompt.len() > text_max {
            return Err((
                self.server.over_limit(
                    "prompt_text_bytes",
                    format!("prompt: at most {text_max} bytes (--max-prompt-text-bytes)"),
                ),
                "invalid",
            ));
        }
        let max = self.server.limits.max_candidates;
        if req.pod_identifiers.len() > max {
            return Err((
                self.server.over_limit(
                    "candidates",
                    format!("pod_identifiers: at most {max} entries (--max-candidates)"),
                ),
                "invalid",
            ));
        }
        let scope = Scope {
            tenant: self.config.tenant.clone(),
            model: req.model_name.clone(),
            hash_scheme: self.config.hash_scheme,
            adapter: String::new(),
        };
        let routed = self.core.route(&RouteRequest {
            scope: &scope,
            prompt: Prompt::Text(&req.prompt),
            candidates: None,
            extras: None,
            received: started,
            purpose: Purpose::Scores,
        });
        let matches = match routed {
            Ok(Routed::Scores(matches)) => matches,
            Ok(_) => {
                return Err((
                    Status::internal("the core answered another purpose"),
                    "invalid",
                ));
            }
            Err(RouteError::Tokenize(e @ EncodeError::NoTokenizer(_))) => {
                return Err((
                    Status::failed_precondition(format!("model_name: {e}")),
                    "no_tokenizer",
                ));
            }
            Err(e) => return Err(invalid(format!("prompt: {e}"))),
        };
        let (matches, outcome) = match matches {
            Ok(m) => (m, "scored"),
            Err(ic_index::route::NoHintReason::LookupTimeout) => (Vec::new(), "timeout"),
            Err(_) => (Vec::new(), "no_match"),
        };
        let known = self.core.index().replicas_in(&scope, None, None);
        let weighted = self.weighted(&scope, &req.prompt, matches, started);
        let scores = pod_scores(&known, &weighted, &req.pod_identifiers)
            .into_iter()
            .map(|s| pb::PodScore {
                pod: s.pod,
                score: s.score,
                data_parallel_rank: s.dp_rank.map(|r| i32::try_from(r).unwrap_or(i32::MAX)),
            })
            .collect::<Vec<_>>();
        let outcome = if outcome == "scored" && scores.is_empty() {
            "no_match"
        } else {
            outcome
        };
        Ok((pb::GetPodScoresResponse { scores }, outcome))
    }
}

impl LlmdIndexer {
    /// Each match with its score, block by block as llm-d weighs it. A T1
    /// match is T1 in every block; a T2 match (its coldest block is T2) is
    /// looked at block by block, with the prompt's blocks from a second,
    /// uncounted pass through the core (only then: it tokenizes again).
    fn weighted(
        &self,
        scope: &Scope,
        prompt: &str,
        matches: Vec<Candidate>,
        received: Instant,
    ) -> Vec<(Candidate, f64)> {
        let weights = self.config.weights;
        let mut blocks: Option<Vec<ic_index::Fingerprint>> = None;
        matches
            .into_iter()
            .map(|m| {
                if m.tier == Tier::T1 || m.matched_blocks == 0 {
                    let score = uniform_score(&m, weights);
                    return (m, score);
                }
                let blocks =
                    blocks.get_or_insert_with(|| self.prompt_blocks(scope, prompt, received));
                let score = self.tiers_of(scope, &m, blocks).map_or_else(
                    || uniform_score(&m, weights),
                    |t| block_by_block_score(t, weights),
                );
                (m, score)
            })
            .collect()
    }

    /// The prompt's block fingerprints (empty when the core gives none).
    fn prompt_blocks(
        &self,
        scope: &Scope,
        prompt: &str,
        received: Instant,
    ) -> Vec<ic_index::Fingerprint> {
        match self.core.route(&RouteRequest {
            scope,
            prompt: Prompt::Text(prompt),
            candidates: None,
            extras: None,
            received,
            purpose: Purpose::Hint { record_pick: false },
        }) {
            Ok(Routed::Hint(ranked)) => ranked.blocks,
            _ => Vec::new(),
        }
    }

    /// The tier of each block `m` holds, from one look per block at that
    /// block's holders narrowed to its replica; `None` when the blocks do
    /// not cover the match (the index changed in between). Each block is
    /// asked through [`ic_index::Index::lookup_prefix_hash`], which finds a
    /// block at any depth: [`ic_index::Index::lookup`] takes a prompt from
    /// its first block, and a block after the first asked that way is a
    /// miss.
    fn tiers_of(
        &self,
        scope: &Scope,
        m: &Candidate,
        blocks: &[ic_index::Fingerprint],
    ) -> Option<Vec<Tier>> {
        let n = usize::try_from(m.matched_blocks).ok()?;
        let only: HashSet<String> = [m.replica.replica_id.clone()].into();
        let index = self.core.index();
        blocks
            .get(..n)?
            .iter()
            .map(
                |&fp| match index.lookup_prefix_hash(scope, fp, Some(&only), None) {
                    LookupOutcome::Matches(found) => found
                        .into_iter()
                        .find(|c| c.replica == m.replica)
                        .map(|c| c.tier),
                    _ => None,
                },
            )
            .collect()
    }
}

#[tonic::async_trait]
impl IndexerService for LlmdIndexer {
    async fn get_pod_scores(
        &self,
        request: Request<pb::GetPodScoresRequest>,
    ) -> Result<Response<pb::GetPodScoresResponse>, Status> {
        let caller = self.server.caller(&request, "pod_scores").await?;
        self.server
            .access
            .authorize_lookup(&caller, &self.config.tenant)
            .await
            .map_err(|d| self.server.refused("pod_scores", &d))?;
        let started = Instant::now();
        // Tokenizing is CPU work: keep it off the I/O threads.
        let me = self.clone();
        let result = tokio::task::spawn_blocking(move || me.score(request.get_ref()))
            .await
            .map_err(|e| Status::internal(format!("scoring task failed: {e}")))?;
        let (outcome, result) = match result {
            Ok((response, outcome)) => (outcome, Ok(Response::new(response))),
            Err((status, outcome)) => (outcome, Err(status)),
        };
        self.core.metrics().llmd_scored(outcome, started.elapsed());
        result
    }
}
