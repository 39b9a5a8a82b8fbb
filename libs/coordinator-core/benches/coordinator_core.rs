//! Hot paths of the coordinator's pure logic: token → key resolution, event
//! application to the views, and an eviction plan over a large LRU.
//!
//! Run: `cargo bench -p ic-coordinator-core --bench coordinator_core`

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ic_coordinator_core::StorageLevel;
use ic_coordinator_core::directory::KeyDirectory;
use ic_coordinator_core::events::{Batch, Entry, EventType};
use ic_coordinator_core::eviction::{EvictionSettings, Quotas, plan};
use ic_coordinator_core::gate::Gate;
use ic_coordinator_core::key::ObjectKey;
use ic_coordinator_core::pins::Pins;
use ic_coordinator_core::resolve::{RequestLimits, TokenQuery, resolve};
use ic_coordinator_core::usage::UsageView;

fn key(i: u64) -> ObjectKey {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&i.to_be_bytes());
    ObjectKey {
        chunk_hash: hash.to_vec(),
        model_name: "meta-llama/Llama-3.1-8B".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: format!("tenant-{}", i % 8),
    }
}

fn store_batch(seq: u64, first: u64, n: u64) -> Batch {
    Batch {
        instance_id: "mp-a".into(),
        incarnation: 1,
        seq,
        event_type: EventType::Store,
        tier: StorageLevel::L2,
        backend: "fs".into(),
        entries: (first..first + n)
            .map(|i| Entry {
                key: key(i),
                size_bytes: 1 << 20,
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

fn bench_resolve(c: &mut Criterion) {
    let mut group = c.benchmark_group("resolve");
    for tokens in [4_096usize, 131_072] {
        let ids: Vec<i64> = (0..tokens as i64).map(|t| (t * 31) % 150_000).collect();
        group.throughput(Throughput::Elements(tokens as u64));
        group.bench_with_input(BenchmarkId::from_parameter(tokens), &ids, |b, ids| {
            b.iter(|| {
                resolve(
                    &TokenQuery {
                        token_ids: ids,
                        model_name: "m",
                        world_size: 1,
                        cache_salt: "",
                    },
                    256,
                    RequestLimits::default(),
                )
                .map(|r| r.keys.len())
            });
        });
    }
    group.finish();
}

fn bench_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_store_batch");
    let n = 256u64;
    group.throughput(Throughput::Elements(n));
    group.bench_function("gate+directory+usage+lru", |b| {
        // The directory keeps the L2 LRU itself.
        let (mut gate, mut dir, mut usage) = (Gate::new(), KeyDirectory::new(), UsageView::new());
        let mut seq = 0u64;
        // Batches are built outside the measurement; keys cycle through a
        // 1M-key working set so the maps stay large.
        b.iter_batched(
            || {
                seq += 1;
                store_batch(seq, (seq * n) % 1_000_000, n)
            },
            |batch| {
                gate.offer(&batch.instance_id, batch.incarnation, batch.seq, 0);
                let old = dir.apply(&batch);
                usage.apply(&batch, &old);
                batch
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn bench_plan(c: &mut Criterion) {
    let (mut dir, mut usage) = (KeyDirectory::new(), UsageView::new());
    for chunk in 0..400u64 {
        let batch = store_batch(chunk + 1, chunk * 250, 250);
        let old = dir.apply(&batch);
        usage.apply(&batch, &old);
    }
    let quotas = Quotas {
        limits: Default::default(),
        default_limit: Some(1 << 30),
    };
    c.bench_function("eviction_plan_100k_keys", |b| {
        b.iter(|| {
            plan(
                &dir,
                &usage,
                &quotas,
                &Pins::new(),
                EvictionSettings::default(),
            )
            .victims
            .len()
        });
    });
}

criterion_group!(benches, bench_resolve, bench_apply, bench_plan);
criterion_main!(benches);
