//! Which replicas of a scope the ranking scores in full: every replica
//! holding part of the prompt (really or speculatively) and the best
//! `others` of the rest by [`OtherKey`], ranked with the whole
//! scope's [`Fleet`] figures. [`crate::pick::rank_top`] then answers exactly what
//! [`crate::pick::rank`] of every replica answers, while a replica that is
//! neither costs one load read and one key instead of a full score, a name
//! hash, two holder searches and a sort entry.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::load::{LoadReader, MemberLoads, ReplicaLoad};
use crate::pick::{
    Fleet, HeldHashes, OtherKey, PickInput, ScoreWeights, Scored, TtftModel, rank_hashed,
};
use crate::registry::ReplicaMeta;
use crate::types::ReplicaKey;

/// A scope's eligible replicas as the ranking reads them, in one order.
#[derive(Debug, Default)]
pub(super) struct Eligible<'a> {
    /// Replica and address.
    pub(super) replicas: Vec<(&'a ReplicaKey, &'a str)>,
    /// The load of each.
    pub(super) loads: Vec<ReplicaLoad>,
    /// [`id_hash`] of each replica id.
    pub(super) id_hashes: Vec<u64>,
    /// The whole scope's figures, when these are only part of it (a
    /// [`Shortlist`]'s); else computed from `loads`.
    pub(super) fleet: Option<Fleet>,
}

impl<'a> Eligible<'a> {
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            replicas: Vec::with_capacity(n),
            loads: Vec::with_capacity(n),
            id_hashes: Vec::with_capacity(n),
            fleet: None,
        }
    }

    pub(super) fn push(&mut self, replica: (&'a ReplicaKey, &'a str), load: ReplicaLoad, h: u64) {
        self.replicas.push(replica);
        self.loads.push(load);
        self.id_hashes.push(h);
    }
}

/// Ranks `eligible` for the prompt of `input` (its `replicas` are ignored,
/// its holders hashed in `held`): the best `holders` holders and the best
/// `others` others (each at least one), best first.
pub(super) fn rank_eligible(
    eligible: &Eligible<'_>,
    input: &PickInput<'_>,
    held: &HeldHashes,
    weights: &ScoreWeights,
    others: usize,
    holders: usize,
) -> Vec<Scored> {
    let others = others.max(1);
    let n = eligible.replicas.len();
    let fleet = eligible
        .fleet
        .unwrap_or_else(|| Fleet::of(n, &eligible.loads));
    if n <= input.matches.len() + input.speculative.len() + others {
        // Every replica would be scored anyway.
        let all = PickInput {
            replicas: &eligible.replicas,
            ..*input
        };
        return rank_hashed(
            &all,
            weights,
            &eligible.loads,
            &fleet,
            others,
            holders,
            Some(&eligible.id_hashes),
            Some(held),
        );
    }
    // A hash shared by a holder and another replica only scores that one in
    // full too: a superset of the holders changes nothing.
    let holds = |h: u64| held.holds(h);
    let key_of = |i: usize| eligible.replicas[i].0;
    let better = |a: &(OtherKey, usize), b: &(OtherKey, usize)| {
        a.0.rank_cmp(&b.0)
            .then_with(|| key_of(a.1).cmp(key_of(b.1)))
    };
    // On the stack for the usual few holders and others (five allocations
    // a ranking otherwise).
    let mut chosen: smallvec::SmallVec<[usize; 16]> =
        smallvec::SmallVec::with_capacity(held.len() + others);
    // The best others so far, best first.
    let mut best: smallvec::SmallVec<[(OtherKey, usize); 9]> =
        smallvec::SmallVec::with_capacity(others + 1);
    for (i, (&h, load)) in eligible.id_hashes.iter().zip(&eligible.loads).enumerate() {
        if holds(h) {
            chosen.push(i);
            continue;
        }
        let key = (OtherKey::new(input, weights, &fleet, load, h), i);
        if best.len() == others && better(&key, &best[others - 1]).is_ge() {
            continue;
        }
        let at = best.partition_point(|b| better(b, &key).is_lt());
        best.insert(at, key);
        best.truncate(others);
    }
    chosen.extend(best.iter().map(|(_, i)| *i));
    chosen.sort_unstable();
    let replicas: smallvec::SmallVec<[(&ReplicaKey, &str); 16]> =
        chosen.iter().map(|&i| eligible.replicas[i]).collect();
    let loads: smallvec::SmallVec<[ReplicaLoad; 16]> =
        chosen.iter().map(|&i| eligible.loads[i]).collect();
    let hashes: smallvec::SmallVec<[u64; 16]> =
        chosen.iter().map(|&i| eligible.id_hashes[i]).collect();
    let part = PickInput {
        replicas: &replicas,
        ..*input
    };
    rank_hashed(
        &part,
        weights,
        &loads,
        &fleet,
        others,
        holders,
        Some(&hashes),
        Some(held),
    )
}

/// Scopes with more replicas than this (stale ones counted) keep a [`Shortlist`]
/// between lookups; smaller ones read every load (a few hundred
/// instructions in all).
pub(super) const SHORTLIST_ABOVE: usize = 64;

/// Replicas a [`Shortlist`] lists, best first (and every replica tied with
/// the last). A lookup reads them in order only until the others asked for
/// are proven the best; picks make the first ones busier, so a list is read
/// further as it ages, until it is worn out and rebuilt. Longer lists
/// outlive more picks but cost every lookup more reads: at 256 replicas
/// under LookupRoute's load (callgrind, `--shortlist-refresh-ms 1000`),
/// reading a worn list of 64 cost 23 k instructions a lookup
/// (`Shortlist::eligible`), one of 24 5.9 k (commit `c9ce1ee4`; the
/// figures left docs/benchmarks.md when it was pruned, see `git log -p`).
const LISTED: usize = 24;

/// A list of more replicas than this (those tied with the
/// [`LISTED`]th included) is not kept in order: most of the scope is tied
/// (an idle or level fleet), and floors would prove nothing among equals.
/// The list keeps the replicas before the tie in order and the tied ones
/// as a [`Tied`] group, whose best for a prompt is its tie-break's.
const TIED_ABOVE: usize = 4 * LISTED;

/// Members of the tied group a lookup reads before it gives up on the
/// list (each read is a tied member picks made busier since the build).
const TIED_READS: usize = 8;

/// The members tied with the [`LISTED`]th of a [`Shortlist`] (more than
/// [`TIED_ABOVE`] of them: an idle or level fleet). Among equal loads a
/// prompt's ranking prefers the largest tie-break (a hash of the prompt
/// and the replica id), so a lookup hashes the group's ids, reads the
/// loads of the largest few only, and proves them against the group's
/// floor: every unread member's load is at least the floor (picks only
/// add), and its tie-break is below the reads'.
#[derive(Debug)]
struct Tied {
    /// Member positions.
    positions: Box<[u32]>,
    /// No more than the figures of any member of the group, when built.
    floor: ReplicaLoad,
    /// No more than the figures of any eligible member after the group
    /// (none: no such member).
    rest: Option<ReplicaLoad>,
}

/// A large scope's least loaded replicas in order of load as of one moment, each with a
/// floor under its figures and those of every replica after it (and every
/// replica not listed), and the whole scope's [`Fleet`] figures then, kept
/// up to date by the scope's picks ([`Shortlist::picked`]).
///
/// A lookup reads its holders' loads and the listed replicas' in order,
/// stopping once the others asked for (the routing core's
/// [`super::Scoring::others`]) rank strictly before the floor
/// of everything unread ([`OtherKey::floor`]): those are then the best
/// others of the whole scope. Picks and queued work only make a replica's
/// figures larger, so a floor stays a floor and a pick costs the list
/// nothing; a list whose first replicas picks made too busy is read
/// further, and rebuilt (by a lookup that reads every load anyway) once
/// the floors prove nothing. At the moment it was built, whatever picks
/// were made since, a lookup answers exactly what ranking every replica
/// answers. Other changes (engine reports, requests started or ended,
/// peers' figures) can make an unread replica less loaded: the list is
/// rebuilt after [`crate::load::LoadSettings::shortlist_refresh_changes`]
/// of them, or once [`crate::load::LoadSettings::shortlist_refresh_ms`]
/// old (time lowers every load, not all alike); until then an unread
/// replica is missed only if such a change or time made it less loaded
/// than the others read.
#[derive(Debug)]
pub(crate) struct Shortlist {
    at_ms: i64,
    changes: u64,
    weights: ScoreWeights,
    /// By TTFT a shortlist serves prompts of its own power of two of
    /// tokens only.
    prompt_class: u32,
    /// By TTFT with prefill rates that differ between replicas, a
    /// replica's key depends on the prompt's exact length (its own rate
    /// prices the prefill): the shortlist serves that many tokens only.
    exact_tokens: Option<u64>,
    fleet: Fleet,
    /// More than [`TIED_ABOVE`] replicas tied with the [`LISTED`]th: they
    /// are this group, and `listed` holds only those before them.
    tied: Option<Tied>,
    /// Member positions, best first by load when built.
    listed: Box<[u32]>,
    /// `floors[i]`: no more than the figures of `listed[i..]` and of every
    /// eligible member not listed (the tied group's included), when built
    /// (`None`: no such member).
    floors: Box<[Option<ReplicaLoad>]>,
    /// The members eligible when built, one bit each: whose picks change
    /// the fleet's figures.
    eligible: Box<[u64]>,
    /// What the scope's picks changed since, on cache lines of their own:
    /// every pick writes them, and the fields above are read by every
    /// lookup.
    since: CachePadded<PicksSince>,
}

/// The picks of a [`Shortlist`]'s eligible members since it was built.
#[derive(Debug)]
struct PicksSince {
    /// Requests they added, over the eligible members (`f64` bits).
    added_requests: AtomicU64,
    /// The busiest eligible member's requests, picks included (`f64`
    /// bits).
    max_requests: AtomicU64,
    /// How many.
    picks: AtomicU64,
}

fn prompt_tokens(input: &PickInput<'_>) -> u64 {
    u64::from(input.prompt_blocks.max(1)) * u64::from(input.block_size.max(1))
}

fn prompt_class(input: &PickInput<'_>) -> u32 {
    prompt_tokens(input).ilog2()
}

/// The lowest of each figure of `a` and `b` (the fastest rate, a missing
/// one read as `model_rate`, the rate its score assumes).
fn lower(a: &ReplicaLoad, b: &ReplicaLoad, model_rate: f64) -> ReplicaLoad {
    let rate = |l: &ReplicaLoad| l.prefill_tokens_per_ms.unwrap_or(model_rate);
    ReplicaLoad {
        requests: a.requests.min(b.requests),
        kv_usage: a.kv_usage.min(b.kv_usage),
        queued_ms: a.queued_ms.min(b.queued_ms),
        prefill_tokens_per_ms: Some(rate(a).max(rate(b))),
        own_requests: a.own_requests.min(b.own_requests),
    }
}

fn add_f64(a: &AtomicU64, x: f64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        Some((f64::from_bits(bits) + x).to_bits())
    });
}

fn max_f64(a: &AtomicU64, x: f64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        (x > f64::from_bits(bits)).then(|| x.to_bits())
    });
}

impl Shortlist {
    /// Built from every eligible member (`positions` in the scope's member
    /// list, ascending; `loads` theirs) of a scope of `members` members.
    pub(super) fn build(
        members: usize,
        positions: &[u32],
        loads: &[ReplicaLoad],
        input: &PickInput<'_>,
        weights: &ScoreWeights,
        reader: &LoadReader<'_>,
    ) -> Self {
        let fleet = Fleet::of(positions.len(), loads);
        let rates_differ = weights.ttft.is_some()
            && loads
                .windows(2)
                .any(|w| w[0].prefill_tokens_per_ms != w[1].prefill_tokens_per_ms);
        let model_rate = weights
            .ttft
            .map_or(TtftModel::DEFAULT.tokens_per_ms, |m| m.tokens_per_ms);
        let mut keys: Vec<(OtherKey, u32)> = positions
            .iter()
            .zip(loads)
            .enumerate()
            .map(|(i, (_, load))| {
                let i = u32::try_from(i).unwrap_or(u32::MAX);
                (OtherKey::new(input, weights, &fleet, load, 0), i)
            })
            .collect();
        let cmp = |a: &(OtherKey, u32), b: &(OtherKey, u32)| a.0.load_cmp(&b.0);
        let mut listed = keys.len();
        if keys.len() > LISTED {
            let (_, last, _) = keys.select_nth_unstable_by(LISTED - 1, cmp);
            let last = last.0;
            // Every replica tied with the last too: the floor of the rest
            // is then above the list's last, so the list can prove its
            // best others (a tie with an unread replica proves nothing).
            let (first, rest) = keys.split_at_mut(LISTED);
            let mut tied = 0;
            for i in 0..rest.len() {
                if rest[i].0.load_cmp(&last).is_eq() {
                    rest.swap(tied, i);
                    tied += 1;
                }
            }
            let _ = first;
            listed = LISTED + tied;
        }
        let mut eligible = vec![0u64; members.div_ceil(64)];
        for &p in positions {
            eligible[p as usize / 64] |= 1 << (p % 64);
        }
        // `keys[..listed]` in order, `keys[listed..level_end]` the tied
        // group (none unless more than TIED_ABOVE tie), the rest after.
        let level_end = listed;
        if listed > TIED_ABOVE {
            // Those before the LISTEDth's load to the front, in order; the
            // ones tied with it are the group, not sorted.
            let level = keys[LISTED - 1].0;
            let mut before = 0;
            for i in 0..listed {
                if keys[i].0.load_cmp(&level).is_lt() {
                    keys.swap(before, i);
                    before += 1;
                }
            }
            listed = before;
        }
        keys[..listed].sort_unstable_by(cmp);
        let lowest = |part: &[(OtherKey, u32)]| {
            part.iter()
                .map(|(_, i)| loads[*i as usize])
                .reduce(|a, b| lower(&a, &b, model_rate))
        };
        let rest = lowest(&keys[level_end..]);
        let tied = lowest(&keys[listed..level_end]).map(|floor| Tied {
            positions: keys[listed..level_end]
                .iter()
                .map(|(_, i)| positions[*i as usize])
                .collect(),
            floor,
            rest,
        });
        let mut floor = match (&tied, rest) {
            (Some(t), Some(r)) => Some(lower(&t.floor, &r, model_rate)),
            (Some(t), None) => Some(t.floor),
            (None, r) => r,
        };
        let first = &keys[..listed];
        let mut floors = vec![floor; first.len() + 1];
        for (j, (_, i)) in first.iter().enumerate().rev() {
            let l = &loads[*i as usize];
            floor = Some(floor.map_or(*l, |f| lower(&f, l, model_rate)));
            floors[j] = floor;
        }
        Self {
            at_ms: reader.now_ms(),
            changes: reader.changes(),
            weights: *weights,
            prompt_class: prompt_class(input),
            exact_tokens: rates_differ.then(|| prompt_tokens(input)),
            fleet,
            tied,
            listed: first.iter().map(|(_, i)| positions[*i as usize]).collect(),
            floors: floors.into(),
            eligible: eligible.into(),
            since: CachePadded::new(PicksSince {
                added_requests: AtomicU64::new(0f64.to_bits()),
                max_requests: AtomicU64::new(fleet.max_requests.to_bits()),
                picks: AtomicU64::new(0),
            }),
        }
    }

    /// Whether member `p` was eligible when this was built.
    pub(crate) fn counts(&self, p: usize) -> bool {
        self.eligible
            .get(p / 64)
            .is_some_and(|w| w & (1 << (p % 64)) != 0)
    }

    /// A pick added `requests` to `members` eligible members (one replica
    /// id's), each now busy with `now_requests`.
    pub(crate) fn picked(&self, members: usize, requests: f64, now_requests: f64) {
        if members > 0 && requests.is_finite() && now_requests.is_finite() {
            self.since.picks.fetch_add(1, Ordering::Relaxed);
            add_f64(&self.since.added_requests, requests * members as f64);
            max_f64(&self.since.max_requests, now_requests);
        }
    }

    /// Whether picks were made since it was built: a list whose floors
    /// prove nothing then is worn out, and rebuilt (one that proves
    /// nothing without picks is tied with the rest, as in an idle fleet,
    /// and a rebuild would prove nothing either).
    fn worn(&self) -> bool {
        self.since.picks.load(Ordering::Relaxed) > 0
    }

    /// The scope's fleet figures now: as built, with the picks since.
    fn fleet_now(&self) -> Fleet {
        Fleet {
            max_requests: f64::from_bits(self.since.max_requests.load(Ordering::Relaxed)),
            total_requests: self.fleet.total_requests
                + f64::from_bits(self.since.added_requests.load(Ordering::Relaxed)),
            replicas: self.fleet.replicas,
        }
    }

    /// Whether this shortlist may answer `input` under `weights` now.
    pub(super) fn serves(
        &self,
        input: &PickInput<'_>,
        weights: &ScoreWeights,
        reader: &LoadReader<'_>,
    ) -> bool {
        let settings = reader.settings();
        let age = reader.now_ms().saturating_sub(self.at_ms);
        (0..settings.shortlist_refresh_ms).contains(&age)
            && reader.changes().wrapping_sub(self.changes) < settings.shortlist_refresh_changes
            && self.weights == *weights
            && (weights.ttft.is_none() || self.prompt_class == prompt_class(input))
            && self.exact_tokens.is_none_or(|t| t == prompt_tokens(input))
    }

    /// The eligible replicas to rank for `input`, held by the replicas
    /// hashing to `holders` ([`id_hash`]): those, and the best `others` of
    /// the listed others, read until those rank before the floor of the
    /// rest, with the fleet's figures now; else (ranking every replica
    /// answers then) whether the list is worn out and should be rebuilt.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn eligible<'a>(
        &self,
        members: &'a [Arc<ReplicaMeta>],
        resolved: &MemberLoads,
        reader: &LoadReader<'_>,
        input: &PickInput<'_>,
        holders: &[u64],
        fresh_since: Option<i64>,
        others: usize,
    ) -> Result<Eligible<'a>, bool> {
        let others = others.max(1);
        let fleet = self.fleet_now();
        let weights = &self.weights;
        let mut held: smallvec::SmallVec<[usize; 16]> = smallvec::SmallVec::new();
        for &h in holders {
            held.extend(resolved.with_hash(h));
        }
        held.sort_unstable();
        held.dedup();
        // Room for every holder's members and the best others: no growing.
        let mut eligible = Eligible::with_capacity(held.len() + others);
        eligible.fleet = Some(fleet);
        for &p in &held {
            let m = members.get(p).ok_or(false)?;
            if m.answers(None, fresh_since) {
                eligible.push(
                    (&m.key, m.address.as_str()),
                    reader.member(resolved, p),
                    resolved.id_hashes[p],
                );
            }
        }
        let read = Reading {
            members,
            resolved,
            reader,
            input,
            weights,
            holders,
            fresh_since,
            fleet: &fleet,
        };
        // The best others read so far, in the ranking's order: only they
        // join the holders in `eligible`, so the ranking scores the holders
        // and these few, not every replica read on the way to the proof.
        let mut best = BestOthers::new(others);
        let proven = |best: &BestOthers, floor: &Option<ReplicaLoad>| {
            best.full()
                && floor.as_ref().is_none_or(|f| {
                    best.last()
                        .load_cmp(&OtherKey::floor(input, weights, &fleet, f))
                        .is_lt()
                })
        };
        let outcome = 'read: {
            for (i, &p) in self.listed.iter().enumerate() {
                if proven(&best, &self.floors[i]) {
                    break 'read Ok(());
                }
                let p = p as usize;
                let h = *resolved.id_hashes.get(p).ok_or(false)?;
                if !holders.contains(&h) {
                    read.other(p, h, &mut best)?;
                }
            }
            if proven(&best, &self.floors[self.listed.len()]) {
                break 'read Ok(());
            }
            if let Some(tied) = &self.tied
                && read.tied(tied, &mut best)?
            {
                break 'read Ok(());
            }
            // Too few others listed for this prompt (its holders are most of
            // the list) is no wear.
            Err(best.full() && self.worn())
        };
        outcome?;
        for other in best.kept {
            let m = &members[other.position];
            eligible.push((&m.key, m.address.as_str()), other.load, other.id_hash);
        }
        Ok(eligible)
    }
}

/// Lookups a tied group answered (tests: that the group is exercised).
#[cfg(test)]
pub(crate) static TIED_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[inline]
fn count_tied_answer() {
    #[cfg(test)]
    TIED_ANSWERS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
thread_local! {
    /// Others a lookup on this thread read from a list (tests: how far a
    /// list is read).
    static OTHERS_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A non-holder read from a [`Shortlist`]: its member position, id hash,
/// load and key.
struct Other {
    key: OtherKey,
    position: usize,
    id_hash: u64,
    load: ReplicaLoad,
}

/// The best `others` non-holders read so far, best first in the ranking's
/// order: by key, equal keys (a pod's data-parallel ranks) by replica, as
/// [`rank_eligible`] breaks them.
struct BestOthers {
    others: usize,
    kept: smallvec::SmallVec<[Other; 2]>,
}

impl BestOthers {
    fn new(others: usize) -> Self {
        Self {
            others: others.max(1),
            kept: smallvec::SmallVec::new(),
        }
    }

    /// Whether `others` were read.
    fn full(&self) -> bool {
        self.kept.len() == self.others
    }

    /// The key of the last kept (only when [`Self::full`]).
    fn last(&self) -> &OtherKey {
        &self.kept[self.others - 1].key
    }

    /// Keeps `other` if it is among the best read.
    #[inline(always)]
    fn offer(&mut self, other: Other, members: &[Arc<ReplicaMeta>]) {
        let key_of = |o: &Other| &members[o.position].key;
        let better = |a: &Other, b: &Other| {
            a.key
                .rank_cmp(&b.key)
                .then_with(|| key_of(a).cmp(key_of(b)))
        };
        if self.full() && better(&other, &self.kept[self.others - 1]).is_ge() {
            return;
        }
        let at = self.kept.partition_point(|b| better(b, &other).is_lt());
        self.kept.insert(at, other);
        self.kept.truncate(self.others);
    }
}

/// What a lookup reading a shortlist reads with.
struct Reading<'r, 'a> {
    members: &'a [Arc<ReplicaMeta>],
    resolved: &'r MemberLoads,
    reader: &'r LoadReader<'r>,
    input: &'r PickInput<'r>,
    weights: &'r ScoreWeights,
    holders: &'r [u64],
    fresh_since: Option<i64>,
    fleet: &'r Fleet,
}

impl<'a> Reading<'_, 'a> {
    /// Reads member `p` (its id hashing to `h`) as an other, unless it
    /// does not answer: kept in `best` if it is among them.
    #[inline(always)]
    fn other(&self, p: usize, h: u64, best: &mut BestOthers) -> Result<(), bool> {
        let m = self.members.get(p).ok_or(false)?;
        if m.answers(None, self.fresh_since) {
            #[cfg(test)]
            OTHERS_READ.with(|n| n.set(n.get() + 1));
            let load = self.reader.member(self.resolved, p);
            let key = OtherKey::new(self.input, self.weights, self.fleet, &load, h);
            best.offer(
                Other {
                    key,
                    position: p,
                    id_hash: h,
                    load,
                },
                self.members,
            );
        }
        Ok(())
    }

    /// Reads the tied group's members in order of their tie-break for
    /// this prompt until the best `others` read (listed ones included)
    /// rank before every unread member: Ok(true) then, Ok(false) when
    /// [`TIED_READS`] reads did not prove it (or the rest's floor is no
    /// higher than the group's), Err on a member list out of step.
    fn tied(&self, tied: &Tied, best: &mut BestOthers) -> Result<bool, bool> {
        let (input, weights, fleet) = (self.input, self.weights, self.fleet);
        let hashes = &self.resolved.id_hashes;
        let floor = OtherKey::floor(input, weights, fleet, &tied.floor);
        let rest = tied
            .rest
            .as_ref()
            .map(|r| OtherKey::floor(input, weights, fleet, r));
        if rest.as_ref().is_some_and(|r| r.load_cmp(&floor).is_le()) {
            // No member of the group can rank before the rest's floor, and
            // the listed ones read did not (the list's last floor covers
            // both): only reading every load tells.
            return Ok(false);
        }
        // The non-holders' largest tie-breaks (holders are ranked apart),
        // largest first: one pass, a handful kept (the tie-breaks are
        // hashes, so few replace a kept one). The last kept bounds those
        // of every member not kept.
        const KEPT: usize = TIED_READS + 2;
        let mut top: smallvec::SmallVec<[(u64, u32); KEPT]> = smallvec::SmallVec::new();
        for &p in &tied.positions {
            let h = *hashes.get(p as usize).ok_or(false)?;
            if self.holders.contains(&h) {
                continue;
            }
            let tie = OtherKey::tie_of(input, h);
            if top.len() == KEPT {
                if top[KEPT - 1].0 >= tie {
                    continue;
                }
                top.pop();
            }
            let at = top.partition_point(|(t, _)| *t > tie);
            top.insert(at, (tie, p));
        }
        // Up to TIED_READS + 1 read; the next kept bounds the unread.
        for read in 0..KEPT {
            let next = top.get(read).copied();
            if best.full() {
                let last = best.last();
                // Every unread member of the group: a load of at least the
                // floor, and a tie-break no larger than `next`'s (an equal
                // one proves nothing: the replica key decides then).
                let before_group = next.is_none_or(|(tie, _)| match last.load_cmp(&floor) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Equal => last.tie() > tie,
                    std::cmp::Ordering::Greater => false,
                });
                let before_rest = rest.as_ref().is_none_or(|r| last.load_cmp(r).is_lt());
                if before_group && before_rest {
                    count_tied_answer();
                    return Ok(true);
                }
            }
            match next {
                Some((_, p)) if read <= TIED_READS => {
                    let p = p as usize;
                    self.other(p, hashes[p], best)?;
                }
                _ => break,
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests;
