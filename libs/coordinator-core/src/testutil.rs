//! Builders shared by the unit tests.

use crate::StorageLevel;
use crate::events::{Batch, Entry, EventType};
use crate::key::ObjectKey;

pub(crate) fn key(hash: u8, salt: &str) -> ObjectKey {
    ObjectKey {
        chunk_hash: vec![hash; 4],
        model_name: "m".into(),
        kv_rank: 16777472,
        object_group_id: 0,
        cache_salt: salt.into(),
    }
}

pub(crate) fn batch(
    instance: &str,
    event: EventType,
    tier: StorageLevel,
    backend: &str,
    shared: bool,
    entries: &[(ObjectKey, u64)],
) -> Batch {
    Batch {
        instance_id: instance.into(),
        incarnation: 1,
        seq: 1,
        event_type: event,
        tier,
        backend: backend.into(),
        entries: entries
            .iter()
            .map(|(k, s)| Entry {
                key: k.clone(),
                size_bytes: *s,
                token_ids: Vec::new(),
                token_offset: -1,
            })
            .collect(),
        shared,
        ts: 1.0,
        capacity_bytes: 0,
        capacity_revision: 0,
        dropped_events: 0,
    }
}
