//! Fleet L2 eviction: per-tenant quotas and the planner that picks victims
//! from the L2 LRU order the key directory keeps. Dispatch (HTTP) lives in the service.

use std::collections::BTreeMap;

use crate::StorageLevel;
use crate::directory::KeyDirectory;
use crate::key::ObjectKey;
use crate::pins::Pins;
use crate::usage::UsageView;

/// Bytes per GiB; quota limits travel as GiB floats.
pub const GIB: f64 = 1_073_741_824.0;

/// `int(gb × 2^30)`, the reference's rounding.
pub fn gb_to_bytes(gb: f64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bytes = (gb * GIB) as u64;
    bytes
}

/// Bytes as GiB.
pub fn bytes_to_gb(bytes: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let gb = bytes as f64 / GIB;
    gb
}

/// Per-tenant L2 limits and the default for tenants without one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quotas {
    /// Explicit limits, bytes.
    pub limits: BTreeMap<String, u64>,
    /// Limit of tenants without an explicit one; `None` exempts them.
    pub default_limit: Option<u64>,
}

impl Quotas {
    /// The limit that applies to `salt`.
    pub fn effective(&self, salt: &str) -> Option<u64> {
        self.limits.get(salt).copied().or(self.default_limit)
    }
}

/// Settings of a sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvictionSettings {
    /// Fraction of the limit that triggers eviction, in (0, 1].
    pub trigger_watermark: f64,
    /// Fraction of the bucket evicted per sweep.
    pub eviction_ratio: f64,
}

impl Default for EvictionSettings {
    fn default() -> Self {
        Self {
            trigger_watermark: 1.0,
            eviction_ratio: 0.2,
        }
    }
}

/// What one sweep decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictionPlan {
    /// Keys to delete, oldest first per tenant.
    pub victims: Vec<ObjectKey>,
    /// Tenants over their watermark.
    pub tenants_over: usize,
    /// Pinned keys passed over while walking.
    pub skipped_pinned: u64,
}

/// Picks victims: for each tenant in the directory's L2 LRU whose L2 bytes
/// reach `watermark × limit`, walk its LRU from the oldest, skip pinned
/// keys, and take `max(1, int(len × ratio))` (everything when the limit is
/// 0).
pub fn plan(
    directory: &KeyDirectory,
    usage: &UsageView,
    quotas: &Quotas,
    pins: &Pins,
    settings: EvictionSettings,
) -> EvictionPlan {
    let mut out = EvictionPlan::default();
    for (salt, len) in directory.lru_salts() {
        let used = usage.salt_bytes(StorageLevel::L2, &salt);
        if used == 0 {
            continue;
        }
        let Some(limit) = quotas.effective(&salt) else {
            continue;
        };
        #[allow(clippy::cast_precision_loss)]
        if (used as f64) < settings.trigger_watermark * limit as f64 {
            continue;
        }
        out.tenants_over += 1;
        let ratio = if limit == 0 {
            1.0
        } else {
            settings.eviction_ratio
        };
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let n = ((len as f64 * ratio) as usize).max(1);
        let mut taken = 0;
        for key in directory.lru_oldest(&salt) {
            if taken == n {
                break;
            }
            if pins.is_pinned(&key) {
                out.skipped_pinned += 1;
                continue;
            }
            out.victims.push(key);
            taken += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventType;
    use crate::testutil::{batch, key};

    fn setup(n: u8, size: u64) -> (KeyDirectory, UsageView) {
        let (mut d, mut u) = (KeyDirectory::new(), UsageView::new());
        for h in 0..n {
            let b = batch(
                "a",
                EventType::Store,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(h, "t"), size)],
            );
            let old = d.apply(&b);
            u.apply(&b, &old);
        }
        (d, u)
    }

    fn hashes(keys: &[ObjectKey]) -> Vec<u8> {
        keys.iter().map(|k| k.chunk_hash[0]).collect()
    }

    #[test]
    fn gb_rounding_matches_reference() {
        assert_eq!(bytes_to_gb(gb_to_bytes(0.1)), 0.099_999_999_627_470_97);
        assert_eq!(gb_to_bytes(1.0), 1 << 30);
    }

    #[test]
    fn under_quota_or_no_limit_evicts_nothing() {
        let (d, u) = setup(10, 100);
        let none = Quotas::default();
        assert!(
            plan(&d, &u, &none, &Pins::new(), EvictionSettings::default())
                .victims
                .is_empty()
        );
        let roomy = Quotas {
            limits: [("t".to_owned(), 1001)].into(),
            default_limit: None,
        };
        assert!(
            plan(&d, &u, &roomy, &Pins::new(), EvictionSettings::default())
                .victims
                .is_empty()
        );
    }

    #[test]
    fn over_quota_takes_ratio_of_oldest_skipping_pins() {
        let (d, u) = setup(10, 100);
        let q = Quotas {
            limits: [("t".to_owned(), 1000)].into(),
            default_limit: None,
        };
        let mut pins = Pins::new();
        pins.pin([&key(0, "t")]);
        let p = plan(&d, &u, &q, &pins, EvictionSettings::default());
        assert_eq!(hashes(&p.victims), vec![1, 2]);
        assert_eq!(p.skipped_pinned, 1);
    }

    #[test]
    fn watermark_triggers_early_and_zero_limit_evicts_all_unpinned() {
        let (d, u) = setup(10, 100);
        let q = Quotas {
            limits: BTreeMap::new(),
            default_limit: Some(1250),
        };
        let s = EvictionSettings {
            trigger_watermark: 0.8,
            eviction_ratio: 0.01,
        };
        assert_eq!(
            plan(&d, &u, &q, &Pins::new(), s).victims.len(),
            1,
            "at least one key"
        );
        let zero = Quotas {
            limits: [("t".to_owned(), 0)].into(),
            default_limit: None,
        };
        let mut pins = Pins::new();
        pins.pin([&key(3, "t")]);
        let p = plan(&d, &u, &zero, &pins, s);
        assert_eq!(p.victims.len(), 9);
        assert!(!hashes(&p.victims).contains(&3));
    }

    #[test]
    fn access_reorders_and_delete_drops_when_no_l2_left() {
        let (mut d, mut u) = setup(3, 100);
        let access = batch(
            "a",
            EventType::Access,
            StorageLevel::L2,
            "",
            false,
            &[(key(0, "t"), 0)],
        );
        d.apply(&access);
        let q = Quotas {
            limits: [("t".to_owned(), 0)].into(),
            default_limit: None,
        };
        let p = plan(&d, &u, &q, &Pins::new(), EvictionSettings::default());
        assert_eq!(hashes(&p.victims), vec![1, 2, 0]);
        let del = batch(
            "a",
            EventType::Delete,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(1, "t"), 0)],
        );
        let old = d.apply(&del);
        u.apply(&del, &old);
        assert_eq!(d.lru_bucket_len("t"), 2);
    }
}
