//! Lookups beside registry writers, for the tail both see:
//! `target/release/examples/route_contention ROUTERS APPLIES GAP_US HOLDERS [solo N] [top K]`
//! builds a scope of 256 engines on the load board, HOLDERS of them
//! holding a share of a 32-block prompt (the rest other blocks); ROUTERS threads rank the prompt and
//! record each destination as a pick (LookupRoute's path: a large scope's
//! shortlist followed by picks and rebuilt every 20 ms of the shared
//! logical clock, one ms per ranking), while one thread resyncs an engine
//! (`Index::replace`: two writes of the registry) APPLIES times, GAP_US
//! apart. Prints p50/p99/p99.9/max of each (F7: a ranking inside the
//! walk, with the registry read-locked, made each resync wait for it).
//! With `solo N`: one thread, N
//! rankings, no writer and no timing (for callgrind: run two N and
//! difference). With `top K`: each ranking answers the best K holders
//! only (LookupRoute's `max_candidates`; default all). With `idle 1`: no
//! engine reports, so every engine is as idle as the next (a level fleet,
//! which the shortlist keeps as one tied group). With `replicas R` and
//! `blocks B`: R engines (default 256) and a B-block prompt (default 32);
//! with `whole 1` each holder holds the whole prompt (ic-loadgen's
//! preload: four engines storing one chain, so each block's record lists
//! them all).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use ic_index::load::{EngineLoad, LoadBoard, LoadSettings};
use ic_index::pick::ScoreWeights;
use ic_index::route::{
    Boards, Ranked, RouteKey, RoutePolicy, RouteQuery, Scoring, route_ranked, scope_tag,
};
use ic_index::speculative::{Speculation, SpeculationSettings};
use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

const T0: i64 = 1_700_000_000_000;

struct Fleet {
    index: Index,
    load: LoadBoard,
    speculation: Speculation,
    scope: Scope,
    prompt: Vec<Fingerprint>,
    clock: AtomicI64,
    holders: u64,
    replicas: u64,
    whole: bool,
}

/// The fleet's shape, from the command line.
#[derive(Clone, Copy)]
struct Shape {
    holders: u64,
    idle: bool,
    replicas: u64,
    blocks: u64,
    whole: bool,
}

fn key(r: u64) -> ReplicaKey {
    ReplicaKey {
        tenant: "t".into(),
        replica_id: format!("engine-{r}"),
        dp_rank: 0,
    }
}

fn address(r: u64) -> String {
    format!("10.0.{}.{}:8000", r / 256, r % 256)
}

/// Engine `r`'s blocks: a share of the prompt for the first `holders`,
/// a block of its own for the rest.
fn holding(prompt: &[Fingerprint], r: u64, holders: u64, whole: bool) -> Change {
    let held = if whole {
        prompt.len()
    } else {
        usize::try_from(r % 33).unwrap_or(0).clamp(1, prompt.len())
    };
    Change::Stored {
        start_depth: 0,
        fingerprints: if r < holders {
            prompt[..held].to_vec()
        } else {
            Fingerprint::from_raw(vec![prompt.len() as u64 + 1_000 + r])
        },
        block_size: 16,
        tier: Tier::T1,
    }
}

impl Fleet {
    fn new(shape: Shape) -> Self {
        let Shape {
            holders,
            idle,
            replicas,
            blocks,
            whole,
        } = shape;
        let scope = Scope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        };
        let index = Index::new(IndexConfig::default());
        let load = LoadBoard::new(LoadSettings::default());
        let prompt: Vec<Fingerprint> = Fingerprint::from_raw((1..=blocks).collect());
        for r in 0..replicas {
            let _ = index.apply(
                &key(r),
                &scope,
                &address(r),
                &[holding(&prompt, r, holders, whole)],
                T0,
            );
            if idle {
                continue;
            }
            load.report_engine(
                &key(r).replica_id,
                EngineLoad {
                    waiting: u32::try_from(r % 5).unwrap_or(0),
                    running: u32::try_from(r % 7).unwrap_or(0),
                    kv_usage: 0.5,
                },
                T0,
            );
        }
        Self {
            index,
            load,
            speculation: Speculation::new(SpeculationSettings::default()),
            scope,
            prompt,
            clock: AtomicI64::new(T0),
            holders,
            replicas,
            whole,
        }
    }

    /// One LookupRoute: ranked, and the destination recorded as a pick.
    fn route(&self, weights: &ScoreWeights, tag: u64, top: usize) -> usize {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let query = RouteQuery {
            scope: &self.scope,
            key: RouteKey::Blocks(&self.prompt),
            candidates: None,
            extras: None,
        };
        let scoring = Scoring {
            weights,
            source: &Boards {
                load: &self.load,
                speculation: &self.speculation,
            },
            scope_tag: tag,
            pool: None,
            others: 1,
            holders: top,
        };
        // Every engine stays fresh however far the logical clock runs.
        let policy = RoutePolicy {
            replica_stale_after: Duration::from_secs(1 << 32),
            ..RoutePolicy::default()
        };
        let deadline = ic_index::NoDeadline;
        let ranked: Ranked =
            route_ranked(&self.index, &query, &policy, 16, now, &deadline, scoring);
        if let Some(to) = ranked.destination() {
            self.load
                .picked_in_scope(tag, &to.replica.replica_id, now, |_| 0.0);
        }
        ranked.ranked.len()
    }
}

fn percentiles(name: &str, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1_000.0;
    println!(
        "{name}: n={} p50={:.1}us p99={:.1}us p99.9={:.1}us max={:.1}us",
        ns.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let routers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let applies: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let gap_us: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let holders: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let mut solo = false;
    let mut solo_n: usize = 2_000;
    let mut top = usize::MAX;
    let mut idle = false;
    let mut replicas: u64 = 256;
    let mut blocks: u64 = 32;
    let mut whole = false;
    while let Some(a) = args.next() {
        let n = args.next().and_then(|n| n.parse().ok());
        match a.as_str() {
            "solo" => (solo, solo_n) = (true, n.unwrap_or(solo_n)),
            "top" => top = n.unwrap_or(top),
            "idle" => idle = n.unwrap_or(0) != 0,
            "replicas" => replicas = n.map_or(replicas, |n| n as u64).max(1),
            "blocks" => blocks = n.map_or(blocks, |n| n as u64).max(1),
            "whole" => whole = n.unwrap_or(0) != 0,
            _ => {}
        }
    }
    let fleet = Arc::new(Fleet::new(Shape {
        holders,
        idle,
        replicas,
        blocks,
        whole,
    }));
    let weights = ScoreWeights::default();
    let tag = scope_tag(&fleet.scope);
    if solo {
        let ranked: usize = (0..solo_n).map(|_| fleet.route(&weights, tag, top)).sum();
        println!("{ranked}");
        return;
    }
    let done = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..routers)
        .map(|_| {
            let fleet = fleet.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut ns = Vec::with_capacity(1 << 20);
                while !done.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    std::hint::black_box(fleet.route(&weights, tag, top));
                    ns.push(t.elapsed().as_nanos() as u64);
                }
                ns
            })
        })
        .collect();
    let mut apply_ns = Vec::with_capacity(applies);
    for i in 0..applies {
        let r = i as u64 % fleet.replicas;
        let change = holding(&fleet.prompt, r, fleet.holders, fleet.whole);
        let now = fleet.clock.load(Ordering::Relaxed);
        let t = Instant::now();
        let _ = fleet
            .index
            .replace(&key(r), &fleet.scope, &address(r), &[change], now);
        apply_ns.push(t.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_micros(gap_us));
    }
    done.store(true, Ordering::Relaxed);
    let lookups: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap_or_default())
        .collect();
    println!("routers={routers} gap_us={gap_us} holders={holders}");
    percentiles("lookup", lookups);
    percentiles("replace", apply_ns);
}
