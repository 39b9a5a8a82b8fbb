//! The Prometheus registry every component registers its metrics into.
//!
//! Metrics are registered once at start-up; after that the registry is only
//! read (encoded on scrape), so it sits behind an `RwLock` that writers take
//! only while building the service.

use std::sync::{Arc, RwLock};

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A cloneable handle to the process's Prometheus registry.
#[derive(Clone, Debug)]
pub struct MetricsRegistry {
    inner: Arc<RwLock<Registry>>,
}

impl MetricsRegistry {
    /// Creates a registry with every metric name prefixed by `prefix`
    /// (`inferencecache` for our services) and an `…_build_info` gauge that
    /// identifies the binary and version.
    pub fn new(prefix: &str, binary: &str) -> Self {
        let mut registry = Registry::with_prefix(prefix);
        let build_info = Family::<Vec<(String, String)>, Gauge>::default();
        build_info
            .get_or_create(&vec![
                ("binary".to_owned(), binary.to_owned()),
                ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            ])
            .set(1);
        registry.register(
            "build_info",
            "Build information of the running binary",
            build_info,
        );
        crate::otel::register(&mut registry);
        Self {
            inner: Arc::new(RwLock::new(registry)),
        }
    }

    /// Runs `register` with mutable access to the registry.
    pub fn register_with<R>(&self, register: impl FnOnce(&mut Registry) -> R) -> R {
        let mut guard = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        register(&mut guard)
    }

    /// Encodes every registered metric in the OpenMetrics text format,
    /// followed by the process's own `process_*` series read now.
    pub fn encode(&self) -> String {
        let guard = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = String::new();
        // Encoding into a String cannot fail: fmt::Write for String is infallible.
        let _ = encode_registry(&mut out, &guard);
        if let Some(stats) = crate::process_metrics::ProcessStats::read() {
            let _ = encode_registry(&mut out, &stats.registry());
        }
        let _ = encode_eof(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn encodes_build_info_and_registered_metrics() {
        let registry = MetricsRegistry::new("inferencecache", "ic-test");
        let counter = Counter::<u64>::default();
        registry.register_with(|r| r.register("widgets", "Widgets made", counter.clone()));
        counter.inc_by(3);
        let text = registry.encode();
        assert!(
            text.contains(r#"inferencecache_build_info{binary="ic-test",version="#),
            "{text}"
        );
        assert!(text.contains("inferencecache_widgets_total 3"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // The standard process series, unprefixed, once each.
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert_eq!(
                text.matches(&format!("\n{series}")).count(),
                1,
                "{series}: {text}"
            );
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }
}
