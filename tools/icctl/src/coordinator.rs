//! Coordinator commands over its LMCache-compatible REST API.

use anyhow::{Context, bail};
use reqwest::Method;
use serde_json::{Value, json};

use crate::table::render;

/// A coordinator at a base URL.
#[derive(Clone, Debug)]
pub struct Coordinator {
    base: String,
    http: reqwest::Client,
}

/// Which chunks a pin, prefetch or delete names.
#[derive(Clone, Debug)]
pub struct Chunks {
    /// Model name as the MP servers report it.
    pub model_name: String,
    /// Tensor-parallel world size.
    pub world_size: u32,
    /// Prompt token ids.
    pub token_ids: Vec<u32>,
    /// Tenant salt.
    pub cache_salt: String,
}

impl Chunks {
    fn body(&self) -> Value {
        json!({
            "model_name": self.model_name,
            "world_size": self.world_size,
            "token_ids": self.token_ids,
            "cache_salt": self.cache_salt,
        })
    }
}

fn str_of(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn gib(bytes: &Value) -> String {
    bytes
        .as_f64()
        .map_or("-".into(), |b| format!("{:.2}", b / f64::from(1u32 << 30)))
}

impl Coordinator {
    /// A client for `base` (e.g. `http://127.0.0.1:9300`).
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// Sends a request; a non-2xx answer is an error carrying the server's
    /// own message.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method.clone(), &url)
            .headers(crate::trace_headers());
        if let Some(b) = body {
            req = req.json(&b);
        }
        let response = req.send().await.with_context(|| {
            format!(
                "cannot reach the coordinator at {}: is it running? (set --coordinator or IC_COORDINATOR)",
                self.base
            )
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if !status.is_success() {
            let message = value
                .get("detail")
                .or_else(|| value.get("error"))
                .map_or_else(
                    || value.to_string(),
                    |d| match d {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                );
            bail!("{method} {path}: HTTP {}: {message}", status.as_u16());
        }
        Ok(value)
    }

    /// `GET /instances`.
    pub async fn instances(&self) -> anyhow::Result<Value> {
        self.call(Method::GET, "/instances", None).await
    }

    /// `GET /instances/usage` or one instance's.
    pub async fn usage(&self, instance: Option<&str>) -> anyhow::Result<Value> {
        match instance {
            Some(id) => {
                self.call(Method::GET, &format!("/instances/{id}/usage"), None)
                    .await
            }
            None => self.call(Method::GET, "/instances/usage", None).await,
        }
    }

    /// `GET /quota/{salt}`.
    pub async fn quota_get(&self, salt: &str) -> anyhow::Result<Value> {
        self.call(Method::GET, &format!("/quota/{}", salt_path(salt)), None)
            .await
    }

    /// `PUT /quota/{salt}`.
    pub async fn quota_set(&self, salt: &str, limit_gb: f64) -> anyhow::Result<Value> {
        self.call(
            Method::PUT,
            &format!("/quota/{}", salt_path(salt)),
            Some(json!({"limit_gb": limit_gb, "tier": "l2"})),
        )
        .await
    }

    /// `DELETE /quota/{salt}`.
    pub async fn quota_rm(&self, salt: &str) -> anyhow::Result<Value> {
        self.call(
            Method::DELETE,
            &format!("/quota/{}?tier=l2", salt_path(salt)),
            None,
        )
        .await
    }

    /// `GET /quota`.
    pub async fn quota_ls(&self) -> anyhow::Result<Value> {
        self.call(Method::GET, "/quota?tier=l2", None).await
    }

    /// `POST` or `DELETE /cache/pins`.
    pub async fn pins(&self, add: bool, chunks: &Chunks) -> anyhow::Result<Value> {
        let method = if add { Method::POST } else { Method::DELETE };
        self.call(method, "/cache/pins", Some(chunks.body())).await
    }

    /// `GET /cache/pins`.
    pub async fn pins_ls(&self, salt: &str, model: &str) -> anyhow::Result<Value> {
        let url = reqwest::Url::parse_with_params(
            "http://x/cache/pins",
            &[
                ("cache_salt", salt),
                ("model_name", model),
                ("limit", "10000"),
            ],
        )?;
        let path = format!("{}?{}", url.path(), url.query().unwrap_or_default());
        self.call(Method::GET, &path, None).await
    }

    /// `POST /cache/prefetches`.
    pub async fn prefetch(&self, instance: &str, chunks: &Chunks) -> anyhow::Result<Value> {
        let mut body = chunks.body();
        body["instance_id"] = json!(instance);
        self.call(Method::POST, "/cache/prefetches", Some(body))
            .await
    }

    /// `GET /cache/prefetches/{instance}/{request}`.
    pub async fn prefetch_status(&self, instance: &str, request: &str) -> anyhow::Result<Value> {
        self.call(
            Method::GET,
            &format!("/cache/prefetches/{instance}/{request}"),
            None,
        )
        .await
    }

    /// `POST /cache/delete`.
    pub async fn delete(
        &self,
        instance: &str,
        chunks: &Chunks,
        tier: &str,
        force: bool,
    ) -> anyhow::Result<Value> {
        let mut body = chunks.body();
        body["instance_id"] = json!(instance);
        body["tier"] = json!(tier);
        body["force"] = json!(force);
        self.call(Method::POST, "/cache/delete", Some(body)).await
    }
}

/// The path segment for a salt (the empty salt is `_default`).
fn salt_path(salt: &str) -> String {
    if salt.is_empty() {
        "_default".into()
    } else {
        salt.to_owned()
    }
}

/// `instances` for people.
pub fn instances_text(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    vec![
                        str_of(&i["instance_id"]),
                        format!("{}:{}", str_of(&i["ip"]), str_of(&i["http_port"])),
                        str_of(&i["mq_port"]),
                        i["registration_time"]
                            .as_f64()
                            .map_or("-".into(), |t| format!("{t:.0}")),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    render(&["INSTANCE", "HTTP", ">MQ-PORT", ">REGISTERED-AT"], &rows)
}

/// `usage` for people (all instances or one).
pub fn usage_text(v: &Value) -> String {
    let instances: Vec<&Value> = match v["instances"].as_array() {
        Some(a) => a.iter().collect(),
        None => vec![v],
    };
    let row = |owner: String, m: &Value| {
        vec![
            owner,
            str_of(&m["tier"]),
            str_of(&m["backend"]),
            gib(&m["used_bytes"]),
            gib(&m["capacity_bytes"]),
            m["usage_ratio"]
                .as_f64()
                .map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
        ]
    };
    let mut rows = Vec::new();
    for i in instances {
        for m in i["modules"].as_array().into_iter().flatten() {
            rows.push(row(str_of(&i["instance_id"]), m));
        }
    }
    for m in v["shared_modules"].as_array().into_iter().flatten() {
        rows.push(row("(shared)".into(), m));
    }
    render(
        &[
            "INSTANCE",
            "TIER",
            "BACKEND",
            ">USED-GIB",
            ">CAPACITY-GIB",
            ">USED",
        ],
        &rows,
    )
}

/// `quota ls` for people.
pub fn quota_ls_text(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["by_cache_salt"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|q| {
                    vec![
                        match q["cache_salt"].as_str() {
                            Some("") => "(default salt)".into(),
                            _ => str_of(&q["cache_salt"]),
                        },
                        if q["quota_exists"].as_bool() == Some(true) {
                            str_of(&q["quota_limit_gb"])
                        } else {
                            "-".into()
                        },
                        str_of(&q["usage_gb"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = render(&["CACHE-SALT", ">LIMIT-GB", ">USED-GB"], &rows);
    out.push_str(&format!("total {} GB\n", str_of(&v["total_gb"])));
    out
}

/// `pins ls` for people.
pub fn pins_text(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["pins"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let k = &p["key"];
                    vec![
                        str_of(&k["model_name"]),
                        str_of(&k["cache_salt"]),
                        str_of(&k["worker_id"]),
                        str_of(&k["chunk_hash"]),
                        str_of(&p["pin_count"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = render(&["MODEL", "SALT", ">RANK", "CHUNK", ">PINS"], &rows);
    out.push_str(&format!("{} pinned keys\n", str_of(&v["total"])));
    out
}

/// Any flat JSON object as `key: value` lines (for one-line answers).
pub fn object_text(v: &Value) -> String {
    match v.as_object() {
        Some(o) => o
            .iter()
            .map(|(k, v)| format!("{k}: {}\n", str_of(v)))
            .collect(),
        None => format!("{}\n", str_of(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_rows_cover_private_and_shared_modules() {
        let v = json!({
            "instances": [{"instance_id": "mp-1", "modules": [
                {"tier": "l1", "backend": "cpu", "used_bytes": 1073741824u64, "capacity_bytes": 4294967296u64, "usage_ratio": 0.25}
            ]}],
            "shared_modules": [{"tier": "l2", "backend": "redis", "used_bytes": 0, "capacity_bytes": 0, "usage_ratio": null}]
        });
        let text = usage_text(&v);
        assert!(text.contains("mp-1      l1    cpu"), "{text}");
        assert!(text.contains("25.0%"), "{text}");
        assert!(text.contains("(shared)"), "{text}");
    }

    #[test]
    fn empty_salt_uses_the_default_route() {
        assert_eq!(salt_path(""), "_default");
        assert_eq!(salt_path("team-a"), "team-a");
    }
}
