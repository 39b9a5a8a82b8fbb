//! `--placements DIR`: where each request of each routed variant went, one
//! CSV per variant, to compare two runs request by request.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::fleet::Placement;

/// The CSV's header: one row per request, in trace order.
pub const HEADER: &str = "request,replica,engine,how,hit_blocks,prompt_blocks,best_blocks,ttft_ms";

/// The file of the variant at `position` in the variant list:
/// `<position>-<name, every character but ASCII letters and digits as a
/// dash>.csv`. The position keeps it injective (two names may dash to the
/// same slug) and stable across runs that select different variants.
pub fn file_name(position: usize, variant: &str) -> String {
    let slug: String = variant
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{position}-{slug}.csv")
}

/// The CSV text of `placements`.
pub fn csv(placements: &[Placement]) -> String {
    let mut csv = format!("{HEADER}\n");
    for (i, p) in placements.iter().enumerate() {
        let _ = writeln!(
            csv,
            "{i},{},{},{},{},{},{},{:.1}",
            p.replica, p.engine, p.how, p.hit_blocks, p.prompt_blocks, p.best_blocks, p.ttft_ms
        );
    }
    csv
}

/// Writes `placements` to `dir/file_name(position, variant)`; the path
/// written.
pub fn write(
    dir: &Path,
    position: usize,
    variant: &str,
    placements: &[Placement],
) -> anyhow::Result<PathBuf> {
    let path = dir.join(file_name(position, variant));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, csv(placements)))
        .with_context(|| format!("--placements {}: writing {}", dir.display(), path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::variants::VARIANTS;

    #[test]
    fn names_that_dash_alike_get_distinct_files() {
        // "a, b" and "a  b" both dash to "a--b".
        assert_eq!(file_name(0, "a, b"), "0-a--b.csv");
        assert_eq!(file_name(1, "a  b"), "1-a--b.csv");
        assert_ne!(file_name(0, "a, b"), file_name(1, "a  b"));
    }

    #[test]
    fn every_variant_has_its_own_file_name_of_safe_characters() {
        let names: HashSet<String> = VARIANTS
            .iter()
            .enumerate()
            .map(|(i, v)| file_name(i, v.name))
            .collect();
        assert_eq!(names.len(), VARIANTS.len(), "{names:?}");
        for name in &names {
            let stem = name
                .strip_suffix(".csv")
                .unwrap_or_else(|| panic!("{name}"));
            assert!(
                stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "{name}"
            );
        }
        assert!(names.contains("6-lookup-route--default-.csv"), "{names:?}");
    }

    #[test]
    fn one_row_per_request_in_order_under_the_header() {
        let p = |engine, ttft_ms| Placement {
            replica: 1,
            engine,
            how: "prefix",
            hit_blocks: 2,
            prompt_blocks: 5,
            best_blocks: 3,
            ttft_ms,
        };
        assert_eq!(
            csv(&[p(0, 12.34), p(3, 7.0)]),
            format!("{HEADER}\n0,1,0,prefix,2,5,3,12.3\n1,1,3,prefix,2,5,3,7.0\n")
        );
    }
}
