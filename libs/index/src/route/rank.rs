//! The load-aware half of [`super::route_ranked`]: the walk's matches,
//! real and speculative, scored with every eligible replica's load, and the
//! hint chosen. Runs after the walk has released the index's registry;
//! the matches' names are borrowed from their registry entries, which the
//! caller keeps.

use crate::pick::{HeldHashes, PickInput, id_hash};
use crate::registry::Members;
use crate::types::{Fingerprint, Match, ReplicaKey};

use super::shortlist::{Eligible, SHORTLIST_ABOVE, Shortlist, rank_eligible};
use super::{NoHintReason, Ranked, RouteKey, RoutePolicy, RouteQuery, Scoring, monotone};

/// What the walk decided, borrowed for the ranking.
#[derive(Clone, Copy)]
pub(super) struct Decided<'a, 'q> {
    /// The query, its key the prompt's fingerprints (or a prefix hash).
    pub(super) query: &'a RouteQuery<'q>,
    /// The holders worth routing on, in the walk's order (empty: none).
    pub(super) matches: &'a [Match<'a>],
    /// [`id_hash`] of each of `matches`' replica ids, in their order.
    pub(super) match_hashes: &'a [u64],
    /// The scope's members (`None`: none, or a pool is scored instead).
    pub(super) members: Option<&'a Members>,
    /// The prompt's fingerprints.
    pub(super) blocks: &'a [Fingerprint],
    /// Tokens per block in the scope.
    pub(super) block_size: u32,
    /// Full blocks in the prompt (0 for a prefix-hash query).
    pub(super) prompt_blocks: u32,
}

/// Ranks `decided`'s holders and the scope's (or the pool's) other
/// eligible replicas; the answer's `blocks` are left empty for the caller.
pub(super) fn rank_matches(
    decided: &Decided<'_, '_>,
    policy: &RoutePolicy,
    now_ms: i64,
    scoring: &Scoring<'_>,
) -> Ranked {
    let stale_ms = i64::try_from(policy.replica_stale_after.as_millis()).unwrap_or(i64::MAX);
    let Decided {
        query,
        matches,
        blocks,
        block_size,
        prompt_blocks,
        ..
    } = *decided;
    // Borrowed from the pool or the scope's shared member list: nothing
    // per replica is copied before the ranking has chosen.
    let members = match scoring.pool {
        Some(_) => None,
        None => decided.members,
    };
    let fresh_since = Some(now_ms.saturating_sub(stale_ms));
    let speculative = match query.key {
        RouteKey::PrefixHash(_) => Vec::new(),
        _ => {
            let holders: smallvec::SmallVec<[(&str, u32); 8]> = matches
                .iter()
                .map(|m| (m.replica.replica_id.as_str(), m.matched_blocks))
                .collect();
            scoring
                .source
                .speculative(scoring.scope_tag, blocks, &holders, now_ms)
        }
    };
    let input = PickInput {
        replicas: &[],
        matches,
        speculative: &speculative,
        prompt_blocks,
        block_size,
        tie_seed: blocks.last().map_or(0, |f| f.0),
    };
    // The holders' id hashes, read once for the whole ranking.
    let held = HeldHashes::with_match_hashes(&input, decided.match_hashes);
    let eligible = match (scoring.pool, members, scoring.source.board()) {
        (Some(pool), _, _) => {
            let ids: Vec<&str> = pool.iter().map(|(k, _)| k.replica_id.as_str()).collect();
            let loads = scoring.source.loads(&ids, now_ms);
            Eligible {
                replicas: pool.iter().map(|(k, a)| (k, a.as_str())).collect(),
                id_hashes: ids.iter().map(|id| id_hash(id)).collect(),
                loads,
                fleet: None,
            }
        }
        (None, Some(members), Some(board)) => {
            board.with_members(scoring.scope_tag, members, now_ms, |reader, resolved| {
                // A large scope without a candidate set reads its holders
                // and its shortlist only; a bound of 0 keeps none (every
                // replica ranked, nothing built).
                let settings = reader.settings();
                let mut keep = query.candidates.is_none()
                    && members.len() > SHORTLIST_ABOVE
                    && settings.shortlist_refresh_ms > 0
                    && settings.shortlist_refresh_changes > 0
                    && monotone(scoring.weights);
                // The prompt's holders and the list's best others, ranked.
                let from_list = |list: &Shortlist| {
                    let holders: smallvec::SmallVec<[u64; 16]> = held.hashes().collect();
                    list.eligible(
                        members,
                        resolved,
                        reader,
                        &input,
                        &holders,
                        fresh_since,
                        scoring.others,
                    )
                };
                if keep {
                    // Read under the lock, not cloned: a clone's count is
                    // one more write every lookup and pick would share.
                    let shortlist = resolved.shortlist.read();
                    if let Some(shortlist) = shortlist
                        .as_deref()
                        .filter(|s| s.serves(&input, scoring.weights, reader))
                    {
                        match from_list(shortlist) {
                            Ok(eligible) => return eligible,
                            // Fresh but of no use to this prompt: rebuilt
                            // only when picks wore it out.
                            Err(worn) => keep = worn,
                        }
                    }
                }
                // No pick adds itself to the old list and misses the new.
                let rebuilding = keep.then(|| resolved.rebuilding.write());
                let mut eligible = Eligible::with_capacity(members.len());
                let mut positions = Vec::with_capacity(if keep { members.len() } else { 0 });
                for (i, m) in members.iter().enumerate() {
                    if m.answers(query.candidates, fresh_since) {
                        eligible.push(
                            (&m.key, m.address.as_str()),
                            reader.member(resolved, i),
                            resolved.id_hashes[i],
                        );
                        if keep {
                            positions.push(u32::try_from(i).unwrap_or(u32::MAX));
                        }
                    }
                }
                if keep {
                    // Built from the loads just read: the lookup that
                    // finds the shortlist stale pays one pass, as before.
                    let rebuilt = std::sync::Arc::new(Shortlist::build(
                        members.len(),
                        &positions,
                        &eligible.loads,
                        &input,
                        scoring.weights,
                        reader,
                    ));
                    *resolved.shortlist.write() = Some(std::sync::Arc::clone(&rebuilt));
                    reader.refreshed();
                    drop(rebuilding);
                    // Answered from the list just built, as the next
                    // lookups are (the same answer as ranking every
                    // replica): its holders and the few listed others
                    // ranked, not every load a second time.
                    if let Ok(listed) = from_list(&rebuilt) {
                        return listed;
                    }
                    return eligible;
                }
                drop(rebuilding);
                eligible
            })
        }
        (None, Some(members), None) => {
            let replicas: Vec<(&ReplicaKey, &str)> = members
                .iter()
                .filter(|m| m.answers(query.candidates, fresh_since))
                .map(|m| (&m.key, m.address.as_str()))
                .collect();
            let ids: Vec<&str> = replicas
                .iter()
                .map(|(k, _)| k.replica_id.as_str())
                .collect();
            Eligible {
                loads: scoring.source.loads(&ids, now_ms),
                id_hashes: ids.iter().map(|id| id_hash(id)).collect(),
                replicas,
                fleet: None,
            }
        }
        (None, None, _) => Eligible::default(),
    };
    // Every holder and the best few others, scored as among the whole scope.
    let ranked = rank_eligible(
        &eligible,
        &input,
        &held,
        scoring.weights,
        scoring.others,
        scoring.holders,
    );
    let holder_within = ranked
        .iter()
        .position(|s| s.matched_blocks > 0 && !s.over_bound)
        // By predicted TTFT a holder ranked below a non-holder answers
        // later: hinting it anyway sent every prompt sharing a first block
        // to that block's holder (the chat workload's collapse).
        .filter(|&i| scoring.weights.ttft.is_none() || i == 0);
    let other_within = ranked
        .iter()
        .any(|s| s.matched_blocks == 0 && !s.over_bound);
    let hint = holder_within.or_else(|| {
        // Nobody is within the bound (too little load seen to tell): the
        // best holder still gets the hint.
        (!other_within)
            .then(|| ranked.iter().position(|s| s.matched_blocks > 0))
            .flatten()
    });
    let no_hint = match hint {
        Some(_) => None,
        None if matches.is_empty() && speculative.is_empty() => Some((
            NoHintReason::NoEntry,
            "no replica holds the first block".to_owned(),
        )),
        None => Some((
            NoHintReason::LoadBound,
            if scoring.weights.ttft.is_some() {
                "a replica holding none of the prompt is predicted to answer first"
            } else {
                "every replica holding the prefix is over its load bound"
            }
            .to_owned(),
        )),
    };
    // Load alone decides for a gateway that named its candidates: it sends
    // the request somewhere anyway, and a pick the index never hears of
    // hides that load from every later decision.
    let by_load = (hint.is_none() && query.candidates.is_some() && !ranked.is_empty()).then_some(0);
    Ranked {
        block_size,
        prompt_blocks,
        ranked,
        hint,
        no_hint,
        by_load,
        // Attached by the caller, which owns them.
        blocks: Vec::new(),
        // The pool's eligible list is the whole pool, in order.
        pool_loads: if scoring.pool.is_some() {
            eligible.loads
        } else {
            Vec::new()
        },
    }
}
