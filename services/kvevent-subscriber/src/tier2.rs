//! What the subscriber reads from the engine's Prometheus endpoint: tier-2
//! hit counters and the engine's load gauges.

const HITS: &str = "vllm:external_prefix_cache_hits_total";
const QUERIES: &str = "vllm:external_prefix_cache_queries_total";

/// Cumulative tier-2 counters scraped from the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tier2Counters {
    /// `vllm:external_prefix_cache_hits_total`.
    pub hits: u64,
    /// `vllm:external_prefix_cache_queries_total`.
    pub queries: u64,
}

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
    let mut hits: Option<u64> = None;
    let mut queries: Option<u64> = None;
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
            *slot = Some(slot.unwrap_or(0).saturating_add(v));
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

/// The engine's KV cache size (see the `EngineCache` message).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCache {
    /// Accelerator bytes the KV cache occupies.
    pub memory_bytes: Option<u64>,
    /// Tokens it holds.
    pub capacity_tokens: Option<u64>,
}

/// The label set of a sample line, unescaped (`None` when malformed).
fn labels(line: &str) -> Option<Vec<(&str, String)>> {
    let open = line.find('{')?;
    let mut rest = &line[open + 1..];
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            let _ = after;
            return Some(out);
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].trim();
        rest = rest[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        out.push((name, value));
        rest = &rest[end + 1..];
    }
}

/// The engine's KV cache size: SGLang's `sglang:kv_cache_memory_usage_gb`
/// (GiB, summed over ranks) and `sglang:max_total_num_tokens`; vLLM's
/// `vllm:cache_config_info` labels (`num_gpu_blocks` × `block_size`, or
/// `kv_cache_size_tokens` where present; `kv_cache_memory_bytes` when the
/// operator set it), summed over engines. `None` when the page has none.
pub fn parse_engine_cache(text: &str) -> Option<EngineCache> {
    let (mut bytes, mut tokens) = (None::<f64>, None::<f64>);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if line.starts_with("vllm:cache_config_info{") {
            let Some(labels) = labels(line) else { continue };
            let num = |name: &str| {
                labels
                    .iter()
                    .find(|(n, _)| *n == name)
                    .and_then(|(_, v)| v.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v > 0.0)
            };
            let capacity = num("kv_cache_size_tokens")
                .or_else(|| Some(num("num_gpu_blocks")? * num("block_size")?));
            if let Some(c) = capacity {
                *tokens.get_or_insert(0.0) += c;
            }
            if let Some(b) = num("kv_cache_memory_bytes") {
                *bytes.get_or_insert(0.0) += b;
            }
        }
    }
    for (name, value) in samples(text) {
        if !(value.is_finite() && value > 0.0) {
            continue;
        }
        match name {
            "sglang:kv_cache_memory_usage_gb" => {
                *bytes.get_or_insert(0.0) += value * f64::from(1u32 << 30);
            }
            "sglang:max_total_num_tokens" => *tokens.get_or_insert(0.0) += value,
            _ => {}
        }
    }
    if bytes.is_none() && tokens.is_none() {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = |v: Option<f64>| v.map(|v| v.round().min(u64::MAX as f64) as u64);
    Some(EngineCache {
        memory_bytes: whole(bytes),
        capacity_tokens: whole(tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_cache_from_vllm_and_sglang_pages() {
        // vLLM 0.11: no token label, no configured bytes (the label says None).
        let vllm = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",kv_cache_memory_bytes=\"None\",num_gpu_blocks=\"27000\",prefix_caching_hash_algo=\"sha256\"} 1.0\n";
        assert_eq!(
            parse_engine_cache(vllm),
            Some(EngineCache {
                memory_bytes: None,
                capacity_tokens: Some(432_000)
            })
        );
        let configured = "vllm:cache_config_info{engine=\"0\",kv_cache_memory_bytes=\"8589934592\",kv_cache_size_tokens=\"100000\",num_gpu_blocks=\"1\",block_size=\"16\"} 1.0\n";
        assert_eq!(
            parse_engine_cache(configured),
            Some(EngineCache {
                memory_bytes: Some(8_589_934_592),
                capacity_tokens: Some(100_000)
            })
        );
        let sglang = "sglang:kv_cache_memory_usage_gb{model_name=\"m\",dp_rank=\"0\"} 1.5\n\
sglang:kv_cache_memory_usage_gb{model_name=\"m\",dp_rank=\"1\"} 1.5\n\
sglang:max_total_num_tokens{model_name=\"m\"} 500000\n";
        assert_eq!(
            parse_engine_cache(sglang),
            Some(EngineCache {
                memory_bytes: Some(3 << 30),
                capacity_tokens: Some(500_000)
            })
        );
        assert_eq!(parse_engine_cache("vllm:num_requests_running 3\n"), None);
        assert_eq!(
            parse_engine_cache(
                "vllm:cache_config_info{num_gpu_blocks=\"x\",block_size=\"16\"} 1\n"
            ),
            None
        );
        assert_eq!(
            labels("m{a=\"x\\\"y\",b=\"\"} 1").unwrap(),
            [("a", "x\"y".to_owned()), ("b", String::new())]
        );
    }

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
        // Sums past u64 saturate (a debug build overflowed here).
        let huge = "\
vllm:external_prefix_cache_hits_total{engine=\"0\"} 1e19
vllm:external_prefix_cache_hits_total{engine=\"1\"} 1e19
vllm:external_prefix_cache_queries_total{engine=\"0\"} 1e19
";
        assert_eq!(
            parse_tier2(huge),
            Some(Tier2Counters {
                hits: u64::MAX,
                queries: 10_000_000_000_000_000_000
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
