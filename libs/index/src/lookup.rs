//! Lookups: score every replica of a scope by its longest run of a
//! prompt's blocks from the start.
//!
//! The walk follows the records after the previous block's while they
//! carry the prompt's next keys (a chain an engine reported in one event
//! was stored in order), and probes the key table only where that run
//! breaks — so a prompt costs a handful of random reads, not one per block.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use crate::arena::{Holder, RecId};
use crate::index::{
    Index, Registry, ReplicaIdx, ReplicaMeta, ScopeId, entry_key, salted_key, scope_salt,
};
use crate::store::{Block, hash};
use crate::types::{
    Deadline, Fingerprint, LookupOutcome, LookupView, Match, NoDeadline, Scope, ScopeHandle, Tier,
};

/// Whether replica `idx` may appear in an answer for `scope`.
fn eligible(
    reg: &Registry,
    idx: ReplicaIdx,
    scope: ScopeId,
    candidates: Option<&HashSet<String>>,
    fresh_since_ms: Option<i64>,
) -> bool {
    let Some(Some(meta)) = reg.replicas.get(idx as usize) else {
        return false;
    };
    meta.scope == scope && meta.answers(candidates, fresh_since_ms)
}

/// Matches as a lookup hands them to its callback (no allocation for up to
/// eight).
type Matches<'a> = SmallVec<[Match<'a>; 8]>;

/// The registry entries of a lookup's matches, in their order.
type Metas<'a> = SmallVec<[&'a Arc<ReplicaMeta>; 8]>;

/// What a lookup found, borrowing the registry. One per lookup, on the
/// stack: the inline matches are the point (boxing would allocate).
#[allow(clippy::large_enum_variant)]
enum Found<'a> {
    /// A scope never reported.
    UnknownScope,
    /// The deadline passed before the walk ended.
    TimedOut,
    /// The matches (none: no entry), and their registry entries.
    Matches(Matches<'a>, Metas<'a>),
}

impl<'a> Found<'a> {
    const UNKNOWN_SCOPE: Self = Found::UnknownScope;

    fn no_entry() -> Self {
        Found::Matches(SmallVec::new(), SmallVec::new())
    }

    /// The matches' registry entries, in their order.
    fn metas(&self) -> &[&'a Arc<ReplicaMeta>] {
        match self {
            Found::Matches(_, metas) => metas,
            _ => &[],
        }
    }

    fn view(&self) -> LookupView<'_> {
        match self {
            Found::UnknownScope => LookupView::UnknownScope,
            Found::TimedOut => LookupView::TimedOut,
            Found::Matches(m, _) if m.is_empty() => LookupView::NoEntry,
            Found::Matches(m, _) => LookupView::Matches(m),
        }
    }
}

/// Blocks walked between two looks at the deadline (a look is a clock
/// read; a block is a few nanoseconds).
const DEADLINE_EVERY: usize = 256;

/// The order a lookup answers its matches in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MatchOrder {
    /// Best first (see [`ranked`]): what every public lookup answers.
    Best,
    /// The walk's own order: for the load-aware ranking, which orders every
    /// holder itself (sorting them first cost ~1 k instructions a lookup
    /// of four holders, their names compared on ties).
    Walk,
}

/// Orders matches best first: longest, then T1 before T2, then the replica
/// heard from most recently, then by key (deterministic). Names are
/// borrowed: copying them was most of a lookup's time once the blocks
/// were found.
fn ranked<'a>(
    reg: &'a Registry,
    scope: ScopeId,
    mut matches: SmallVec<[(ReplicaIdx, u32, Tier); 8]>,
    order: MatchOrder,
) -> Found<'a> {
    let block_size = reg.block_size(scope);
    let meta = |idx: ReplicaIdx| reg.replicas.get(idx as usize).and_then(Option::as_ref);
    if matches.len() > 1 && order == MatchOrder::Best {
        // Sorted as indices (12 bytes each, not the 40 of a `Match`); the
        // registry is read only to break ties.
        // Last-seen read once per match: ingest advances it concurrently, and
        // a sort whose keys change under it is not a total order (the
        // standard sort panics on that).
        let seen = |idx| meta(idx).map_or(i64::MIN, |m| m.last_seen_ms.load(Ordering::Relaxed));
        let mut keyed: SmallVec<[(ReplicaIdx, u32, Tier, i64); 8]> = matches
            .iter()
            .map(|&(idx, len, tier)| (idx, len, tier, seen(idx)))
            .collect();
        keyed.sort_by(|&(a, a_len, a_tier, a_seen), &(b, b_len, b_tier, b_seen)| {
            b_len
                .cmp(&a_len)
                .then(a_tier.cmp(&b_tier))
                .then(b_seen.cmp(&a_seen))
                .then_with(|| meta(a).map(|m| &m.key).cmp(&meta(b).map(|m| &m.key)))
        });
        matches = keyed
            .into_iter()
            .map(|(idx, len, tier, _)| (idx, len, tier))
            .collect();
    }
    let mut out = Matches::new();
    let mut metas = Metas::new();
    for (idx, matched_blocks, tier) in matches {
        if let Some(meta) = meta(idx) {
            metas.push(meta);
            out.push(Match {
                replica: &meta.key,
                address: &meta.address,
                matched_blocks,
                block_size,
                tier,
            });
        }
    }
    Found::Matches(out, metas)
}

/// The running score of one lookup.
#[derive(Debug)]
struct Scoring {
    /// Replicas still matching, with the coldest tier so far.
    active: SmallVec<[(ReplicaIdx, Tier); 8]>,
    /// Replicas that stopped matching: (replica, blocks matched, tier).
    finished: SmallVec<[(ReplicaIdx, u32, Tier); 8]>,
    /// Blocks matched by the replicas still active.
    matched: u32,
    /// The previous block's holders, raw, when at most [`LAST`]: a block
    /// held exactly as its predecessor changes nothing. (An array, not a
    /// small vector: this is read for every block, and a small vector's
    /// length and slice each test where it lives.)
    last: [u32; LAST],
    /// How many of `last` are the previous block's holders; `usize::MAX`
    /// when it had more than [`LAST`] (no length equals that, so the next
    /// block takes the slow step).
    last_len: usize,
    /// `last`'s only holder, when it has exactly one (`u64::MAX`
    /// otherwise): the common block is checked without touching `last`.
    last_single: u64,
    /// Scratch of [`Scoring::step_many`]: per 64 replica slots, a word of
    /// bits of those holding the block, then a word of those holding it at
    /// T2 (empty until a block has more than [`LAST`] replicas still
    /// matching; then the thread's [`MARKS`], given back by
    /// [`Scoring::finish`]). All zeros between blocks.
    marks: Vec<u64>,
    /// Words of `marks` this walk uses (two per 64 slots up to the highest
    /// active replica's).
    words: usize,
}

thread_local! {
    /// [`Scoring::marks`] kept between walks on this thread (all zeros), so
    /// a walk through a widely held prefix allocates none.
    static MARKS: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Holders [`Scoring::last`] keeps.
const LAST: usize = 8;

/// Whether `holders` are the first holders of `last`, their count
/// already checked equal. Up to four, by length (each length's comparison
/// is a few instructions, where a loop of single compares cost six a
/// holder and slice equality a `memcmp` call a block: a prompt four
/// replicas share is the common case), then one by one.
#[inline(always)]
fn same_holders(holders: &[u32], last: &[u32; LAST]) -> bool {
    let l = last;
    match *holders {
        [a] => a == l[0],
        [a, b] => [a, b] == [l[0], l[1]],
        [a, b, c] => [a, b, c] == [l[0], l[1], l[2]],
        [a, b, c, d] => [a, b, c, d] == [l[0], l[1], l[2], l[3]],
        _ => holders.iter().zip(l).all(|(a, b)| a == b),
    }
}

impl Default for Scoring {
    fn default() -> Self {
        Self {
            active: SmallVec::new(),
            finished: SmallVec::new(),
            matched: 0,
            last: [0; LAST],
            last_len: 0,
            last_single: u64::MAX,
            marks: Vec::new(),
            words: 0,
        }
    }
}

impl crate::arena::Visit for &mut Scoring {
    #[inline(always)]
    fn visit(&mut self, holders: &[u32]) -> bool {
        self.step(holders)
    }

    #[inline(always)]
    fn visit_one(&mut self, holder: u32) -> bool {
        if u64::from(holder) == self.last_single {
            self.matched += 1;
            return true;
        }
        self.step_slow(std::slice::from_ref(&holder))
    }

    #[inline(always)]
    fn visit_four(&mut self, slot: &[u32; 4], len: usize) -> bool {
        // The slot and the last block's first four holders, as two words
        // each, compared under a mask of the list's length.
        let words = |l: &[u32]| {
            (
                u64::from(l[0]) | u64::from(l[1]) << 32,
                u64::from(l[2]) | u64::from(l[3]) << 32,
            )
        };
        let (mask_lo, mask_hi) = FOUR_MASKS[len & 3];
        let (a, b) = words(slot);
        let (x, y) = words(&self.last);
        if len == self.last_len && ((a ^ x) & mask_lo) | ((b ^ y) & mask_hi) == 0 {
            self.matched += 1;
            return true;
        }
        self.step_slow(&slot[..len.min(4)])
    }

    #[inline(always)]
    fn visit_eight(&mut self, slot: &[u32; 8], len: usize) -> bool {
        // As `visit_four`, over four words: the first two always the
        // list's, the last two masked by its length.
        let word = |l: &[u32], i: usize| u64::from(l[2 * i]) | u64::from(l[2 * i + 1]) << 32;
        let (mask_2, mask_3) = EIGHT_MASKS[len & 3];
        let differ = (word(slot, 0) ^ word(&self.last, 0))
            | (word(slot, 1) ^ word(&self.last, 1))
            | ((word(slot, 2) ^ word(&self.last, 2)) & mask_2)
            | ((word(slot, 3) ^ word(&self.last, 3)) & mask_3);
        if len == self.last_len && differ == 0 {
            self.matched += 1;
            return true;
        }
        self.step_slow(&slot[..len.min(8)])
    }
}

/// The masks of the two words of a 16-byte slot that hold a list's
/// holders, by the length's low two bits (a pooled list has two to four:
/// 4 is entry 0; entry 1, no pooled length, compares two, which only makes
/// a match stricter). Indexed so, not by the length capped at four: the
/// cap cost the four-holder block's loop 5 instructions (`lookup_loop`).
const FOUR_MASKS: [(u64, u64); 4] = [
    (u64::MAX, u64::MAX),
    (u64::MAX, 0),
    (u64::MAX, 0),
    (u64::MAX, u64::MAX >> 32),
];

/// [`FOUR_MASKS`] for the last two of a 32-byte slot's four words, a
/// pooled list of five to eight holders (8 is entry 0).
const EIGHT_MASKS: [(u64, u64); 4] = [
    (u64::MAX, u64::MAX),
    (u64::MAX >> 32, 0),
    (u64::MAX, 0),
    (u64::MAX, u64::MAX >> 32),
];

impl Scoring {
    /// Folds in the next block's holders; false once no replica is left.
    /// Inlined into the walk: most blocks are held by one replica, as the
    /// block before them was.
    #[inline(always)]
    fn step(&mut self, holders: &[u32]) -> bool {
        if let [one] = holders
            && u64::from(*one) == self.last_single
        {
            self.matched += 1;
            return true;
        }
        if holders.len() == self.last_len && same_holders(holders, &self.last) {
            self.matched += 1;
            return true;
        }
        self.step_slow(holders)
    }

    /// Remembers `holders` as the last block's.
    fn set_last(&mut self, holders: &[u32]) {
        if let Some(last) = self.last.get_mut(..holders.len()) {
            last.copy_from_slice(holders);
            self.last_len = holders.len();
        } else {
            self.last_len = usize::MAX;
        }
        self.last_single = match holders {
            [one] => u64::from(*one),
            _ => u64::MAX,
        };
    }

    #[inline(never)]
    fn step_slow(&mut self, holders: &[u32]) -> bool {
        self.set_last(holders);
        // Fast path: the holders start with the active replicas in the same
        // order (they stored the chain in the same order): everyone stays.
        if holders.len() >= self.active.len()
            && self
                .active
                .iter()
                .zip(holders)
                .all(|(a, &h)| Holder::from_raw(h).replica() == a.0)
        {
            for (a, &h) in self.active.iter_mut().zip(holders) {
                a.1 = a.1.max(Holder::from_raw(h).tier());
            }
            self.matched += 1;
            return true;
        }
        if self.active.len() > LAST {
            return self.step_many(holders);
        }
        // Compact `active` in place (most blocks keep everyone).
        let mut kept = 0;
        for k in 0..self.active.len() {
            let (idx, tier) = self.active[k];
            match holders
                .iter()
                .map(|&x| Holder::from_raw(x))
                .find(|x| x.replica() == idx)
            {
                Some(x) => {
                    self.active[kept] = (idx, tier.max(x.tier()));
                    kept += 1;
                }
                None => self.finished.push((idx, self.matched, tier)),
            }
        }
        self.active.truncate(kept);
        if self.active.is_empty() {
            return false;
        }
        self.matched += 1;
        true
    }

    /// [`Self::step_slow`] for more than [`LAST`] replicas still
    /// matching (a prefix most of a large scope holds): the block's holders
    /// marked once in a bit set over the replicas, then each active
    /// replica looked up in it, so a block costs one pass over each list,
    /// not a scan of the block's holders per replica (a 32-block prompt
    /// 256 replicas hold cost 2.8 M instructions a walk that way).
    fn step_many(&mut self, holders: &[u32]) -> bool {
        if self.marks.is_empty() {
            // Sized once a walk: the active replicas only ever get fewer.
            let top = self.active.iter().map(|a| a.0).max().unwrap_or(0);
            self.words = 2 * (top as usize / 64 + 1);
            self.marks = MARKS.with(std::cell::Cell::take);
            if self.marks.len() < self.words {
                self.marks.resize(self.words, 0);
            }
        }
        let words = self.words;
        let marks = &mut self.marks[..words];
        // Word pair of replica `r`: held at 2w, held at T2 at 2w + 1.
        let at = |r: u32| (2 * (r as usize / 64), 1u64 << (r % 64));
        for &x in holders {
            let x = Holder::from_raw(x);
            let (w, bit) = at(x.replica());
            if let Some([held, cold]) = marks.get_mut(w..w + 2) {
                *held |= bit;
                if x.tier() == Tier::T2 {
                    *cold |= bit;
                }
            }
        }
        let mut kept = 0;
        for k in 0..self.active.len() {
            let (idx, tier) = self.active[k];
            let (w, bit) = at(idx);
            match marks.get(w..w + 2) {
                Some(&[held, cold]) if held & bit != 0 => {
                    let t = if cold & bit != 0 { Tier::T2 } else { Tier::T1 };
                    self.active[kept] = (idx, tier.max(t));
                    kept += 1;
                }
                _ => self.finished.push((idx, self.matched, tier)),
            }
        }
        // Cleared by the holders' words when they are fewer than the
        // walk's words (a few replicas of many slots), else all at once.
        if holders.len() * 2 < words {
            for &x in holders {
                let (w, _) = at(Holder::from_raw(x).replica());
                if let Some(pair) = marks.get_mut(w..w + 2) {
                    pair.fill(0);
                }
            }
        } else {
            marks.fill(0);
        }
        self.active.truncate(kept);
        if self.active.is_empty() {
            return false;
        }
        self.matched += 1;
        true
    }

    fn finish(mut self) -> SmallVec<[(ReplicaIdx, u32, Tier); 8]> {
        let matched = self.matched;
        if self.marks.capacity() > 0 {
            // All zeros: kept for this thread's next walk.
            let marks = std::mem::take(&mut self.marks);
            MARKS.with(|m| m.set(marks));
        }
        self.finished
            .extend(self.active.iter().map(|&(idx, tier)| (idx, matched, tier)));
        self.finished
    }
}

impl Index {
    /// Scores every replica in `scope` by its longest run of consecutive
    /// blocks of `fingerprints` from the start. `candidates` restricts the
    /// answer to those replica ids; `fresh_since_ms` drops replicas not seen
    /// since then.
    ///
    /// `fingerprints` is a prompt: its first element is the prompt's first
    /// block (stored at depth 0). The first block is read in the first-block
    /// filter, which holds only depth-0 records' keys, so a list starting at
    /// a later block of a chain (one block asked alone, a window of a
    /// prompt) is not a prompt and is answered as a miss
    /// ([`LookupOutcome::NoEntry`]; a rare filter false positive may match
    /// it instead, as one block: rely on neither). Ask about one block at
    /// any depth, and which replicas hold it at which tier, through
    /// [`Index::lookup_prefix_hash`].
    pub fn lookup(
        &self,
        scope: &Scope,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> LookupOutcome {
        self.lookup_with(scope, fingerprints, candidates, fresh_since_ms, |view| {
            view.to_outcome()
        })
    }

    /// [`Index::lookup`], handing the answer to `answer` with the replicas'
    /// names borrowed from the index instead of copied. The registry stays
    /// read-locked while `answer` runs (replicas cannot join or leave
    /// meanwhile), so it should only turn the view into its own form.
    /// `fingerprints` starts at the prompt's first block (depth 0), as for
    /// [`Index::lookup`]: a block after the first is asked through
    /// [`Index::lookup_prefix_hash_with`].
    pub fn lookup_with<R>(
        &self,
        scope: &Scope,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        answer: impl FnOnce(LookupView<'_>) -> R,
    ) -> R {
        self.lookup_until(
            scope,
            fingerprints,
            candidates,
            fresh_since_ms,
            &NoDeadline,
            answer,
        )
    }

    /// [`Index::lookup_with`] that gives up with [`LookupView::TimedOut`]
    /// once `deadline` has passed, looking at it every few hundred blocks
    /// while it walks (a long prompt never runs past its budget).
    pub fn lookup_until<R>(
        &self,
        scope: &Scope,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        deadline: &dyn Deadline,
        answer: impl FnOnce(LookupView<'_>) -> R,
    ) -> R {
        // Held for the whole lookup: shared, and written only when replicas
        // join, leave or resync.
        let reg = self.registry.read();
        let found = match reg.scopes.get(scope) {
            Some(&scope_id) => {
                let first = self.first_probe(scope_id, fingerprints);
                self.score(
                    &reg,
                    scope_id,
                    fingerprints,
                    candidates,
                    fresh_since_ms,
                    deadline,
                    first,
                    MatchOrder::Best,
                )
            }
            None => Found::UNKNOWN_SCOPE,
        };
        answer(found.view())
    }

    /// A record that may be the prompt's first block's (`None`: a sure
    /// miss; see [`crate::store::Store::first_probe`]).
    #[inline]
    fn first_probe(&self, scope: ScopeId, fingerprints: &[Fingerprint]) -> Option<RecId> {
        fingerprints
            .first()
            .and_then(|&first| self.store.first_probe(hash(entry_key(scope, first))))
    }

    /// The handle of `scope` for [`Index::lookup_resolved_until`], once a
    /// replica of it has reported (`None` before). Scope ids are never
    /// reused, so a handle stays valid for the index's life.
    pub fn resolve_scope(&self, scope: &Scope) -> Option<ScopeHandle> {
        self.registry
            .read()
            .scopes
            .get(scope)
            .map(|&id| ScopeHandle(id))
    }

    /// [`Index::lookup_until`] in a scope resolved by
    /// [`Index::resolve_scope`]: a caller that asks about one scope many
    /// times skips hashing and comparing its names on every lookup. A
    /// handle from another index answers as that index's scope of the same
    /// id would here (an unknown one: [`LookupView::UnknownScope`]).
    pub fn lookup_resolved_until<R>(
        &self,
        scope: ScopeHandle,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        deadline: &dyn Deadline,
        answer: impl FnOnce(LookupView<'_>) -> R,
    ) -> R {
        self.lookup_resolved_in(
            scope,
            fingerprints,
            candidates,
            fresh_since_ms,
            deadline,
            MatchOrder::Best,
            |_, view| answer(view),
        )
    }

    /// [`Index::lookup_resolved_until`] whose answer is also handed the
    /// matches' registry entries, in their order (the names are borrowed
    /// from them): the router keeps its own references to them and ranks
    /// after the registry is released. The matches come in `order`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lookup_resolved_in<R>(
        &self,
        scope: ScopeHandle,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        deadline: &dyn Deadline,
        order: MatchOrder,
        answer: impl for<'r> FnOnce(&'r [&'r Arc<ReplicaMeta>], LookupView<'r>) -> R,
    ) -> R {
        if scope.0 >= self.scopes_known.load(Ordering::Acquire) {
            return answer(&[], LookupView::UnknownScope);
        }
        // Before any lock: most prompts a fleet has never seen end here,
        // having locked nothing.
        let first = self.first_probe(scope.0, fingerprints);
        if first.is_none() {
            return answer(&[], LookupView::NoEntry);
        }
        let reg = self.registry.read();
        let found = self.score(
            &reg,
            scope.0,
            fingerprints,
            candidates,
            fresh_since_ms,
            deadline,
            first,
            order,
        );
        answer(found.metas(), found.view())
    }

    /// Scores the prompt; `maybe` is [`Index::first_probe`]'s answer for
    /// its first block (`None`: it is in no key table; a record: the one
    /// to try before probing the table again).
    #[allow(clippy::too_many_arguments)]
    fn score<'a>(
        &self,
        reg: &'a Registry,
        scope_id: ScopeId,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        deadline: &dyn Deadline,
        maybe: Option<RecId>,
        order: MatchOrder,
    ) -> Found<'a> {
        let Some((&first, rest)) = fingerprints.split_first() else {
            return Found::no_entry();
        };
        let Some(tagged) = maybe else {
            return Found::no_entry();
        };
        let mut reader = self.store.reader(self.store.directory());
        let key = entry_key(scope_id, first);
        // The record the first probe found, when it is the key's (all but
        // a few percent of the time: another key may share its tag).
        let found = if reader.is(tagged, key) {
            Some(tagged)
        } else {
            reader.find(key, hash(key))
        };
        let Some(mut prev) = found else {
            return Found::no_entry();
        };
        let mut scoring = Scoring::default();
        if let Some(view) = reader.view(prev) {
            scoring.set_last(view.holders());
            scoring.active = view
                .holders()
                .iter()
                .map(|&x| Holder::from_raw(x))
                .filter(|x| eligible(reg, x.replica(), scope_id, candidates, fresh_since_ms))
                .map(|x| (x.replica(), x.tier()))
                .collect();
        }
        if scoring.active.is_empty() {
            return Found::no_entry();
        }
        scoring.matched = 1;
        let salt = scope_salt(scope_id);
        let mut next = 0;
        // The distance between the last two blocks found through the key
        // table: blocks of concurrent requests reported one at a time
        // (decode) interleave at a fairly steady stride.
        let mut stride = 0;
        let mut since_look = 0;
        while next < rest.len() {
            if since_look >= DEADLINE_EVERY {
                if deadline.expired() {
                    return Found::TimedOut;
                }
                since_look = 0;
            }
            // Along the records stored right after the previous block (at
            // most until the next look at the deadline)...
            let until = rest.len().min(next + DEADLINE_EVERY - since_look);
            let walked = reader.walk(
                prev,
                &rest[next..until],
                |&fp| salted_key(salt, fp),
                &mut scoring,
            );
            since_look += walked.blocks.max(1);
            next += walked.blocks;
            if walked.blocks > 0 {
                prev += u32::try_from(walked.blocks).unwrap_or(0);
            }
            if walked.stopped || next >= rest.len() {
                break;
            }
            if next >= until {
                // The window was walked to its end: look at the deadline,
                // then walk on.
                continue;
            }
            // ...at the last stride, or through the key table.
            let key = entry_key(scope_id, rest[next]);
            let by_stride = prev
                .checked_add(stride)
                .filter(|&r| stride > 1 && reader.is(r, key));
            let Some(rec) = by_stride.or_else(|| reader.find(key, hash(key))) else {
                break;
            };
            let Some(view) = reader.view(rec) else {
                break;
            };
            if !scoring.step(view.holders()) {
                break;
            }
            stride = rec.wrapping_sub(prev);
            prev = rec;
            next += 1;
        }
        drop(reader);
        ranked(reg, scope_id, scoring.finish(), order)
    }

    /// Replicas holding the block `fingerprint` (and so the whole prefix
    /// ending with it); matched blocks come from its recorded depth, the
    /// tier is each holder's tier for this block. The block may be at any
    /// depth (no first-block filter is read): this, not [`Index::lookup`]
    /// of the one fingerprint, is how to ask about a block after a
    /// prompt's first.
    pub fn lookup_prefix_hash(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> LookupOutcome {
        self.lookup_prefix_hash_with(scope, fingerprint, candidates, fresh_since_ms, |view| {
            view.to_outcome()
        })
    }

    /// [`Index::lookup_prefix_hash`] with borrowed names, as
    /// [`Index::lookup_with`].
    pub fn lookup_prefix_hash_with<R>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        answer: impl FnOnce(LookupView<'_>) -> R,
    ) -> R {
        self.lookup_prefix_hash_in(scope, fingerprint, candidates, fresh_since_ms, |_, view| {
            answer(view)
        })
    }

    /// [`Index::lookup_prefix_hash_with`] whose answer is also handed the
    /// matches' registry entries, as [`Index::lookup_resolved_in`].
    pub(crate) fn lookup_prefix_hash_in<R>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
        answer: impl for<'r> FnOnce(&'r [&'r Arc<ReplicaMeta>], LookupView<'r>) -> R,
    ) -> R {
        let reg = self.registry.read();
        let found = self.holders_of(&reg, scope, fingerprint, candidates, fresh_since_ms);
        answer(found.metas(), found.view())
    }

    fn holders_of<'a>(
        &self,
        reg: &'a Registry,
        scope: &Scope,
        fingerprint: Fingerprint,
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> Found<'a> {
        let Some(&scope_id) = reg.scopes.get(scope) else {
            return Found::UNKNOWN_SCOPE;
        };
        let block = Block::new(entry_key(scope_id, fingerprint), 0);
        let matches: SmallVec<[(ReplicaIdx, u32, Tier); 8]> = {
            let mut reader = self.store.reader(self.store.directory());
            let Some(view) = reader
                .find(block.key, block.h)
                .and_then(|rec| reader.view(rec))
            else {
                return Found::no_entry();
            };
            view.holders()
                .iter()
                .map(|&x| Holder::from_raw(x))
                .filter(|x| eligible(reg, x.replica(), scope_id, candidates, fresh_since_ms))
                .map(|x| (x.replica(), view.depth.saturating_add(1), x.tier()))
                .collect()
        };
        ranked(reg, scope_id, matches, MatchOrder::Best)
    }
}

#[cfg(test)]
mod same_holders_tests {
    use super::{LAST, Scoring, same_holders};
    use crate::arena::{Holder, Visit};

    #[test]
    fn a_pooled_list_is_compared_over_its_own_holders_only() {
        for len in 2..=8 {
            let held: Vec<u32> = (1..=len as u32).collect();
            let fresh = || {
                let mut s = Scoring {
                    active: held
                        .iter()
                        .map(|&h| (Holder::from_raw(h).replica(), Holder::from_raw(h).tier()))
                        .collect(),
                    matched: 1,
                    ..Scoring::default()
                };
                s.set_last(&held);
                s
            };
            // The slot's tail is not the list's: it differs, and the block
            // still counts as held as the last.
            let visit = |s: &mut Scoring, slot: &[u32; 8]| {
                let mut s = s;
                if len <= 4 {
                    let four: [u32; 4] = [slot[0], slot[1], slot[2], slot[3]];
                    s.visit_four(&four, len)
                } else {
                    s.visit_eight(slot, len)
                }
            };
            let mut slot = [7u32; 8];
            slot[..len].copy_from_slice(&held);
            let mut s = fresh();
            assert!(visit(&mut s, &slot), "length {len}");
            assert_eq!((s.matched, s.active.len()), (2, len), "length {len}");
            // Any holder of the list changed: that replica stops matching.
            for at in 0..len {
                let mut other = slot;
                other[at] ^= 1 << 20;
                let mut s = fresh();
                assert!(visit(&mut s, &other), "length {len}, at {at}");
                assert_eq!(
                    (s.matched, s.active.len(), s.finished.len()),
                    (2, len - 1, 1),
                    "length {len}, at {at}"
                );
            }
        }
    }

    #[test]
    fn holder_lists_compare_equal_only_when_every_holder_is_the_same() {
        let last: [u32; LAST] = [11, 22, 33, 44, 55, 66, 77, 88];
        for len in 1..=LAST {
            assert!(same_holders(&last[..len], &last), "length {len}");
            for at in 0..len {
                let mut other = last;
                other[at] ^= 1 << 20;
                assert!(!same_holders(&other[..len], &last), "length {len}, at {at}");
            }
        }
        // Holders beyond the list's own length are not read.
        for len in 1..LAST {
            let mut longer = last;
            longer[len] = 0;
            assert!(same_holders(&last[..len], &longer), "length {len}");
        }
    }
}
