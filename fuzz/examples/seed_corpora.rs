//! Writes the seed inputs of every fuzz target into `fuzz/corpus/` from
//! real engine captures, the webhook's review fixtures, request bodies of
//! the coordinator's API and files made by the real encoders:
//! `cargo run -p ic-fuzz --example seed_corpora`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use ic_fuzz::{COORDINATOR_ROUTES, join_frames, seed_resync};
use ic_proto::index_v1 as pb;
use prost::Message;
use serde_json::json;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = root().join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
}

/// Writes the seed inputs: real engine captures, the webhook's review
/// fixtures, request bodies from the coordinator's API, and files made by
/// the real encoders.
fn main() {
    let workspace = root().join("..");
    // KV-event payloads captured from real vLLM and SGLang publishers.
    let wire = workspace.join("libs/kvevents/tests/fixtures/wire");
    let mut payloads = Vec::new();
    for path in inputs(&wire) {
        if path.extension().is_some_and(|e| e == "msgpack") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let data = std::fs::read(&path).unwrap();
            write("kv_event_batch", &stem, &data);
            payloads.push((stem, data));
        }
    }
    for (i, (stem, payload)) in payloads.iter().enumerate() {
        let seq = (i as u64).to_be_bytes();
        write(
            "zmq_frames",
            &format!("live-{stem}"),
            &join_frames(&[b"kv-events", &seq, payload]),
        );
        write(
            "zmq_frames",
            &format!("replay-{stem}"),
            &join_frames(&[b"", b"kv-events", &seq, payload]),
        );
        write(
            "zmq_frames",
            &format!("replay-old-{stem}"),
            &join_frames(&[b"", &seq, payload]),
        );
    }
    write(
        "zmq_frames",
        "replay-end",
        &join_frames(&[b"", b"", &[0xff; 8], b""]),
    );

    // AdmissionReviews the webhook tests send.
    let fixtures = workspace.join("services/webhook/tests/fixtures");
    write(
        "pod_review",
        "pod-create-vllm",
        &std::fs::read(fixtures.join("pod-create-vllm.json")).unwrap(),
    );
    let pod: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("pod-create-vllm.json")).unwrap())
            .unwrap();
    let mut other_ns = pod.clone();
    other_ns["request"]["namespace"] = json!("elsewhere");
    write(
        "pod_review",
        "pod-create-other-namespace",
        other_ns.to_string().as_bytes(),
    );
    let mut update = pod;
    update["request"]["operation"] = json!("UPDATE");
    write("pod_review", "pod-update", update.to_string().as_bytes());
    for name in [
        "cachebackend-create",
        "cachebackend-create-invalid",
        "cachebackend-update-new-violation",
        "cachebackend-update-preexisting",
    ] {
        write(
            "cachebackend_review",
            name,
            &std::fs::read(fixtures.join(format!("{name}.json"))).unwrap(),
        );
    }

    // Coordinator request bodies, one per route.
    let key = json!({"chunk_hash_hex": "00ff", "model_name": "org/model-a", "kv_rank": 16_777_472,
                     "object_group_id": 0, "cache_salt": ""});
    let bodies = [
        json!({"instance_id": "i-0", "ip": "127.0.0.1", "http_port": 8080, "metadata": {"role": "prefill"}, "mq_port": 5555}),
        json!({}),
        json!({}),
        json!({"batches": [{"instance_id": "i-0", "incarnation": 1000, "seq": 1, "event_type": "store",
                            "tier": "l2", "backend": "s3", "entries": [{"key": key, "size_bytes": 8192}]}]}),
        json!({"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "model_name": "org/model-a", "world_size": 2, "cache_salt": ""}),
        json!({"token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1}),
        json!({"limit_gb": 4}),
        json!({"limit_gb": 1.5}),
        json!({}),
        json!({"token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1, "cache_salt": ""}),
        json!({"token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1, "cache_salt": ""}),
        json!({"instance_id": "i-0", "token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1, "tier": "l2", "force": false}),
        json!({"instance_id": "i-0", "token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1}),
        json!(null),
        json!(null),
    ];
    assert_eq!(bodies.len(), COORDINATOR_ROUTES.len());
    for (i, ((method, path), body)) in COORDINATOR_ROUTES.iter().zip(&bodies).enumerate() {
        let mut data = vec![u8::try_from(i).unwrap()];
        if !body.is_null() {
            data.extend_from_slice(body.to_string().as_bytes());
        }
        let name = format!(
            "{i:02}-{}{}",
            method.to_lowercase(),
            path.replace(['/', '?', '&', '='], "_")
        );
        write("coordinator_body", &name, &data);
    }

    // Files from the real encoders.
    use ic_coordinator_core::{checkpoint, metadata, trace};
    write(
        "checkpoint_file",
        "empty-checkpoint",
        &checkpoint::encode(&checkpoint::Sections::default()).unwrap(),
    );
    write(
        "checkpoint_file",
        "empty-metadata",
        &metadata::encode(&metadata::Metadata::default(), 1_700_000_000.0),
    );
    let batch: ic_coordinator_core::events::WireBatch = serde_json::from_value(json!({
        "instance_id": "i-0", "incarnation": 1000, "seq": 1, "event_type": "store",
        "tier": "l2", "backend": "s3", "entries": [{"key": key, "size_bytes": 8192}]}))
    .unwrap();
    // The version-2 file the coordinator writes: its sections and a
    // directory image holding that batch's key.
    let mut dir = ic_coordinator_core::directory::KeyDirectory::new();
    dir.apply(&batch.validate(0).unwrap());
    let sections = checkpoint::Sections {
        kafka_stream_position: Some(checkpoint::KafkaPositionSection {
            offsets: vec![("events".into(), 0, 7)],
        }),
        ..checkpoint::Sections::default()
    };
    write(
        "checkpoint_file",
        "v2-one-key",
        &checkpoint::encode_file(&sections, &dir).unwrap(),
    );
    let mut writer = trace::TraceWriter::new(Vec::new(), &trace::Header::default()).unwrap();
    writer.batch(0.5, 1_700_000_000.5, &batch).unwrap();
    writer.batch(1.0, 1_700_000_001.0, &batch).unwrap();
    let lct = writer.finish().unwrap();
    write("trace_file", "two-batches", &lct);
    let header_only = trace::TraceWriter::new(Vec::new(), &trace::Header::default())
        .unwrap()
        .finish()
        .unwrap();
    write("trace_file", "header-only", &header_only);
    write("trace_file", "truncated", &lct[..lct.len() / 2]);
    write("checkpoint_file", "trace-as-checkpoint", &lct);

    // gRPC messages.
    let scope = Some(pb::IndexScope {
        tenant: "team-a".into(),
        model: "meta-llama/Llama-3.1-8B".into(),
        hash_scheme: pb::HashScheme::Vllm as i32,
        adapter: String::new(),
    });
    let tokens: Vec<u32> = (0..64 * 16).collect();
    let lookups = [
        (
            "token-ids",
            pb::LookupRouteRequest {
                scope: scope.clone(),
                key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
                    ids: tokens.clone(),
                })),
                observe_only: true,
                ..Default::default()
            },
        ),
        (
            "block-hashes",
            pb::LookupRouteRequest {
                scope: scope.clone(),
                key: Some(pb::lookup_route_request::Key::BlockHashes(
                    pb::BlockHashes {
                        hashes: ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(
                            None, &tokens, 16,
                        )),
                    },
                )),
                candidate_replicas: vec!["engine-1".into()],
                ..Default::default()
            },
        ),
        (
            "routed",
            pb::LookupRouteRequest {
                scope: scope.clone(),
                key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
                    ids: tokens[..100].to_vec(),
                })),
                ..Default::default()
            },
        ),
    ];
    for (name, request) in lookups {
        write("lookup_route", name, &request.encode_to_vec());
    }
    let resync = seed_resync("engine-0");
    let mut follow = resync.clone();
    follow.seq = 2;
    follow.resync_begin = false;
    follow.resync_end = false;
    follow.events = vec![pb::IndexEvent {
        kind: Some(pb::index_event::Kind::Evicted(pb::BlocksEvicted {
            fingerprints: ic_kvevents::Fingerprint::to_raw(
                ic_kvevents::chain_fingerprints(None, &tokens, 16)[60..].to_vec(),
            ),
            at_unix_ms: 0,
        })),
    }];
    let stream = |batches: &[&pb::IngestBatch]| -> Vec<u8> {
        batches
            .iter()
            .flat_map(|b| b.encode_length_delimited_to_vec())
            .collect()
    };
    write("ingest_events", "resync", &stream(&[&resync]));
    write(
        "ingest_events",
        "resync-then-removal",
        &stream(&[&resync, &follow]),
    );
    let mut begin = resync.clone();
    begin.resync_end = false;
    let mut end = resync.clone();
    end.seq = 2;
    end.resync_begin = false;
    write(
        "ingest_events",
        "split-resync",
        &stream(&[&begin, &end, &follow]),
    );
}
