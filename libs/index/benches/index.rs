//! Index benchmarks: apply throughput, lookup latency at scale, and bytes
//! per resident (replica, block) entry as the allocator counts them.
//!
//! Run: `cargo bench -p ic-index --bench index`
//! (`IC_BENCH_ENTRIES=10000000` for the 10M-entry point; default 1M;
//! `IC_BENCH_LAYOUT=interleaved` to build the index from single-block
//! events of 64 chains in flight instead of one event per chain;
//! `IC_BENCH_SHARING=1` for chains held by one replica each instead of 4.)

use std::alloc::System;
use std::collections::HashSet;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ic_index::{
    Change, Fingerprint, HashScheme, Index, IndexConfig, LookupView, ReplicaKey, Scope, Tier,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const REPLICAS: u32 = 256;
const CHAIN: u32 = 1024;

fn scope() -> Scope {
    Scope {
        tenant: "bench".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    }
}

fn key(r: u32) -> ReplicaKey {
    ReplicaKey {
        tenant: "bench".into(),
        replica_id: format!("engine-{r}"),
        dp_rank: 0,
    }
}

/// Replicas holding each chain (`IC_BENCH_SHARING`, default 4; 1 is a
/// fleet where routing keeps every prefix on one replica).
fn sharing() -> u32 {
    std::env::var("IC_BENCH_SHARING")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|s| (1..=REPLICAS).contains(s))
        .unwrap_or(4)
}

/// Fingerprint of block `depth` of prompt family `family` (stand-ins: any
/// distinct u64s behave the same in the index).
fn fp(family: u64, depth: u32) -> Fingerprint {
    Fingerprint((family << 20 | u64::from(depth)).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Fills an index with `entries` (replica, block) entries: each replica
/// holds chains of up to CHAIN blocks; chains are shared by `sharing()`
/// replicas (4 unless `IC_BENCH_SHARING` says otherwise) so lookups see
/// realistic candidate sets. Each chain arrives as one event
/// (as a prefill does), or with `interleaved` one block per event, round
/// robin over 64 chains in flight (as decode steps of concurrent requests
/// do): the worst layout for the index's record order.
fn build(entries: u64, interleaved: bool) -> Index {
    let index = Index::new(IndexConfig {
        capacity_entries: entries * 2,
        ..IndexConfig::default()
    });
    let per_replica = entries / u64::from(REPLICAS);
    let scope = scope();
    for r in 0..REPLICAS {
        let key = key(r);
        let first_family = u64::from(r / sharing()) * 1_000_000;
        // (family, length) of this replica's chains.
        let mut chains = Vec::new();
        let mut held = 0u64;
        while held < per_replica {
            let len = CHAIN.min(u32::try_from(per_replica - held).unwrap_or(CHAIN));
            chains.push((first_family + chains.len() as u64, len));
            held += u64::from(len);
        }
        let store = |family: u64, from: u32, to: u32| {
            let change = Change::Stored {
                start_depth: from,
                fingerprints: (from..to).map(|d| fp(family, d)).collect(),
                block_size: 16,
                tier: Tier::T1,
            };
            index.apply(&key, &scope, "10.0.0.1:8000", &[change], 1);
        };
        if !interleaved {
            for &(family, len) in &chains {
                store(family, 0, len);
            }
            continue;
        }
        for group in chains.chunks(64) {
            let longest = group.iter().map(|c| c.1).max().unwrap_or(0);
            for d in 0..longest {
                for &(family, _) in group.iter().filter(|c| d < c.1) {
                    store(family, d, d + 1);
                }
            }
        }
    }
    index
}

/// What a caller takes from a lookup: the best replica's name, address and
/// match length, read where the index lends them (as the gRPC server does
/// while building its response).
fn best(view: LookupView<'_>) -> Option<(usize, u32)> {
    match view {
        LookupView::Matches(m) => m.first().map(|b| {
            (
                b.replica.replica_id.len() + b.address.len(),
                b.matched_blocks,
            )
        }),
        LookupView::NoEntry | LookupView::UnknownScope | LookupView::TimedOut => None,
    }
}

fn chain(family: u64, blocks: u32) -> Change {
    Change::Stored {
        start_depth: 0,
        fingerprints: (0..blocks).map(|d| fp(family, d)).collect(),
        block_size: 16,
        tier: Tier::T1,
    }
}

fn bench_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    let keys: Vec<ReplicaKey> = (0..REPLICAS).map(key).collect();
    let scope = scope();
    let replica = |family: u64| &keys[(family % u64::from(REPLICAS)) as usize];
    let benching = std::env::args().any(|a| a == "--bench");
    let capacity: u64 = if benching { 2_000_000 } else { 20_000 };
    for blocks in [64u32, 1024] {
        group.throughput(Throughput::Elements(u64::from(blocks)));
        // Each iteration stores the next family's chain.
        let store_next = |b: &mut criterion::Bencher, index: &Index, family: &mut u64| {
            b.iter_batched(
                || {
                    *family += 1;
                    (chain(*family, blocks), *family)
                },
                |(change, f)| {
                    black_box(index.apply(replica(f), &scope, "10.0.0.1:8000", &[change], 1))
                },
                criterion::BatchSize::SmallInput,
            );
        };
        // From an empty index until it is full (its tables growing all the
        // way), then again from a fresh one: no timed store evicts, and the
        // index never outgrows the at-capacity bench's. Only the stores are
        // timed, not building chains or replacing the full index.
        let config = IndexConfig {
            capacity_entries: capacity,
            ..IndexConfig::default()
        };
        let mut filling = Index::new(config);
        let mut family = 0u64;
        group.bench_function(format!("store_{blocks}_block_chains_into_empty"), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    if filling.len() + u64::from(blocks) > capacity {
                        filling = Index::new(config);
                    }
                    family += 1;
                    let change = [chain(family, blocks)];
                    let start = Instant::now();
                    black_box(filling.apply(replica(family), &scope, "10.0.0.1:8000", &change, 1));
                    spent += start.elapsed();
                }
                spent
            });
        });
        drop(filling);
        // A full index: every store evicts as many older entries. Filled
        // on first use, so that a run filtering this bench out skips it.
        let mut full: Option<(Index, u64)> = None;
        let fill = || {
            let index = Index::new(IndexConfig {
                capacity_entries: capacity,
                ..IndexConfig::default()
            });
            let mut family = 0u64;
            while index.capacity_evictions() == 0 {
                family += 1;
                index.apply(
                    replica(family),
                    &scope,
                    "10.0.0.1:8000",
                    &[chain(family, blocks)],
                    1,
                );
            }
            (index, family)
        };
        group.bench_function(format!("store_{blocks}_block_chains_at_capacity"), |b| {
            let (index, family) = full.get_or_insert_with(fill);
            store_next(b, index, family);
        });
    }
    // An engine's steady state: it stores a chain and evicts as many blocks
    // itself, so the index stays below capacity (two block events per
    // block). Engines evict mostly in the order they stored (`oldest`); a
    // random resident chain (`random`) is the hardest case for reclaiming
    // record space. vLLM frees a finished request's blocks tail first, so
    // its evictions take a chain's tail and, later, its head (`tail_first`:
    // each step evicts the tail half of a random whole chain and the head
    // half of the chain whose tail went longest ago).
    let blocks = 64u32;
    let half = blocks / 2;
    group.throughput(Throughput::Elements(2 * u64::from(blocks)));
    let resident = capacity / u64::from(blocks);
    for order in ["oldest", "random", "tail_first"] {
        let tail_first = order == "tail_first";
        // Chains down to their head half at the start (after the whole ones).
        let headless = if tail_first { resident / 4 } else { 0 };
        let region = Region::new(GLOBAL);
        // Filled on first use (see above).
        let mut filled: Option<Index> = None;
        let fill = || {
            let index = Index::new(IndexConfig {
                capacity_entries: capacity * 2,
                ..IndexConfig::default()
            });
            for family in 1..=resident {
                index.apply(
                    replica(family),
                    &scope,
                    "10.0.0.1:8000",
                    &[chain(family, blocks)],
                    1,
                );
            }
            for family in resident + 1..=resident + headless {
                let head = chain(family, half);
                index.apply(replica(family), &scope, "10.0.0.1:8000", &[head], 1);
            }
            index
        };
        // The resident whole chains, the head-only ones (oldest first), and
        // the next family to store.
        let mut families: Vec<u64> = (1..=resident).collect();
        let mut heads: std::collections::VecDeque<u64> =
            (resident + 1..=resident + headless).collect();
        let mut next = resident + headless;
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        group.bench_function(format!("store_and_evict_64_block_chains_{order}"), |b| {
            let index = filled.get_or_insert_with(fill);
            b.iter_batched(
                || {
                    next += 1;
                    let slot = if order == "oldest" {
                        (next - resident - 1) % resident
                    } else {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng % resident
                    };
                    let slot = usize::try_from(slot).unwrap_or(0);
                    let old = std::mem::replace(&mut families[slot], next);
                    let evicted = |family: u64, depths: std::ops::Range<u32>| Change::Evicted {
                        fingerprints: depths.map(|d| fp(family, d)).collect(),
                    };
                    // Each chain's own replica evicts or stores it.
                    let mut steps = Vec::with_capacity(3);
                    if tail_first {
                        steps.push((old, evicted(old, half..blocks)));
                        heads.push_back(old);
                        if let Some(headless) = heads.pop_front() {
                            steps.push((headless, evicted(headless, 0..half)));
                        }
                    } else {
                        steps.push((old, evicted(old, 0..blocks)));
                    }
                    steps.push((next, chain(next, blocks)));
                    steps
                },
                |steps| {
                    for (family, change) in &steps {
                        black_box(index.apply(
                            replica(*family),
                            &scope,
                            "10.0.0.1:8000",
                            std::slice::from_ref(change),
                            1,
                        ));
                    }
                    steps
                },
                criterion::BatchSize::SmallInput,
            );
        });
        let Some(index) = filled else {
            // Filtered out.
            continue;
        };
        let stored = (next - resident - headless) * u64::from(blocks);
        // The fill stores each chain once: nothing to relocate yet.
        let relocated = index.records_relocated();
        // Criterion's own allocations in the region are a few KB: noise.
        let stats = region.change();
        let bytes = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
        eprintln!(
            "evicting {order}: {relocated} records relocated for {stored} stored ({:.3} per stored block); {:.1} bytes per entry after the churn",
            relocated as f64 / stored.max(1) as f64,
            bytes as f64 / index.len().max(1) as f64
        );
    }
    group.finish();
}

fn bench_lookup(c: &mut Criterion) {
    // Under `cargo test`/nextest (no --bench) each benchmark runs once as a
    // smoke test: keep the index small there.
    let benching = std::env::args().any(|a| a == "--bench");
    let entries: u64 = std::env::var("IC_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 1_000_000 } else { 20_000 });
    let interleaved = std::env::var("IC_BENCH_LAYOUT").is_ok_and(|v| v == "interleaved");
    let region = Region::new(GLOBAL);
    let index = build(entries, interleaved);
    let stats = region.change();
    let bytes = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
    // stderr: test runners parse stdout when listing benchmarks.
    eprintln!(
        "index of {} entries over {REPLICAS} replicas ({} layout, {} replicas per chain): {} bytes live, {:.1} bytes per entry",
        index.len(),
        if interleaved {
            "interleaved"
        } else {
            "chain per event"
        },
        sharing(),
        bytes,
        bytes as f64 / index.len() as f64
    );
    // What the `memory_bytes` gauge would report, beside the allocator.
    eprintln!("Index::memory: {:?}", index.memory());
    latency_distribution(&index, entries, if benching { 20_000 } else { 50 });
    let scope = scope();
    let mut group = c.benchmark_group(format!("lookup_{}k_entries", entries / 1000));
    for prompt in [16u32, 128, 1024] {
        // Replica group 0's first family: a full-length match on 4 replicas.
        let fps: Vec<Fingerprint> = (0..prompt).map(|d| fp(0, d)).collect();
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{prompt}_blocks")),
            &fps,
            |b, fps| {
                b.iter(|| black_box(index.lookup_with(&scope, black_box(fps), None, None, best)));
            },
        );
    }
    let candidates: HashSet<String> = (0..8).map(|r| format!("engine-{r}")).collect();
    let fps: Vec<Fingerprint> = (0..128).map(|d| fp(0, d)).collect();
    group.bench_function("128_blocks_8_candidates", |b| {
        b.iter(|| black_box(index.lookup_with(&scope, &fps, Some(&candidates), None, best)));
    });
    // One `/metrics` scrape's memory count (walks every page).
    group.bench_function("memory_scrape", |b| b.iter(|| black_box(index.memory())));
    group.finish();
}

/// p50/p99 of single lookups over prompts spread across every replica
/// group's families (cold in cache, unlike criterion's repeated prompt).
fn latency_distribution(index: &Index, entries: u64, samples: usize) {
    let per_replica = entries / u64::from(REPLICAS);
    let families = per_replica.div_ceil(u64::from(CHAIN)).max(1);
    let groups = u64::from(REPLICAS / sharing());
    let scope = scope();
    for prompt in [16u32, 128, 1024] {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let prompts: Vec<Vec<Fingerprint>> = (0..1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let family = (x % groups) * 1_000_000 + (x >> 32) % families;
                (0..prompt).map(|d| fp(family, d)).collect()
            })
            .collect();
        let mut took: Vec<Duration> = prompts
            .iter()
            .cycle()
            .take(samples)
            .map(|p| {
                let t = Instant::now();
                black_box(index.lookup_with(&scope, black_box(p), None, None, best));
                t.elapsed()
            })
            .collect();
        took.sort_unstable();
        let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        eprintln!(
            "lookup latency, {} entries, {prompt}-block prompts over random families: \
             p50 {:?} p99 {:?} ({} samples)",
            index.len(),
            at(0.50),
            at(0.99),
            took.len()
        );
    }
}

criterion_group!(benches, bench_apply, bench_lookup);
criterion_main!(benches);
