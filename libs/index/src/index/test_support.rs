//! Helpers shared by the index's own capacity and clock tests.

use crate::*;

/// The one scope these tests store into.
pub(super) fn scope() -> Scope {
    Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    }
}

/// A replica of tenant "t".
pub(super) fn key(id: &str) -> ReplicaKey {
    ReplicaKey {
        tenant: "t".into(),
        replica_id: id.into(),
        dp_rank: 0,
    }
}

/// One chain of `n` consecutive fingerprints from `from`, stored at depth 0.
pub(super) fn stored(from: u64, n: u64) -> Vec<Change> {
    vec![Change::Stored {
        start_depth: 0,
        fingerprints: Fingerprint::from_raw((from..from + n).collect()),
        block_size: 16,
        tier: Tier::T1,
    }]
}

/// Holders per store epoch, counted from the records themselves.
pub(super) fn holders_per_epoch(ix: &Index) -> Vec<u64> {
    let mut per = vec![0u64; crate::arena::EPOCHS as usize];
    for (_, page) in ix.store.directory().iter() {
        let page = page.read();
        for offset in page.live_offsets() {
            if let Some(view) = page.view(offset) {
                for &h in view.holders() {
                    per[crate::arena::Holder::from_raw(h).epoch() as usize] += 1;
                }
            }
        }
    }
    per
}
