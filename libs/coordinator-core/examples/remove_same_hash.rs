//! The cost of removing every key of one chunk hash: stores K keys that
//! share a chunk hash (K object groups, as an emitter reporting many groups
//! or ranks under one chunk does), then deletes them one batch a key in a
//! shuffled order. Run under callgrind, counting only the deletes:
//!
//! `cargo build --release -p ic-coordinator-core --example remove_same_hash`, then
//! `valgrind --tool=callgrind --toggle-collect='*delete_all*' target/release/examples/remove_same_hash K`.

use ic_coordinator_core::StorageLevel;
use ic_coordinator_core::directory::KeyDirectory;
use ic_coordinator_core::events::{Batch, Entry, EventType};
use ic_coordinator_core::key::ObjectKey;

fn batch(event_type: EventType, seq: u64, groups: &[i64]) -> Batch {
    Batch {
        instance_id: "mp-0".into(),
        incarnation: 1,
        seq,
        event_type,
        tier: StorageLevel::L2,
        backend: "fs".into(),
        entries: groups
            .iter()
            .map(|&g| Entry {
                key: ObjectKey {
                    chunk_hash: vec![7; 16],
                    model_name: "m".into(),
                    kv_rank: 0,
                    object_group_id: g,
                    cache_salt: String::new(),
                },
                size_bytes: 1,
                token_ids: Vec::new(),
                token_offset: -1,
            })
            .collect(),
        shared: false,
        ts: 1.0,
        capacity_bytes: 0,
        capacity_revision: 0,
        dropped_events: 0,
    }
}

/// Deletes the keys of `order`'s groups, one batch each (what callgrind
/// counts).
#[inline(never)]
fn delete_all(dir: &mut KeyDirectory, order: &[i64]) {
    for (i, &g) in order.iter().enumerate() {
        dir.apply(&batch(EventType::Delete, i as u64 + 2, &[g]));
    }
}

fn main() {
    let k: i64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let mut dir = KeyDirectory::new();
    let groups: Vec<i64> = (0..k).collect();
    dir.apply(&batch(EventType::Store, 1, &groups));
    // A fixed shuffle (xorshift), so runs compare.
    let mut order = groups;
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    delete_all(&mut dir, &order);
    assert_eq!(dir.len(), 0);
    println!("removed {k} keys of one chunk hash");
}
