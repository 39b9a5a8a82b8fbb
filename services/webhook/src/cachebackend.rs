//! CacheBackend admission: defaulting (mutating) and validation, as pure
//! functions from an [`AdmissionRequest`] to a [`Decision`].

use ic_adapters::providers::images::{self, ProviderImageDefaults};
use ic_api::CacheBackend;
use ic_api::validate::{ErrorType, FieldError, introduced};
use serde_json::Value;

use crate::review::{
    AdmissionRequest, AdmissionResponse, Operation, Status, StatusCause, StatusDetails,
};

/// An answer plus the metric labels describing it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// What goes back to the API server.
    pub response: AdmissionResponse,
    /// `allowed`, `patched`, `denied`, `fail_open`, `skipped`, `error`.
    pub result: &'static str,
    /// Why (fixed set).
    pub reason: &'static str,
}

impl Decision {
    fn new(response: AdmissionResponse, result: &'static str, reason: &'static str) -> Self {
        Self {
            response,
            result,
            reason,
        }
    }
}

const GROUP_RESOURCE: &str = "CacheBackend.inferencecache.io";

/// Why a submitted object could not be read as a CacheBackend.
enum Undecodable {
    /// Not a CacheBackend at all (no object, another kind): a bad request.
    NotABackend(String),
    /// A CacheBackend our types refuse, at this field.
    Field(FieldError),
}

fn decode(value: Option<&Value>, which: &str) -> Result<CacheBackend, Undecodable> {
    let value =
        value.ok_or_else(|| Undecodable::NotABackend(format!("the request has no {which}")))?;
    if let Some(kind) = value.get("kind").and_then(Value::as_str)
        && kind != "CacheBackend"
    {
        return Err(Undecodable::NotABackend(format!(
            "{which} is a {kind}, not a CacheBackend"
        )));
    }
    ic_api::decode::decode(value).map_err(Undecodable::Field)
}

/// The CacheBackend a CREATE or UPDATE submits. Other operations are
/// allowed as they are; an object that is not a CacheBackend is a bad
/// request; one our types refuse goes to `refused`, with the field.
fn submitted(
    req: &AdmissionRequest,
    refused: impl FnOnce(FieldError) -> Decision,
) -> Result<CacheBackend, Box<Decision>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Err(Box::new(Decision::new(
            AdmissionResponse::allow(&req.uid),
            "allowed",
            "operation",
        )));
    }
    decode(req.object.as_ref(), "object").map_err(|e| {
        Box::new(match e {
            Undecodable::NotABackend(message) => Decision::new(
                AdmissionResponse::bad_request(&req.uid, message),
                "error",
                "decode",
            ),
            Undecodable::Field(error) => refused(error),
        })
    })
}

/// The object's name as the API server will report it.
fn object_name(req: &AdmissionRequest) -> String {
    let meta = req.object.as_ref().and_then(|o| o.get("metadata"));
    let of = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
    };
    of("name")
        .or_else(|| Some(req.name.clone()).filter(|n| !n.is_empty()))
        .or_else(|| of("generateName"))
        .unwrap_or_default()
}

// === defaulting ===

/// `POST /mutate-cachebackend`: fills the context-dependent defaults on
/// CREATE and UPDATE and answers with a JSON patch when anything changed.
pub fn default(req: &AdmissionRequest) -> Decision {
    default_with(req, &ProviderImageDefaults::default())
}

/// [`default`], also filling a Managed backend's provider image from a
/// private registry and its provider pods' pull secrets.
#[tracing::instrument(level = "debug", skip_all, fields(uid = %req.uid, ns = ?req.namespace, name = %req.name))]
pub fn default_with(req: &AdmissionRequest, providers: &ProviderImageDefaults) -> Decision {
    // Mutating admission runs before the schema: an object our types refuse
    // passes unchanged, so the API server's schema validation (or, failing
    // that, the validating webhook) names the field.
    let backend = match submitted(req, |error| {
        let mut response = AdmissionResponse::allow(&req.uid);
        response.warnings = vec![format!("not defaulted: {}", error)];
        Decision::new(response, "allowed", "undecodable")
    }) {
        Ok(b) => b,
        Err(decision) => return *decision,
    };
    let mut defaulted = backend.clone();
    let mut changed = ic_api::defaults::apply(&mut defaulted.spec);
    changed.extend(images::apply(&mut defaulted.spec, providers));
    if changed.is_empty() {
        return Decision::new(AdmissionResponse::allow(&req.uid), "allowed", "unchanged");
    }
    // Both sides go through the same serializer, so the diff holds only
    // what `apply` changed, never representation noise.
    let patch = match (
        serde_json::to_value(&backend),
        serde_json::to_value(&defaulted),
    ) {
        (Ok(before), Ok(after)) => json_patch::diff(&before, &after),
        (Err(e), _) | (_, Err(e)) => {
            return Decision::new(
                AdmissionResponse::bad_request(&req.uid, format!("cannot encode: {e}")),
                "error",
                "encode",
            );
        }
    };
    tracing::debug!(uid = %req.uid, name = %req.name, ?changed, "defaulted CacheBackend");
    match AdmissionResponse::allow(&req.uid).with_patch(&patch) {
        Ok(r) if r.patch.is_some() => Decision::new(r, "patched", "defaulted"),
        Ok(r) => Decision::new(r, "allowed", "unchanged"),
        Err(e) => Decision::new(
            AdmissionResponse::bad_request(&req.uid, format!("cannot encode patch: {e}")),
            "error",
            "encode",
        ),
    }
}

// === validation ===

/// `POST /validate-cachebackend`: every violation on CREATE, only the
/// violations an UPDATE introduces, nothing on DELETE/CONNECT.
#[tracing::instrument(level = "debug", skip_all, fields(uid = %req.uid, ns = ?req.namespace, name = %req.name))]
pub fn validate(req: &AdmissionRequest) -> Decision {
    let backend = match submitted(req, |error| {
        tracing::info!(uid = %req.uid, field = %error.field, "denied an undecodable CacheBackend");
        Decision::new(
            AdmissionResponse::deny(&req.uid, invalid_status(&object_name(req), &[error])),
            "denied",
            "undecodable",
        )
    }) {
        Ok(b) => b,
        Err(decision) => return *decision,
    };
    let mut errors = ic_adapters::admission::validate_backend(&backend);
    if req.operation == Operation::Update {
        // An old object that no longer decodes (admitted under an older
        // schema) filters nothing: the new object is judged in full.
        match decode(req.old_object.as_ref(), "oldObject") {
            Ok(old) => {
                errors = introduced(&ic_adapters::admission::validate_backend(&old), errors);
            }
            Err(Undecodable::NotABackend(message)) => {
                tracing::warn!(uid = %req.uid, name = %req.name, %message, "UPDATE without a readable oldObject");
            }
            Err(Undecodable::Field(error)) => {
                tracing::warn!(uid = %req.uid, name = %req.name, %error, "UPDATE without a readable oldObject");
            }
        }
    }
    if errors.is_empty() {
        let mut response = AdmissionResponse::allow(&req.uid);
        response.warnings = ic_adapters::admission::backend_warnings(&backend);
        return Decision::new(response, "allowed", "valid");
    }
    let name = object_name(req);
    tracing::info!(uid = %req.uid, name = %name, namespace = ?req.namespace, violations = errors.len(), "denied CacheBackend");
    Decision::new(
        AdmissionResponse::deny(&req.uid, invalid_status(&name, &errors)),
        "denied",
        "invalid",
    )
}

/// The `metav1.Status` of an `Invalid` error, shaped like the API server's
/// own (`apierrors.NewInvalid`), so kubectl prints every violation.
pub fn invalid_status(name: &str, errors: &[FieldError]) -> Status {
    let rendered: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.field, error_body(e)))
        .collect();
    let aggregate = match rendered.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    Status {
        status: "Failure".into(),
        message: format!("{GROUP_RESOURCE} {name:?} is invalid: {aggregate}"),
        reason: "Invalid".into(),
        code: 422,
        details: Some(StatusDetails {
            name: name.to_owned(),
            group: ic_api::consts::GROUP.to_owned(),
            kind: "CacheBackend".into(),
            causes: errors
                .iter()
                .map(|e| StatusCause {
                    reason: cause_type(e.kind).into(),
                    message: error_body(e),
                    field: e.field.clone(),
                })
                .collect(),
        }),
        ..Status::default()
    }
}

fn cause_type(kind: ErrorType) -> &'static str {
    match kind {
        ErrorType::Required => "FieldValueRequired",
        ErrorType::Forbidden => "FieldValueForbidden",
        ErrorType::Invalid => "FieldValueInvalid",
        ErrorType::NotSupported => "FieldValueNotSupported",
    }
}

/// The error text without the field, as `field.Error.ErrorBody()` renders it.
fn error_body(e: &FieldError) -> String {
    let head = match e.kind {
        ErrorType::Required => "Required value".to_owned(),
        ErrorType::Forbidden => "Forbidden".to_owned(),
        ErrorType::Invalid | ErrorType::NotSupported => {
            let label = if e.kind == ErrorType::Invalid {
                "Invalid value"
            } else {
                "Unsupported value"
            };
            match &e.bad_value {
                Some(v) => format!("{label}: {}", Value::String(v.clone())),
                None => label.to_owned(),
            }
        }
    };
    if e.detail.is_empty() {
        head
    } else {
        format!("{head}: {}", e.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::AdmissionReview;
    use serde_json::json;

    fn review(operation: &str, object: Value, old: Option<Value>) -> AdmissionRequest {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "7f0c6a8e-1111-2222-3333-444455556666",
                "kind": {"group": "inferencecache.io", "version": "v1alpha1", "kind": "CacheBackend"},
                "resource": {"group": "inferencecache.io", "version": "v1alpha1", "resource": "cachebackends"},
                "name": "cb",
                "namespace": "inference",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": old,
                "dryRun": false,
            }
        });
        AdmissionReview::parse(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    fn backend(spec: Value) -> Value {
        json!({
            "apiVersion": "inferencecache.io/v1alpha1",
            "kind": "CacheBackend",
            "metadata": {"name": "cb", "namespace": "inference"},
            "spec": spec,
        })
    }

    #[test]
    fn defaulting_patches_only_missing_blocks() {
        let req = review(
            "CREATE",
            backend(json!({"runtime": "VLLM", "type": "LMCache", "replicas": 2,
                "deploymentKind": "Deployment",
                "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
                "autoscaling": {"maxReplicas": 4}})),
            None,
        );
        let d = default(&req);
        assert_eq!((d.result, d.reason), ("patched", "defaulted"));
        let mut object = req.object.clone().unwrap();
        json_patch::patch(&mut object, &d.response.decoded_patch().unwrap()).unwrap();
        assert_eq!(object["spec"]["autoscaling"]["minReplicas"], 2);
        assert_eq!(object["spec"]["integration"]["failOpen"], true);
        assert_eq!(object["spec"]["observation"]["firstEventTimeout"], "5m");

        // Applying the patch converged it: a second pass changes nothing.
        let again = default(&review("UPDATE", object.clone(), Some(object)));
        assert_eq!((again.result, again.reason), ("allowed", "unchanged"));
        assert!(again.response.patch.is_none());
    }

    #[test]
    fn defaulting_refuses_non_cachebackends_and_ignores_delete() {
        let d = default(&review("CREATE", json!({"kind": "Pod", "spec": {}}), None));
        assert!(!d.response.allowed);
        assert_eq!(d.response.status.as_ref().unwrap().code, 400);
        let d = default(&review("DELETE", Value::Null, Some(backend(json!({})))));
        assert!(d.response.allowed);
    }

    #[test]
    fn invalid_status_matches_the_api_server_shape() {
        let errors = vec![
            FieldError {
                kind: ErrorType::Required,
                field: "spec.remoteStorage.endpoint".into(),
                bad_value: None,
                detail: "required when ownership is External".into(),
            },
            FieldError {
                kind: ErrorType::Invalid,
                field: "spec.replicas".into(),
                bad_value: Some("0".into()),
                detail: "set minReplicas".into(),
            },
        ];
        let s = invalid_status("cb", &errors);
        assert_eq!(s.code, 422);
        assert_eq!(s.reason, "Invalid");
        assert_eq!(
            s.message,
            "CacheBackend.inferencecache.io \"cb\" is invalid: [spec.remoteStorage.endpoint: \
             Required value: required when ownership is External, spec.replicas: Invalid value: \
             \"0\": set minReplicas]"
        );
        let causes = &s.details.as_ref().unwrap().causes;
        assert_eq!(causes[0].reason, "FieldValueRequired");
        assert_eq!(causes[1].reason, "FieldValueInvalid");
        assert_eq!(causes[1].field, "spec.replicas");
        let one = invalid_status("cb", &errors[..1]);
        assert!(!one.message.contains('['), "{}", one.message);
    }

    #[test]
    fn validation_create_update_and_delete() {
        let bad = backend(json!({"runtime": "VLLM",
            "remoteStorage": {"provider": "Redis", "ownership": "External"}}));
        let d = validate(&review("CREATE", bad.clone(), None));
        assert_eq!((d.result, d.reason), ("denied", "invalid"));
        let status = d.response.status.unwrap();
        assert!(
            status
                .details
                .unwrap()
                .causes
                .iter()
                .any(|c| c.field == "spec.remoteStorage.endpoint"),
        );

        // A label edit on an object that was already invalid goes through.
        let mut relabelled = bad.clone();
        relabelled["metadata"]["labels"] = json!({"team": "x"});
        let d = validate(&review("UPDATE", relabelled, Some(bad.clone())));
        assert!(d.response.allowed, "{:?}", d.response);

        // Breaking a valid object is still refused.
        let good = backend(json!({"runtime": "VLLM",
            "remoteStorage": {"provider": "Redis", "ownership": "External", "endpoint": "redis:6379"}}));
        assert!(
            validate(&review("CREATE", good.clone(), None))
                .response
                .allowed
        );
        let d = validate(&review("UPDATE", bad.clone(), Some(good)));
        assert!(!d.response.allowed);

        assert!(
            validate(&review("DELETE", Value::Null, Some(bad)))
                .response
                .allowed
        );
    }
}
