//! What a Kafka snapshot costs at scale: fills an index with `ENTRIES`
//! entries (engines × prompts of 32 blocks, a shared system prompt per
//! engine), then times the dump, its byte form both ways and the restore
//! into an empty index. `cargo run --release -p ic-index --example
//! dump_scale [ENTRIES]` (default 10,000,000); figures in
//! docs/benchmarks.md.

use std::time::Instant;

use ic_index::dump::{Dec, Dump, Enc};
use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

fn main() {
    let entries: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let engines: u64 = 100;
    let per_prompt: u64 = 32;
    let prompts = entries / engines / per_prompt;
    let config = IndexConfig {
        capacity_entries: entries + entries / 8,
        shards: 32,
        ..IndexConfig::default()
    };
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let index = Index::new(config);
    let started = Instant::now();
    for e in 0..engines {
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: format!("engine-{e}"),
            dp_rank: 0,
        };
        let changes: Vec<Change> = (0..prompts)
            .map(|p| Change::Stored {
                start_depth: 0,
                fingerprints: (0..per_prompt)
                    .map(|b| Fingerprint((e << 40) ^ (p << 8) ^ b ^ 0x9e37_79b9_7f4a_7c15))
                    .collect(),
                block_size: 16,
                tier: Tier::T1,
            })
            .collect();
        index.replace(
            &key,
            &scope,
            &format!("10.0.{}.{}:8000", e / 256, e % 256),
            &changes,
            1,
        );
    }
    let fill = started.elapsed();
    let started = Instant::now();
    let dump = index.dump();
    let dumped = started.elapsed();
    let started = Instant::now();
    let mut enc = Enc::default();
    dump.encode(&mut enc);
    let encoded = started.elapsed();
    let started = Instant::now();
    let decoded = Dump::decode(&mut Dec::new(&enc.buf)).expect("decodes");
    let decode = started.elapsed();
    let restored = Index::new(config);
    let started = Instant::now();
    let errors = restored.restore(&decoded, 2);
    let restore = started.elapsed();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(restored.len(), index.len());
    println!(
        "entries {} in {engines} engines; fill (as resyncs) {:.2} s; dump {:.2} s; encode {:.2} s ({} MiB); decode {:.2} s; restore {:.2} s",
        index.len(),
        fill.as_secs_f64(),
        dumped.as_secs_f64(),
        encoded.as_secs_f64(),
        enc.buf.len() >> 20,
        decode.as_secs_f64(),
        restore.as_secs_f64(),
    );
}
