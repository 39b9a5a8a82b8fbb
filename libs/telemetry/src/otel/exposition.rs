//! Reads the registry's own text exposition back into metric families, and
//! turns those into OTLP metrics.
//!
//! Every binary keeps one Prometheus registry (what `/metrics` serves).
//! Pushing the same numbers over OTLP means reading that registry; its text
//! form is the one stable view prometheus-client offers, and we only ever
//! parse what our own encoder wrote, so the parser is small and strict: a
//! line it cannot read is skipped and counted, never guessed at.

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
    metric, number_data_point,
};

/// The kind a `# TYPE` line declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic counter (`…_total` samples).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
    /// Labels only, value 1 (`…_info` samples).
    Info,
    /// Anything else (`unknown`, `stateset`, …): pushed as a gauge.
    Other,
}

/// One sample line: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The full sample name (family name plus `_total`, `_bucket`, …).
    pub name: String,
    /// Label pairs in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

/// A metric family as the exposition describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The family name (without sample suffixes).
    pub name: String,
    /// `# HELP` text.
    pub help: String,
    /// `# UNIT`, if any.
    pub unit: String,
    /// `# TYPE`.
    pub kind: Kind,
    /// Its sample lines.
    pub samples: Vec<Sample>,
}

/// What [`parse`] read: the families and how many lines it could not read.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Families in exposition order.
    pub families: Vec<Family>,
    /// Lines skipped as unreadable.
    pub unreadable: usize,
}

/// Parses OpenMetrics / Prometheus text. Samples before any `# TYPE` line,
/// or whose name is not the current family's, start an untyped family.
pub fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (Some(keyword), Some(name)) = (parts.next(), parts.next()) else {
                out.unreadable += 1;
                continue;
            };
            let value = parts.next().unwrap_or("");
            let family = family_named(&mut out.families, name);
            match keyword {
                "HELP" => family.help = unescape(value),
                "UNIT" => family.unit = value.to_owned(),
                "TYPE" => family.kind = kind_of(value),
                _ => {}
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some(sample) = parse_sample(line) else {
            out.unreadable += 1;
            continue;
        };
        let owner = out
            .families
            .last()
            .filter(|f| belongs(&sample.name, f))
            .is_some();
        if !owner {
            out.families.push(Family {
                name: sample.name.clone(),
                help: String::new(),
                unit: String::new(),
                kind: Kind::Other,
                samples: Vec::new(),
            });
        }
        if let Some(family) = out.families.last_mut() {
            family.samples.push(sample);
        }
    }
    out
}

/// The family `name`, the last one if it is that, otherwise a new one.
fn family_named<'a>(families: &'a mut Vec<Family>, name: &str) -> &'a mut Family {
    if families.last().is_none_or(|f| f.name != name) {
        families.push(Family {
            name: name.to_owned(),
            help: String::new(),
            unit: String::new(),
            kind: Kind::Other,
            samples: Vec::new(),
        });
    }
    let last = families.len() - 1;
    &mut families[last]
}

fn kind_of(value: &str) -> Kind {
    match value {
        "counter" => Kind::Counter,
        "gauge" => Kind::Gauge,
        "histogram" => Kind::Histogram,
        "info" => Kind::Info,
        _ => Kind::Other,
    }
}

fn belongs(sample: &str, family: &Family) -> bool {
    sample
        .strip_prefix(family.name.as_str())
        .is_some_and(|suffix| {
            matches!(
                suffix,
                "" | "_total" | "_created" | "_bucket" | "_sum" | "_count" | "_info"
            )
        })
}

/// `name{a="b",c="d"} 1.5` (an exemplar or timestamp after the value is
/// ignored).
fn parse_sample(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    if name.is_empty() {
        return None;
    }
    let (labels, rest) = if let Some(body) = rest.strip_prefix('{') {
        parse_labels(body)?
    } else {
        (Vec::new(), rest)
    };
    let value = rest.split_whitespace().next()?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value: parse_value(value)?,
    })
}

/// Reads `a="b",c="d"}` and returns the pairs and what follows the `}`.
fn parse_labels(mut body: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        body = body.trim_start_matches(',');
        if let Some(rest) = body.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = body.find('=')?;
        let key = body[..eq].trim().to_owned();
        let mut chars = body[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c)? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                other => value.push(other),
            }
        }
        body = &body[end?..];
        labels.push((key, value));
    }
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        other => other.parse().ok(),
    }
}

fn unescape(text: &str) -> String {
    text.replace("\\n", "\n").replace("\\\\", "\\")
}

/// Converts families to OTLP metrics. Counters and histograms are
/// cumulative since `start_ns` (the process start); counters lose their
/// `_total` suffix, which an OTLP-to-Prometheus bridge adds back, so the
/// series keep the names dashboards know.
pub fn to_otlp(families: &[Family], start_ns: u64, now_ns: u64) -> Vec<Metric> {
    families
        .iter()
        .filter(|f| !f.samples.is_empty())
        .map(|f| {
            let data = match f.kind {
                Kind::Counter => metric::Data::Sum(Sum {
                    data_points: number_points(f, start_ns, now_ns, |s| {
                        !s.name.ends_with("_created")
                    }),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                }),
                Kind::Histogram => metric::Data::Histogram(Histogram {
                    data_points: histogram_points(f, start_ns, now_ns),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                }),
                Kind::Gauge | Kind::Info | Kind::Other => metric::Data::Gauge(Gauge {
                    data_points: number_points(f, 0, now_ns, |_| true),
                }),
            };
            let name = match f.kind {
                Kind::Info => format!("{}_info", f.name),
                _ => f.name.clone(),
            };
            Metric {
                name,
                description: f.help.clone(),
                unit: f.unit.clone(),
                data: Some(data),
                metadata: Vec::new(),
            }
        })
        .collect()
}

fn number_points(
    family: &Family,
    start_ns: u64,
    now_ns: u64,
    keep: impl Fn(&Sample) -> bool,
) -> Vec<NumberDataPoint> {
    family
        .samples
        .iter()
        .filter(|s| keep(s))
        .map(|s| NumberDataPoint {
            attributes: attributes(&s.labels, None),
            start_time_unix_nano: start_ns,
            time_unix_nano: now_ns,
            value: Some(number_data_point::Value::AsDouble(s.value)),
            exemplars: Vec::new(),
            flags: 0,
        })
        .collect()
}

/// Groups `_bucket`/`_sum`/`_count` samples by their labels (less `le`).
fn histogram_points(family: &Family, start_ns: u64, now_ns: u64) -> Vec<HistogramDataPoint> {
    #[derive(Default)]
    struct Acc {
        labels: Vec<(String, String)>,
        buckets: Vec<(f64, f64)>,
        sum: f64,
        count: f64,
    }
    let mut groups: Vec<Acc> = Vec::new();
    for s in &family.samples {
        let labels: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        let at = match groups.iter().position(|g| g.labels == labels) {
            Some(i) => i,
            None => {
                groups.push(Acc {
                    labels,
                    ..Acc::default()
                });
                groups.len() - 1
            }
        };
        let group = &mut groups[at];
        let suffix = &s.name[family.name.len().min(s.name.len())..];
        match suffix {
            "_bucket" => {
                let le = s
                    .labels
                    .iter()
                    .find(|(k, _)| k == "le")
                    .and_then(|(_, v)| parse_value(v));
                if let Some(le) = le {
                    group.buckets.push((le, s.value));
                }
            }
            "_sum" => group.sum = s.value,
            "_count" => group.count = s.value,
            _ => {}
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            g.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The exposition's buckets are cumulative; OTLP's are per bucket.
            let mut previous = 0.0;
            let mut counts = Vec::with_capacity(g.buckets.len());
            for &(_, cumulative) in &g.buckets {
                counts.push(to_count(cumulative - previous));
                previous = cumulative;
            }
            HistogramDataPoint {
                attributes: attributes(&g.labels, None),
                start_time_unix_nano: start_ns,
                time_unix_nano: now_ns,
                count: to_count(g.count),
                sum: Some(g.sum),
                bucket_counts: counts,
                explicit_bounds: g
                    .buckets
                    .iter()
                    .map(|b| b.0)
                    .filter(|b| b.is_finite())
                    .collect(),
                exemplars: Vec::new(),
                flags: 0,
                min: None,
                max: None,
            }
        })
        .collect()
}

fn to_count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        // Counts are integral in the exposition; the cast only drops ".0".
        value.round() as u64
    } else {
        0
    }
}

/// OTLP attributes from label pairs (and `extra`).
pub fn attributes(labels: &[(String, String)], extra: Option<(&str, &str)>) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(extra)
        .map(|(k, v)| KeyValue {
            key: k.to_owned(),
            key_strindex: 0,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.to_owned())),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP ic_build_info Build information.\n\
# TYPE ic_build_info gauge\n\
ic_build_info{binary=\"ic-x\",version=\"0.1.0\"} 1\n\
# HELP ic_batches Batches by outcome.\n\
# TYPE ic_batches counter\n\
ic_batches_total{outcome=\"applied\"} 7\n\
ic_batches_total{outcome=\"say \\\"hi\\\"\"} 2\n\
# HELP ic_seconds Lookup latency.\n\
# TYPE ic_seconds histogram\n\
# UNIT ic_seconds seconds\n\
ic_seconds_sum{route=\"a\"} 0.75\n\
ic_seconds_count{route=\"a\"} 3\n\
ic_seconds_bucket{le=\"0.1\",route=\"a\"} 1\n\
ic_seconds_bucket{le=\"1.0\",route=\"a\"} 3\n\
ic_seconds_bucket{le=\"+Inf\",route=\"a\"} 3\n\
# TYPE ic_tier info\n\
ic_tier_info{tier=\"l2\"} 1\n\
process_open_fds 12\n\
garbage line\n\
# EOF\n";

    #[test]
    fn reads_every_kind_our_encoder_writes() {
        let parsed = parse(TEXT);
        assert_eq!(parsed.unreadable, 1, "{parsed:?}");
        let names: Vec<(&str, Kind, usize)> = parsed
            .families
            .iter()
            .map(|f| (f.name.as_str(), f.kind, f.samples.len()))
            .collect();
        assert_eq!(
            names,
            [
                ("ic_build_info", Kind::Gauge, 1),
                ("ic_batches", Kind::Counter, 2),
                ("ic_seconds", Kind::Histogram, 5),
                ("ic_tier", Kind::Info, 1),
                ("process_open_fds", Kind::Other, 1),
            ]
        );
        assert_eq!(
            parsed.families[1].samples[1].labels,
            [("outcome".to_owned(), "say \"hi\"".to_owned())]
        );
        assert_eq!(parsed.families[2].unit, "seconds");
    }

    #[test]
    fn converts_counters_histograms_and_gauges() {
        let metrics = to_otlp(&parse(TEXT).families, 10, 20);
        let by_name = |n: &str| metrics.iter().find(|m| m.name == n).expect(n);
        let Some(metric::Data::Sum(sum)) = &by_name("ic_batches").data else {
            panic!("ic_batches is not a sum");
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.data_points.len(), 2);
        assert_eq!(sum.data_points[0].start_time_unix_nano, 10);
        assert_eq!(
            sum.data_points[0].value,
            Some(number_data_point::Value::AsDouble(7.0))
        );
        let Some(metric::Data::Histogram(h)) = &by_name("ic_seconds").data else {
            panic!("ic_seconds is not a histogram");
        };
        let point = &h.data_points[0];
        assert_eq!(point.explicit_bounds, [0.1, 1.0]);
        assert_eq!(point.bucket_counts, [1, 2, 0]);
        assert_eq!((point.count, point.sum), (3, Some(0.75)));
        assert_eq!(point.attributes.len(), 1, "le is not an attribute");
        assert!(matches!(
            by_name("ic_tier_info").data,
            Some(metric::Data::Gauge(_))
        ));
        assert!(matches!(
            by_name("process_open_fds").data,
            Some(metric::Data::Gauge(_))
        ));
    }

    #[test]
    fn what_our_registry_writes_reads_back_whole() {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family as PromFamily;
        use prometheus_client::metrics::histogram::Histogram as PromHistogram;
        let registry = crate::MetricsRegistry::new("inferencecache", "ic-test");
        let requests = PromFamily::<Vec<(String, String)>, Counter>::default();
        let latency = PromHistogram::new([0.01, 0.1, 1.0]);
        registry.register_with(|r| {
            r.register("requests", "Requests", requests.clone());
            r.register("latency_seconds", "Latency", latency.clone());
        });
        requests
            .get_or_create(&vec![("path".into(), "a \"b\"\nc".into())])
            .inc_by(3);
        latency.observe(0.05);
        latency.observe(5.0);
        let parsed = parse(&registry.encode());
        assert_eq!(parsed.unreadable, 0, "{parsed:?}");
        let metrics = to_otlp(&parsed.families, 1, 2);
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        for want in [
            "inferencecache_build_info",
            "inferencecache_requests",
            "inferencecache_latency_seconds",
            "process_cpu_seconds",
            "process_resident_memory_bytes",
        ] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        let requests = parsed
            .families
            .iter()
            .find(|f| f.name == "inferencecache_requests")
            .expect("requests");
        assert_eq!(requests.samples[0].labels[0].1, "a \"b\"\nc");
        let Some(metric::Data::Histogram(h)) = &metrics
            .iter()
            .find(|m| m.name == "inferencecache_latency_seconds")
            .expect("latency")
            .data
        else {
            panic!("latency is not a histogram");
        };
        assert_eq!(h.data_points[0].bucket_counts, [0, 1, 0, 1]);
        assert_eq!(h.data_points[0].count, 2);
    }

    #[test]
    fn hostile_text_is_skipped_not_guessed() {
        for text in [
            "x{a=\"unterminated 1\n",
            "x{a=b} 1\n",
            "x 1e999999x\n",
            "{} 1\n",
            "x{\n",
        ] {
            let parsed = parse(text);
            assert_eq!(parsed.unreadable, 1, "{text:?}: {parsed:?}");
        }
    }
}
