//! A real Kafka-protocol broker for tests: `tansu` on loopback with
//! in-memory storage, one per test, stopped on drop. Records are produced
//! with rdkafka, the same client library the coordinator consumes with.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use ic_e2e::tansu::INSTALL;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::{Value, json};

/// How long a wait for the broker or the coordinator to reach a state may
/// last (a hang guard, not a timing check).
pub const DEADLINE: Duration = Duration::from_secs(90);

/// A running tansu broker.
#[derive(Debug)]
pub struct Broker {
    child: Child,
    bin: PathBuf,
    /// Listener port on 127.0.0.1.
    pub port: u16,
}

impl Broker {
    /// Starts a broker on a free loopback port.
    pub fn start() -> Self {
        Self::start_on(ic_e2e::free_port())
    }

    /// Starts a broker on `port` and waits until it accepts connections.
    ///
    /// # Panics
    /// When tansu is missing or does not come up.
    pub fn start_on(port: u16) -> Self {
        let bin = ic_e2e::tansu::binary();
        let child = ic_e2e::tansu::broker_command(&bin, port, ic_e2e::tansu::Storage::Memory)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL}", bin.display()));
        let mut broker = Self { child, bin, port };
        ic_e2e::tansu::wait_listening(&mut broker.child, port, String::new);
        broker
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates a topic (tansu does not auto-create them).
    pub fn create_topic(&self, name: &str, partitions: u32) {
        ic_e2e::tansu::create_topic(&self.bin, self.port, name, partitions);
    }

    /// A producer with the MP servers' delivery settings.
    pub fn producer(&self) -> BaseProducer {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("acks", "all")
            // One in-flight request keeps each partition in send order even
            // across retries.
            .set("max.in.flight.requests.per.connection", "1")
            // tansu 0.6.0 reports a partition's high watermark as the last
            // record batch's base offset + 1; one record per batch keeps the
            // watermarks (lag, readiness) right.
            .set("batch.num.messages", "1")
            .set("linger.ms", "0")
            .create()
            .unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One record: key (`None` for a keyless record) and value (`None` for a
/// tombstone).
pub type Record = (Option<String>, Option<Vec<u8>>);

/// Sends records in order to `topic` (partition chosen by key) and waits
/// until the broker has them all.
pub fn produce(producer: &BaseProducer, topic: &str, records: &[Record]) {
    for (key, value) in records {
        let mut record: BaseRecord<'_, str, [u8]> = BaseRecord::to(topic);
        if let Some(k) = key {
            record = record.key(k.as_str());
        }
        if let Some(v) = value {
            record = record.payload(v.as_slice());
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(DEADLINE).unwrap();
}

/// A valid record carrying one batch, keyed by its instance.
pub fn batch_record(batch: &Value) -> Record {
    let key = batch["instance_id"].as_str().unwrap().to_owned();
    let value = serde_json::to_vec(&json!({ "batches": [batch] })).unwrap();
    (Some(key), Some(value))
}

/// A key unique to `(instance, seq, n)`, tenant `t`.
pub fn key(instance: &str, seq: u64, n: u64) -> Value {
    let hash = stable_hex(&format!("{instance}/{seq}/{n}"));
    json!({"chunk_hash_hex": hash, "model_name": "org/model-a", "kv_rank": 16777472,
           "object_group_id": 0, "cache_salt": "t"})
}

fn stable_hex(s: &str) -> String {
    // A stable 64-hex-digit hash without another dependency.
    let mut out = String::new();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0..4u64 {
        for b in s.bytes().chain(round.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// Instance `instance`'s batch number `seq`: a config first, then stores on
/// L1 and L2, accesses (which count, so a double apply shows) and deletes.
pub fn scripted_batch(instance: &str, incarnation: u64, seq: u64) -> Value {
    let base = |event: &str, tier: &str, backend: &str| {
        json!({"instance_id": instance, "incarnation": incarnation, "seq": seq,
             "event_type": event, "tier": tier, "backend": backend, "entries": []})
    };
    let entry = |k: Value, size: u64| json!({"key": k, "size_bytes": size});
    if seq == 1 {
        let mut b = base("config", "l2", "fs");
        b["capacity_bytes"] = json!(1u64 << 30);
        b["capacity_revision"] = json!(1);
        return b;
    }
    if seq.is_multiple_of(5) {
        let mut b = base("access", "l2", "fs");
        b["entries"] = json!([
            entry(key(instance, seq - 1, 0), 0),
            entry(key(instance, seq - 3, 0), 0)
        ]);
        return b;
    }
    if seq.is_multiple_of(7) {
        let mut b = base("delete", "l2", "fs");
        b["entries"] = json!([entry(key(instance, seq - 2, 0), 0)]);
        return b;
    }
    if seq.is_multiple_of(2) {
        let mut b = base("store", "l1", "dram");
        b["entries"] = json!([entry(key(instance, seq, 1), 1000 + seq)]);
        return b;
    }
    let mut b = base("store", "l2", "fs");
    b["entries"] = json!([
        entry(key(instance, seq, 0), 4096 + seq),
        entry(key(instance, seq, 2), 10)
    ]);
    b
}

/// Records consumed according to `/status`: offsets start at 0 and are
/// contiguous on these topics, so `last_offset + 1` summed over partitions.
pub fn consumed(status: &Value) -> i64 {
    status["kafka"]["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["last_offset"].as_i64())
        .map(|o| o + 1)
        .sum()
}

/// The views a client can read, in a form two coordinators fed the same
/// events compare equal in even when partitions interleaved differently:
/// directory keys sorted, gate cursors without registry details.
pub fn views(stats: &Value, keys: &Value, usage: &Value, status: &Value) -> Value {
    let mut keys = keys["keys"].as_array().cloned().unwrap_or_default();
    keys.sort_by_key(|k| k["key"].to_string());
    let streams: Vec<Value> = status["streams"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            json!([
                s["instance_id"],
                s["incarnation"],
                s["last_seq"],
                s["gap_detected"]
            ])
        })
        .collect();
    json!({"stats": stats, "keys": keys, "total": keys.len(), "usage": usage, "streams": streams})
}
