//! Where managed provider images come from on a cluster behind a private
//! registry: the defaulting webhook writes the re-homed default image and
//! the pull secrets into a Managed backend, so the stored object says what
//! the provider pods will pull.

use ic_api::cachebackend::{
    CacheBackendSpec, LmCacheServerSpec, MooncakeSpec, PodTemplateOverrides, RedisSpec,
    StorageProvider,
};
use k8s_openapi::api::core::v1::LocalObjectReference;

use super::{
    LMCACHE_SERVER_DEFAULT_IMAGE, MOONCAKE_DEFAULT_IMAGE, REDIS_DEFAULT_IMAGE, managed_provider,
};

/// The webhook's registry settings for provider workloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderImageDefaults {
    /// Registry (and path prefix) replacing `docker.io` in the default
    /// provider images, e.g. `registry.corp.example/mirror`; `None` keeps
    /// the defaults.
    pub registry: Option<String>,
    /// Pull secrets added to the provider pods' template.
    pub pull_secrets: Vec<String>,
}

/// The default image of `provider`, moved under `registry` when one is set
/// (`docker.io/library/redis:7.4.2-alpine` → `<registry>/library/redis:7.4.2-alpine`).
pub fn default_image(provider: StorageProvider, registry: Option<&str>) -> String {
    let image = match provider {
        StorageProvider::Redis => REDIS_DEFAULT_IMAGE,
        StorageProvider::LMCacheServer => LMCACHE_SERVER_DEFAULT_IMAGE,
        StorageProvider::Mooncake => MOONCAKE_DEFAULT_IMAGE,
    };
    match registry
        .map(|r| r.trim().trim_end_matches('/'))
        .filter(|r| !r.is_empty())
    {
        Some(registry) => {
            let path = image.strip_prefix("docker.io/").unwrap_or(image);
            format!("{registry}/{path}")
        }
        None => image.to_owned(),
    }
}

/// Fills a Managed backend's unset provider image with the re-homed default
/// and adds the pull secrets its template lacks; returns the fields changed.
/// An image the operator chose is never touched, nor a backend that
/// provisions nothing.
pub fn apply(spec: &mut CacheBackendSpec, defaults: &ProviderImageDefaults) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let Some(provider) = managed_provider(spec) else {
        return changed;
    };
    if defaults.registry.is_some() {
        let image = default_image(provider, defaults.registry.as_deref());
        let Some(rs) = spec.remote_storage.as_mut() else {
            return changed;
        };
        let (slot, field) = match provider {
            StorageProvider::Redis => (
                &mut rs
                    .redis
                    .get_or_insert(RedisSpec {
                        image: None,
                        resources: None,
                    })
                    .image,
                "spec.remoteStorage.redis.image",
            ),
            StorageProvider::LMCacheServer => (
                &mut rs
                    .lm_cache_server
                    .get_or_insert(LmCacheServerSpec {
                        image: None,
                        command: None,
                        resources: None,
                    })
                    .image,
                "spec.remoteStorage.lmCacheServer.image",
            ),
            StorageProvider::Mooncake => (
                &mut rs
                    .mooncake
                    .get_or_insert(MooncakeSpec {
                        image: None,
                        command: None,
                        resources: None,
                    })
                    .image,
                "spec.remoteStorage.mooncake.image",
            ),
        };
        if slot.as_deref().is_none_or(|i| i.trim().is_empty()) {
            *slot = Some(image);
            changed.push(field);
        }
    }
    let wanted: Vec<&str> = defaults
        .pull_secrets
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    if !wanted.is_empty() {
        let template = spec
            .template
            .get_or_insert_with(PodTemplateOverrides::default);
        let list = template.image_pull_secrets.get_or_insert_with(Vec::new);
        let before = list.len();
        for name in wanted {
            if !list.iter().any(|r| r.name == name) {
                list.push(LocalObjectReference {
                    name: name.to_owned(),
                });
            }
        }
        if list.len() != before {
            changed.push("spec.template.imagePullSecrets");
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> CacheBackendSpec {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn default_images_are_fully_qualified_and_follow_the_registry() {
        for provider in [
            StorageProvider::Redis,
            StorageProvider::LMCacheServer,
            StorageProvider::Mooncake,
        ] {
            let image = default_image(provider, None);
            // CRI-O's short-name enforcement refuses a first component
            // that is not a registry host.
            let host = image.split('/').next().unwrap_or_default();
            assert!(
                image.matches('/').count() >= 2 && host.contains('.'),
                "{image} is not fully qualified"
            );
            let moved = default_image(provider, Some("mirror.example/hub/"));
            assert!(moved.starts_with("mirror.example/hub/"), "{moved}");
            assert!(!moved.contains("docker.io"), "{moved}");
        }
    }

    #[test]
    fn fills_only_unset_images_of_managed_backends_and_adds_secrets_once() {
        let defaults = ProviderImageDefaults {
            registry: Some("mirror.example".into()),
            pull_secrets: vec!["regcred".into(), "regcred".into()],
        };
        let mut managed = spec(serde_json::json!({"runtime": "VLLM",
            "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
            "template": {"imagePullSecrets": [{"name": "own"}]}}));
        assert_eq!(
            apply(&mut managed, &defaults),
            [
                "spec.remoteStorage.redis.image",
                "spec.template.imagePullSecrets"
            ]
        );
        let rs = managed.remote_storage.as_ref().unwrap();
        assert_eq!(
            rs.redis.as_ref().unwrap().image.as_deref(),
            Some("mirror.example/library/redis:7.4.2-alpine")
        );
        let names: Vec<&str> = managed
            .template
            .as_ref()
            .unwrap()
            .image_pull_secrets
            .as_ref()
            .unwrap()
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["own", "regcred"]);
        // Again: nothing left to change.
        assert!(apply(&mut managed, &defaults).is_empty());

        let mut chosen = spec(serde_json::json!({"runtime": "VLLM",
            "remoteStorage": {"provider": "Mooncake", "ownership": "Managed",
                "mooncake": {"image": "my/mooncake:1"}}}));
        assert_eq!(
            apply(
                &mut chosen,
                &ProviderImageDefaults {
                    pull_secrets: vec![],
                    ..defaults.clone()
                }
            ),
            Vec::<&str>::new()
        );
        let mut external = spec(serde_json::json!({"runtime": "VLLM",
            "remoteStorage": {"provider": "Redis", "ownership": "External",
                "endpoint": "redis://r:6379"}}));
        assert!(apply(&mut external, &defaults).is_empty());
        assert!(external.template.is_none());
    }
}
