//! An in-memory, stateful stand-in for the Kubernetes API server, served as
//! a tower `Service` so `kube::Client::new(fake.service(), "default")` talks
//! to it exactly as it would to a real one (paths, query strings, patch
//! content types, Status errors).
//!
//! What it does: GET, LIST (with equality `labelSelector`s), POST, PUT (with
//! `resourceVersion` preconditions, 409 on a stale one), PATCH, DELETE, the
//! `status` subresource, `resourceVersion` and `generation` bookkeeping, for
//! any group/version/plural (Leases and Events included). Every request is
//! logged for assertions, and failures can be injected.
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
//! * No watch, no admission, no defaulting, no owner-reference garbage
//!   collection, no field selectors.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use serde_json::{Value, json};

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
}

/// A failure to inject: requests matching `method` and containing `path_part`
/// get `status` for the next `times` matches.
#[derive(Clone, Debug)]
struct Injected {
    method: Method,
    path_part: String,
    status: u16,
    times: usize,
}

/// Where an object lives.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// `api/v1` or `apis/<group>/<version>`.
    pub api: String,
    /// Resource plural.
    pub plural: String,
    /// Namespace (empty for cluster-scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
}

#[derive(Debug, Default)]
struct Stored {
    object: Value,
    /// Last applied configuration per (field manager, subresource).
    applied: BTreeMap<(String, bool), Value>,
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<ObjectKey, Stored>,
    resource_version: u64,
    uid: u64,
    requests: Vec<RecordedRequest>,
    injected: Vec<Injected>,
}

/// The fake API server. Cheap to clone; clones share state.
#[derive(Clone, Debug, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

/// Parsed request path.
#[derive(Debug)]
struct Target {
    api: String,
    plural: String,
    namespace: String,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("api/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("apis/{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => ((*ns).to_owned(), tail),
        _ => (String::new(), rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some((*name).to_owned()), false),
        [plural, name, "status"] => (*plural, Some((*name).to_owned()), true),
        _ => return None,
    };
    Some(Target {
        api,
        plural: plural.to_owned(),
        namespace,
        name,
        status,
    })
}

fn api_path_of(api_version: &str) -> String {
    if api_version.contains('/') {
        format!("apis/{api_version}")
    } else {
        format!("api/{api_version}")
    }
}

/// RFC 7386 JSON merge patch of `patch` into `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Removes from `target` the leaves of `old` that `new` no longer has.
fn prune_dropped(target: &mut Value, old: &Value, new: &Value) {
    let (Value::Object(t), Value::Object(o)) = (target, old) else {
        return;
    };
    for (k, ov) in o {
        match new.get(k) {
            None => {
                t.remove(k);
            }
            Some(nv) if ov.is_object() && nv.is_object() => {
                if let Some(tv) = t.get_mut(k) {
                    prune_dropped(tv, ov, nv);
                }
            }
            Some(_) => {}
        }
    }
}

fn status_error(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn without(value: &Value, keys: &[&str]) -> Value {
    let mut v = value.clone();
    if let Value::Object(m) = &mut v {
        for k in keys {
            m.remove(*k);
        }
    }
    v
}

fn matches_selector(object: &Value, selector: &str) -> bool {
    let labels = object.pointer("/metadata/labels");
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|term| match term.split_once("!=") {
            Some((k, v)) => labels.and_then(|l| l.get(k)).and_then(Value::as_str) != Some(v),
            None => match term.split_once('=') {
                Some((k, v)) => {
                    let v = v.trim_start_matches('=');
                    labels.and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v)
                }
                None => labels.and_then(|l| l.get(term)).is_some(),
            },
        })
}

impl FakeApi {
    /// An empty API server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A kube client talking to this fake.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    /// The tower service.
    pub fn service(
        &self,
    ) -> impl tower::Service<
        Request<kube::client::Body>,
        Response = Response<Full<Bytes>>,
        Error = std::convert::Infallible,
        Future = impl Send + 'static,
    > + Send
    + Clone
    + 'static {
        let this = self.clone();
        tower::service_fn(move |req: Request<kube::client::Body>| {
            let this = this.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = body
                    .collect()
                    .await
                    .map(http_body_util::Collected::to_bytes)
                    .unwrap_or_default();
                let (code, value) = this.handle(&parts, &bytes);
                let response = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(value.to_string())))
                    .unwrap_or_default();
                Ok(response)
            }
        })
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
        let mut state = self.state.lock();
        state.resource_version += 1;
        state.uid += 1;
        let (rv, uid) = (state.resource_version, state.uid);
        let meta = value["metadata"].as_object_mut().expect("metadata");
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.entry("uid").or_insert(json!(format!("uid-{uid}")));
        meta.entry("generation").or_insert(json!(1));
        meta.entry("creationTimestamp")
            .or_insert(json!("2026-01-01T00:00:00Z"));
        let applied = state
            .objects
            .remove(&key)
            .map(|s| s.applied)
            .unwrap_or_default();
        state.objects.insert(
            key,
            Stored {
                object: value.clone(),
                applied,
            },
        );
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
        let state = self.state.lock();
        state
            .objects
            .get(&key)
            .and_then(|s| serde_json::from_value(s.object.clone()).ok())
    }

    /// Every stored object of `plural` (any namespace), typed.
    pub fn list<K: serde::de::DeserializeOwned>(&self, plural: &str) -> Vec<K> {
        let state = self.state.lock();
        state
            .objects
            .iter()
            .filter(|(k, _)| k.plural == plural)
            .filter_map(|(_, s)| serde_json::from_value(s.object.clone()).ok())
            .collect()
    }

    /// Removes an object directly (no request logged).
    pub fn remove(&self, api_version: &str, plural: &str, namespace: &str, name: &str) -> bool {
        let key = ObjectKey {
            api: api_path_of(api_version),
            plural: plural.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        self.state.lock().objects.remove(&key).is_some()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.lock().requests.clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.state.lock().requests.clear();
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
        self.state.lock().injected.push(Injected {
            method,
            path_part: path_part.into(),
            status,
            times,
        });
    }

    fn handle(&self, parts: &http::request::Parts, body: &[u8]) -> (u16, Value) {
        let path = parts.uri.path().to_owned();
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .map(|q| {
                url_decode_pairs(q)
                    .into_iter()
                    .collect::<BTreeMap<String, String>>()
            })
            .unwrap_or_default();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let mut state = self.state.lock();
        state.requests.push(RecordedRequest {
            method: parts.method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body.clone(),
        });
        if let Some(i) = state
            .injected
            .iter()
            .position(|f| f.method == parts.method && path.contains(&f.path_part) && f.times > 0)
        {
            state.injected[i].times -= 1;
            let code = state.injected[i].status;
            return status_error(code, "InternalError", "injected failure");
        }
        let Some(target) = parse_path(&path) else {
            return status_error(404, "NotFound", &format!("no route for {path}"));
        };
        if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
            return status_error(
                405,
                "MethodNotAllowed",
                "the fake API server does not watch",
            );
        }
        match (&parts.method, &target.name) {
            (&Method::GET, None) => list(&state, &target, &query),
            (&Method::GET, Some(name)) => match state.objects.get(&key(&target, name)) {
                Some(s) => (200, s.object.clone()),
                None => not_found(&target, name),
            },
            (&Method::POST, None) => create(&mut state, &target, body),
            (&Method::PUT, Some(name)) => replace(&mut state, &target, name, body),
            (&Method::PATCH, Some(name)) => patch(
                &mut state,
                &target,
                name,
                content_type.as_deref().unwrap_or_default(),
                &query,
                body,
            ),
            (&Method::DELETE, Some(name)) => match state.objects.remove(&key(&target, name)) {
                Some(s) => (200, s.object),
                None => not_found(&target, name),
            },
            _ => status_error(405, "MethodNotAllowed", "unsupported verb"),
        }
    }
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    out.push(b);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The lower-case plural the API uses for `kind` (the kinds this project touches).
pub fn plural_of(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    match lower.as_str() {
        "cacheindex" => "cacheindexes".into(),
        "cachepolicy" => "cachepolicies".into(),
        "endpoints" => "endpoints".into(),
        _ if lower.ends_with("ss") => format!("{lower}es"),
        _ => format!("{lower}s"),
    }
}

fn key(target: &Target, name: &str) -> ObjectKey {
    ObjectKey {
        api: target.api.clone(),
        plural: target.plural.clone(),
        namespace: target.namespace.clone(),
        name: name.to_owned(),
    }
}

fn not_found(target: &Target, name: &str) -> (u16, Value) {
    status_error(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", target.plural),
    )
}

fn list(state: &State, target: &Target, query: &BTreeMap<String, String>) -> (u16, Value) {
    let selector = query.get("labelSelector").map(String::as_str).unwrap_or("");
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|(k, _)| {
            k.api == target.api
                && k.plural == target.plural
                && (target.namespace.is_empty() || k.namespace == target.namespace)
        })
        .map(|(_, s)| &s.object)
        .filter(|o| matches_selector(o, selector))
        .cloned()
        .collect();
    let kind = items
        .first()
        .and_then(|o| o["kind"].as_str())
        .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
    (
        200,
        json!({"kind": kind, "apiVersion": target.api.trim_start_matches("apis/").trim_start_matches("api/"),
               "metadata": {"resourceVersion": state.resource_version.to_string()},
               "items": items}),
    )
}

fn stamp_new(state: &mut State, target: &Target, object: &mut Value, name: &str) {
    state.resource_version += 1;
    state.uid += 1;
    let (rv, uid) = (state.resource_version, state.uid);
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    let meta = object["metadata"].as_object_mut();
    if let Some(meta) = meta {
        meta.insert("name".into(), json!(name));
        if !target.namespace.is_empty() {
            meta.insert("namespace".into(), json!(target.namespace));
        }
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("uid".into(), json!(format!("uid-{uid}")));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
    }
}

fn create(state: &mut State, target: &Target, mut body: Value) -> (u16, Value) {
    let Some(name) = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return status_error(422, "Invalid", "metadata.name: Required value");
    };
    let k = key(target, &name);
    if state.objects.contains_key(&k) {
        return status_error(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", target.plural),
        );
    }
    stamp_new(state, target, &mut body, &name);
    state.objects.insert(
        k,
        Stored {
            object: body.clone(),
            applied: BTreeMap::new(),
        },
    );
    (201, body)
}

/// Applies `next` as the new version of the stored object: keeps identity,
/// bumps resourceVersion, and moves generation on spec changes.
fn commit(state: &mut State, k: &ObjectKey, mut next: Value) -> Value {
    state.resource_version += 1;
    let rv = state.resource_version;
    let Some(stored) = state.objects.get_mut(k) else {
        return next;
    };
    let old = &stored.object;
    let spec_changed =
        without(old, &["metadata", "status"]) != without(&next, &["metadata", "status"]);
    let generation = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if let Some(meta) = next["metadata"].as_object_mut() {
        for field in ["uid", "creationTimestamp", "name", "namespace"] {
            if let Some(v) = old["metadata"].get(field) {
                meta.insert(field.into(), v.clone());
            }
        }
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert(
            "generation".into(),
            json!(if spec_changed {
                generation + 1
            } else {
                generation
            }),
        );
    }
    stored.object = next.clone();
    next
}

fn precondition(stored: &Value, body: &Value) -> Result<(), (u16, Value)> {
    let wanted = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    let have = stored
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    match wanted {
        Some(w) if !w.is_empty() && Some(w) != have => Err(status_error(
            409,
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your \
             changes to the latest version and try again",
        )),
        _ => Ok(()),
    }
}

/// The object that results from writing `body` to the main resource or to
/// `/status` of `old`.
fn split_write(old: &Value, mut body: Value, status: bool) -> Value {
    if status {
        let mut next = old.clone();
        match body.get("status") {
            Some(s) => next["status"] = s.clone(),
            None => {
                if let Value::Object(m) = &mut next {
                    m.remove("status");
                }
            }
        }
        next
    } else {
        if let Value::Object(m) = &mut body {
            match old.get("status") {
                Some(s) => {
                    m.insert("status".into(), s.clone());
                }
                None => {
                    m.remove("status");
                }
            }
        }
        body
    }
}

fn replace(state: &mut State, target: &Target, name: &str, body: Value) -> (u16, Value) {
    let k = key(target, name);
    let Some(stored) = state.objects.get(&k) else {
        return not_found(target, name);
    };
    if let Err(e) = precondition(&stored.object, &body) {
        return e;
    }
    let next = split_write(&stored.object, body, target.status);
    (200, commit(state, &k, next))
}

fn patch(
    state: &mut State,
    target: &Target,
    name: &str,
    content_type: &str,
    query: &BTreeMap<String, String>,
    body: Value,
) -> (u16, Value) {
    let k = key(target, name);
    let apply = content_type.starts_with("application/apply-patch");
    if !apply
        && !content_type.starts_with("application/merge-patch+json")
        && !content_type.starts_with("application/strategic-merge-patch+json")
    {
        return status_error(
            415,
            "UnsupportedMediaType",
            &format!("the fake API server does not support {content_type:?}"),
        );
    }
    if apply {
        let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
            return status_error(400, "BadRequest", "PATCH apply requires a fieldManager");
        };
        let manager = manager.clone();
        if !state.objects.contains_key(&k) {
            if target.status {
                return not_found(target, name);
            }
            let mut object = body.clone();
            stamp_new(state, target, &mut object, name);
            let mut applied = BTreeMap::new();
            applied.insert((manager, false), body);
            state.objects.insert(
                k,
                Stored {
                    object: object.clone(),
                    applied,
                },
            );
            return (201, object);
        }
        let Some(stored) = state.objects.get_mut(&k) else {
            return not_found(target, name);
        };
        if let Err(e) = precondition(&stored.object, &body) {
            return e;
        }
        let mut merged = stored.object.clone();
        if let Some(previous) = stored.applied.get(&(manager.clone(), target.status)) {
            prune_dropped(
                &mut merged,
                &without(previous, &["apiVersion", "kind"]),
                &body,
            );
        }
        let mut clean = body.clone();
        if let Some(m) = clean.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        merge_patch(&mut merged, &clean);
        stored.applied.insert((manager, target.status), body);
        let next = split_write(&stored.object, merged, target.status);
        return (200, commit(state, &k, next));
    }
    let Some(stored) = state.objects.get(&k) else {
        return not_found(target, name);
    };
    if let Err(e) = precondition(&stored.object, &body) {
        return e;
    }
    let mut merged = stored.object.clone();
    let mut clean = body;
    if let Some(m) = clean.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    merge_patch(&mut merged, &clean);
    let next = split_write(&stored.object, merged, target.status);
    (200, commit(state, &k, next))
}
