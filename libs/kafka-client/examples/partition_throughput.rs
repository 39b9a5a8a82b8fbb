//! What one partition carries: produces `RECORDS` index batches (each a
//! delta of `EVENTS` stored blocks, as a busy engine's subscriber sends
//! them) to partition 0 of a topic with the subscriber's producer settings
//! (idempotent, acks=all), waits for every acknowledgement, then reads them
//! all back with the index server's consumer settings. Needs a broker with
//! the topic created:
//!
//! ```sh
//! cargo run --release -p ic-kafka-client --example partition_throughput -- \
//!     127.0.0.1:9092 bench-topic [RECORDS] [EVENTS]
//! ```

use std::time::{Duration, Instant};

use ic_kafka_client::{KafkaFlags, Transport, encode};
use ic_proto::index_v1 as pb;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let brokers = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:9092".into());
    let topic = args.get(2).cloned().unwrap_or_else(|| "bench-topic".into());
    let records: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let events: u64 = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(16);
    let flags = KafkaFlags {
        transport: Transport::Kafka,
        kafka_brokers: vec![brokers],
        kafka_topic: topic.clone(),
        ..KafkaFlags::default()
    };
    let batch = |seq: u64| pb::IngestBatch {
        replica: Some(pb::ReplicaIdentity {
            scope: Some(pb::IndexScope {
                tenant: "t".into(),
                model: "m".into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            replica_id: "engine-0".into(),
            address: "10.0.0.1:8000".into(),
            dp_rank: 0,
            incarnation: 1,
        }),
        seq,
        events: (0..events)
            .map(|i| pb::IndexEvent {
                kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
                    parent_fingerprint: 0,
                    start_depth: 0,
                    fingerprints: vec![seq << 16 | i],
                    block_size: 16,
                    tier: pb::Tier::T1 as i32,
                    at_unix_ms: 0,
                })),
            })
            .collect(),
        ..Default::default()
    };
    let mut config = flags.client_config("partition-throughput").expect("flags");
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000");
    let producer: ThreadedProducer<_> = config.create().expect("producer");
    let values: Vec<Vec<u8>> = (1..=records as u64).map(|s| encode(&batch(s))).collect();
    let bytes: usize = values.iter().map(Vec::len).sum();
    let started = Instant::now();
    for value in &values {
        let mut record = BaseRecord::to(&topic)
            .key("t/engine-0")
            .partition(0)
            .payload(value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .expect("every record acknowledged");
    let produced = started.elapsed();

    let mut config = flags.client_config("partition-throughput").expect("flags");
    config
        .set("group.id", "partition-throughput")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100");
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&list).expect("assign");
    let started = Instant::now();
    let mut read = 0;
    while read < records {
        if let Some(message) = consumer.poll(Duration::from_secs(10)) {
            let message = message.expect("a record");
            ic_kafka_client::decode(message.payload()).expect("decodes");
            read += 1;
        } else {
            panic!("only {read} of {records} records came back");
        }
    }
    let consumed = started.elapsed();
    let mib = bytes as f64 / f64::from(1 << 20);
    println!(
        "{records} records of {events} events ({:.0} bytes each): produced {:.0} records/s ({:.1} MiB/s), consumed {:.0} records/s ({:.1} MiB/s)",
        bytes as f64 / records as f64,
        records as f64 / produced.as_secs_f64(),
        mib / produced.as_secs_f64(),
        records as f64 / consumed.as_secs_f64(),
        mib / consumed.as_secs_f64(),
    );
}
