//! A scope's members on the [`LoadBoard`] ([`MemberLoads`], resolved once
//! per change of the members or of the board's replicas) and how a lookup
//! reads their loads ([`LoadReader`]).

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};

use super::entry::Entry;
use super::{LoadBoard, LoadSettings, ReplicaLoad};
use crate::registry::Members;
use crate::sharded::ShardedRwLock;

/// The board's entries of one scope's members, in the members' order, and
/// the hash of each member's replica id ([`crate::pick::id_hash`]).
#[derive(Debug)]
pub(crate) struct MemberLoads {
    /// The member list these were resolved for (held, so its address is
    /// never another list's).
    pub(super) members: Members,
    generation: u64,
    entries: Box<[Option<Arc<Entry>>]>,
    pub(crate) id_hashes: Box<[u64]>,
    /// `(id_hashes[i], i)`, sorted: finds a holder's members.
    by_hash: Box<[(u64, u32)]>,
    /// The scope's shortlist, when it is large enough to keep one.
    pub(crate) shortlist: ShardedRwLock<Option<Arc<crate::route::Shortlist>>>,
    /// Held shared by a pick of a member (from before it reads the list
    /// until it has added itself to it) and exclusively by a lookup
    /// rebuilding the list (from reading the loads until it is published):
    /// a pick is then in the new list's loads or in its figures, never
    /// lost between the two.
    pub(crate) rebuilding: ShardedRwLock<()>,
    /// Looked up since the board's last upkeep ([`LoadBoard::retain`]),
    /// which forgets a scope no lookup used between two upkeeps (a scope
    /// gone from the index, or one whose replicas moved to another).
    pub(super) used: AtomicBool,
}

impl MemberLoads {
    /// The members whose replica id hashes to `h` (a pod's data-parallel
    /// ranks share their id).
    pub(crate) fn with_hash(&self, h: u64) -> impl Iterator<Item = usize> + '_ {
        let from = self.by_hash.partition_point(|(x, _)| *x < h);
        self.by_hash[from..]
            .iter()
            .take_while(move |(x, _)| *x == h)
            .map(|(_, i)| *i as usize)
    }
}

/// Reads loads at one moment: the decay factor read once, and read again
/// only when a rebase ([`LoadBoard::pick`]) re-expressed the weights since.
///
/// A rebase rescales every replica's weight and moves the epoch while
/// lookups read without the board's map lock; a read that overlapped one
/// would multiply a rescaled weight by the old factor (or the reverse).
/// Each read is therefore checked against the board's rebase count, as a
/// sequence lock: a rebase makes it odd while under way and even again
/// after, so a read that saw neither change read one scale; any other is
/// read again with the factor of the new epoch, and checked the same way
/// (never under the map's lock: see [`LoadReader::reread`]).
#[derive(Debug)]
pub(crate) struct LoadReader<'a> {
    board: &'a LoadBoard,
    now_ms: i64,
    /// The factor and the rebase count it was read at (a reader is used by
    /// one lookup on one thread).
    decay: Cell<f64>,
    rebases: Cell<u64>,
    changes: u64,
}

impl<'a> LoadReader<'a> {
    fn new(board: &'a LoadBoard, now_ms: i64) -> Self {
        let reader = Self {
            board,
            now_ms,
            decay: Cell::new(0.0),
            rebases: Cell::new(0),
            changes: board.changes.load(Ordering::Relaxed),
        };
        let rebases = board.rebases.load(Ordering::Acquire);
        if rebases.is_multiple_of(2) {
            reader.rebases.set(rebases);
            reader.decay.set(board.decay_factor(now_ms));
        } else {
            reader.reread(|_| ());
        }
        reader
    }

    /// Reads the factor again, and with it `read(factor)`, as a sequence
    /// lock's read: retried until no rebase was under way or completed
    /// between reading the count and checking it again; then keeps the
    /// factor and the count it was read at.
    ///
    /// Takes no lock: a lookup calls this while it holds a scope's
    /// `rebuilding` lock, which a pick waits for while holding the map's
    /// read lock, so waiting here for the map (behind a queued writer)
    /// would close a cycle. A rebase holds the count odd only while it
    /// rescales the weights under the map's write lock, waiting for
    /// nothing, so the spin is bounded by one rescale.
    #[cold]
    #[inline(never)]
    fn reread<T>(&self, read: impl Fn(f64) -> T) -> T {
        let mut tries = 0_u32;
        loop {
            let rebases = self.board.rebases.load(Ordering::Acquire);
            if rebases.is_multiple_of(2) {
                let decay = self.board.decay_factor(self.now_ms);
                let value = read(decay);
                // The figures' loads before the count's (a sequence
                // lock's read).
                fence(Ordering::Acquire);
                if self.board.rebases.load(Ordering::Relaxed) == rebases {
                    self.rebases.set(rebases);
                    self.decay.set(decay);
                    return value;
                }
            }
            // A rebase under way: its writer may be off the CPU.
            tries += 1;
            if tries.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl LoadReader<'_> {
    /// The moment it reads at.
    pub(crate) fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// The board's load changes when this reader was made.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// The board's settings.
    pub(crate) fn settings(&self) -> &LoadSettings {
        &self.board.settings
    }

    /// Counts a shortlist rebuilt.
    pub(crate) fn refreshed(&self) {
        self.board.refreshes.fetch_add(1, Ordering::Relaxed);
    }

    /// The load of member `i` of `members` (idle when not on the board).
    pub(crate) fn member(&self, members: &MemberLoads, i: usize) -> ReplicaLoad {
        let Some(e) = members.entries.get(i).and_then(Option::as_deref) else {
            return ReplicaLoad::default();
        };
        let load = self.board.entry_load(e, self.now_ms, self.decay.get());
        // The figures' loads before the count's (a sequence lock's read).
        fence(Ordering::Acquire);
        if self.board.rebases.load(Ordering::Relaxed) == self.rebases.get() {
            return load;
        }
        self.reread(|decay| self.board.entry_load(e, self.now_ms, decay))
    }
}

impl LoadBoard {
    /// Runs `f` with a reader at `now_ms` and the resolved entries of the
    /// scope tagged `scope_tag` whose members are `members` (resolving them
    /// when the members or the board's replicas changed since).
    pub(crate) fn with_members<R>(
        &self,
        scope_tag: u64,
        members: &Members,
        now_ms: i64,
        f: impl FnOnce(&LoadReader<'_>, &MemberLoads) -> R,
    ) -> R {
        let reader = LoadReader::new(self, now_ms);
        let current = |m: &&MemberLoads| {
            Arc::ptr_eq(&m.members, members)
                && m.generation == self.generation.load(Ordering::Relaxed)
        };
        {
            let scopes = self.scopes.read();
            if let Some(m) = scopes.get(&scope_tag).filter(current) {
                // Written once an upkeep, not on every lookup.
                if !m.used.load(Ordering::Relaxed) {
                    m.used.store(true, Ordering::Relaxed);
                }
                return f(&reader, m);
            }
        }
        // Inserted before `f` runs, so picks find (and hold) the shortlist
        // it builds.
        let resolved = self.resolve(scope_tag, members);
        self.scopes.write().insert(scope_tag, resolved);
        {
            let scopes = self.scopes.read();
            if let Some(m) = scopes.get(&scope_tag).filter(current) {
                return f(&reader, m);
            }
        }
        // Replaced meanwhile (the members or the board's replicas changed
        // again): answered from entries of its own, whose shortlist no pick
        // could find and which is therefore not kept.
        f(&reader, &self.resolve(scope_tag, members))
    }

    /// The board's entries of `members`, each member given one.
    fn resolve(&self, scope_tag: u64, members: &Members) -> MemberLoads {
        // Every member gets its entry now: a replica's first pick or
        // report then changes no generation, so a large scope is not
        // resolved again once per replica as its replicas are first
        // picked (256 resolutions of 256 members, warming up).
        let missing = {
            let map = self.entries.read();
            members
                .iter()
                .any(|m| !map.contains_key(m.key.replica_id.as_str()))
        };
        if missing {
            let mut map = self.entries.write();
            for m in members.iter() {
                if !map.contains_key(m.key.replica_id.as_str()) {
                    map.insert(m.key.replica_id.as_str().into(), Arc::default());
                }
            }
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        let map = self.entries.read();
        let entries: Box<[Option<Arc<Entry>>]> = members
            .iter()
            .map(|m| map.get(m.key.replica_id.as_str()).cloned())
            .collect();
        for e in entries.iter().flatten() {
            e.note_scope(scope_tag);
        }
        let id_hashes: Box<[u64]> = members.iter().map(|m| m.id_hash).collect();
        let mut by_hash: Vec<(u64, u32)> = id_hashes
            .iter()
            .enumerate()
            .map(|(i, h)| (*h, u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        by_hash.sort_unstable();
        MemberLoads {
            members: Arc::clone(members),
            // Read under the map's lock: an entry added later bumps it.
            generation: self.generation.load(Ordering::Relaxed),
            entries,
            id_hashes,
            by_hash: by_hash.into(),
            shortlist: ShardedRwLock::new(None),
            rebuilding: ShardedRwLock::new(()),
            used: AtomicBool::new(true),
        }
    }
}
