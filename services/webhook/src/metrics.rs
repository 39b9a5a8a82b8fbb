//! The webhook's Prometheus metrics (prefixed `inferencecache_webhook_`).

use std::time::Duration;

use ic_telemetry::MetricsRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Which admission endpoint (fixed set).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AdmissionKind {
    /// `POST /mutate-cachebackend`.
    CacheBackendDefault,
    /// `POST /validate-cachebackend`.
    CacheBackendValidate,
    /// `POST /mutate-pod`.
    Pod,
}

impl AdmissionKind {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::CacheBackendDefault => "cachebackend_default",
            Self::CacheBackendValidate => "cachebackend_validate",
            Self::Pod => "pod",
        }
    }
}

/// Labels of `admissions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// Endpoint.
    pub kind: &'static str,
    /// `allowed`, `patched`, `denied`, `fail_open`, `skipped`, `error`.
    pub result: &'static str,
    /// Why (a fail-open reason, `invalid`, `injected`, ...; `none` otherwise).
    pub reason: &'static str,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// Endpoint.
    pub kind: &'static str,
}

/// Labels of the TLS reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `success` or `failure`.
    pub result: &'static str,
}

/// Labels of rejected HTTP requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabel {
    /// `malformed`, `wrong_type`, `missing_request`, `too_large`, `body_read`, `timeout`,
    /// `encode`.
    pub reason: &'static str,
}

/// Labels of the managed-certificate metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabel {
    /// `created`, `ca` or `serving` (renewals); `ca` or `serving` (expiry);
    /// the failed step (errors).
    pub what: &'static str,
}

/// Latency buckets, seconds: sub-millisecond resolution where admission
/// normally lands, up to the API server's 10 s webhook timeout.
const LATENCY_BUCKETS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.5, 2.0, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Every metric of the webhook.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Admission decisions.
    pub admissions: Family<AdmissionLabels, Counter>,
    /// Time from request to answer, by endpoint.
    pub latency: Family<KindLabel, Histogram, fn() -> Histogram>,
    /// Certificate reloads.
    pub tls_reloads: Family<ResultLabel, Counter>,
    /// Requests answered with an HTTP error instead of a review.
    pub rejected_requests: Family<RejectLabel, Counter>,
    /// Time to list a namespace's CacheBackends from the API server.
    pub list_latency: Histogram,
    /// Managed mode: certificates this replica issued, by what was renewed.
    pub certificate_renewals: Family<CertLabel, Counter>,
    /// Managed mode: when the stored certificates expire (Unix seconds).
    pub certificate_expiry: Family<CertLabel, Gauge>,
    /// Managed mode: failed certificate checks, by the step that failed.
    pub certificate_errors: Family<CertLabel, Counter>,
    /// Managed mode: webhook configurations whose caBundle was written.
    pub ca_bundle_writes: Counter,
    /// Pod admissions by where the namespace's CacheBackends came from
    /// (`store`: the watch-fed store; `live`: a LIST, before it synced).
    pub backend_lookups: Family<SourceLabel, Counter>,
    /// 1 once the CacheBackend store has completed its first LIST.
    pub backend_store_synced: Gauge,
    /// Connections closed after `--connection-idle-timeout-seconds` without
    /// traffic.
    pub idle_connections_closed: Counter,
    /// HTTP/1.1 connections cut because a request's headers took longer
    /// than `--header-read-timeout-seconds`.
    pub header_read_timeouts: Counter,
    /// TLS handshakes that failed or did not finish within
    /// `--tls-handshake-timeout-seconds`.
    pub tls_handshake_failures: Counter,
}

/// `{source}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// `store` or `live`.
    pub source: &'static str,
}

impl Metrics {
    /// Metrics that are not exported (unit tests).
    pub fn unregistered() -> Self {
        Self {
            admissions: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            tls_reloads: Family::default(),
            rejected_requests: Family::default(),
            list_latency: latency_histogram(),
            certificate_renewals: Family::default(),
            certificate_expiry: Family::default(),
            certificate_errors: Family::default(),
            ca_bundle_writes: Counter::default(),
            backend_lookups: Family::default(),
            backend_store_synced: Gauge::default(),
            idle_connections_closed: Counter::default(),
            header_read_timeouts: Counter::default(),
            tls_handshake_failures: Counter::default(),
        }
    }

    /// Registers every metric into `registry`.
    pub fn register(registry: &MetricsRegistry) -> Self {
        let m = Self::unregistered();
        registry.register_with(|r| {
            let r = r.sub_registry_with_prefix("webhook");
            r.register(
                "admissions",
                "Admission decisions, by endpoint kind, result and reason",
                m.admissions.clone(),
            );
            r.register(
                "admission_duration_seconds",
                "Time to answer an admission request, by endpoint kind",
                m.latency.clone(),
            );
            r.register(
                "tls_reloads",
                "Serving certificate reloads after a change on disk, by result",
                m.tls_reloads.clone(),
            );
            r.register(
                "rejected_requests",
                "Requests answered with an HTTP error instead of an AdmissionReview, by reason",
                m.rejected_requests.clone(),
            );
            r.register(
                "backend_list_duration_seconds",
                "Time to list a namespace's CacheBackends (pod admission), failures included",
                m.list_latency.clone(),
            );
            r.register(
                "backend_lookups",
                "Pod admissions by where the namespace's CacheBackends were read (store or live)",
                m.backend_lookups.clone(),
            );
            r.register(
                "backend_store_synced",
                "1 once the webhook's watch-fed CacheBackend store completed its first LIST",
                m.backend_store_synced.clone(),
            );
            r.register(
                "idle_connections_closed",
                "Connections closed after --connection-idle-timeout-seconds without traffic",
                m.idle_connections_closed.clone(),
            );
            r.register(
                "header_read_timeouts",
                "HTTP/1.1 connections closed because a request's headers took longer than --header-read-timeout-seconds",
                m.header_read_timeouts.clone(),
            );
            r.register(
                "tls_handshake_failures",
                "TLS handshakes that failed or did not finish within --tls-handshake-timeout-seconds",
                m.tls_handshake_failures.clone(),
            );
            r.register(
                "certificate_renewals",
                "Managed certificates issued by this replica, by what was renewed",
                m.certificate_renewals.clone(),
            );
            r.register(
                "certificate_expiry_timestamp_seconds",
                "When the managed certificates expire (Unix time), by certificate",
                m.certificate_expiry.clone(),
            );
            r.register(
                "certificate_errors",
                "Failed managed-certificate checks, by the step that failed",
                m.certificate_errors.clone(),
            );
            r.register(
                "ca_bundle_writes",
                "Webhook configurations whose caBundle this replica updated",
                m.ca_bundle_writes.clone(),
            );
        });
        m
    }

    /// Counts one decision.
    pub fn admission(&self, kind: AdmissionKind, result: &'static str, reason: &'static str) {
        self.admissions
            .get_or_create(&AdmissionLabels {
                kind: kind.label(),
                result,
                reason,
            })
            .inc();
    }

    /// Records how long one admission took.
    pub fn observe(&self, kind: AdmissionKind, elapsed: Duration) {
        self.latency
            .get_or_create(&KindLabel { kind: kind.label() })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a request refused at the HTTP level.
    pub fn rejected(&self, reason: &'static str) {
        self.rejected_requests
            .get_or_create(&RejectLabel { reason })
            .inc();
    }

    /// Counts an issued certificate.
    pub fn certificate_renewed(&self, what: &'static str) {
        self.certificate_renewals
            .get_or_create(&CertLabel { what })
            .inc();
    }

    /// Exports when a certificate expires (`None`: unreadable, not exported).
    pub fn set_certificate_expiry(&self, what: &'static str, unix: Option<i64>) {
        match unix {
            Some(t) => {
                self.certificate_expiry
                    .get_or_create(&CertLabel { what })
                    .set(t);
            }
            None => {
                self.certificate_expiry.remove(&CertLabel { what });
            }
        }
    }

    /// Counts a failed certificate check.
    pub fn certificate_error(&self, step: &'static str) {
        self.certificate_errors
            .get_or_create(&CertLabel { what: step })
            .inc();
    }

    /// Counts caBundle writes.
    pub fn ca_bundles_written(&self, count: usize) {
        self.ca_bundle_writes.inc_by(count as u64);
    }

    /// Counts a TLS reload.
    pub fn tls_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.tls_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }
}
