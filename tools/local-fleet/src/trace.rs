//! Mooncake-format request traces: one JSON object per line with
//! `timestamp` (ms), `input_length`, `output_length` and `hash_ids` (one id
//! per 512-token block, chained: an id stands for its whole prefix).

use std::path::Path;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival time, ms from the start.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Prompt blocks, as chained ids.
    pub hash_ids: Vec<u64>,
}

/// A trace line that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: {message}")]
pub struct TraceError {
    path: String,
    line: usize,
    message: String,
}

/// Reads a trace file; the error names the line.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError {
        path: path.display().to_string(),
        line: 0,
        message: e.to_string(),
    })?;
    parse_trace(&text).map_err(|(line, message)| TraceError {
        path: path.display().to_string(),
        line,
        message,
    })
}

/// Parses trace text; errors carry the 1-based line number.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRequest>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| (i + 1, e.to_string()))?;
        let field = |name: &str| {
            v[name]
                .as_u64()
                .ok_or_else(|| (i + 1, format!("{name}: expected a non-negative integer")))
        };
        let hash_ids = v["hash_ids"]
            .as_array()
            .ok_or_else(|| (i + 1, "hash_ids: expected an array".to_owned()))?
            .iter()
            .map(|h| {
                h.as_u64()
                    .ok_or_else(|| (i + 1, "hash_ids: expected integers".to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push(TraceRequest {
            timestamp_ms: field("timestamp")?,
            input_length: field("input_length")?,
            hash_ids,
        });
    }
    Ok(out)
}

/// A synthetic chat workload in the same format: `sessions` conversations
/// of `turns` turns each, interleaved; every conversation starts with one
/// of `system_prompts` shared system prompts (8 blocks) and each turn extends
/// the conversation by 3 blocks. Deterministic.
pub fn synthetic(sessions: u64, turns: u64, system_prompts: u64) -> Vec<TraceRequest> {
    const SYSTEM_BLOCKS: u64 = 8;
    const TURN_BLOCKS: u64 = 3;
    let system_prompts = system_prompts.max(1);
    // Ids 0.. are the system prompts' blocks; turns draw fresh ids after them.
    let mut next_id = system_prompts * SYSTEM_BLOCKS;
    let mut history: Vec<Vec<u64>> = (0..sessions)
        .map(|s| {
            let base = (s % system_prompts) * SYSTEM_BLOCKS;
            (base..base + SYSTEM_BLOCKS).collect()
        })
        .collect();
    let mut out = Vec::new();
    let mut clock = 0;
    for turn in 0..turns {
        // Sessions arrive in a different order every turn, so no routing
        // policy gets session affinity for free.
        let mut order: Vec<usize> = (0..history.len()).collect();
        order.sort_by_key(|&s| {
            (s as u64 ^ turn.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x2545_f491_4f6c_dd1d)
        });
        for s in order {
            let ids = &mut history[s];
            ids.extend(next_id..next_id + TURN_BLOCKS);
            next_id += TURN_BLOCKS;
            out.push(TraceRequest {
                timestamp_ms: clock,
                input_length: ids.len() as u64 * 512,
                hash_ids: ids.clone(),
            });
            clock += 100;
        }
    }
    out
}

/// Many multi-turn conversations behind one fleet-wide system prompt: every
/// request starts with the same first block, then its conversation so far;
/// each turn adds `turn_blocks` blocks. Conversations start staggered
/// (`concurrent` are open at a time, a finished one is replaced), and
/// turns of the open ones interleave, so a conversation comes back after
/// many others — with caches smaller than the working set, where routing
/// decides whether its history is still there. Deterministic.
pub fn shared_prefix_chat(
    requests: usize,
    concurrent: usize,
    turns: u64,
    turn_blocks: u64,
) -> Vec<TraceRequest> {
    const SHARED: u64 = 0;
    let concurrent = concurrent.max(1);
    let mut next_id = 1;
    let mut open: Vec<(Vec<u64>, u64)> = Vec::new();
    let mut out = Vec::with_capacity(requests);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut clock = 0;
    while out.len() < requests {
        while open.len() < concurrent {
            open.push((vec![SHARED], 0));
        }
        // xorshift: pick which open conversation speaks next.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let i = (rng % open.len() as u64) as usize;
        let (ids, done) = &mut open[i];
        ids.extend(next_id..next_id + turn_blocks);
        next_id += turn_blocks;
        *done += 1;
        out.push(TraceRequest {
            timestamp_ms: clock,
            input_length: ids.len() as u64 * 512,
            hash_ids: ids.clone(),
        });
        clock += 100;
        if *done >= turns {
            open.swap_remove(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_chat_shares_one_block_and_conversations_grow() {
        let t = shared_prefix_chat(500, 20, 10, 3);
        assert_eq!(t.len(), 500);
        assert!(
            t.iter().all(|r| r.hash_ids[0] == 0),
            "one shared first block"
        );
        // A request either opens a conversation (1 + 3 blocks) or extends an
        // earlier request by exactly one turn.
        for (i, r) in t.iter().enumerate() {
            let opens = r.hash_ids.len() == 4;
            let extends = t[..i].iter().any(|e| {
                r.hash_ids.starts_with(&e.hash_ids) && r.hash_ids.len() == e.hash_ids.len() + 3
            });
            assert!(opens || extends, "request {i}");
        }
        let longest = t.iter().map(|r| r.hash_ids.len()).max().unwrap();
        assert_eq!(longest, 1 + 10 * 3, "a conversation ends after its turns");
    }

    #[test]
    fn synthetic_sessions_share_system_prompts_and_grow() {
        let t = synthetic(4, 2, 2);
        assert_eq!(t.len(), 8);
        let prompts: std::collections::BTreeSet<&[u64]> =
            t[..4].iter().map(|r| &r.hash_ids[..8]).collect();
        assert_eq!(prompts.len(), 2, "two shared system prompts");
        for later in &t[4..] {
            assert!(
                t[..4]
                    .iter()
                    .any(|first| later.hash_ids.starts_with(&first.hash_ids)
                        && later.hash_ids.len() == first.hash_ids.len() + 3),
                "every second turn extends a first turn"
            );
        }
    }

    #[test]
    fn parses_lines_and_names_bad_ones() {
        let text = "{\"timestamp\": 5, \"input_length\": 1024, \"output_length\": 3, \"hash_ids\": [0, 1]}\n\n";
        assert_eq!(
            parse_trace(text).unwrap(),
            vec![TraceRequest {
                timestamp_ms: 5,
                input_length: 1024,
                hash_ids: vec![0, 1]
            }]
        );
        let bad =
            "{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": [0]}\n{\"timestamp\": -1}\n";
        assert_eq!(parse_trace(bad).unwrap_err().0, 2);
        assert_eq!(parse_trace("nope").unwrap_err().0, 1);
    }
}
