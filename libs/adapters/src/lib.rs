//! Runtime adapters (vLLM + LMCache, SGLang + LMCache MP, SGLang HiCache) and
//! storage-provider adapters (Redis, LMCache server, Mooncake): engine pod
//! wiring and provider workload rendering as pure functions over k8s-openapi
//! types. Empty until the admission-webhook work lands; the crate exists so
//! the workspace layout is settled.
