//! WATCH: the change log as newline-delimited JSON events, from a
//! resourceVersion on (or synthetic ADDED events of what exists first, as the
//! API server does for an unset or `"0"` resourceVersion), until the
//! request's `timeoutSeconds`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};

use crate::body::Body;
use crate::store::{State, Target, matches_selector};

/// Longest a watch stays open (clients re-watch from where they were).
const MAX_WATCH: Duration = Duration::from_secs(290);

/// One watch, as requested.
pub(crate) struct WatchRequest {
    target: Target,
    selector: String,
    /// Changes after this resourceVersion are sent.
    from: u64,
    /// Synthetic ADDED events sent first.
    initial: Vec<Value>,
    timeout: Duration,
}

impl WatchRequest {
    /// Reads the watch parameters; `state` supplies the starting point.
    pub(crate) fn new(target: Target, query: &BTreeMap<String, String>, state: &State) -> Self {
        let selector = query.get("labelSelector").cloned().unwrap_or_default();
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map_or(MAX_WATCH, Duration::from_secs)
            .min(MAX_WATCH);
        let requested = query
            .get("resourceVersion")
            .and_then(|rv| rv.parse::<u64>().ok())
            .filter(|rv| *rv > 0);
        let (from, initial) = match requested {
            Some(rv) => (rv, Vec::new()),
            None => {
                let initial = state
                    .objects
                    .iter()
                    .filter(|(k, s)| target.holds(k) && matches_selector(&s.object, &selector))
                    .map(|(_, s)| json!({"type": "ADDED", "object": s.object}))
                    .collect();
                (state.resource_version, initial)
            }
        };
        Self {
            target,
            selector,
            from,
            initial,
            timeout,
        }
    }
}

fn line(event: &Value) -> Bytes {
    let mut text = event.to_string();
    text.push('\n');
    Bytes::from(text)
}

impl WatchRequest {
    /// Events of `state`'s change log after this request's position that
    /// it watches, oldest first.
    pub(crate) fn unseen(&self, state: &State) -> Vec<(u64, Value)> {
        state
            .events
            .iter()
            .filter(|e| e.rv > self.from && self.target.holds(&e.key))
            .filter(|e| matches_selector(&e.object, &self.selector))
            .map(|e| (e.rv, json!({"type": e.kind, "object": e.object})))
            .collect()
    }
}

/// The streaming answer to `request`: its initial events, then whatever
/// `unseen` returns each time `changes` moves, until its timeout.
pub(crate) fn respond<F>(
    unseen: F,
    changes: tokio::sync::watch::Receiver<u64>,
    request: WatchRequest,
) -> Response<Body>
where
    F: Fn(&WatchRequest) -> Vec<(u64, Value)> + Send + Sync + 'static,
{
    let deadline = tokio::time::Instant::now() + request.timeout;
    let initial: Vec<Bytes> = request.initial.iter().map(line).collect();
    let unseen = std::sync::Arc::new(unseen);
    let state = (unseen, changes, request, initial.into_iter(), deadline);
    let stream = futures::stream::unfold(
        state,
        |(unseen, mut changes, mut request, mut initial, deadline)| async move {
            if let Some(first) = initial.next() {
                return Some((first, (unseen, changes, request, initial, deadline)));
            }
            loop {
                // Mark the current change seen before reading the log, so a
                // change made after the read still wakes us.
                changes.borrow_and_update();
                let next = unseen(&request);
                if !next.is_empty() {
                    request.from = next.last().map_or(request.from, |(rv, _)| *rv);
                    let mut chunk = Vec::new();
                    for (_, event) in &next {
                        chunk.extend_from_slice(&line(event));
                    }
                    return Some((
                        Bytes::from(chunk),
                        (unseen, changes, request, initial, deadline),
                    ));
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => return None,
                    changed = changes.changed() => if changed.is_err() { return None },
                }
            }
        },
    );
    let body = StreamBody::new(futures::StreamExt::map(stream, |b| {
        Ok::<_, Infallible>(Frame::data(b))
    }));
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(body.boxed_unsync())
        .unwrap_or_default()
}
