//! Two threads looking up the chains a writer stores while it stores
//! them: the harness of the tests that race lookups against refills,
//! compaction and the first-block filter's rebuilds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use super::*;

/// Chain `k`: `len` blocks, distinct from every other chain's.
pub(super) fn chain(k: u64, len: u64) -> Vec<Fingerprint> {
    (0..len).map(|d| Fingerprint((k + 1) * 1_000 + d)).collect()
}

/// The readers: each looks up a chain published so far (half the time
/// the newest, the one being worked on) and asserts that replica
/// "stable" holds all of it at T1.
pub(super) struct ChainReaders {
    published: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl ChainReaders {
    pub(super) fn spawn(ix: &Arc<Index>, len: u64) -> Self {
        let published = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let threads = (0..2u64)
            .map(|seed| {
                let (ix, published, done) = (ix.clone(), published.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut x = seed + 1;
                    let mut lookups = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        let n = published.load(Ordering::Acquire);
                        if n == 0 {
                            std::thread::yield_now();
                            continue;
                        }
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let k = if x % 2 == 0 { n - 1 } else { (x >> 33) % n };
                        let got = matches(ix.lookup(&scope("t"), &chain(k, len), None, None));
                        assert_eq!(got, [("stable".into(), len as u32, Tier::T1)], "chain {k}");
                        lookups += 1;
                    }
                    lookups
                })
            })
            .collect();
        Self {
            published,
            done,
            threads,
        }
    }

    /// Chains 0..n are stored: the readers may look them up.
    pub(super) fn publish(&self, n: u64) {
        self.published.store(n, Ordering::Release);
    }

    /// Stops the readers (re-raising a reader's failed assertion) and
    /// asserts they looked something up.
    pub(super) fn finish(self) {
        self.done.store(true, Ordering::Relaxed);
        let lookups: u64 = self.threads.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(lookups > 0);
    }
}
