//! The stored objects and the write rules: create, replace, patch (merge
//! and server-side apply), delete, status-subresource splitting,
//! `resourceVersion`/`generation` bookkeeping, and the event log watches
//! are served from.

use std::collections::BTreeMap;

use serde_json::{Value, json};

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
pub(crate) struct Stored {
    pub object: Value,
    /// Last applied configuration per (field manager, subresource).
    pub applied: BTreeMap<(String, bool), Value>,
}

/// One change, as a watch reports it.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// The object's place.
    pub key: ObjectKey,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object after the change (before it, for deletions).
    pub object: Value,
}

/// Everything the fake holds.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub objects: BTreeMap<ObjectKey, Stored>,
    pub resource_version: u64,
    pub uid: u64,
    /// Every change, oldest first (watches replay from any point).
    pub events: Vec<Event>,
}

impl State {
    /// Logs a change for watchers.
    pub fn emit(&mut self, kind: &'static str, key: &ObjectKey, object: &Value) {
        let rv = self.resource_version;
        self.events.push(Event {
            rv,
            key: key.clone(),
            kind,
            object: object.clone(),
        });
    }
}

/// Parsed request path.
#[derive(Debug)]
pub(crate) struct Target {
    pub api: String,
    pub plural: String,
    pub namespace: String,
    pub name: Option<String>,
    pub status: bool,
}

impl Target {
    /// Whether the object at `key` is one this collection request covers.
    pub(crate) fn holds(&self, key: &ObjectKey) -> bool {
        key.api == self.api
            && key.plural == self.plural
            && (self.namespace.is_empty() || key.namespace == self.namespace)
            && self.name.as_ref().is_none_or(|n| *n == key.name)
    }
}

pub(crate) fn parse_path(path: &str) -> Option<Target> {
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

pub(crate) fn api_path_of(api_version: &str) -> String {
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

pub(crate) fn status_error(code: u16, reason: &str, message: &str) -> (u16, Value) {
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

pub(crate) fn matches_selector(object: &Value, selector: &str) -> bool {
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

pub(crate) fn key(target: &Target, name: &str) -> ObjectKey {
    ObjectKey {
        api: target.api.clone(),
        plural: target.plural.clone(),
        namespace: target.namespace.clone(),
        name: name.to_owned(),
    }
}

pub(crate) fn not_found(target: &Target, name: &str) -> (u16, Value) {
    status_error(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", target.plural),
    )
}

pub(crate) fn list(
    state: &State,
    target: &Target,
    query: &BTreeMap<String, String>,
) -> (u16, Value) {
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

pub(crate) fn stamp_new(state: &mut State, target: &Target, object: &mut Value, name: &str) {
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

pub(crate) fn create(state: &mut State, target: &Target, mut body: Value) -> (u16, Value) {
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
    state.emit("ADDED", &k, &body);
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
    if let Some(stored) = state.objects.get(k) {
        let unchanged = without(&stored.object, &["metadata"]) == without(&next, &["metadata"])
            && meta_without_version(&stored.object) == meta_without_version(&next);
        if unchanged {
            // As the API server does: a write that changes nothing keeps
            // the resourceVersion and sends no watch event.
            return stored.object.clone();
        }
    }
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
    state.emit("MODIFIED", k, &next);
    if next.pointer("/metadata/deletionTimestamp").is_some() && !has_finalizers(&next) {
        // The last finalizer is gone from an object being deleted.
        remove_now(state, k);
    }
    next
}

fn meta_without_version(object: &Value) -> Value {
    let mut meta = object.get("metadata").cloned().unwrap_or(Value::Null);
    if let Some(m) = meta.as_object_mut() {
        m.remove("resourceVersion");
        m.remove("generation");
    }
    meta
}

fn has_finalizers(object: &Value) -> bool {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

fn remove_now(state: &mut State, k: &ObjectKey) -> Option<Value> {
    let stored = state.objects.remove(k)?;
    state.resource_version += 1;
    state.emit("DELETED", k, &stored.object);
    Some(stored.object)
}

/// Deletes the object at `k`, if any. One with finalizers only gets its
/// deletionTimestamp, as on a real API server; it goes when the last
/// finalizer is removed.
pub(crate) fn delete(state: &mut State, k: &ObjectKey) -> Option<Value> {
    let object = state.objects.get(k)?.object.clone();
    if !has_finalizers(&object) {
        return remove_now(state, k);
    }
    if object.pointer("/metadata/deletionTimestamp").is_some() {
        return Some(object);
    }
    let mut next = object;
    next["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    Some(commit(state, k, next))
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

pub(crate) fn replace(state: &mut State, target: &Target, name: &str, body: Value) -> (u16, Value) {
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

pub(crate) fn patch(
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
            state.emit("ADDED", &k, &object);
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
