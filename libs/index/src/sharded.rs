//! A reader-writer lock for data that every lookup and pick reads and
//! almost nothing writes (the load board's maps, a scope's shortlist and
//! its rebuild guard; the index server's list of peer reporters).
//!
//! One `RwLock` keeps its readers' count in one word: every read lock and
//! unlock writes that cache line, so concurrent lookups on several cores
//! pass it between them on every request even though none ever waits.
//! Here a thread reads through one of eight shards, chosen by its index
//! (crossbeam's `ShardedLock`, each shard on a cache line of its own), and
//! a writer takes every shard: up to eight threads read writing nothing
//! another's reads write (threads past eight share shards), and writes
//! cost a lock per shard. The
//! exclusion is a reader-writer lock's, so code written for one keeps its
//! reasoning unchanged.

use std::sync::PoisonError;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

/// See the module documentation. Poisoning is ignored, as with
/// `parking_lot`'s lock these replace: nothing under them panics on input.
#[derive(Debug, Default)]
pub struct ShardedRwLock<T>(ShardedLock<T>);

impl<T> ShardedRwLock<T> {
    /// A lock holding `value`.
    pub fn new(value: T) -> Self {
        Self(ShardedLock::new(value))
    }

    /// Shared access, through the calling thread's shard.
    #[inline]
    pub fn read(&self) -> ShardedLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive access: waits for every shard's readers.
    pub fn write(&self) -> ShardedLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}
