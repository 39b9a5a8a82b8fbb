//! Context-dependent CacheBackend defaults, as the defaulting admission
//! webhook applies them (schema-literal defaults are stamped by the API
//! server before it). Operator-set values are never overwritten.

use crate::cachebackend::{
    CacheBackendSpec, DEFAULT_FIRST_EVENT_TIMEOUT, IntegrationSpec, ObservationSpec,
};

/// What [`apply`] changed, by field path (for logs and tests).
pub type Changed = Vec<&'static str>;

/// Fills the context-dependent defaults into `spec`:
///
/// * `spec.integration` and `spec.observation` are materialised when
///   omitted, so their nested defaults have a parent to live in;
/// * `spec.autoscaling.minReplicas` takes `spec.replicas` when autoscaling
///   is set without it — unless replicas is 0 (the validator rejects that
///   combination instead of guessing a floor of 1).
pub fn apply(spec: &mut CacheBackendSpec) -> Changed {
    let mut changed = Vec::new();
    if spec.integration.is_none() {
        spec.integration = Some(IntegrationSpec::default());
        changed.push("spec.integration");
    }
    if spec.observation.is_none() {
        spec.observation = Some(ObservationSpec {
            model_id: None,
            first_event_timeout: DEFAULT_FIRST_EVENT_TIMEOUT.to_owned(),
        });
        changed.push("spec.observation");
    }
    let replicas = spec.replicas;
    if let Some(a) = spec.autoscaling.as_mut()
        && a.min_replicas.is_none()
        && replicas > 0
    {
        a.min_replicas = Some(replicas);
        changed.push("spec.autoscaling.minReplicas");
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cachebackend::{IntegrationMode, IntegrationRole};

    fn spec(yaml: &str) -> CacheBackendSpec {
        serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn materialises_missing_blocks() {
        let mut s = spec("runtime: VLLM\n");
        assert_eq!(apply(&mut s), ["spec.integration", "spec.observation"]);
        let i = s.integration.as_ref().unwrap();
        assert_eq!(
            (i.mode, i.role, i.fail_open),
            (IntegrationMode::Offload, IntegrationRole::ReadWrite, true)
        );
        assert_eq!(
            s.observation
                .as_ref()
                .map(|o| o.first_event_timeout.as_str()),
            Some("5m")
        );
        // Idempotent: a second pass changes nothing.
        assert!(apply(&mut s).is_empty());
    }

    #[test]
    fn min_replicas_follows_replicas_once_and_never_overwrites() {
        let mut s = spec(
            "runtime: VLLM\nreplicas: 3\nintegration: {}\nobservation: {}\nautoscaling: {maxReplicas: 5}\n",
        );
        assert_eq!(apply(&mut s), ["spec.autoscaling.minReplicas"]);
        assert_eq!(s.autoscaling.as_ref().and_then(|a| a.min_replicas), Some(3));
        s.replicas = 1;
        assert!(
            apply(&mut s).is_empty(),
            "a later replicas edit leaves the floor alone"
        );
        assert_eq!(s.autoscaling.as_ref().and_then(|a| a.min_replicas), Some(3));

        let mut set = spec(
            "runtime: VLLM\nreplicas: 3\nintegration: {}\nobservation: {}\nautoscaling: {minReplicas: 2, maxReplicas: 5}\n",
        );
        assert!(apply(&mut set).is_empty());
        let mut zero = spec(
            "runtime: VLLM\nreplicas: 0\nintegration: {}\nobservation: {}\nautoscaling: {maxReplicas: 5}\n",
        );
        assert!(apply(&mut zero).is_empty(), "left to the validator");
        assert_eq!(zero.autoscaling.as_ref().and_then(|a| a.min_replicas), None);
    }
}
