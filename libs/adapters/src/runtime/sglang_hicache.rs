//! SGLang native HiCache: `--enable-hierarchical-cache` plus the
//! `--hicache-*` flags, engine-local, no sidecar and no binding.
//!
//! The whole plan is validated against the original pod before anything is
//! changed: an existing matching flag is kept byte-for-byte, a missing one
//! is appended once, and a different value, the opposite capacity mode, a
//! malformed or duplicated flag, or SGLang LMCache flags refuse the pod —
//! so a refused pod never carries partial HiCache wiring.

use k8s_openapi::api::core::v1::{Container, Pod};

use ic_api::cachebackend::{
    CacheType, HiCacheIoBackend, HiCacheMemoryLayout, HiCacheSpec, HiCacheWritePolicy, Runtime,
};

use super::{
    ENABLE_HICACHE, ENABLE_LMCACHE, ENABLE_METRICS, InjectContext, LMCACHE_CONFIG_FILE,
    RuntimeAdapter,
};
use crate::binding::Protocol;
use crate::merge::{ArgItem, flag_items, upsert_flag};

/// Host cache as a multiple of the device cache.
pub const HICACHE_RATIO: &str = "--hicache-ratio";
/// Host cache size in GB.
pub const HICACHE_SIZE: &str = "--hicache-size";
/// Write policy.
pub const HICACHE_WRITE_POLICY: &str = "--hicache-write-policy";
/// I/O backend.
pub const HICACHE_IO_BACKEND: &str = "--hicache-io-backend";
/// Memory layout.
pub const HICACHE_MEM_LAYOUT: &str = "--hicache-mem-layout";

const RESERVED_ARGS: &[&str] = &[
    ENABLE_HICACHE,
    HICACHE_RATIO,
    HICACHE_SIZE,
    HICACHE_WRITE_POLICY,
    HICACHE_IO_BACKEND,
    HICACHE_MEM_LAYOUT,
];

/// The SGLang HiCache adapter.
#[derive(Debug, Clone, Copy, Default)]
pub struct SglangHiCache;

/// A decimal number normalised to (significant digits, base-10 exponent),
/// so `"2"`, `"2.0"` and `"0.2e1"` compare equal without floats.
fn normalize_decimal(s: &str) -> Option<(String, i64)> {
    let s = s.strip_prefix('+').unwrap_or(s);
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i64>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mut exp = exp.checked_sub(i64::try_from(frac.len()).ok()?)?;
    let trimmed = digits.trim_start_matches('0');
    let without_trailing = trimmed.trim_end_matches('0');
    exp = exp.checked_add(i64::try_from(trimmed.len() - without_trailing.len()).ok()?)?;
    if without_trailing.is_empty() {
        return Some((String::new(), 0));
    }
    Some((without_trailing.to_owned(), exp))
}

/// A finite ratio greater than zero.
pub fn valid_ratio(s: &str) -> bool {
    normalize_decimal(s.trim()).is_some_and(|(d, _)| !d.is_empty())
}

fn write_policy(p: HiCacheWritePolicy) -> &'static str {
    match p {
        HiCacheWritePolicy::WriteBack => "write_back",
        HiCacheWritePolicy::WriteThrough => "write_through",
        HiCacheWritePolicy::WriteThroughSelective => "write_through_selective",
    }
}

fn io_backend(b: HiCacheIoBackend) -> &'static str {
    match b {
        HiCacheIoBackend::Direct => "direct",
        HiCacheIoBackend::Kernel => "kernel",
        HiCacheIoBackend::KernelAscend => "kernel_ascend",
    }
}

fn mem_layout(l: HiCacheMemoryLayout) -> &'static str {
    match l {
        HiCacheMemoryLayout::LayerFirst => "layer_first",
        HiCacheMemoryLayout::PageFirst => "page_first",
        HiCacheMemoryLayout::PageFirstDirect => "page_first_direct",
        HiCacheMemoryLayout::PageFirstKvSplit => "page_first_kv_split",
        HiCacheMemoryLayout::PageHead => "page_head",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Compare {
    Exact,
    Decimal,
    Integer,
}

fn same_value(kind: Compare, have: &str, want: &str) -> Option<bool> {
    match kind {
        Compare::Exact => Some(have == want),
        Compare::Decimal => Some(normalize_decimal(have)? == normalize_decimal(want)?),
        Compare::Integer => Some(have.parse::<i64>().ok()? == want.parse::<i64>().ok()?),
    }
}

/// The flags to append to `args`, or why the pod is refused.
fn plan(hi: Option<&HiCacheSpec>, args: &[String]) -> Result<Vec<Vec<String>>, String> {
    let hi = hi.ok_or("spec.hiCache is required for type SGLangHiCache")?;
    for f in [ENABLE_LMCACHE, LMCACHE_CONFIG_FILE] {
        if !flag_items(args, f).is_empty() {
            return Err(format!(
                "the engine carries SGLang LMCache flag {f}; HiCache and LMCache are exclusive"
            ));
        }
    }
    let (capacity, opposite, value, kind) = match (&hi.ratio, hi.size_gb) {
        (Some(r), None) => {
            if !valid_ratio(r) {
                return Err(format!(
                    "hiCache.ratio {r:?} must be a finite number greater than zero"
                ));
            }
            (
                HICACHE_RATIO,
                HICACHE_SIZE,
                r.trim().to_owned(),
                Compare::Decimal,
            )
        }
        (None, Some(gb)) if gb >= 1 => (
            HICACHE_SIZE,
            HICACHE_RATIO,
            gb.to_string(),
            Compare::Integer,
        ),
        (None, Some(gb)) => return Err(format!("hiCache.sizeGB {gb} must be a positive integer")),
        _ => return Err("exactly one of hiCache.ratio and hiCache.sizeGB must be set".into()),
    };
    if !flag_items(args, opposite).is_empty() {
        return Err(format!(
            "the engine already sets {opposite}, the other HiCache capacity mode than {capacity}"
        ));
    }
    let mut out = Vec::new();
    let enable = flag_items(args, ENABLE_HICACHE);
    match enable.as_slice() {
        [] => out.push(vec![ENABLE_HICACHE.to_owned()]),
        [ArgItem { inline: false, .. }] => {}
        [_] => return Err(format!("{ENABLE_HICACHE} takes no value")),
        _ => return Err(format!("{ENABLE_HICACHE} is given more than once")),
    }
    let mut wanted = vec![(capacity, value, kind)];
    if let Some(p) = hi.write_policy {
        wanted.push((
            HICACHE_WRITE_POLICY,
            write_policy(p).to_owned(),
            Compare::Exact,
        ));
    }
    if let Some(b) = hi.io_backend {
        wanted.push((HICACHE_IO_BACKEND, io_backend(b).to_owned(), Compare::Exact));
    }
    if let Some(l) = hi.memory_layout {
        wanted.push((HICACHE_MEM_LAYOUT, mem_layout(l).to_owned(), Compare::Exact));
    }
    for (flag, want, kind) in wanted {
        match flag_items(args, flag).as_slice() {
            [] => out.push(vec![flag.to_owned(), want]),
            [item] => {
                let have = item
                    .value
                    .as_deref()
                    .ok_or(format!("{flag} has no value"))?;
                match same_value(kind, have, &want) {
                    None => return Err(format!("{flag} value {have:?} is malformed")),
                    Some(false) => {
                        return Err(format!(
                            "{flag} is {have:?} on the pod but the CacheBackend asks for {want:?}"
                        ));
                    }
                    Some(true) => {}
                }
            }
            _ => return Err(format!("{flag} is given more than once")),
        }
    }
    Ok(out)
}

impl RuntimeAdapter for SglangHiCache {
    fn id(&self) -> &'static str {
        "sglang-hicache"
    }

    fn display_name(&self) -> &'static str {
        "SGLang HiCache"
    }

    fn pair(&self) -> (Runtime, CacheType) {
        (Runtime::SGLang, CacheType::SGLangHiCache)
    }

    fn reserved_args(&self) -> &'static [&'static str] {
        RESERVED_ARGS
    }

    fn reserved_env(&self, _protocol: Option<Protocol>) -> Vec<&'static str> {
        Vec::new()
    }

    fn supports_binding(&self, protocol: Option<Protocol>) -> bool {
        protocol.is_none()
    }

    fn hash_scheme(&self) -> &'static str {
        "sglang"
    }

    fn exports_engine_metrics(&self) -> bool {
        true
    }

    fn serves_metrics_as_written(&self, args: &[String]) -> bool {
        !flag_items(args, ENABLE_METRICS).is_empty()
    }

    fn default_engine_port(&self) -> i32 {
        30000
    }

    fn check_pod(&self, ctx: &InjectContext<'_>, pod: &Pod, engine: usize) -> Result<(), String> {
        let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
        let args = spec.containers[engine].args.as_deref().unwrap_or_default();
        plan(ctx.backend.spec.hi_cache.as_ref(), args).map(|_| ())
    }

    fn inject_engine_config(
        &self,
        ctx: &InjectContext<'_>,
        engine: &mut Container,
    ) -> Result<(), String> {
        let additions = plan(
            ctx.backend.spec.hi_cache.as_ref(),
            engine.args.as_deref().unwrap_or_default(),
        )?;
        let args = engine.args.get_or_insert_with(Vec::new);
        for tokens in additions {
            args.extend(tokens);
        }
        upsert_flag(args, ENABLE_METRICS);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_compare_numerically() {
        assert_eq!(normalize_decimal("2"), normalize_decimal("2.0"));
        assert_eq!(normalize_decimal("2"), normalize_decimal("0.2e1"));
        assert_eq!(normalize_decimal("+20"), normalize_decimal("2E1"));
        assert_ne!(normalize_decimal("2"), normalize_decimal("2.5"));
        assert!(valid_ratio("0.5"));
        assert!(!valid_ratio("0"));
        assert!(!valid_ratio("0.000"));
        assert!(!valid_ratio("-1"));
        assert!(!valid_ratio("abc"));
        assert!(!valid_ratio("inf"));
        assert!(!valid_ratio("."));
    }
}
