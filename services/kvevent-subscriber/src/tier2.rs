//! What the subscriber reads from the engine's Prometheus endpoint: tier-2
//! hit counters and the engine's load gauges.

use crate::outbox::Tier2Counters;

const HITS: &str = "vllm:external_prefix_cache_hits_total";
const QUERIES: &str = "vllm:external_prefix_cache_queries_total";

/// Every sample of a Prometheus text page: metric name (without labels)
/// and value. Comments and unparsable lines are skipped.
pub(crate) fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (name, rest) = line.split_at(line.find(['{', ' '])?);
            // The value follows the label set (if any); a timestamp may follow it.
            let after_labels = match rest.rfind('}') {
                Some(i) => &rest[i + 1..],
                None => rest,
            };
            let value = after_labels
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()?;
            Some((name, value))
        })
}

/// Sums the tier-2 counters over all their label sets. `None` unless the
/// engine exports both (absent counters stay absent; they are not zero).
pub fn parse_tier2(text: &str) -> Option<Tier2Counters> {
    let mut hits = None;
    let mut queries = None;
    for (name, value) in samples(text) {
        let slot = match name {
            HITS => &mut hits,
            QUERIES => &mut queries,
            _ => continue,
        };
        if value.is_finite() && value >= 0.0 {
            // Counters are integral; a float rendering ("12.0") is normal.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = value as u64;
            *slot = Some(slot.unwrap_or(0) + v);
        }
    }
    Some(Tier2Counters {
        hits: hits?,
        queries: queries?,
    })
}

/// What the engine says it is busy with, summed over its label sets (one
/// set per DP rank); KV usage is the mean over the sets that report it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests waiting.
    pub waiting: u32,
    /// Requests running.
    pub running: u32,
    /// KV-cache usage, 0..1.
    pub kv_usage: f32,
}

/// The engine's load gauges: vLLM (`vllm:num_requests_waiting`,
/// `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, before 0.10
/// `vllm:gpu_cache_usage_perc`) or SGLang (`sglang:num_queue_reqs`,
/// `sglang:num_running_reqs`, `sglang:token_usage`). `None` when the page
/// has none of them.
pub fn parse_engine_load(text: &str) -> Option<EngineLoad> {
    let (mut waiting, mut running) = (None::<f64>, None::<f64>);
    let (mut usage_sum, mut usage_n) = (0.0, 0u32);
    for (name, value) in samples(text) {
        if !(value.is_finite() && value >= 0.0) {
            continue;
        }
        match name {
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => {
                *waiting.get_or_insert(0.0) += value;
            }
            "vllm:num_requests_running" | "sglang:num_running_reqs" => {
                *running.get_or_insert(0.0) += value;
            }
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                usage_sum += value.min(1.0);
                usage_n += 1;
            }
            _ => {}
        }
    }
    if waiting.is_none() && running.is_none() && usage_n == 0 {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count = |v: Option<f64>| v.map_or(0, |v| v.min(f64::from(u32::MAX)) as u32);
    #[allow(clippy::cast_possible_truncation)]
    let kv_usage = if usage_n == 0 {
        0.0
    } else {
        (usage_sum / f64::from(usage_n)) as f32
    };
    Some(EngineLoad {
        waiting: count(waiting),
        running: count(running),
        kv_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_label_sets_and_ignores_the_rest() {
        let text = "\
# HELP vllm:external_prefix_cache_hits_total Hits
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 12.0
vllm:external_prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 3.0
vllm:external_prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 40.0 1700000000000
vllm:prefix_cache_hits_total{engine=\"0\"} 999
";
        assert_eq!(
            parse_tier2(text),
            Some(Tier2Counters {
                hits: 15,
                queries: 40
            })
        );
    }

    #[test]
    fn engine_load_from_vllm_and_sglang_pages() {
        let vllm = "\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 1.0
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 5.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.25
";
        assert_eq!(
            parse_engine_load(vllm),
            Some(EngineLoad {
                waiting: 4,
                running: 5,
                kv_usage: 0.375
            })
        );
        let sglang = "sglang:num_queue_reqs{model_name=\"m\"} 2\nsglang:num_running_reqs{model_name=\"m\"} 7\nsglang:token_usage{model_name=\"m\"} 0.8\n";
        let load = parse_engine_load(sglang).unwrap();
        assert_eq!((load.waiting, load.running), (2, 7));
        assert!((load.kv_usage - 0.8).abs() < 1e-6);
        assert_eq!(parse_engine_load("vllm:prefix_cache_hits_total 3\n"), None);
        assert_eq!(
            parse_engine_load("vllm:num_requests_waiting NaN\nvllm:num_requests_running -1\n"),
            None,
            "unusable values are not load"
        );
    }

    #[test]
    fn absent_counters_stay_absent() {
        assert_eq!(parse_tier2("vllm:num_requests_running 3\n"), None);
        assert_eq!(
            parse_tier2("vllm:external_prefix_cache_hits_total 1\n"),
            None
        );
        assert_eq!(parse_tier2(""), None);
    }

    #[test]
    fn unlabelled_counters_parse() {
        let text =
            "vllm:external_prefix_cache_hits_total 0\nvllm:external_prefix_cache_queries_total 7\n";
        assert_eq!(
            parse_tier2(text),
            Some(Tier2Counters {
                hits: 0,
                queries: 7
            })
        );
    }
}
