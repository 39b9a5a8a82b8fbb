//! The load generator's pure parts: the synthetic fleet it preloads (which
//! replica holds which block chains) and latency summaries.
//!
//! Replicas come in groups of four sharing the same prompt families (as
//! replicas behind one model with a shared system prompt do), so lookups
//! see realistic candidate sets.

pub mod http1;
pub mod lean;
pub mod prom;
pub mod schedule;
pub mod stalls;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// Replicas sharing each family.
pub const GROUP: u32 = 4;

/// Fingerprint of block `depth` of prompt family `family`: distinct
/// well-mixed u64s, like real fingerprints.
pub fn fingerprint(family: u64, depth: u32) -> u64 {
    let x = (family << 20 | u64::from(depth)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 31)
}

/// Block `j` of request `i`'s new tail ([`Fleet::lookup_prompt_with_new`]):
/// well mixed, and apart from every [`fingerprint`] in practice.
pub fn fresh_fingerprint(i: u64, j: u32) -> u64 {
    let x = (i.rotate_left(17) ^ u64::from(j) ^ 0x5bd1_e995_0000_0000)
        .wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

/// The synthetic fleet's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fleet {
    /// Replicas (pods).
    pub replicas: u32,
    /// Resident (replica, block) entries to preload in total.
    pub entries: u64,
    /// Blocks per family chain.
    pub chain: u32,
}

impl Fleet {
    /// Blocks each replica holds.
    pub fn per_replica(&self) -> u64 {
        self.entries / u64::from(self.replicas.max(1))
    }

    /// Families (chains) each replica group holds.
    pub fn families_per_group(&self) -> u64 {
        self.per_replica().div_ceil(u64::from(self.chain.max(1)))
    }

    /// The `i`-th family of replica `r`'s group.
    pub fn family(&self, replica: u32, i: u64) -> u64 {
        u64::from(replica / GROUP) * 1_000_000 + i
    }

    /// Chains replica `r` holds, as (family, blocks).
    pub fn chains(&self, replica: u32) -> Vec<(u64, u32)> {
        let mut left = self.per_replica();
        let mut out = Vec::new();
        let mut i = 0;
        while left > 0 {
            let len = u64::from(self.chain).min(left);
            out.push((
                self.family(replica, i),
                u32::try_from(len).unwrap_or(u32::MAX),
            ));
            left -= len;
            i += 1;
        }
        out
    }

    /// A prompt of `blocks` blocks from family `i` of group `group` (a hit
    /// on that group's replicas up to the chain length).
    pub fn prompt(&self, group: u32, i: u64, blocks: u32) -> Vec<u64> {
        let family = self.family(group * GROUP, i % self.families_per_group().max(1));
        (0..blocks).map(|d| fingerprint(family, d)).collect()
    }

    /// Replica groups.
    pub fn groups(&self) -> u32 {
        self.replicas.div_ceil(GROUP)
    }

    /// The `i`-th LookupRoute's prompt: groups in turn, each group's
    /// families in turn, so a run cycles through
    /// [`Self::distinct_prompts`] prompts.
    pub fn lookup_prompt(&self, i: u64, blocks: u32) -> Vec<u64> {
        let groups = u64::from(self.groups().max(1));
        self.prompt(u32::try_from(i % groups).unwrap_or(0), i / groups, blocks)
    }

    /// [`Self::lookup_prompt`] whose last `new` of its `blocks` blocks are
    /// [`fresh_fingerprint`]s of request `i`: held up to there, then a
    /// tail no replica holds and no other request names (as a prompt
    /// ending in a new user turn).
    pub fn lookup_prompt_with_new(&self, i: u64, blocks: u32, new: u32) -> Vec<u64> {
        let new = new.min(blocks);
        let mut prompt = self.lookup_prompt(i, blocks - new);
        prompt.extend((0..new).map(|j| fresh_fingerprint(i, j)));
        prompt
    }

    /// Distinct prompts [`Self::lookup_prompt`] cycles through.
    pub fn distinct_prompts(&self) -> u64 {
        u64::from(self.groups().max(1)) * self.families_per_group().max(1)
    }
}

/// Where a service binary is: in `bin_dir`, or next to the running one.
pub fn service_binary(bin_dir: Option<&Path>, name: &str) -> Result<PathBuf, String> {
    let dir = match bin_dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot locate this binary: {e}"))?
            .parent()
            .ok_or("this binary has no directory")?
            .to_path_buf(),
    };
    let bin = dir.join(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: build it (`cargo build --release --bins`) or pass --target",
            bin.display()
        ))
    }
}

/// Latency and rate of one phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseStats {
    /// Requests completed.
    pub requests: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Completed requests per second.
    pub qps: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile latency, microseconds.
    pub p999_us: f64,
}

/// Microseconds, exact to the nanosecond (`as_secs_f64() * 1e6` is not).
fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e3
}

/// Nearest-rank percentile `p` (0..100) of sorted `v`, microseconds; 0
/// when empty.
fn percentile_us(v: &[Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    // Nearest rank, less a hair so 99.9 % of 1,000 (999.0000000000001 in
    // floating point) is rank 999; the cast is of a small positive value.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((p / 100.0) * v.len() as f64 - 1e-9).ceil() as usize;
    micros(v[rank.clamp(1, v.len()) - 1])
}

/// A distribution's median, tail and maximum, microseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

impl Quantiles {
    /// Of `v`, any order.
    pub fn of(mut v: Vec<Duration>) -> Self {
        v.sort_unstable();
        Self {
            p50_us: percentile_us(&v, 50.0),
            p99_us: percentile_us(&v, 99.0),
            p999_us: percentile_us(&v, 99.9),
            max_us: v.last().map_or(0.0, |d| micros(*d)),
        }
    }
}

/// Summarises latencies (any order) measured over `elapsed`.
pub fn summarize(mut latencies: Vec<Duration>, errors: u64, elapsed: Duration) -> PhaseStats {
    latencies.sort_unstable();
    let pct = |p: f64| percentile_us(&latencies, p);
    PhaseStats {
        requests: latencies.len() as u64,
        errors,
        qps: latencies.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_us: pct(50.0),
        p99_us: pct(99.0),
        p999_us: pct(99.9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_cover_each_replicas_share_and_groups_share_families() {
        let fleet = Fleet {
            replicas: 8,
            entries: 8 * 2500,
            chain: 1024,
        };
        let chains = fleet.chains(5);
        assert_eq!(chains.iter().map(|c| u64::from(c.1)).sum::<u64>(), 2500);
        assert_eq!(chains.len(), 3);
        assert_eq!(fleet.chains(4), chains, "same group, same families");
        assert_ne!(fleet.chains(3), chains);
        assert_eq!(fleet.groups(), 2);
        let prompt = fleet.prompt(1, 0, 16);
        assert_eq!(prompt[3], fingerprint(chains[0].0, 3));
        // A new tail: held blocks first, then fresh ones of this request only.
        let with_new = fleet.lookup_prompt_with_new(1, 16, 4);
        assert_eq!(with_new[..12], fleet.lookup_prompt(1, 12)[..]);
        assert_eq!(
            with_new[12..],
            [0, 1, 2, 3].map(|j| fresh_fingerprint(1, j))
        );
        assert_ne!(fleet.lookup_prompt_with_new(2, 16, 4)[12..], with_new[12..]);
        assert_eq!(
            fleet.lookup_prompt_with_new(1, 16, 0),
            fleet.lookup_prompt(1, 16)
        );
    }

    #[test]
    fn summaries_use_nearest_rank() {
        let lat: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = summarize(lat, 2, Duration::from_secs(2));
        assert_eq!((s.requests, s.errors), (100, 2));
        assert!((s.qps - 50.0).abs() < 1e-9);
        assert!((s.p50_us - 50.0).abs() < 1e-9);
        assert!((s.p99_us - 99.0).abs() < 1e-9);
        assert!((s.p999_us - 100.0).abs() < 1e-9);
        assert_eq!(summarize(Vec::new(), 0, Duration::from_secs(1)).p99_us, 0.0);
        let q = Quantiles::of((1..=1000).map(Duration::from_micros).collect());
        assert_eq!(
            (q.p50_us, q.p99_us, q.p999_us, q.max_us),
            (500.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(Quantiles::of(Vec::new()).max_us, 0.0);
    }
}
