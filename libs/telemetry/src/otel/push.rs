//! Pushes a binary's metrics to the OTLP collector on an interval.
//!
//! The numbers are the registry's, read the way a scrape reads them
//! ([`super::exposition`]), so a collector and Prometheus agree. A push that
//! fails is counted and retried at the next tick with fresh numbers (they
//! are cumulative: nothing is lost but resolution).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio_util::sync::CancellationToken;

use super::{PIPELINE, exposition};

/// Where the pushed text comes from: the registry's exposition, read now.
pub type Source = Arc<dyn Fn() -> String + Send + Sync>;

/// Starts pushing `source` every `--otlp-export-interval-seconds` until
/// `shutdown`, with a last push then. Does nothing when export is off.
/// [`super::shutdown`] waits for the last push.
pub fn spawn(source: Source, shutdown: CancellationToken) {
    let Some(pipeline) = PIPELINE.get() else {
        return;
    };
    let resource = resource(&pipeline.resource);
    let client = MetricsServiceClient::new(pipeline.channel.clone());
    let interval = pipeline.interval;
    let task = tokio::spawn(run(client, resource, source, interval, shutdown));
    pipeline
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(task);
}

async fn run(
    mut client: MetricsServiceClient<tonic::transport::Channel>,
    resource: Resource,
    source: Source,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let start_ns = process_start_ns();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: wait one interval, as a scraper would.
    tick.tick().await;
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            () = shutdown.cancelled() => true,
        };
        let request = {
            let source = source.clone();
            let resource = resource.clone();
            // Encoding may walk large structures (the index's memory): off
            // the runtime's I/O threads, as the scrape handler does.
            match tokio::task::spawn_blocking(move || request(&source(), resource, start_ns)).await
            {
                Ok(request) => request,
                Err(_) => continue,
            }
        };
        let outcome = client.export(request).await;
        super::count_export("metrics", outcome.is_ok());
        if let Err(status) = outcome {
            tracing::debug!(%status, "metrics push failed");
        }
        if last {
            break;
        }
    }
}

/// The export request for exposition `text`.
pub fn request(text: &str, resource: Resource, start_ns: u64) -> ExportMetricsServiceRequest {
    let parsed = exposition::parse(text);
    let now_ns = unix_ns(SystemTime::now());
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "inferencecache".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    attributes: Vec::new(),
                    dropped_attributes_count: 0,
                }),
                metrics: exposition::to_otlp(&parsed.families, start_ns, now_ns),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn resource(sdk: &opentelemetry_sdk::Resource) -> Resource {
    Resource {
        attributes: sdk
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.to_string(),
                key_strindex: 0,
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(v.to_string())),
                }),
            })
            .collect(),
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    }
}

fn unix_ns(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// When this process started (cumulative series count from here).
fn process_start_ns() -> u64 {
    crate::process_metrics::ProcessStats::read()
        .filter(|s| s.start_time_seconds.is_finite() && s.start_time_seconds > 0.0)
        .map_or_else(
            || unix_ns(SystemTime::now()),
            |s| unix_ns(UNIX_EPOCH + Duration::from_secs_f64(s.start_time_seconds)),
        )
}
