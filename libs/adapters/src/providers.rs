//! Managed provider workloads (Redis, LMCache server, Mooncake master) and
//! their Services and HPAs, rendered from a CacheBackend for the controller.
