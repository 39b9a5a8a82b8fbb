//! Admission of IngestEvents streams: how many may be open in all and per
//! client, how long one may stay silent, and the bounds each stream's
//! session enforces. Every bound is a flag; a refusal is counted in
//! `ingest_refused_total{limit}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ic_index::ingest::IngestLimits;
use parking_lot::Mutex;

/// Stream bounds of one server.
#[derive(Debug)]
pub struct IngestControl {
    /// Bounds inside each stream (ranks, resync buffering).
    pub limits: IngestLimits,
    /// Streams open at once, in all.
    pub max_streams: usize,
    /// Streams open at once per client (its identity, or its IP address
    /// when callers are anonymous).
    pub max_streams_per_client: usize,
    /// A stream with no batch for this long is closed (subscribers
    /// heartbeat every 5 s).
    pub idle_timeout: Duration,
    open: Mutex<OpenStreams>,
}

#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    by_client: HashMap<String, usize>,
}

impl Default for IngestControl {
    fn default() -> Self {
        Self::new(IngestLimits::default(), 4096, 64, Duration::from_secs(60))
    }
}

/// Why a stream was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamRefusal {
    /// `--max-ingest-streams`.
    Total,
    /// `--max-ingest-streams-per-client`.
    PerClient,
}

impl StreamRefusal {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Total => "streams",
            Self::PerClient => "streams_per_client",
        }
    }

    /// What the caller is told.
    pub fn detail(self, control: &IngestControl) -> String {
        match self {
            Self::Total => format!(
                "the index server already has {} ingest streams open (--max-ingest-streams)",
                control.max_streams
            ),
            Self::PerClient => format!(
                "this client already has {} ingest streams open (--max-ingest-streams-per-client)",
                control.max_streams_per_client
            ),
        }
    }
}

impl IngestControl {
    /// A control with these bounds.
    pub fn new(
        limits: IngestLimits,
        max_streams: usize,
        max_streams_per_client: usize,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            limits,
            max_streams,
            max_streams_per_client,
            idle_timeout,
            open: Mutex::new(OpenStreams::default()),
        }
    }

    /// Admits one stream of `client`; it counts until the permit drops.
    pub fn admit(self: &Arc<Self>, client: String) -> Result<StreamPermit, StreamRefusal> {
        let mut open = self.open.lock();
        if open.total >= self.max_streams {
            return Err(StreamRefusal::Total);
        }
        let mine = open.by_client.get(&client).copied().unwrap_or(0);
        if mine >= self.max_streams_per_client {
            return Err(StreamRefusal::PerClient);
        }
        open.total += 1;
        open.by_client.insert(client.clone(), mine + 1);
        Ok(StreamPermit {
            control: self.clone(),
            client,
        })
    }
}

/// One admitted stream.
#[derive(Debug)]
pub struct StreamPermit {
    control: Arc<IngestControl>,
    client: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.control.open.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_client.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_capped_in_all_and_per_client_and_released_on_drop() {
        let control = Arc::new(IngestControl::new(
            IngestLimits::default(),
            3,
            2,
            Duration::from_secs(1),
        ));
        let a1 = control.admit("a".into()).unwrap();
        let _a2 = control.admit("a".into()).unwrap();
        assert_eq!(
            control.admit("a".into()).unwrap_err(),
            StreamRefusal::PerClient
        );
        let _b1 = control.admit("b".into()).unwrap();
        assert_eq!(control.admit("c".into()).unwrap_err(), StreamRefusal::Total);
        drop(a1);
        let _c1 = control.admit("c".into()).unwrap();
        assert_eq!(control.open.lock().by_client.len(), 3);
    }
}
