//! The shared "read, then check lag" step of a Kafka consumer: the topic's
//! partitions and their watermarks are asked on a thread of their own,
//! through a client that never fetches, and published for the reading
//! thread to pick up without waiting. A slow or failing broker then delays
//! the lag figure, never the records: the reading thread polls on while a
//! lag query is in flight, and a failed query is reported, not retried on
//! the reading thread.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// How often the probe asks, and how long it waits.
#[derive(Clone, Copy, Debug)]
pub struct ProbeTimes {
    /// Between two watermark rounds while the broker answers.
    pub watermarks_every: Duration,
    /// Between two partition lookups while the broker answers.
    pub metadata_every: Duration,
    /// One broker call's timeout.
    pub timeout: Duration,
    /// Longest wait between attempts while the broker fails (doubling from
    /// `watermarks_every`).
    pub backoff_max: Duration,
}

/// A failed probe call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeError {
    /// `metadata` or `watermarks` (a fixed set, fit for a metric label).
    pub kind: &'static str,
    /// What the broker or librdkafka said.
    pub message: String,
}

/// What the probe learnt since a [`ProbeCursor`] last looked.
#[derive(Debug, Default)]
pub struct ProbeNews {
    /// The topic's partitions, sorted, when a lookup succeeded since.
    pub partitions: Option<Vec<i32>>,
    /// (low, high) watermarks of every partition, when a round succeeded since.
    pub watermarks: Option<BTreeMap<i32, (i64, i64)>>,
    /// Calls that failed since.
    pub failures: u64,
    /// The newest failure, when any failed since.
    pub last_error: Option<ProbeError>,
}

/// Which of the probe's findings a reader has seen.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeCursor {
    partitions: u64,
    watermarks: u64,
    failures: u64,
}

#[derive(Debug, Default)]
struct Found {
    partitions: Vec<i32>,
    partitions_seq: u64,
    watermarks: BTreeMap<i32, (i64, i64)>,
    watermarks_seq: u64,
    failures: u64,
    last_error: Option<ProbeError>,
}

/// The probe thread's handle; the thread ends soon after the handle is
/// dropped (it is not joined: a call in flight may take `timeout`).
#[derive(Debug)]
pub struct BrokerProbe {
    found: Arc<Mutex<Found>>,
    stop: Arc<AtomicBool>,
}

fn lock(found: &Mutex<Found>) -> MutexGuard<'_, Found> {
    // The probe thread holds the lock only to copy plain data in.
    found
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl BrokerProbe {
    /// Starts asking about `topic` through `client` (which must not be the
    /// reading client: on it, these calls queue behind the fetches).
    pub fn start(client: BaseConsumer, topic: String, times: ProbeTimes) -> std::io::Result<Self> {
        let found = Arc::new(Mutex::new(Found::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (found.clone(), stop.clone());
        std::thread::Builder::new()
            .name("kafka-probe".into())
            .spawn(move || probe_loop(&client, &topic, times, &f, &s))?;
        Ok(Self { found, stop })
    }

    /// What was learnt since `cursor` last looked; never waits on the broker.
    pub fn news(&self, cursor: &mut ProbeCursor) -> ProbeNews {
        let found = lock(&self.found);
        let mut news = ProbeNews::default();
        if found.partitions_seq != cursor.partitions {
            cursor.partitions = found.partitions_seq;
            news.partitions = Some(found.partitions.clone());
        }
        if found.watermarks_seq != cursor.watermarks {
            cursor.watermarks = found.watermarks_seq;
            news.watermarks = Some(found.watermarks.clone());
        }
        if found.failures != cursor.failures {
            news.failures = found.failures - cursor.failures;
            cursor.failures = found.failures;
            news.last_error = found.last_error.clone();
        }
        news
    }
}

impl Drop for BrokerProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn probe_loop(
    client: &BaseConsumer,
    topic: &str,
    times: ProbeTimes,
    found: &Mutex<Found>,
    stop: &AtomicBool,
) {
    let mut partitions: Vec<i32> = Vec::new();
    let mut next_metadata = Instant::now();
    let mut delay = times.watermarks_every;
    while !stop.load(Ordering::Relaxed) {
        let failure = probe_once(
            client,
            topic,
            times,
            &mut partitions,
            &mut next_metadata,
            found,
        );
        delay = match failure {
            None => times.watermarks_every,
            Some(error) => {
                let mut f = lock(found);
                f.failures += 1;
                f.last_error = Some(error);
                (delay * 2).min(times.backoff_max)
            }
        };
        let until = Instant::now() + delay;
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50).min(delay));
        }
    }
}

/// One round: the partitions when due, then every partition's watermarks.
fn probe_once(
    client: &BaseConsumer,
    topic: &str,
    times: ProbeTimes,
    partitions: &mut Vec<i32>,
    next_metadata: &mut Instant,
    found: &Mutex<Found>,
) -> Option<ProbeError> {
    if partitions.is_empty() || Instant::now() >= *next_metadata {
        match topic_partitions(client, topic, times.timeout) {
            Ok(ids) => {
                *next_metadata = Instant::now() + times.metadata_every;
                *partitions = ids;
                let mut f = lock(found);
                f.partitions.clone_from(partitions);
                f.partitions_seq += 1;
            }
            Err(message) => {
                return Some(ProbeError {
                    kind: "metadata",
                    message,
                });
            }
        }
    }
    let mut marks = BTreeMap::new();
    for id in partitions.iter() {
        match client.fetch_watermarks(topic, *id, times.timeout) {
            Ok(m) => {
                marks.insert(*id, m);
            }
            Err(e) => {
                return Some(ProbeError {
                    kind: "watermarks",
                    message: format!("partition {id}: {e}"),
                });
            }
        }
    }
    let mut f = lock(found);
    f.watermarks = marks;
    f.watermarks_seq += 1;
    None
}

/// The topic's partitions, sorted; an error names what was wrong.
pub fn topic_partitions<C: Consumer>(
    client: &C,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, String> {
    let metadata = client
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("metadata: {e}"))?;
    let t = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("metadata: topic {topic:?} not found"))?;
    if let Some(error) = t.error() {
        return Err(format!(
            "metadata: topic {topic:?}: {}",
            RDKafkaErrorCode::from(error)
        ));
    }
    let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if ids.is_empty() {
        return Err(format!("metadata: topic {topic:?} has no partitions"));
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Whether a consumer's poll error ends the client (librdkafka's fatal
/// errors); every other one is transient (librdkafka reconnects and
/// retries on its own), so the reading loop counts it and polls on.
pub fn is_fatal<C: Consumer>(client: &C, error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal)
        || client.client().fatal_error().is_some()
}
