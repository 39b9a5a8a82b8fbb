//! Deterministic names and label values derived from a CacheBackend name.
//!
//! CacheBackend names are DNS subdomains (up to 253 characters, dots
//! allowed), while a Service name must be a DNS-1035 label (63 characters,
//! starting with a letter) and a label value is limited to 63 characters.
//! The common case is passed through untouched; only names that would be
//! rejected are shortened, and those get a stable hash of the full name so two
//! long backends sharing a prefix never collide.

/// Longest Service name / label value Kubernetes accepts.
const MAX_LABEL: usize = 63;

/// `<backend>-<suffix>` when that is a valid DNS-1035 label, otherwise a
/// sanitised, shortened stem plus an 8-hex-digit hash of `backend`.
pub(crate) fn object_name(backend: &str, suffix: &str) -> String {
    let plain = format!("{backend}-{suffix}");
    if is_dns1035_label(&plain) {
        return plain;
    }
    let hash = fnv1a_hex(backend);
    let mut stem: String = backend
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    if !stem.starts_with(|c: char| c.is_ascii_lowercase()) {
        stem.insert_str(0, "cb-");
    }
    let budget = MAX_LABEL.saturating_sub(suffix.len() + hash.len() + 2);
    stem.truncate(budget);
    let stem = stem.trim_end_matches('-');
    format!("{stem}-{hash}-{suffix}")
}

/// `value` when it is a valid label value, otherwise a sanitised, shortened
/// form plus a hash of the original.
pub(crate) fn label_value(value: &str) -> String {
    if is_label_value(value) {
        return value.to_owned();
    }
    let hash = fnv1a_hex(value);
    let mapped: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut stem = mapped
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned();
    stem.truncate(MAX_LABEL - hash.len() - 1);
    let stem = stem.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if stem.is_empty() {
        hash
    } else {
        format!("{stem}-{hash}")
    }
}

fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_lowercase()
        && b.last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() {
        return true;
    }
    b.len() <= MAX_LABEL
        && b[0].is_ascii_alphanumeric()
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// 32-bit FNV-1a as 8 lowercase hex digits: tiny, dependency-free and stable
/// across releases, which is all a name disambiguator needs.
fn fnv1a_hex(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_pass_through() {
        assert_eq!(object_name("llama", "redis"), "llama-redis");
        assert_eq!(label_value("llama"), "llama");
    }

    #[test]
    fn long_or_dotted_names_are_shortened_stably() {
        let long = "a".repeat(80);
        let n = object_name(&long, "lmcache-server");
        assert!(is_dns1035_label(&n), "{n}");
        assert!(n.ends_with("-lmcache-server"));
        assert_eq!(n, object_name(&long, "lmcache-server"));
        let other = format!("{}b", "a".repeat(79));
        assert_ne!(n, object_name(&other, "lmcache-server"));

        let dotted = object_name("team.cache", "redis");
        assert!(is_dns1035_label(&dotted), "{dotted}");
        assert!(dotted.starts_with("team-cache-"));
        let digit = object_name("1cache", "redis");
        assert!(digit.starts_with("cb-1cache-"), "{digit}");

        let lv = label_value(&long);
        assert!(is_label_value(&lv) && lv.len() <= 63, "{lv}");
    }

    #[test]
    fn fnv_reference_values() {
        assert_eq!(fnv1a_hex(""), "811c9dc5");
        assert_eq!(fnv1a_hex("a"), "e40c292c");
    }
}
