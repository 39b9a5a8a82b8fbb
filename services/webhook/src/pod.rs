//! Engine Pod mutation: decode, read the namespace's CacheBackends,
//! let the adapters decide, answer with a JSON patch. Every path admits
//! the pod; errors only mean it is admitted unwired.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ic_adapters::admission::{
    FailOpenReason, InjectionConfig, PodAdmission, PodOutcome, admit_pod, fail_open,
};
use ic_api::CacheBackend;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::cachebackend::Decision;
use crate::metrics::Metrics;
use crate::review::{AdmissionRequest, AdmissionResponse, Operation};

/// Why the backends of a namespace could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The API server refused or could not be reached.
    #[error("listing CacheBackends in namespace {namespace}: {source}")]
    Api {
        /// The namespace listed.
        namespace: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The list did not answer in time.
    #[error("listing CacheBackends in namespace {namespace} timed out after {after:?}")]
    Timeout {
        /// The namespace listed.
        namespace: String,
        /// The deadline.
        after: Duration,
    },
    /// A test source that fails on purpose.
    #[error("{0}")]
    Other(String),
}

/// A boxed future returned by [`BackendSource::list`].
pub type ListFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<CacheBackend>, ListError>> + Send + 'a>>;

/// Where the live CacheBackends of a namespace come from.
pub trait BackendSource: Send + Sync + Debug {
    /// Every CacheBackend in `namespace`, in list order, read live.
    fn list<'a>(&'a self, namespace: &'a str) -> ListFuture<'a>;
}

/// Lists through the Kubernetes API on every call: what
/// [`crate::store::StoreBackends`] falls back to until its store has synced.
#[derive(Clone)]
pub struct KubeBackends {
    client: kube::Client,
    timeout: Duration,
    metrics: Metrics,
}

impl Debug for KubeBackends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackends")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KubeBackends {
    /// A source using `client`, giving up on one list after `timeout`.
    pub fn new(client: kube::Client, timeout: Duration, metrics: Metrics) -> Self {
        Self {
            client,
            timeout,
            metrics,
        }
    }
}

impl BackendSource for KubeBackends {
    fn list<'a>(&'a self, namespace: &'a str) -> ListFuture<'a> {
        Box::pin(async move {
            let api: kube::Api<CacheBackend> =
                kube::Api::namespaced(self.client.clone(), namespace);
            let started = std::time::Instant::now();
            let listed = tokio::time::timeout(self.timeout, api.list(&Default::default())).await;
            self.metrics
                .list_latency
                .observe(started.elapsed().as_secs_f64());
            match listed {
                Ok(Ok(list)) => Ok(list.items),
                Ok(Err(source)) => Err(ListError::Api {
                    namespace: namespace.to_owned(),
                    source,
                }),
                Err(_) => Err(ListError::Timeout {
                    namespace: namespace.to_owned(),
                    after: self.timeout,
                }),
            }
        })
    }
}

/// A pod ready for the adapters: the decoded pod (with its namespace filled
/// from the request when the object omitted it), and the serialized form
/// the patch is computed against.
#[derive(Debug)]
struct Decoded {
    pod: Pod,
    namespace: String,
    /// Whether `pod.metadata.namespace` was filled in by us.
    filled_namespace: bool,
    original: Value,
}

fn decode(req: &AdmissionRequest) -> Result<Decoded, String> {
    if !req.kind.kind.is_empty() && req.kind.kind != "Pod" {
        return Err(format!("request is for a {}, not a Pod", req.kind.kind));
    }
    let object = req.object.as_ref().ok_or("the request has no object")?;
    if let Some(kind) = object.get("kind").and_then(Value::as_str)
        && kind != "Pod"
    {
        return Err(format!("object is a {kind}, not a Pod"));
    }
    let mut pod: Pod =
        serde_json::from_value(object.clone()).map_err(|e| format!("cannot decode Pod: {e}"))?;
    let original = serde_json::to_value(&pod).map_err(|e| format!("cannot re-encode Pod: {e}"))?;
    let namespace = req
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| pod.metadata.namespace.clone().filter(|n| !n.is_empty()))
        .ok_or("the request names no namespace")?;
    let filled_namespace = pod.metadata.namespace.is_none();
    if filled_namespace {
        pod.metadata.namespace = Some(namespace.clone());
    }
    Ok(Decoded {
        pod,
        namespace,
        filled_namespace,
        original,
    })
}

/// `POST /mutate-pod`.
#[tracing::instrument(level = "debug", skip_all, fields(uid = %req.uid, ns = ?req.namespace))]
pub async fn mutate(
    req: &AdmissionRequest,
    source: &dyn BackendSource,
    config: &InjectionConfig,
) -> Decision {
    if req.operation != Operation::Create {
        return Decision {
            response: AdmissionResponse::allow(&req.uid),
            result: "allowed",
            reason: "operation",
        };
    }
    let decoded = match decode(req) {
        Ok(d) => d,
        Err(message) => {
            tracing::info!(uid = %req.uid, %message, "pod admitted unwired: decode failed");
            let reason = FailOpenReason::Decode;
            let mut response = AdmissionResponse::allow_with_reason(
                &req.uid,
                reason.label(),
                format!("pod not wired: {message}"),
            );
            response
                .audit_annotations
                .insert("outcome".into(), format!("fail_open:{}", reason.label()));
            return Decision {
                response,
                result: "fail_open",
                reason: reason.label(),
            };
        }
    };
    let admission = match source.list(&decoded.namespace).await {
        Ok(backends) => admit_pod(&decoded.pod, &backends, config),
        Err(error) => {
            tracing::warn!(uid = %req.uid, ns = %decoded.namespace, %error, "pod admitted unwired: cannot list CacheBackends");
            fail_open(&decoded.pod, FailOpenReason::ListFailed)
        }
    };
    answer(req, &decoded, admission)
}

/// Turns the adapters' decision into a response, diffing the admitted pod
/// against the original.
fn answer(req: &AdmissionRequest, decoded: &Decoded, admission: PodAdmission) -> Decision {
    let (admission, patch) = match patch_for(decoded, &admission.pod) {
        Ok(patch) => (admission, patch),
        Err(error) => {
            tracing::warn!(uid = %req.uid, %error, "pod admitted unwired: cannot encode the admitted pod");
            let fallback = fail_open(&decoded.pod, FailOpenReason::Encode);
            let patch =
                patch_for(decoded, &fallback.pod).unwrap_or_else(|_| json_patch::Patch(Vec::new()));
            (fallback, patch)
        }
    };
    let (result, reason, note) = match &admission.outcome {
        PodOutcome::Injected { backend } => ("patched", "injected", format!("wired to {backend}")),
        PodOutcome::EventsOnly { backend } => (
            "patched",
            "events_only",
            format!("kv-events wired to {backend}"),
        ),
        PodOutcome::Skipped => (
            "skipped",
            "skip_inject",
            "skipped: inferencecache.io/skip-inject".to_owned(),
        ),
        PodOutcome::FailOpen(r) => {
            let detail = match r {
                FailOpenReason::AdapterRejected(d) => format!(": {d}"),
                _ => String::new(),
            };
            (
                "fail_open",
                r.label(),
                format!("pod not wired: {}{detail}", r.label()),
            )
        }
    };
    // A wired pod that needed no change (re-admission) is plain "allowed".
    let result = if result == "patched" && patch.0.is_empty() {
        "allowed"
    } else {
        result
    };
    tracing::debug!(uid = %req.uid, ns = %decoded.namespace, result, reason, ops = patch.0.len(), "pod admitted");
    let mut response = AdmissionResponse::allow_with_reason(&req.uid, reason, note);
    response.warnings = admission.warnings;
    response
        .audit_annotations
        .insert("outcome".into(), format!("{result}:{reason}"));
    match response.clone().with_patch(&patch) {
        Ok(r) => Decision {
            response: r,
            result,
            reason,
        },
        // The patch was serializable a moment ago; if not, admit unchanged.
        Err(_) => Decision {
            response,
            result: "fail_open",
            reason: FailOpenReason::Encode.label(),
        },
    }
}

fn patch_for(decoded: &Decoded, admitted: &Pod) -> Result<json_patch::Patch, serde_json::Error> {
    let mut after = serde_json::to_value(admitted)?;
    if decoded.filled_namespace
        && let Some(meta) = after.get_mut("metadata").and_then(Value::as_object_mut)
        && meta.get("namespace").and_then(Value::as_str) == Some(decoded.namespace.as_str())
    {
        meta.remove("namespace");
    }
    Ok(json_patch::diff(&decoded.original, &after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::AdmissionReview;
    use serde_json::json;

    #[derive(Debug)]
    struct Fixed(Result<Vec<CacheBackend>, String>);

    impl BackendSource for Fixed {
        fn list<'a>(&'a self, _namespace: &'a str) -> ListFuture<'a> {
            let answer = self.0.clone().map_err(ListError::Other);
            Box::pin(async move { answer })
        }
    }

    fn request(operation: &str, object: Value) -> AdmissionRequest {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "pod-uid",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "inference",
                "operation": operation,
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": object,
                "dryRun": false,
            }
        });
        AdmissionReview::parse(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    fn stale_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "llama-", "labels": {"app": "other"},
                "annotations": {"inferencecache.io/injected-by": "inference/forged"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}
        })
    }

    #[tokio::test]
    async fn non_create_is_admitted_untouched() {
        let d = mutate(
            &request("UPDATE", stale_pod()),
            &Fixed(Ok(vec![])),
            &InjectionConfig::default(),
        )
        .await;
        assert!(d.response.allowed && d.response.patch.is_none());
        assert_eq!((d.result, d.reason), ("allowed", "operation"));
    }

    #[tokio::test]
    async fn decode_failures_fail_open() {
        for object in [
            json!({"kind": "CacheBackend", "spec": {}}),
            json!({"kind": "Pod", "spec": {"containers": "not-a-list"}}),
            json!("a string"),
        ] {
            let d = mutate(
                &request("CREATE", object),
                &Fixed(Ok(vec![])),
                &InjectionConfig::default(),
            )
            .await;
            assert!(d.response.allowed);
            assert!(d.response.patch.is_none());
            assert_eq!((d.result, d.reason), ("fail_open", "decode"));
        }
    }

    #[tokio::test]
    async fn list_failure_fails_open_with_reason() {
        let d = mutate(
            &request("CREATE", stale_pod()),
            &Fixed(Err("boom".into())),
            &InjectionConfig::default(),
        )
        .await;
        assert!(d.response.allowed);
        assert_eq!((d.result, d.reason), ("fail_open", "list_failed"));
        assert_eq!(d.response.status.as_ref().unwrap().reason, "list_failed");
        // Whatever the adapters strip is returned as a patch that applies.
        if let Some(patch) = d.response.decoded_patch() {
            let mut pod = stale_pod();
            json_patch::patch(&mut pod, &patch).unwrap();
        }
    }

    #[test]
    fn namespace_filled_for_the_adapters_is_not_patched_in() {
        let req = request("CREATE", stale_pod());
        let decoded = decode(&req).unwrap();
        assert!(decoded.filled_namespace);
        assert_eq!(decoded.pod.metadata.namespace.as_deref(), Some("inference"));
        assert!(patch_for(&decoded, &decoded.pod).unwrap().0.is_empty());
    }
}
