//! Byte-exact payloads of every engine era (written by
//! `tests/fixtures/gen_wire_fixtures.py` with the engines' own msgspec
//! encoding) decode to exactly what the engine meant.

// Test and benchmark helpers panic on bad fixtures by design.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::Path;

use ic_kvevents::{EngineHash, KvEvent, Medium, decode_batch};
use serde_json::Value;

fn medium_of(v: &Value) -> Medium {
    match v.as_str() {
        None | Some("GPU") => Medium::Gpu,
        Some(other) => Medium::Offload(other.to_owned()),
    }
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn hashes(v: &Value) -> Vec<EngineHash> {
    u64s(v).into_iter().map(EngineHash).collect()
}

fn check_event(got: &KvEvent, want: &Value, ctx: &str) {
    match (got, want["type"].as_str().unwrap()) {
        (KvEvent::BlockStored(s), "BlockStored") => {
            assert_eq!(s.block_hashes, hashes(&want["block_hashes"]), "{ctx}");
            assert_eq!(
                s.parent_block_hash,
                want["parent_block_hash"].as_u64().map(EngineHash),
                "{ctx}"
            );
            let tokens: Vec<u32> = u64s(&want["token_ids"])
                .into_iter()
                .map(|t| t as u32)
                .collect();
            assert_eq!(s.token_ids, tokens, "{ctx}");
            assert_eq!(
                u64::from(s.block_size),
                want["block_size"].as_u64().unwrap(),
                "{ctx}"
            );
            assert_eq!(s.medium, medium_of(&want["medium"]), "{ctx}");
            assert_eq!(s.lora_name.as_deref(), want["lora_name"].as_str(), "{ctx}");
            assert_eq!(
                s.group_idx.map(u64::from),
                want["group_idx"].as_u64(),
                "{ctx}"
            );
            assert_eq!(
                s.kv_cache_spec_kind.as_deref(),
                want["kv_cache_spec_kind"].as_str(),
                "{ctx}"
            );
            assert_eq!(
                s.cache_salt.as_deref(),
                want["cache_salt"].as_str(),
                "{ctx}"
            );
        }
        (KvEvent::BlockRemoved(r), "BlockRemoved") => {
            assert_eq!(r.block_hashes, hashes(&want["block_hashes"]), "{ctx}");
            assert_eq!(r.medium, medium_of(&want["medium"]), "{ctx}");
            assert_eq!(
                r.group_idx.map(u64::from),
                want["group_idx"].as_u64(),
                "{ctx}"
            );
        }
        (KvEvent::AllBlocksCleared, "AllBlocksCleared") => {}
        (got, want) => panic!("{ctx}: decoded {got:?}, expected a {want}"),
    }
}

#[test]
fn every_era_decodes_exactly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "msgpack") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let payload = std::fs::read(&path).unwrap();
        let expected: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}.expected.json"))).unwrap(),
        )
        .unwrap();
        let batch = decode_batch(&payload).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(batch.rejected.is_empty(), "{name}: {:?}", batch.rejected);
        assert_eq!(batch.ts, expected["ts"].as_f64().unwrap(), "{name}");
        assert_eq!(
            batch.data_parallel_rank.map(u64::from),
            expected["data_parallel_rank"].as_u64(),
            "{name}"
        );
        let want = expected["events"].as_array().unwrap();
        assert_eq!(batch.events.len(), want.len(), "{name}");
        for (i, (got, want)) in batch.events.iter().zip(want).enumerate() {
            check_event(got, want, &format!("{name} event {i}"));
        }
        count += 1;
    }
    assert!(count >= 7, "fixtures missing: {count}");
}
