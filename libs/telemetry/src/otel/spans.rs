//! The bounded queue between finished spans and the OTLP exporter.
//!
//! A span ends on a request's thread; that thread must never wait for the
//! collector. Ended spans go into a bounded channel (`--otlp-span-queue`);
//! when it is full the span is dropped and counted, which is what the SDK's
//! batch processor does too, but here the drop is a metric rather than one
//! log line at shutdown. One task drains the queue in batches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Spans per export call.
const BATCH: usize = 512;
/// Longest a span waits in the queue while traffic is light.
const LINGER: Duration = Duration::from_secs(1);

type Sender = Arc<Mutex<Option<mpsc::Sender<SpanData>>>>;

/// The producer side, shared by the processor and [`super::shutdown`].
#[derive(Debug)]
pub(super) struct Queue {
    tx: Sender,
    closing: CancellationToken,
}

impl Queue {
    /// The processor to install in the tracer provider.
    pub(super) fn processor(&self) -> QueueProcessor {
        QueueProcessor {
            tx: self.tx.clone(),
        }
    }

    /// Stops taking spans; the drain task exports what is queued and ends.
    pub(super) fn close(&self) {
        self.tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        self.closing.cancel();
    }
}

/// A queue of `capacity` spans and the task that drains it into `exporter`.
pub(super) fn queue<E>(
    capacity: usize,
    exporter: E,
) -> (Queue, impl std::future::Future<Output = ()> + Send)
where
    E: SpanExporter + 'static,
{
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let closing = CancellationToken::new();
    let queue = Queue {
        tx: Arc::new(Mutex::new(Some(tx))),
        closing: closing.clone(),
    };
    (queue, drain(rx, exporter, closing))
}

async fn drain<E: SpanExporter>(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: E,
    closing: CancellationToken,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            break;
        }
        let full = batch.len() == BATCH;
        let spans = batch.len() as u64;
        let outcome = exporter.export(std::mem::take(&mut batch)).await;
        super::count_export("traces", outcome.is_ok());
        match outcome {
            Ok(()) => {
                super::counters().spans_exported.inc_by(spans);
            }
            Err(error) => tracing::debug!(%error, spans, "span export failed"),
        }
        if !full && !closing.is_cancelled() {
            // Let a light trickle gather into one call.
            tokio::select! {
                () = tokio::time::sleep(LINGER) => {}
                () = closing.cancelled() => {}
            }
        }
    }
    let _ = exporter.shutdown();
}

/// Hands ended spans to the queue without waiting.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    tx: Sender,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let guard = self
            .tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = guard.as_ref()
            && tx.try_send(span).is_err()
        {
            super::counters().spans_dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // The drain task exports within LINGER; shutdown waits for it.
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    /// An exporter that holds every call until released and records sizes.
    #[derive(Debug, Clone)]
    struct Held {
        sizes: Arc<Mutex<Vec<usize>>>,
        gate: Arc<tokio::sync::Semaphore>,
    }

    impl SpanExporter for Held {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let _permit = self.gate.acquire().await;
            self.sizes.lock().unwrap().push(batch.len());
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_then_drains_on_close() {
        let exporter = Held {
            sizes: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let (queue, drain) = queue(4, exporter.clone());
        let task = tokio::spawn(drain);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue.processor())
            .build();
        let tracer = provider.tracer("t");
        let dropped_before = crate::otel::counters().spans_dropped.get();
        // The exporter is held: one span may be taken into a call, four wait
        // in the queue, the rest are dropped.
        for _ in 0..10 {
            tracer.start("s").end();
            tokio::task::yield_now().await;
        }
        let dropped = crate::otel::counters().spans_dropped.get() - dropped_before;
        assert!((5..=6).contains(&dropped), "dropped {dropped}");
        exporter.gate.add_permits(100);
        queue.close();
        task.await.unwrap();
        let exported: usize = exporter.sizes.lock().unwrap().iter().sum();
        assert_eq!(exported as u64 + dropped, 10);
    }
}
