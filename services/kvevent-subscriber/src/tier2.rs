//! Tier-2 hit counters from the engine's Prometheus endpoint.

use crate::outbox::Tier2Counters;

const HITS: &str = "vllm:external_prefix_cache_hits_total";
const QUERIES: &str = "vllm:external_prefix_cache_queries_total";

/// Sums the tier-2 counters over all their label sets. `None` unless the
/// engine exports both (absent counters stay absent; they are not zero).
pub fn parse_tier2(text: &str) -> Option<Tier2Counters> {
    let mut hits = None;
    let mut queries = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let slot = match name {
            HITS => &mut hits,
            QUERIES => &mut queries,
            _ => continue,
        };
        // The value follows the label set (if any); a timestamp may follow it.
        let after_labels = match rest.rfind('}') {
            Some(i) => &rest[i + 1..],
            None => rest,
        };
        let Some(value) = after_labels
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
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
