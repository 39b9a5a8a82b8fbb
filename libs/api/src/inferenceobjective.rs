//! `InferenceObjective` (`inference.networking.x-k8s.io/v1alpha2`): the
//! Gateway API Inference Extension's kind, not ours. The controller reads
//! each objective's priority and pool and pushes them to the index
//! servers' endpoint pickers; only the fields read are modelled, leniently
//! (the extension owns and validates the schema, so no CRD is generated).

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The serving objective of the requests naming it in their
/// `x-gateway-inference-objective` header.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1alpha2",
    kind = "InferenceObjective",
    plural = "inferenceobjectives",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceObjectiveSpec {
    /// Larger is more important; negative is sheddable; unset is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The InferencePool (in the objective's namespace) it applies to.
    #[serde(default)]
    pub pool_ref: PoolReference,
}

/// A reference to an InferencePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolReference {
    /// `inference.networking.k8s.io` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `InferencePool` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The pool's name.
    #[serde(default)]
    pub name: String,
}

impl InferenceObjectiveSpec {
    /// The priority, 0 when unset (as the extension's picker reads it).
    pub fn priority(&self) -> i32 {
        self.priority.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_extension_s_objects_leniently() {
        let o: InferenceObjective = serde_json::from_value(serde_json::json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {"name": "batch", "namespace": "team-a"},
            "spec": {"priority": -1, "poolRef": {"name": "chat"}, "futureField": 1}
        }))
        .unwrap();
        assert_eq!(o.spec.priority(), -1);
        assert_eq!(o.spec.pool_ref.name, "chat");
        let bare: InferenceObjective = serde_json::from_value(serde_json::json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {"name": "x", "namespace": "team-a"},
            "spec": {"poolRef": {"name": "chat"}}
        }))
        .unwrap();
        assert_eq!(bare.spec.priority(), 0);
    }
}
