//! An in-memory, stateful stand-in for the Kubernetes API server, for
//! tests. In-process it is a tower `Service`, so `kube::Client::new(fake.service(),
//! "default")` talks to it exactly as to a real one (paths, query strings,
//! patch content types, Status errors); [`FakeApi::serve`] puts the same
//! server on a loopback port over HTTP, so real binaries reach it through a
//! kubeconfig ([`write_kubeconfig`]).
//!
//! What it does: GET, LIST (with equality `labelSelector`s), WATCH (every
//! change since a resourceVersion, or synthetic ADDED events first, ended
//! after `timeoutSeconds`), POST, PUT (with `resourceVersion` preconditions,
//! 409 on a stale one), PATCH, DELETE, the `status` subresource,
//! `resourceVersion` and `generation` bookkeeping, finalizers (a DELETE of
//! an object with finalizers sets its deletionTimestamp; it goes when the
//! last one is removed), for any
//! group/version/plural (Leases and Events included), and TokenReviews
//! against tokens a test registers. Every request is logged with its answer
//! for assertions (and [`rbac`] turns the log into the RBAC rules it needs),
//! and failures can be injected.
//!
//! Approximations, on purpose:
//! * **Server-side apply** (`application/apply-patch+yaml`) is
//!   create-or-merge: the applied object is merged into the stored one, and
//!   fields the same field manager applied last time but omits now are
//!   removed (the core of SSA ownership). Lists are atomic. There is no
//!   conflict detection between managers (`force` is recorded, not needed).
//! * **Strategic merge patch** is treated as a JSON merge patch; JSON patch
//!   is refused with 415.
//! * Writes to the main resource never change `status`; writes to `/status`
//!   change only `status`. `generation` moves when anything outside
//!   `metadata` and `status` changes.
//! * No authorization, no admission, no defaulting, no owner-reference
//!   garbage collection, no field selectors, no bookmarks; a watch never
//!   answers 410 Gone (the whole change log is kept).

mod body;
mod http;
mod paths;
pub mod rbac;
mod store;
mod watch;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use ::http::{Method, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use serde_json::{Value, json};

pub use crate::body::Body;
pub use crate::http::{Served, write_kubeconfig};
pub use crate::store::{ObjectKey, merge_patch, plural_of};
use crate::store::{State, Stored, api_path_of, parse_path, status_error};

/// One request the fake received.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: Method,
    /// URL path.
    pub path: String,
    /// Query parameters, decoded.
    pub query: BTreeMap<String, String>,
    /// `content-type` header, if any.
    pub content_type: Option<String>,
    /// Body parsed as JSON (`Null` when empty or not JSON).
    pub body: Value,
    /// The status code answered.
    pub status: u16,
}

/// A failure to inject: requests matching `method` and containing `path_part`
/// get `status` for the next `times` matches.
#[derive(Clone, Debug)]
struct Injected {
    method: Method,
    path_part: String,
    status: u16,
    /// The Status's reason and message.
    reason: String,
    message: String,
    times: usize,
}

/// Who a bearer token is, for TokenReviews.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenIdentity {
    /// `system:serviceaccount:<ns>:<name>` or any user name.
    pub username: String,
    /// Audiences the token is bound to (empty: the API server's own).
    pub audiences: Vec<String>,
    /// The pod a projected token is bound to (the
    /// `authentication.kubernetes.io/pod-name` extra claim).
    pub pod: Option<String>,
}

impl TokenIdentity {
    /// `username`'s token for `audience`, bound to `pod` when given (a
    /// projected service-account token).
    pub fn new(username: &str, audience: &str, pod: Option<&str>) -> Self {
        Self {
            username: username.to_owned(),
            audiences: vec![audience.to_owned()],
            pod: pod.map(str::to_owned),
        }
    }
}

/// One RBAC-like permission SubjectAccessReviews grant: `user` may `verb`
/// `resource` in `group` in `namespace` (`""`: in every namespace and
/// cluster-wide).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The user name.
    pub user: String,
    /// The verb.
    pub verb: String,
    /// The API group.
    pub group: String,
    /// The resource (`resource/subresource` for a subresource, `*` for all).
    pub resource: String,
    /// The namespace, or `""` for all.
    pub namespace: String,
}

impl Grant {
    /// `user` may `verb` `resource` of `group` in `namespace` (`""`: all).
    pub fn new(user: &str, verb: &str, group: &str, resource: &str, namespace: &str) -> Self {
        Self {
            user: user.to_owned(),
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    store: State,
    requests: Vec<RecordedRequest>,
    injected: Vec<Injected>,
    tokens: BTreeMap<String, TokenIdentity>,
    grants: Vec<Grant>,
}

/// The fake API server. Cheap to clone; clones share state.
#[derive(Clone, Debug)]
pub struct FakeApi {
    shared: Arc<Mutex<Shared>>,
    /// The newest resourceVersion, for watches waiting on changes.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self {
            shared: Arc::default(),
            changes: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

/// What one request gets.
enum Answer {
    /// A JSON document.
    Json(u16, Value),
    /// A stream of watch events.
    Watch(watch::WatchRequest),
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(value.to_string())).boxed_unsync())
        .unwrap_or_default()
}

impl FakeApi {
    /// An empty API server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A kube client talking to this fake in-process.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The tower service.
    pub fn service(
        &self,
    ) -> impl tower::Service<
        Request<kube::client::Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Send + 'static,
    > + Send
    + Clone
    + 'static {
        let this = self.clone();
        tower::service_fn(move |req: Request<kube::client::Body>| {
            let this = this.clone();
            async move { Ok(this.respond_to(req).await) }
        })
    }

    /// Reads `req`'s body and answers it (the in-process service and HTTP).
    async fn respond_to<B: hyper::body::Body>(&self, req: Request<B>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        self.respond(&parts, &bytes)
    }

    /// The change log's events `request` has not seen yet, oldest first.
    fn events_for(&self, request: &watch::WatchRequest) -> Vec<(u64, Value)> {
        let shared = self.shared.lock();
        request.unseen(&shared.store)
    }

    /// Serves this fake over plain HTTP/1.1 on `addr` (port 0 picks one).
    ///
    /// # Errors
    /// When the address cannot be bound.
    pub async fn serve(&self, addr: std::net::SocketAddr) -> std::io::Result<Served> {
        let fake = self.clone();
        http::serve(addr, move |req| {
            let fake = fake.clone();
            async move { fake.respond_to(req).await }
        })
        .await
    }

    /// Answers one request.
    fn respond(&self, parts: &::http::request::Parts, body: &[u8]) -> Response<Body> {
        match self.handle(parts, body) {
            Answer::Json(code, value) => json_response(code, &value),
            Answer::Watch(request) => {
                let fake = self.clone();
                watch::respond(
                    move |request: &watch::WatchRequest| fake.events_for(request),
                    self.changes.subscribe(),
                    request,
                )
            }
        }
    }

    /// Lets SubjectAccessReviews allow what `grant` says.
    pub fn grant(&self, grant: Grant) {
        self.shared.lock().grants.push(grant);
    }

    /// Makes TokenReviews refuse `token` from now on (a rotated-out token).
    pub fn remove_token(&self, token: &str) {
        self.shared.lock().tokens.remove(token);
    }

    /// Registers a bearer token that TokenReviews accept.
    pub fn add_token(&self, token: &str, identity: TokenIdentity) {
        self.shared.lock().tokens.insert(token.to_owned(), identity);
    }

    /// Stores `object` as is (plus uid/resourceVersion/generation when
    /// missing), bypassing every write rule: test seeding.
    ///
    /// # Panics
    /// When `object` has no apiVersion, kind or name (a test bug).
    pub fn insert<K: serde::Serialize>(&self, object: &K) -> Value {
        let mut value = serde_json::to_value(object).expect("serializable object");
        let api_version = value["apiVersion"].as_str().expect("apiVersion").to_owned();
        let kind = value["kind"].as_str().expect("kind").to_owned();
        let key = ObjectKey {
            api: api_path_of(&api_version),
            plural: plural_of(&kind),
            namespace: value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            name: value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .expect("metadata.name")
                .to_owned(),
        };
        let mut shared = self.shared.lock();
        let state = &mut shared.store;
        state.resource_version += 1;
        state.uid += 1;
        let (rv, uid) = (state.resource_version, state.uid);
        let meta = value["metadata"].as_object_mut().expect("metadata");
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.entry("uid").or_insert(json!(format!("uid-{uid}")));
        meta.entry("generation").or_insert(json!(1));
        meta.entry("creationTimestamp")
            .or_insert(json!("2026-01-01T00:00:00Z"));
        let existing = state.objects.remove(&key);
        let kind = if existing.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.emit(kind, &key, &value);
        state.objects.insert(
            key,
            Stored {
                object: value.clone(),
                applied: existing.map(|s| s.applied).unwrap_or_default(),
            },
        );
        drop(shared);
        self.changes.send_replace(rv);
        value
    }

    /// The stored object, typed.
    pub fn get<K: serde::de::DeserializeOwned>(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        let key = ObjectKey {
            api: api_path_of(api_version),
            plural: plural.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        let shared = self.shared.lock();
        shared
            .store
            .objects
            .get(&key)
            .and_then(|s| serde_json::from_value(s.object.clone()).ok())
    }

    /// Every stored object of `plural` (any namespace), typed.
    pub fn list<K: serde::de::DeserializeOwned>(&self, plural: &str) -> Vec<K> {
        let shared = self.shared.lock();
        shared
            .store
            .objects
            .iter()
            .filter(|(k, _)| k.plural == plural)
            .filter_map(|(_, s)| serde_json::from_value(s.object.clone()).ok())
            .collect()
    }

    /// Deletes an object directly (no request logged), honouring its
    /// finalizers as a DELETE does.
    pub fn remove(&self, api_version: &str, plural: &str, namespace: &str, name: &str) -> bool {
        let key = ObjectKey {
            api: api_path_of(api_version),
            plural: plural.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        let mut shared = self.shared.lock();
        let removed = store::delete(&mut shared.store, &key).is_some();
        let rv = shared.store.resource_version;
        drop(shared);
        self.changes.send_replace(rv);
        removed
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// Requests that wrote something (anything but GET).
    pub fn writes(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != Method::GET)
            .collect()
    }

    /// The next `times` requests with `method` whose path contains
    /// `path_part` fail with `status`.
    pub fn fail(&self, method: Method, path_part: &str, status: u16, times: usize) {
        self.refuse(
            method,
            path_part,
            status,
            "InternalError",
            "injected failure",
            times,
        );
    }

    /// The next `times` requests with `method` whose path contains
    /// `path_part` are answered `status` with a Status of `reason` and
    /// `message`, as an API server refusing them would (e.g. 400
    /// `BadRequest` "admission webhook ... denied the request").
    pub fn refuse(
        &self,
        method: Method,
        path_part: &str,
        status: u16,
        reason: &str,
        message: &str,
        times: usize,
    ) {
        self.shared.lock().injected.push(Injected {
            method,
            path_part: path_part.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            times,
        });
    }

    fn handle(&self, parts: &::http::request::Parts, body: &[u8]) -> Answer {
        let path = parts.uri.path().to_owned();
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .map(|q| paths::url_decode_pairs(q).into_iter().collect())
            .unwrap_or_default();
        let content_type = parts
            .headers
            .get(::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let mut shared = self.shared.lock();
        let before = shared.store.resource_version;
        let answer = Self::decide(
            &mut shared,
            parts,
            &path,
            &query,
            content_type.as_deref(),
            body.clone(),
        );
        let status = match &answer {
            Answer::Json(code, _) => *code,
            Answer::Watch(_) => 200,
        };
        shared.requests.push(RecordedRequest {
            method: parts.method.clone(),
            path,
            query,
            content_type,
            body,
            status,
        });
        let after = shared.store.resource_version;
        drop(shared);
        if after != before {
            self.changes.send_replace(after);
        }
        answer
    }

    fn decide(
        shared: &mut Shared,
        parts: &::http::request::Parts,
        path: &str,
        query: &BTreeMap<String, String>,
        content_type: Option<&str>,
        body: Value,
    ) -> Answer {
        if let Some(i) = shared
            .injected
            .iter()
            .position(|f| f.method == parts.method && path.contains(&f.path_part) && f.times > 0)
        {
            let injected = &mut shared.injected[i];
            injected.times -= 1;
            let (code, value) = status_error(injected.status, &injected.reason, &injected.message);
            return Answer::Json(code, value);
        }
        let Some(target) = parse_path(path) else {
            let (code, value) = status_error(404, "NotFound", &format!("no route for {path}"));
            return Answer::Json(code, value);
        };
        if target.api == "apis/authentication.k8s.io/v1" && target.plural == "tokenreviews" {
            return Answer::Json(200, review_token(&shared.tokens, &body));
        }
        if target.api == "apis/authorization.k8s.io/v1" && target.plural == "subjectaccessreviews" {
            return Answer::Json(200, review_access(&shared.grants, &body));
        }
        let state = &mut shared.store;
        if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
            return Answer::Watch(watch::WatchRequest::new(target, query, state));
        }
        let (code, value) = match (&parts.method, &target.name) {
            (&Method::GET, None) => store::list(state, &target, query),
            (&Method::GET, Some(name)) => match state.objects.get(&store::key(&target, name)) {
                Some(s) => (200, s.object.clone()),
                None => store::not_found(&target, name),
            },
            (&Method::POST, None) => store::create(state, &target, body),
            (&Method::PUT, Some(name)) => store::replace(state, &target, name, body),
            (&Method::PATCH, Some(name)) => store::patch(
                state,
                &target,
                name,
                content_type.unwrap_or_default(),
                query,
                body,
            ),
            (&Method::DELETE, Some(name)) => match store::delete(state, &store::key(&target, name))
            {
                Some(object) => (200, object),
                None => store::not_found(&target, name),
            },
            _ => status_error(405, "MethodNotAllowed", "unsupported verb"),
        };
        Answer::Json(code, value)
    }
}

/// The SubjectAccessReview answer for `review` against the grants (RBAC's
/// rule: a namespaced grant covers its namespace only; an all-namespace
/// grant covers every namespace and the cluster scope).
fn review_access(grants: &[Grant], review: &Value) -> Value {
    let field = |path: &str| {
        review
            .pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let user = field("/spec/user");
    let verb = field("/spec/resourceAttributes/verb");
    let group = field("/spec/resourceAttributes/group");
    let resource = field("/spec/resourceAttributes/resource");
    let namespace = field("/spec/resourceAttributes/namespace");
    let subresource = field("/spec/resourceAttributes/subresource");
    // RBAC names a subresource `resource/subresource`; `resource/*` covers
    // every subresource and `*` everything, while `resource` alone covers
    // none of its subresources.
    let wanted = if subresource.is_empty() {
        resource.clone()
    } else {
        format!("{resource}/{subresource}")
    };
    let covers = |granted: &str| {
        granted == "*"
            || granted == wanted
            || (!subresource.is_empty() && granted == format!("{resource}/*"))
    };
    let allowed = grants.iter().any(|g| {
        g.user == user
            && g.verb == verb
            && g.group == group
            && covers(&g.resource)
            && (g.namespace.is_empty() || g.namespace == namespace)
    });
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
           "metadata": {"creationTimestamp": null}, "spec": review.get("spec").cloned().unwrap_or(Value::Null),
           "status": {"allowed": allowed}})
}

/// The TokenReview answer for `review` against the registered tokens.
fn review_token(tokens: &BTreeMap<String, TokenIdentity>, review: &Value) -> Value {
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let wanted: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let status = match tokens.get(token) {
        Some(id) => {
            let shared: Vec<&String> = wanted.iter().filter(|a| id.audiences.contains(a)).collect();
            if !wanted.is_empty() && shared.is_empty() {
                json!({"authenticated": false, "error": "token audiences do not match"})
            } else {
                let mut user = json!({"username": id.username, "uid": format!("uid-{}", id.username),
                                      "groups": ["system:authenticated"]});
                if let Some(pod) = &id.pod {
                    user["extra"] = json!({
                        "authentication.kubernetes.io/pod-name": [pod],
                        "authentication.kubernetes.io/pod-uid": [format!("uid-{pod}")],
                    });
                }
                json!({"authenticated": true, "audiences": shared, "user": user})
            }
        }
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
           "metadata": {"creationTimestamp": null}, "spec": review.get("spec").cloned().unwrap_or(Value::Null),
           "status": status})
}
