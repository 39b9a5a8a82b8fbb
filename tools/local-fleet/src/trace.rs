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

#[cfg(test)]
mod tests {
    use super::*;

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
