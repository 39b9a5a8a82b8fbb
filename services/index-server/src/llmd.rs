//! llm-d's remote indexer API, `indexer.v1.IndexerService/GetPodScores`,
//! on the gRPC port: an llm-d router that scores remotely (its precise
//! prefix-cache scorer pointed at a remote indexer) reads our index. A thin
//! adapter: it validates, asks the core for the prefix matches
//! ([`IndexCore::route`] with [`Purpose::Scores`]: the model's tokenizer,
//! the tenant's policy) and converts with [`ic_index::pod_scores`].
//!
//! The scores are prefix scores only, as llm-d's indexer gives them: the
//! router weighs them against its own load scorers, and the call is not a
//! pick (nothing is counted in our load board or speculation).

use std::sync::Arc;
use std::time::Instant;

use ic_index::pod_scores::{TierWeights, pod_scores};
use ic_index::{HashScheme, Scope};
use ic_proto::llmd_indexer_v1 as pb;
use ic_proto::llmd_indexer_v1::indexer_service_server::IndexerService;
use tonic::{Request, Response, Status};

use crate::grpc::{IndexServer, MAX_CANDIDATES};
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
        if req.pod_identifiers.len() > MAX_CANDIDATES {
            return Err(invalid(format!(
                "pod_identifiers: at most {MAX_CANDIDATES} entries"
            )));
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
        let scores = pod_scores(&known, &matches, &req.pod_identifiers, self.config.weights)
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
