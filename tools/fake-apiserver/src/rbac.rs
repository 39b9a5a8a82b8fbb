//! The RBAC rules a request log needs: what a Role or ClusterRole must grant
//! for every request a binary made against the fake to be authorized by a
//! real API server.
//!
//! Beyond the request's own verb, two checks the API server makes on the
//! side are included: a server-side apply that creates its object also needs
//! `create`, and setting an owner reference with `blockOwnerDeletion` needs
//! `update` on the owner's `finalizers` subresource (where the
//! OwnerReferencesPermissionEnforcement admission plugin runs).

use std::collections::BTreeSet;

use http::Method;
use serde_json::Value;

use crate::RecordedRequest;
use crate::store::{parse_path, plural_of};

/// One permission: `verb` on `resource` (with `/subresource`) of `group`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    /// API group (`""` for the core group).
    pub group: String,
    /// Resource plural, with `/subresource` when there is one.
    pub resource: String,
    /// get, list, watch, create, update, patch or delete.
    pub verb: String,
}

impl Permission {
    /// A permission from its parts.
    pub fn new(group: &str, resource: &str, verb: &str) -> Self {
        Self {
            group: group.to_owned(),
            resource: resource.to_owned(),
            verb: verb.to_owned(),
        }
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.resource)
    }
}

fn group_of(api: &str) -> String {
    api.strip_prefix("apis/")
        .and_then(|gv| gv.split('/').next())
        .unwrap_or_default()
        .to_owned()
}

/// Owner references that block deletion, as (group, plural) of the owner.
fn blocking_owners(body: &Value) -> Vec<(String, String)> {
    body.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|o| o.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true))
        .filter_map(|o| {
            let api_version = o.get("apiVersion")?.as_str()?;
            let kind = o.get("kind")?.as_str()?;
            let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
            Some((group.to_owned(), plural_of(kind)))
        })
        .collect()
}

/// The permissions `requests` needed. Requests the fake could not route
/// (unknown paths) need none.
pub fn permissions(requests: &[RecordedRequest]) -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for r in requests {
        let Some(target) = parse_path(&r.path) else {
            continue;
        };
        let group = group_of(&target.api);
        let resource = if target.status {
            format!("{}/status", target.plural)
        } else {
            target.plural.clone()
        };
        let watch = r
            .query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1");
        let verbs: &[&str] = match (&r.method, target.name.is_some()) {
            (&Method::GET, true) => &["get"],
            (&Method::GET, false) if watch => &["watch"],
            (&Method::GET, false) => &["list"],
            (&Method::POST, _) => &["create"],
            (&Method::PUT, _) => &["update"],
            (&Method::DELETE, _) => &["delete"],
            (&Method::PATCH, _)
                if r.status == 201
                    && r.content_type
                        .as_deref()
                        .is_some_and(|c| c.starts_with("application/apply-patch")) =>
            {
                &["patch", "create"]
            }
            (&Method::PATCH, _) => &["patch"],
            _ => &[],
        };
        for verb in verbs {
            out.insert(Permission::new(&group, &resource, verb));
        }
        if matches!(r.method, Method::POST | Method::PUT | Method::PATCH) {
            for (owner_group, owner) in blocking_owners(&r.body) {
                out.insert(Permission::new(
                    &owner_group,
                    &format!("{owner}/finalizers"),
                    "update",
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn request(
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        status: u16,
        body: Value,
    ) -> RecordedRequest {
        RecordedRequest {
            method,
            path: path.to_owned(),
            query: query
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            content_type: Some("application/apply-patch+yaml".to_owned()),
            body,
            status,
        }
    }

    #[test]
    fn verbs_subresources_and_side_checks() {
        let owned = serde_json::json!({"metadata": {"ownerReferences": [
            {"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend", "name": "b", "uid": "u", "blockOwnerDeletion": true}]}});
        let got = permissions(&[
            request(
                Method::GET,
                "/api/v1/pods",
                &[("watch", "true")],
                200,
                Value::Null,
            ),
            request(
                Method::GET,
                "/apis/apps/v1/namespaces/a/deployments",
                &[],
                200,
                Value::Null,
            ),
            request(
                Method::PATCH,
                "/apis/apps/v1/namespaces/a/deployments/d",
                &[],
                201,
                owned,
            ),
            request(
                Method::PATCH,
                "/apis/inferencecache.io/v1alpha1/namespaces/a/cachebackends/b/status",
                &[],
                200,
                Value::Null,
            ),
            request(Method::GET, "/nonsense", &[], 404, Value::Null),
        ]);
        let want: BTreeSet<Permission> = [
            Permission::new("", "pods", "watch"),
            Permission::new("apps", "deployments", "list"),
            Permission::new("apps", "deployments", "patch"),
            Permission::new("apps", "deployments", "create"),
            Permission::new("inferencecache.io", "cachebackends/finalizers", "update"),
            Permission::new("inferencecache.io", "cachebackends/status", "patch"),
        ]
        .into_iter()
        .collect();
        assert_eq!(got, want);
    }
}

/// One line of an RBAC contract file: `verb group/resource  # note`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContractLine {
    /// What is granted.
    pub permission: Permission,
    /// Why, when the line says (`not reached: ...` exempts it from being
    /// recorded; other notes inform).
    pub note: String,
}

impl ContractLine {
    /// Whether the recording is not expected to contain this line.
    pub fn not_reached(&self) -> bool {
        self.note.starts_with("not reached")
    }
}

/// Reads a contract file (`#` comments; `core` names the core group).
///
/// # Errors
/// When the file cannot be read or a line is not `verb group/resource`.
pub fn read_contract(path: &std::path::Path) -> Result<Vec<ContractLine>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| {
            let (rule, note) = l.split_once('#').map_or((l, ""), |(r, n)| (r, n.trim()));
            let mut words = rule.split_whitespace();
            let (Some(verb), Some(target), None) = (words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "{}: {l:?} is not `verb group/resource`",
                    path.display()
                ));
            };
            let (group, resource) = target
                .split_once('/')
                .ok_or_else(|| format!("{}: {target:?} is not group/resource", path.display()))?;
            let group = if group == "core" { "" } else { group };
            Ok(ContractLine {
                permission: Permission::new(group, resource, verb),
                note: note.to_owned(),
            })
        })
        .collect()
}

/// Checks `recorded` (what `binary` called in the test `recorded_by`)
/// against the contract file at `path`: nothing recorded may be missing from
/// it, and everything in it must have been recorded unless marked `not
/// reached`. With `UPDATE_RBAC` set, rewrites the file from the recording
/// instead (keeping the notes of lines that stay).
///
/// # Errors
/// What differs, for the test to fail with.
pub fn check_contract(
    path: &std::path::Path,
    binary: &str,
    recorded_by: &str,
    recorded: &BTreeSet<Permission>,
) -> Result<(), String> {
    let existing = if path.exists() {
        read_contract(path)?
    } else {
        Vec::new()
    };
    if std::env::var_os("UPDATE_RBAC").is_some() {
        let mut lines: Vec<ContractLine> = recorded
            .iter()
            .map(|p| ContractLine {
                permission: p.clone(),
                note: existing
                    .iter()
                    .find(|l| l.permission == *p && !l.not_reached())
                    .map(|l| l.note.clone())
                    .unwrap_or_default(),
            })
            .collect();
        lines.extend(
            existing
                .into_iter()
                .filter(|l| l.not_reached() && !recorded.contains(&l.permission)),
        );
        lines.sort_by(|a, b| {
            (
                &a.permission.group,
                &a.permission.resource,
                &a.permission.verb,
            )
                .cmp(&(
                    &b.permission.group,
                    &b.permission.resource,
                    &b.permission.verb,
                ))
        });
        let mut text = format!(
            "# What {binary} calls, recorded by {recorded_by} from the real binary against\n\
             # the fake API server (UPDATE_RBAC=1 rewrites it). Lines marked \"not reached\" are\n\
             # calls the scenario cannot make, with the code path that makes them. The chart's\n\
             # RBAC must grant exactly these (e2e/tests/chart_contract.rs checks it).\n"
        );
        for l in lines {
            if l.note.is_empty() {
                text.push_str(&format!("{}\n", l.permission));
            } else {
                text.push_str(&format!("{}  # {}\n", l.permission, l.note));
            }
        }
        return std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()));
    }
    let granted: BTreeSet<&Permission> = existing.iter().map(|l| &l.permission).collect();
    let missing: Vec<String> = recorded
        .iter()
        .filter(|p| !granted.contains(p))
        .map(ToString::to_string)
        .collect();
    let unused: Vec<String> = existing
        .iter()
        .filter(|l| !l.not_reached() && !recorded.contains(&l.permission))
        .map(|l| l.permission.to_string())
        .collect();
    if missing.is_empty() && unused.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{binary}'s calls differ from {}: called but not granted {missing:?}; granted but never called {unused:?} \
         (run the test with UPDATE_RBAC=1 to record, then review the diff and the chart's RBAC)",
        path.display()
    ))
}
