//! Domain index changes → `inferencecache.index.v1` messages.

use ic_kvevents::{Fingerprint, IndexChange, Tier};
use ic_proto::index_v1 as pb;

fn tier(t: Tier) -> i32 {
    ic_proto::tier::to_pb(t)
}

/// One change as a protobuf event.
pub fn event(change: IndexChange) -> pb::IndexEvent {
    let kind = match change {
        IndexChange::Stored {
            parent,
            start_depth,
            fingerprints,
            block_size,
            tier: t,
            at_ms,
        } => pb::index_event::Kind::Stored(pb::BlocksStored {
            parent_fingerprint: parent.map_or(0, |p| p.0),
            start_depth,
            fingerprints: Fingerprint::to_raw(fingerprints),
            block_size,
            tier: tier(t),
            at_unix_ms: at_ms,
        }),
        IndexChange::Evicted {
            fingerprints,
            at_ms,
        } => pb::index_event::Kind::Evicted(pb::BlocksEvicted {
            fingerprints: Fingerprint::to_raw(fingerprints),
            at_unix_ms: at_ms,
        }),
        IndexChange::Cleared { tier: t, at_ms } => {
            pb::index_event::Kind::Cleared(pb::ReplicaCleared {
                tier: tier(t),
                at_unix_ms: at_ms,
            })
        }
    };
    pb::IndexEvent { kind: Some(kind) }
}
