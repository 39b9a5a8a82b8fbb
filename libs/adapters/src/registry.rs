//! The runtime-adapter registry: which (runtime, cache type) pairs have an
//! adapter. Admission rejects unregistered pairs (listing SupportedPairs);
//! the pod webhook fails open on them.

use ic_api::cachebackend::{CacheType, Runtime};

use crate::runtime::RuntimeAdapter;
use crate::runtime::sglang_hicache::SglangHiCache;
use crate::runtime::sglang_lmcache::SglangLmCache;
use crate::runtime::vllm_lmcache::VllmLmCache;

static VLLM_LMCACHE: VllmLmCache = VllmLmCache;
static SGLANG_LMCACHE: SglangLmCache = SglangLmCache;
static SGLANG_HICACHE: SglangHiCache = SglangHiCache;

/// The shipping adapters, in SupportedPairs order.
static ADAPTERS: [&dyn RuntimeAdapter; 3] = [&VLLM_LMCACHE, &SGLANG_LMCACHE, &SGLANG_HICACHE];

/// The built-in registry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Registry;

/// `Runtime/CacheType` as the API spells them (`VLLM/LMCache`).
pub fn pair_name(runtime: Runtime, cache: CacheType) -> String {
    let r = match runtime {
        Runtime::Vllm => "VLLM",
        Runtime::SGLang => "SGLang",
    };
    let c = match cache {
        CacheType::LMCache => "LMCache",
        CacheType::SGLangHiCache => "SGLangHiCache",
    };
    format!("{r}/{c}")
}

impl Registry {
    /// The adapter for a pair.
    pub fn select(
        &self,
        runtime: Runtime,
        cache: CacheType,
    ) -> Option<&'static dyn RuntimeAdapter> {
        ADAPTERS
            .iter()
            .copied()
            .find(|a| a.pair() == (runtime, cache))
    }

    /// Every registered pair, as `Runtime/CacheType`.
    pub fn supported_pairs(&self) -> Vec<String> {
        ADAPTERS
            .iter()
            .map(|a| {
                let (r, c) = a.pair();
                pair_name(r, c)
            })
            .collect()
    }

    /// Every adapter.
    pub fn adapters(&self) -> impl Iterator<Item = &'static dyn RuntimeAdapter> {
        ADAPTERS.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipping_pairs() {
        assert_eq!(
            Registry.supported_pairs(),
            ["VLLM/LMCache", "SGLang/LMCache", "SGLang/SGLangHiCache"]
        );
        assert!(
            Registry
                .select(Runtime::Vllm, CacheType::SGLangHiCache)
                .is_none()
        );
        assert_eq!(
            Registry
                .select(Runtime::SGLang, CacheType::LMCache)
                .map(|a| a.id()),
            Some("sglang-lmcache")
        );
    }
}
