//! HTTP routes of the eviction controller: quotas, pins, targeted delete.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use ic_coordinator_core::LevelFilter;
use ic_coordinator_core::StorageLevel;
use ic_coordinator_core::eviction::{bytes_to_gb, gb_to_bytes};
use ic_coordinator_core::key::ObjectKey;
use ic_coordinator_core::resolve::{Resolved, TokenQuery, resolve};
use serde::Deserialize;
use serde_json::{Value, json};

use super::FleetEvictionController;
use crate::controller::Context;
use crate::controllers::prefetch::action_error;
use crate::error::{ApiError, Body, Query, Schema, default_limit, page_bounds};
use ic_coordinator_core::lax::{Model, models};

type Ctx = State<(Context, Arc<FleetEvictionController>)>;

fn salt_of(path: &str) -> String {
    if path == "_default" {
        String::new()
    } else {
        path.to_owned()
    }
}

fn l2_only(tier: LevelFilter) -> Result<(), ApiError> {
    match tier {
        LevelFilter::L2 => Ok(()),
        other => Err(ApiError::BadRequest(format!(
            "quotas apply to tier 'l2' only, not '{}'",
            other.as_str()
        ))),
    }
}

fn usage_tier(tier: LevelFilter) -> Result<StorageLevel, ApiError> {
    match tier {
        LevelFilter::L1 => Ok(StorageLevel::L1),
        LevelFilter::L2 => Ok(StorageLevel::L2),
        LevelFilter::All => Err(ApiError::BadRequest(
            "tier 'all' has no usage accounting; only 'l1', 'l2'".into(),
        )),
    }
}

fn l2() -> LevelFilter {
    LevelFilter::L2
}

#[derive(Debug, Deserialize)]
pub(super) struct TierQuery {
    #[serde(default = "l2")]
    tier: LevelFilter,
}

impl Schema for TierQuery {
    const MODEL: &'static Model = &models::TIER_QUERY;
}

#[derive(Debug, Deserialize)]
pub(super) struct PutQuota {
    limit_gb: f64,
    #[serde(default = "l2")]
    tier: LevelFilter,
}

impl Schema for PutQuota {
    const MODEL: &'static Model = &models::SET_QUOTA;
    fn valid(&self) -> bool {
        self.limit_gb >= 0.0
    }
}

pub(super) async fn put_quota(
    State((ctx, ctl)): Ctx,
    Path(salt): Path<String>,
    Body(req): Body<PutQuota>,
) -> Result<Json<Value>, ApiError> {
    if req.limit_gb < 0.0 || !req.limit_gb.is_finite() {
        return Err(ApiError::body("limit_gb", "limit_gb must be >= 0"));
    }
    l2_only(req.tier)?;
    let salt = salt_of(&salt);
    ctl.state
        .lock()
        .quotas
        .limits
        .insert(salt.clone(), gb_to_bytes(req.limit_gb));
    ctx.persist_intent().await;
    tracing::info!(cache_salt = %salt, limit_gb = req.limit_gb, "quota set");
    Ok(Json(
        json!({"cache_salt": salt, "limit_gb": req.limit_gb, "status": "ok"}),
    ))
}

fn quota_row(
    ctx: &Context,
    ctl: &FleetEvictionController,
    salt: &str,
    tier: StorageLevel,
) -> Value {
    let used = ctx.views.read(|v| v.usage.salt_bytes(tier, salt));
    let limit = match tier {
        StorageLevel::L2 => ctl.state.lock().quotas.limits.get(salt).copied(),
        StorageLevel::L1 => None,
    };
    json!({"cache_salt": salt, "quota_limit_gb": limit.map_or(0.0, bytes_to_gb),
           "quota_exists": limit.is_some(), "usage_gb": bytes_to_gb(used)})
}

pub(super) async fn get_quota(
    State((ctx, ctl)): Ctx,
    Path(salt): Path<String>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    let tier = usage_tier(q.tier)?;
    Ok(Json(quota_row(&ctx, &ctl, &salt_of(&salt), tier)))
}

async fn remove_quota(
    ctx: &Context,
    ctl: &FleetEvictionController,
    salt: String,
    tier: LevelFilter,
) -> Result<Json<Value>, ApiError> {
    l2_only(tier)?;
    let removed = ctl.state.lock().quotas.limits.remove(&salt).is_some();
    if removed {
        ctx.persist_intent().await;
    }
    Ok(Json(json!({"cache_salt": salt, "limit_gb": 0.0,
                    "status": if removed { "removed" } else { "not_found" }})))
}

pub(super) async fn delete_quota(
    State((ctx, ctl)): Ctx,
    Path(salt): Path<String>,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    remove_quota(&ctx, &ctl, salt_of(&salt), q.tier).await
}

/// `DELETE /quota/config` reaches the salt route in the reference (the
/// config route has no DELETE), so it removes the salt named `config`.
pub(super) async fn delete_config_salt(
    State((ctx, ctl)): Ctx,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    remove_quota(&ctx, &ctl, "config".to_owned(), q.tier).await
}

pub(super) async fn list_quotas(
    State((ctx, ctl)): Ctx,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    let tier = usage_tier(q.tier)?;
    let mut salts = ctx.views.read(|v| v.usage.salts(tier));
    let total: u64 = salts.values().sum();
    if tier == StorageLevel::L2 {
        for salt in ctl.state.lock().quotas.limits.keys() {
            salts.entry(salt.clone()).or_insert(0);
        }
    }
    let rows: Vec<Value> = salts
        .keys()
        .map(|s| quota_row(&ctx, &ctl, s, tier))
        .collect();
    Ok(Json(
        json!({"total_gb": bytes_to_gb(total), "by_cache_salt": rows}),
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct PutDefault {
    #[serde(default)]
    default_limit_gb: Option<f64>,
    #[serde(default = "l2")]
    tier: LevelFilter,
}

impl Schema for PutDefault {
    const MODEL: &'static Model = &models::QUOTA_CONFIG;
    fn valid(&self) -> bool {
        self.default_limit_gb.is_none_or(|g| g >= 0.0)
    }
}

pub(super) async fn put_default(
    State((ctx, ctl)): Ctx,
    Body(req): Body<PutDefault>,
) -> Result<Json<Value>, ApiError> {
    if let Some(v) = req.default_limit_gb
        && (v < 0.0 || !v.is_finite())
    {
        return Err(ApiError::body(
            "default_limit_gb",
            "default_limit_gb must be >= 0",
        ));
    }
    l2_only(req.tier)?;
    ctl.state.lock().quotas.default_limit = req.default_limit_gb.map(gb_to_bytes);
    ctx.persist_intent().await;
    Ok(Json(json!({"default_limit_gb": req.default_limit_gb})))
}

pub(super) async fn get_default(
    State((_ctx, ctl)): Ctx,
    Query(q): Query<TierQuery>,
) -> Result<Json<Value>, ApiError> {
    l2_only(q.tier)?;
    let limit = ctl.state.lock().quotas.default_limit;
    Ok(Json(json!({"default_limit_gb": limit.map(bytes_to_gb)})))
}

// === pins ===

#[derive(Debug, Deserialize)]
pub(super) struct PinRequest {
    model_name: String,
    world_size: i64,
    #[serde(default)]
    token_ids: Vec<i64>,
    #[serde(default)]
    cache_salt: String,
}

impl Schema for PinRequest {
    const MODEL: &'static Model = &models::PIN;
    fn valid(&self) -> bool {
        self.world_size >= 1
    }
}

fn resolve_tokens(
    ctx: &Context,
    model: &str,
    ws: i64,
    tokens: &[i64],
    salt: &str,
) -> Result<Resolved, ApiError> {
    if ws < 1 {
        return Err(ApiError::body("world_size", "world_size must be >= 1"));
    }
    let query = TokenQuery {
        token_ids: tokens,
        model_name: model,
        world_size: ws,
        cache_salt: salt,
    };
    resolve(&query, ctx.settings.chunk_size, ctx.settings.request_limits)
        .map_err(|e| ctx.metrics.request_refused(&e))
}

pub(super) async fn pin(ctx: Ctx, body: Body<PinRequest>) -> Result<Json<Value>, ApiError> {
    change_pins(ctx, body, true).await
}

pub(super) async fn unpin(ctx: Ctx, body: Body<PinRequest>) -> Result<Json<Value>, ApiError> {
    change_pins(ctx, body, false).await
}

/// Pins or unpins a prompt's keys; the answer counts every resolved key.
async fn change_pins(
    State((ctx, ctl)): Ctx,
    Body(req): Body<PinRequest>,
    pin: bool,
) -> Result<Json<Value>, ApiError> {
    let r = resolve_tokens(
        &ctx,
        &req.model_name,
        req.world_size,
        &req.token_ids,
        &req.cache_salt,
    )?;
    {
        let mut state = ctl.state.lock();
        if pin {
            state.pins.pin(&r.keys);
        } else {
            state.pins.unpin(&r.keys);
        }
    }
    ctx.persist_intent().await;
    let status = if pin { "pinned" } else { "unpinned" };
    Ok(Json(
        json!({"requested": r.chunks, "affected": r.keys.len(), "status": status}),
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct PinsQuery {
    #[serde(default)]
    cache_salt: String,
    #[serde(default)]
    model_name: String,
    #[serde(default)]
    offset: i64,
    #[serde(default = "default_limit")]
    limit: i64,
}

impl Schema for PinsQuery {
    const MODEL: &'static Model = &models::PINS_QUERY;
}

pub(super) async fn list_pins(
    State((_ctx, ctl)): Ctx,
    Query(q): Query<PinsQuery>,
) -> Result<Json<Value>, ApiError> {
    let (offset, limit) = page_bounds(q.offset, q.limit)?;
    let state = ctl.state.lock();
    let matching: Vec<(&ObjectKey, u64)> = state
        .pins
        .iter()
        .filter(|(k, _)| {
            (q.cache_salt.is_empty() || k.cache_salt == q.cache_salt)
                && (q.model_name.is_empty() || k.model_name == q.model_name)
        })
        .collect();
    let pins: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(|(k, c)| json!({"key": k.to_wire(), "pin_count": c}))
        .collect();
    Ok(Json(json!({"total": matching.len(), "pins": pins})))
}

// === targeted delete ===

fn all() -> LevelFilter {
    LevelFilter::All
}

#[derive(Debug, Deserialize)]
pub(super) struct DeleteRequest {
    instance_id: String,
    model_name: String,
    world_size: i64,
    #[serde(default)]
    token_ids: Vec<i64>,
    #[serde(default)]
    cache_salt: String,
    #[serde(default = "all")]
    tier: LevelFilter,
    #[serde(default)]
    force: bool,
}

impl Schema for DeleteRequest {
    const MODEL: &'static Model = &models::DELETE;
    fn valid(&self) -> bool {
        self.world_size >= 1
    }
}

pub(super) async fn delete(
    State((ctx, ctl)): Ctx,
    Body(req): Body<DeleteRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.world_size < 1 {
        return Err(ApiError::body("world_size", "world_size must be >= 1"));
    }
    let base = ctx
        .actions
        .base_url(&req.instance_id)
        .map_err(|e| action_error("delete to", &req.instance_id, e))?;
    let r = resolve_tokens(
        &ctx,
        &req.model_name,
        req.world_size,
        &req.token_ids,
        &req.cache_salt,
    )?;
    if r.chunks == 0 {
        return Ok(Json(
            json!({"instance_id": req.instance_id, "requested": 0, "affected": 0,
                              "skipped": 0, "status": "noop"}),
        ));
    }
    let expanded: Vec<ObjectKey> = {
        ctx.views.read(|views| {
            r.keys
                .iter()
                .flat_map(|k| views.directory.expand_groups(k))
                .collect()
        })
    };
    let (to_delete, pin_skipped) = if req.tier.touches_l2() && !req.force {
        let state = ctl.state.lock();
        let (pinned, free): (Vec<ObjectKey>, Vec<ObjectKey>) =
            expanded.into_iter().partition(|k| state.pins.is_pinned(k));
        (free, pinned.len())
    } else {
        (expanded, 0)
    };
    let (mut affected, mut skipped) = (0i64, 0i64);
    if !to_delete.is_empty() {
        let keys: Vec<_> = to_delete.iter().map(ObjectKey::to_wire).collect();
        let body = json!({"keys": keys, "tier": req.tier.as_str(), "force": req.force});
        match ctx.actions.delete_objects("delete", &base, &body).await {
            Ok(reply) => {
                affected = reply.get("deleted").and_then(Value::as_i64).unwrap_or(0);
                skipped = reply.get("skipped").and_then(Value::as_i64).unwrap_or(0);
            }
            Err(error) => {
                return Err(ApiError::BadGateway(format!(
                    "delete to '{}' failed: {error}",
                    req.instance_id
                )));
            }
        }
    }
    if req.force && req.tier.touches_l2() {
        let released = ctl.state.lock().pins.release(&r.keys);
        if released > 0 {
            tracing::info!(instance_id = %req.instance_id, released, "forced delete released pins");
        }
        ctx.persist_intent().await;
    }
    Ok(Json(json!({
        "instance_id": req.instance_id,
        "requested": r.chunks,
        "affected": affected,
        "skipped": skipped.saturating_add(i64::try_from(pin_skipped).unwrap_or(i64::MAX)),
        "status": "deleted",
    })))
}
