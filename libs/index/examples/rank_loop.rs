//! A fixed amount of routing work for instruction counting with callgrind:
//! `valgrind --tool=callgrind target/release/examples/rank_loop 2000 256 [ttft|weights] [HOLDERS] [pick]`
//! ranks a 32-block prompt `n` times in a scope of `replicas` engines, each
//! holding a different share of it (or, with `HOLDERS`, only that many of
//! them; the rest hold other blocks), with every replica on the load board;
//! with `pick`, each ranking's destination is recorded as a pick (as
//! LookupRoute does), so a large scope's shortlist follows picks and is
//! rebuilt as it would be under load (one ranking per ms: once 20 ms old,
//! or once picks made its listed replicas busier than the rest).

use ic_index::load::{EngineLoad, LoadBoard, LoadSettings};
use ic_index::pick::{ScoreWeights, TtftModel};
use ic_index::route::{
    Boards, RouteKey, RoutePolicy, RouteQuery, Scoring, route_ranked, scope_tag,
};
use ic_index::speculative::{Speculation, SpeculationSettings};
use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

const T0: i64 = 1_700_000_000_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: i64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let replicas: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let ttft = args.next().is_some_and(|a| a == "ttft");
    let holders: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(replicas);
    let pick = args.next().is_some_and(|a| a == "pick");
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let index = Index::new(IndexConfig::default());
    let load = LoadBoard::new(LoadSettings::default());
    let prompt: Vec<Fingerprint> = Fingerprint::from_raw((1..=32).collect());
    for r in 0..replicas {
        let id = format!("engine-{r}");
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: id.clone(),
            dp_rank: 0,
        };
        let held = usize::try_from(r % 33).unwrap_or(0).max(1);
        let fingerprints = if r < holders {
            prompt[..held].to_vec()
        } else {
            Fingerprint::from_raw(vec![1_000 + r])
        };
        let change = Change::Stored {
            start_depth: 0,
            fingerprints,
            block_size: 16,
            tier: Tier::T1,
        };
        let _ = index.apply(
            &key,
            &scope,
            &format!("10.0.{}.{}:8000", r / 256, r % 256),
            &[change],
            T0,
        );
        load.report_engine(
            &id,
            EngineLoad {
                waiting: u32::try_from(r % 5).unwrap_or(0),
                running: u32::try_from(r % 7).unwrap_or(0),
                kv_usage: 0.5,
            },
            T0,
        );
    }
    let speculation = Speculation::new(SpeculationSettings::default());
    let weights = ScoreWeights {
        ttft: ttft.then_some(TtftModel {
            tokens_per_ms: 16.0,
            overhead_ms: 2.0,
        }),
        ..ScoreWeights::default()
    };
    let mut best = 0usize;
    for i in 0..n {
        let query = RouteQuery {
            scope: &scope,
            key: RouteKey::Blocks(&prompt),
            candidates: None,
            extras: None,
        };
        let ranked = route_ranked(
            &index,
            &query,
            &RoutePolicy::default(),
            16,
            T0 + i,
            &ic_index::NoDeadline,
            Scoring {
                weights: &weights,
                source: &Boards {
                    load: &load,
                    speculation: &speculation,
                },
                scope_tag: scope_tag(&scope),
                pool: None,
                others: ic_index::pick::OTHERS_RANKED,
                holders: usize::MAX,
            },
        );
        best += ranked.ranked.len();
        if let Some(to) = ranked.destination().filter(|_| pick) {
            load.picked(&to.replica.replica_id, T0 + i);
        }
    }
    println!("{best}");
}
