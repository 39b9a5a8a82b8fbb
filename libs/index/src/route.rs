//! The routing core: one query, one namespace policy and the current time
//! in, one decision out. Protocol-free, so LookupRoute, the functional
//! probe and every future front end (a gateway endpoint picker, a Kafka-fed
//! replica) decide the same way; each adapter only validates its input,
//! calls [`route`] and converts the answer.
//!
//! A decision is reached in this order: the key becomes block fingerprints
//! (token ids are chained with the scope's block size); replicas silent for
//! longer than the policy's staleness bound are left out; the index scores
//! the rest (within the deadline); tier-2-only matches are dropped when the
//! policy excludes them; the best match must reach the minimum prefix.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use ic_kvevents::chain_fingerprints;

use crate::Index;
use crate::types::{Deadline, Fingerprint, LookupView, Match, Scope, Tier};

/// What to route on.
#[derive(Clone, Copy, Debug)]
pub enum RouteKey<'a> {
    /// The fingerprint of a prompt's last full block: the replicas holding
    /// it hold its whole prefix.
    PrefixHash(Fingerprint),
    /// A prompt's block fingerprints, in order.
    Blocks(&'a [Fingerprint]),
    /// A prompt's token ids (fingerprinted here with the scope's block size).
    Tokens(&'a [u32]),
}

/// One routing question.
#[derive(Clone, Copy, Debug)]
pub struct RouteQuery<'a> {
    /// Whose index to look in.
    pub scope: &'a Scope,
    /// What to look up.
    pub key: RouteKey<'a>,
    /// Only these replica ids may be answered (`None`: any).
    pub candidates: Option<&'a HashSet<String>>,
}

/// A namespace's routing policy (what a CachePolicy says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutePolicy {
    /// Budget of one lookup.
    pub lookup_timeout: Duration,
    /// Matches shorter than this many tokens are not worth routing on.
    pub minimum_prefix_tokens: u64,
    /// Replicas silent for longer are left out.
    pub replica_stale_after: Duration,
    /// Whether a prefix held only at T2 may be returned.
    pub allow_tier2_matches: bool,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        Self {
            lookup_timeout: Duration::from_millis(20),
            minimum_prefix_tokens: 0,
            replica_stale_after: Duration::from_secs(120),
            allow_tier2_matches: true,
        }
    }
}

/// Why no replica was recommended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoHintReason {
    /// Nothing was ever reported for the scope.
    UnknownModel,
    /// The prompt has no full block.
    PromptTooShort,
    /// No eligible replica holds the first block (or only at an excluded tier).
    NoEntry,
    /// The best match is shorter than the policy's minimum.
    BelowMinimumPrefix,
    /// The deadline passed before the lookup finished.
    LookupTimeout,
}

/// A decision, with the replicas' names borrowed from the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOutcome<'a> {
    /// Replicas holding a prefix worth routing on, best first.
    Route(Vec<Match<'a>>),
    /// No recommendation, and why.
    NoHint {
        /// The reason.
        reason: NoHintReason,
        /// A sentence for humans.
        detail: String,
    },
}

/// What [`route`] decided and the facts it used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDecision<'a> {
    /// Tokens per block in the scope (learned from events, else the default).
    pub block_size: u32,
    /// Full blocks in the prompt (0 for a prefix-hash query).
    pub prompt_blocks: u32,
    /// The decision.
    pub outcome: RouteOutcome<'a>,
}

fn no_hint(reason: NoHintReason, detail: String) -> RouteOutcome<'static> {
    RouteOutcome::NoHint { reason, detail }
}

/// Decides `query` under `policy` at `now_ms` (Unix ms, for staleness),
/// giving up when `deadline` expires, and hands the decision to `answer`
/// while the index lends the replicas' names (the registry stays
/// read-locked meanwhile: `answer` should only convert). `default_block_size`
/// fingerprints token ids in a scope that has not reported one yet.
pub fn route<R>(
    index: &Index,
    query: &RouteQuery<'_>,
    policy: &RoutePolicy,
    default_block_size: u32,
    now_ms: i64,
    deadline: &dyn Deadline,
    answer: impl FnOnce(RouteDecision<'_>) -> R,
) -> R {
    let scope = query.scope;
    let block_size = index.block_size(scope).unwrap_or(default_block_size);
    let stale_ms = i64::try_from(policy.replica_stale_after.as_millis()).unwrap_or(i64::MAX);
    let fresh_since = Some(now_ms.saturating_sub(stale_ms));
    let blocks: Option<Cow<'_, [Fingerprint]>> = match query.key {
        RouteKey::PrefixHash(_) => None,
        RouteKey::Blocks(b) => Some(Cow::Borrowed(b)),
        RouteKey::Tokens(t) => Some(Cow::Owned(chain_fingerprints(None, t, block_size as usize))),
    };
    let prompt_blocks = blocks
        .as_ref()
        .map_or(0, |b| u32::try_from(b.len()).unwrap_or(u32::MAX));
    let decide = |view: LookupView<'_>| {
        let outcome = match view {
            LookupView::UnknownScope => no_hint(
                NoHintReason::UnknownModel,
                format!(
                    "no events seen for tenant {:?} model {:?} ({})",
                    scope.tenant,
                    scope.model,
                    scope.hash_scheme.as_str()
                ),
            ),
            LookupView::TimedOut => no_hint(
                NoHintReason::LookupTimeout,
                format!("lookup took longer than {:?}", policy.lookup_timeout),
            ),
            LookupView::NoEntry if prompt_blocks == 0 && blocks.is_some() => no_hint(
                NoHintReason::PromptTooShort,
                format!("the prompt has no full block of {block_size} tokens"),
            ),
            LookupView::NoEntry => no_hint(
                NoHintReason::NoEntry,
                "no replica holds the first block".into(),
            ),
            LookupView::Matches(all) => {
                let allowed: Vec<Match<'_>> = all
                    .iter()
                    .filter(|m| policy.allow_tier2_matches || m.tier == Tier::T1)
                    .copied()
                    .collect();
                match allowed.first() {
                    None => no_hint(
                        NoHintReason::NoEntry,
                        "only tier-2 matches, which this namespace's policy excludes".into(),
                    ),
                    Some(best) if best.matched_tokens() < policy.minimum_prefix_tokens => no_hint(
                        NoHintReason::BelowMinimumPrefix,
                        format!(
                            "best match is {} tokens, below the minimum of {}",
                            best.matched_tokens(),
                            policy.minimum_prefix_tokens
                        ),
                    ),
                    Some(_) => RouteOutcome::Route(allowed),
                }
            }
        };
        answer(RouteDecision {
            block_size,
            prompt_blocks,
            outcome,
        })
    };
    if deadline.expired() {
        // Fingerprinting a long prompt already spent the budget.
        return decide(LookupView::TimedOut);
    }
    match &blocks {
        None => {
            let RouteKey::PrefixHash(fp) = query.key else {
                return decide(LookupView::NoEntry);
            };
            index.lookup_prefix_hash_with(scope, fp, query.candidates, fresh_since, decide)
        }
        Some(fps) => {
            index.lookup_until(scope, fps, query.candidates, fresh_since, deadline, decide)
        }
    }
}
