//! `admission.k8s.io/v1` `AdmissionReview` wire types, as the API server
//! sends and expects them.
//!
//! The request keeps `object` / `oldObject` as raw JSON: each handler decodes
//! them into the type it expects, so a wrong kind or a malformed object is a
//! handler decision (deny or fail open), not a decode error of the whole
//! review. The response carries the patch base64-encoded, as Go's `[]byte`
//! marshals, and a `metav1.Status` with `details.causes` for denials.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `apiVersion` of every review we accept and answer.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of a review.
pub const KIND: &str = "AdmissionReview";

/// Why a request body is not a usable `AdmissionReview`.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON, or JSON of the wrong shape.
    #[error("request body is not an AdmissionReview: {0}")]
    Malformed(#[from] serde_json::Error),
    /// A review of another kind or version.
    #[error("expected {API_VERSION} {KIND}, got apiVersion {api_version:?} kind {kind:?}")]
    WrongType {
        /// The apiVersion sent.
        api_version: String,
        /// The kind sent.
        kind: String,
    },
    /// A review without `request`.
    #[error("AdmissionReview has no request")]
    MissingRequest,
}

impl ReviewError {
    /// Stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::WrongType { .. } => "wrong_type",
            Self::MissingRequest => "missing_request",
        }
    }
}

/// An incoming review.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    /// `admission.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// `AdmissionReview`.
    #[serde(default)]
    pub kind: String,
    /// The request; absent means the body is not a request.
    #[serde(default)]
    pub request: Option<AdmissionRequest>,
}

impl AdmissionReview {
    /// Parses a request body and checks it is a v1 review with a request.
    pub fn parse(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
        let review: AdmissionReview = serde_json::from_slice(body)?;
        if review.api_version != API_VERSION || review.kind != KIND {
            return Err(ReviewError::WrongType {
                api_version: review.api_version,
                kind: review.kind,
            });
        }
        review.request.ok_or(ReviewError::MissingRequest)
    }
}

/// Group/version/kind as the review spells it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    /// API group, empty for the core group.
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// The admission operation.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    /// CREATE.
    Create,
    /// UPDATE.
    Update,
    /// DELETE.
    Delete,
    /// CONNECT.
    Connect,
}

/// The `request` of a review (fields we read; the rest is ignored).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response.
    pub uid: String,
    /// Kind of the object.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// Object name (empty on CREATE with generateName).
    #[serde(default)]
    pub name: String,
    /// Namespace of the request (authoritative even when the object omits it).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Operation.
    pub operation: Operation,
    /// The new object (CREATE, UPDATE).
    #[serde(default)]
    pub object: Option<Value>,
    /// The previous object (UPDATE, DELETE).
    #[serde(default)]
    pub old_object: Option<Value>,
    /// Whether the request is a dry run (we have no side effects either way).
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// A `metav1.StatusCause`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusCause {
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: String,
    /// The error body (`Invalid value: "x": detail`).
    pub message: String,
    /// The field path.
    pub field: String,
}

/// `metav1.StatusDetails`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusDetails {
    /// Object name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// API group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// Kind.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Field-level causes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
}

/// `metav1.Status` as a webhook returns it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// Empty list metadata, as the API server writes it.
    #[serde(default)]
    pub metadata: serde_json::Map<String, Value>,
    /// `Success` or `Failure`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Machine-readable reason (`Invalid`, `BadRequest`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    /// HTTP code.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub code: u16,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

/// The `response` of a review.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why not (or a note on why it was allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of a JSON Patch document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// `JSONPatch` whenever `patch` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Warnings for the client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Audit annotations (the fail-open reason goes here).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub audit_annotations: std::collections::BTreeMap<String, String>,
}

impl AdmissionResponse {
    /// Allows the request unchanged.
    pub fn allow(uid: &str) -> Self {
        Self {
            uid: uid.to_owned(),
            allowed: true,
            status: None,
            patch: None,
            patch_type: None,
            warnings: Vec::new(),
            audit_annotations: Default::default(),
        }
    }

    /// Allows with a note (shown in audit logs and returned to the client).
    pub fn allow_with_reason(uid: &str, reason: &str, message: impl Into<String>) -> Self {
        let mut response = Self::allow(uid);
        response.status = Some(Status {
            status: "Success".into(),
            message: message.into(),
            reason: reason.into(),
            code: 200,
            ..Status::default()
        });
        response
    }

    /// Denies with `status`.
    pub fn deny(uid: &str, status: Status) -> Self {
        let mut response = Self::allow(uid);
        response.allowed = false;
        response.status = Some(status);
        response
    }

    /// Denies with a 400 Bad Request (the object could not be read).
    pub fn bad_request(uid: &str, message: impl Into<String>) -> Self {
        Self::deny(
            uid,
            Status {
                status: "Failure".into(),
                message: message.into(),
                reason: "BadRequest".into(),
                code: 400,
                ..Status::default()
            },
        )
    }

    /// Attaches `patch` unless it is empty.
    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Result<Self, serde_json::Error> {
        if patch.0.is_empty() {
            return Ok(self);
        }
        let bytes = serde_json::to_vec(patch)?;
        self.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        self.patch_type = Some("JSONPatch".into());
        Ok(self)
    }

    /// Decodes the patch (unit tests).
    #[cfg(test)]
    pub(crate) fn decoded_patch(&self) -> Option<json_patch::Patch> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(self.patch.as_deref()?)
            .ok()?;
        serde_json::from_slice(&raw).ok()
    }

    /// Wraps the response in a review.
    pub fn into_review(self) -> Value {
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "response": self,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_reviews_and_rejects_others() {
        let ok = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
            "request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"Pod"},
            "operation":"CREATE","namespace":"ns","object":{"kind":"Pod"},"dryRun":false}}"#;
        let req = AdmissionReview::parse(ok).unwrap();
        assert_eq!(req.uid, "u1");
        assert_eq!(req.operation, Operation::Create);
        assert_eq!(req.namespace.as_deref(), Some("ns"));

        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE"}}"#;
        assert!(matches!(
            AdmissionReview::parse(v1beta1),
            Err(ReviewError::WrongType { .. })
        ));
        let no_request = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert!(matches!(
            AdmissionReview::parse(no_request),
            Err(ReviewError::MissingRequest)
        ));
        assert!(matches!(
            AdmissionReview::parse(b"{not json"),
            Err(ReviewError::Malformed(_))
        ));
        assert!(matches!(
            AdmissionReview::parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"EXPLODE"}}"#),
            Err(ReviewError::Malformed(_))
        ));
    }

    #[test]
    fn patch_is_base64_json_patch_and_empty_patch_is_omitted() {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}
        ]))
        .unwrap();
        let response = AdmissionResponse::allow("u").with_patch(&patch).unwrap();
        assert_eq!(response.patch_type.as_deref(), Some("JSONPatch"));
        assert_eq!(response.decoded_patch(), Some(patch));
        let wire = response.into_review();
        assert_eq!(wire["apiVersion"], API_VERSION);
        assert_eq!(wire["kind"], KIND);
        assert!(wire["response"]["patch"].is_string());

        let none = AdmissionResponse::allow("u")
            .with_patch(&json_patch::Patch(Vec::new()))
            .unwrap();
        assert!(none.patch.is_none() && none.patch_type.is_none());
    }
}
