//! OpenTelemetry: traces and metrics pushed over OTLP/gRPC when
//! `--otlp-endpoint` is set, and W3C trace context carried across our hops.
//!
//! * **Traces.** `tracing` spans our services open at the hops that matter
//!   (LookupRoute, endpoint-picker requests, ingest batches, admission
//!   reviews, reconciles) become OpenTelemetry spans through
//!   `tracing-opentelemetry`. They are sampled parent-first (a sampled
//!   gateway request is traced end to end), queued in a bounded queue
//!   ([`spans`]) and exported in batches.
//! * **Metrics.** The registry `/metrics` serves is pushed on an interval
//!   ([`push`]), the same series under the same names, so a collector and a
//!   Prometheus scrape see one set of numbers.
//! * **Context.** [`parent_from_headers`], [`parent_from_metadata`] and
//!   [`parent_from_map`] read a caller's `traceparent`/`tracestate`;
//!   [`context_of`] writes ours for the next hop.
//!
//! With no endpoint nothing is installed: the spans are `debug` level and
//! cost nothing unless logging asks for them.

pub mod exposition;
pub mod push;
mod spans;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use clap::Args;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The OTLP flags every binary takes (part of [`crate::LogArgs`]).
#[derive(Clone, Debug, Args)]
pub struct OtlpArgs {
    /// OTLP/gRPC collector to push traces and metrics to, e.g.
    /// `http://otel-collector.observability:4317`. Unset: nothing is
    /// exported (Prometheus `/metrics` is always served, except by the
    /// coordinator, which like LMCache's answers 404 there once this is set).
    #[arg(long, env = "IC_OTLP_ENDPOINT", global = true, value_parser = parse_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// How often metrics are pushed (the reference coordinator's 10 s).
    #[arg(long, env = "IC_OTLP_EXPORT_INTERVAL_SECONDS", default_value_t = 10, global = true,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub otlp_export_interval_seconds: u64,

    /// Fraction of traces this process starts that are sampled (0 to 1). A
    /// caller's sampling decision, carried in its `traceparent`, always wins.
    #[arg(long, env = "IC_OTLP_TRACE_RATIO", default_value_t = 1.0, global = true,
          value_parser = parse_ratio)]
    pub otlp_trace_ratio: f64,

    /// Finished spans held for export; beyond it spans are dropped and
    /// counted in `inferencecache_otlp_spans_dropped_total`.
    #[arg(long, env = "IC_OTLP_SPAN_QUEUE", default_value_t = 2048, global = true,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub otlp_span_queue: u64,
}

impl Default for OtlpArgs {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_export_interval_seconds: 10,
            otlp_trace_ratio: 1.0,
            otlp_span_queue: 2048,
        }
    }
}

fn parse_endpoint(value: &str) -> Result<String, String> {
    let uri: http::Uri = value
        .parse()
        .map_err(|e| format!("not a URL ({e}); expected http://host:port"))?;
    match uri.scheme_str() {
        Some("http") if uri.authority().is_some() => Ok(value.trim_end_matches('/').to_owned()),
        Some("https") => Err(
            "https is not supported: point it at a collector on the node or in the pod \
             (plaintext OTLP/gRPC, as the reference coordinator sends)"
                .to_owned(),
        ),
        _ => Err("expected http://host:port".to_owned()),
    }
}

fn parse_ratio(value: &str) -> Result<f64, String> {
    let ratio: f64 = value.parse().map_err(|e| format!("not a number: {e}"))?;
    if (0.0..=1.0).contains(&ratio) {
        Ok(ratio)
    } else {
        Err("must be between 0 and 1".to_owned())
    }
}

/// What the process exports to, once [`install`] ran with an endpoint.
#[derive(Debug)]
struct Pipeline {
    channel: tonic::transport::Channel,
    interval: Duration,
    resource: Resource,
    provider: SdkTracerProvider,
    spans: spans::Queue,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

static PIPELINE: OnceLock<Pipeline> = OnceLock::new();

/// Whether `--otlp-endpoint` is set in this process.
pub fn enabled() -> bool {
    PIPELINE.get().is_some()
}

/// Counters of the exporter itself, registered into every binary's registry.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExportCounters {
    pub(crate) spans_dropped: Counter,
    pub(crate) spans_exported: Counter,
    pub(crate) exports: Family<Vec<(&'static str, &'static str)>, Counter>,
}

pub(crate) fn counters() -> &'static ExportCounters {
    static COUNTERS: OnceLock<ExportCounters> = OnceLock::new();
    COUNTERS.get_or_init(ExportCounters::default)
}

pub(crate) fn count_export(signal: &'static str, ok: bool) {
    counters()
        .exports
        .get_or_create(&vec![
            ("signal", signal),
            ("outcome", if ok { "ok" } else { "error" }),
        ])
        .inc();
}

/// Registers the exporter's own series (zero while export is off).
pub(crate) fn register(registry: &mut Registry) {
    let c = counters();
    registry.register(
        "otlp_spans_dropped",
        "Finished spans dropped because the export queue (--otlp-span-queue) was full",
        c.spans_dropped.clone(),
    );
    registry.register(
        "otlp_spans_exported",
        "Spans the OTLP collector accepted",
        c.spans_exported.clone(),
    );
    registry.register(
        "otlp_exports",
        "OTLP export calls by signal (traces, metrics) and outcome (ok, error)",
        c.exports.clone(),
    );
}

/// The `tracing` layer that feeds spans to the OTLP pipeline, when one is
/// installed. Only spans of our crates (`ic_*`), at `debug` and above, plus
/// `info`+ events inside them (span events), reach it. Numeric span fields
/// must be recorded as `i64` to arrive as OTLP integers (the bridge renders
/// other integer types as strings).
pub(crate) fn layer<S>() -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let pipeline = PIPELINE.get()?;
    let tracer = pipeline.provider.tracer("inferencecache");
    let filter = tracing_subscriber::filter::filter_fn(|meta| {
        meta.target().starts_with("ic_")
            && if meta.is_span() {
                *meta.level() <= tracing::Level::DEBUG
            } else {
                *meta.level() <= tracing::Level::INFO
            }
    });
    Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(filter),
    )
}

/// Failure to set up export.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint}: {detail}")]
pub struct InstallError {
    endpoint: String,
    detail: String,
}

/// Builds the pipeline for `service` (the binary's name) if `args` names an
/// endpoint. Must run inside the tokio runtime. The connection is lazy: a
/// collector that is down costs failed exports (counted), never start-up.
pub(crate) fn install(service: &str, args: &OtlpArgs) -> Result<(), InstallError> {
    let Some(endpoint) = &args.otlp_endpoint else {
        return Ok(());
    };
    let error = |detail: String| InstallError {
        endpoint: endpoint.clone(),
        detail,
    };
    let channel = tonic::transport::Channel::from_shared(endpoint.clone())
        .map_err(|e| error(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    let resource = resource(service);
    let mut exporter = {
        use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_channel(channel.clone())
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| error(e.to_string()))?
    };
    // The provider hands its resource to its processors; ours hold no
    // exporter, so it is set here.
    opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
    let capacity = usize::try_from(args.otlp_span_queue).unwrap_or(usize::MAX);
    let (queue, drain) = spans::queue(capacity, exporter);
    let provider = SdkTracerProvider::builder()
        .with_resource(resource.clone())
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            args.otlp_trace_ratio,
        ))))
        .with_span_processor(queue.processor())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let pipeline = Pipeline {
        channel,
        interval: Duration::from_secs(args.otlp_export_interval_seconds),
        resource,
        provider,
        spans: queue,
        tasks: Mutex::new(vec![tokio::spawn(drain)]),
    };
    // A second install in one process (tests running several services) keeps the first.
    let _ = PIPELINE.set(pipeline);
    tracing::info!(%endpoint, service, "exporting traces and metrics over OTLP");
    Ok(())
}

fn resource(service: &str) -> Resource {
    let mut attributes = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    // The pod name tells replicas apart (the reference coordinator uses the
    // hostname, which is the pod name under Kubernetes).
    let instance = std::env::var("POD_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        });
    if let Some(instance) = instance {
        attributes.push(KeyValue::new("service.instance.id", instance.clone()));
        attributes.push(KeyValue::new("k8s.pod.name", instance));
    }
    if let Some(namespace) = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|v| !v.is_empty())
    {
        attributes.push(KeyValue::new("k8s.namespace.name", namespace));
    }
    Resource::builder()
        .with_service_name(service.to_owned())
        .with_attributes(attributes)
        .build()
}

/// Flushes what is queued (spans, a last metrics push) and stops export;
/// gives up after `timeout`.
pub async fn shutdown(timeout: Duration) {
    let Some(pipeline) = PIPELINE.get() else {
        return;
    };
    pipeline.spans.close();
    let _ = pipeline.provider.shutdown();
    let tasks: Vec<JoinHandle<()>> = std::mem::take(
        &mut *pipeline
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let _ = tokio::time::timeout(timeout, futures::future::join_all(tasks)).await;
}

/// The caller's trace context from HTTP headers (`traceparent`,
/// `tracestate`); empty when export is off or the caller sent none.
pub fn parent_from_headers(headers: &http::HeaderMap) -> Context {
    struct Headers<'a>(&'a http::HeaderMap);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }
    extract(&Headers(headers))
}

/// The caller's trace context from gRPC metadata.
pub fn parent_from_metadata(metadata: &tonic::metadata::MetadataMap) -> Context {
    struct Metadata<'a>(&'a tonic::metadata::MetadataMap);
    impl Extractor for Metadata<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0
                .keys()
                .filter_map(|k| match k {
                    tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                    tonic::metadata::KeyRef::Binary(_) => None,
                })
                .collect()
        }
    }
    extract(&Metadata(metadata))
}

/// The trace context carried in a message's string map (an ingest batch's
/// `trace_context`).
pub fn parent_from_map(map: &HashMap<String, String>) -> Context {
    struct Map<'a>(&'a HashMap<String, String>);
    impl Extractor for Map<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).map(String::as_str)
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
    }
    extract(&Map(map))
}

fn extract(carrier: &dyn Extractor) -> Context {
    if !enabled() {
        return Context::new();
    }
    TraceContextPropagator::new().extract(carrier)
}

/// Makes `parent` the parent of `span`, if export is on and the caller sent
/// a valid context (otherwise `span` starts a trace of its own).
pub fn adopt(span: &tracing::Span, parent: Context) {
    use opentelemetry::trace::TraceContextExt as _;
    if enabled() && parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// `span`'s context as W3C headers for the next hop (empty when export is
/// off or the span is not sampled).
pub fn context_of(span: &tracing::Span) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if enabled() {
        struct Map<'a>(&'a mut HashMap<String, String>);
        impl Injector for Map<'_> {
            fn set(&mut self, key: &str, value: String) {
                self.0.insert(key.to_owned(), value);
            }
        }
        TraceContextPropagator::new().inject_context(&span.context(), &mut Map(&mut out));
    }
    out
}

/// Writes `span`'s context into outgoing gRPC metadata.
pub fn inject_metadata(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    for (key, value) in context_of(span) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            metadata.insert(key, value);
        }
    }
}

/// The trace id of `span` in hex, for log lines and tests; `None` when
/// export is off.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    enabled().then(|| span.context().span().span_context().trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        otlp: OtlpArgs,
    }

    #[test]
    fn flags_name_what_is_wrong() {
        for (args, needle) in [
            (
                vec!["--otlp-endpoint", "https://c:4317"],
                "https is not supported",
            ),
            (
                vec!["--otlp-endpoint", "c:4317"],
                "expected http://host:port",
            ),
            (vec!["--otlp-trace-ratio", "1.5"], "between 0 and 1"),
            (
                vec!["--otlp-export-interval-seconds", "0"],
                "--otlp-export-interval-seconds",
            ),
            (vec!["--otlp-span-queue", "0"], "--otlp-span-queue"),
        ] {
            let err = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .expect_err("refused");
            assert!(err.to_string().contains(needle), "{args:?}: {err}");
        }
        let cli = Cli::try_parse_from(["x", "--otlp-endpoint", "http://127.0.0.1:4317/"])
            .expect("accepted");
        assert_eq!(
            cli.otlp.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4317")
        );
    }

    #[test]
    fn without_export_nothing_is_read_or_written() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        use opentelemetry::trace::TraceContextExt as _;
        assert!(
            !parent_from_headers(&headers)
                .span()
                .span_context()
                .is_valid()
        );
        assert!(context_of(&tracing::Span::current()).is_empty());
    }
}
