//! Parsing the lists operators type or keep in files.

/// A list that could not be parsed (the message says which item).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ParseError(pub String);

/// Token ids separated by commas and/or whitespace, or a JSON array.
pub fn token_ids(text: &str) -> Result<Vec<u32>, ParseError> {
    let trimmed = text.trim();
    if trimmed.starts_with('[') {
        return serde_json::from_str(trimmed)
            .map_err(|e| ParseError(format!("token ids: not a JSON array of integers: {e}")));
    }
    trimmed
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u32>().map_err(|_| {
                ParseError(format!(
                    "token ids: item {i} ({s:?}) is not an integer in 0..=4294967295"
                ))
            })
        })
        .collect()
}

/// Block fingerprints: `0x`-prefixed hex or decimal, separated by commas
/// and/or whitespace.
pub fn block_hashes(text: &str) -> Result<Vec<u64>, ParseError> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse::<u64>(),
            };
            parsed.map_err(|_| {
                ParseError(format!(
                    "block hashes: item {i} ({s:?}) is neither 0x-hex nor a decimal u64"
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lists() {
        assert_eq!(token_ids("1, 2 3\n4"), Ok(vec![1, 2, 3, 4]));
        assert_eq!(token_ids(" [5,6] "), Ok(vec![5, 6]));
        assert_eq!(token_ids(""), Ok(vec![]));
        assert!(token_ids("1,x").unwrap_err().0.contains("item 1"));
        assert!(token_ids("-1").is_err());
        assert!(token_ids("[1, \"a\"]").is_err());
    }

    #[test]
    fn hash_lists() {
        assert_eq!(
            block_hashes("0xcf97adeedb59e05b, 7"),
            Ok(vec![0xcf97_adee_db59_e05b, 7])
        );
        assert!(block_hashes("0xzz").unwrap_err().0.contains("item 0"));
    }
}
