//! Index-server commands: `lookup`, `snapshot`, and the client-side
//! `fingerprint` reference.

use anyhow::{Context, bail};
use ic_index_http::Snapshot;
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::index_service_client::IndexServiceClient;
use serde_json::{Value, json};

use crate::table::render;

/// What a `lookup` sends as its key.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptKey {
    /// Token ids.
    Tokens(Vec<u32>),
    /// Text for the server's tokenizer.
    Text(String),
    /// Block fingerprints.
    Hashes(Vec<u64>),
}

/// A lookup request as the CLI builds it.
#[derive(Clone, Debug)]
pub struct Lookup {
    /// Scope fields.
    pub tenant: String,
    /// Model id.
    pub model: String,
    /// `vllm` or `sglang`.
    pub scheme: String,
    /// LoRA adapter.
    pub adapter: String,
    /// Prompt.
    pub key: PromptKey,
    /// Candidate replica ids.
    pub candidates: Vec<String>,
}

/// The wire request.
pub fn request(l: &Lookup) -> anyhow::Result<pb::LookupRouteRequest> {
    let hash_scheme = match l.scheme.as_str() {
        "vllm" => pb::HashScheme::Vllm,
        "sglang" => pb::HashScheme::Sglang,
        other => bail!("--scheme {other:?}: use vllm or sglang"),
    };
    use pb::lookup_route_request::Key;
    Ok(pb::LookupRouteRequest {
        scope: Some(pb::IndexScope {
            tenant: l.tenant.clone(),
            model: l.model.clone(),
            hash_scheme: hash_scheme as i32,
            adapter: l.adapter.clone(),
        }),
        key: Some(match &l.key {
            PromptKey::Tokens(ids) => Key::TokenIds(pb::TokenIds { ids: ids.clone() }),
            PromptKey::Text(t) => Key::PromptText(t.clone()),
            PromptKey::Hashes(h) => Key::BlockHashes(pb::BlockHashes { hashes: h.clone() }),
        }),
        candidate_replicas: l.candidates.clone(),
        // An operator's question, not a routed request.
        observe_only: true,
        ..Default::default()
    })
}

fn tier_name(t: i32) -> &'static str {
    match pb::Tier::try_from(t) {
        Ok(pb::Tier::T1) => "T1",
        Ok(pb::Tier::T2) => "T2",
        _ => "?",
    }
}

/// The response as JSON (stable field names, enums by name).
pub fn response_json(r: &pb::LookupRouteResponse) -> Value {
    let score = |c: &pb::CandidateScore| {
        json!({
            "replicaId": c.replica.as_ref().map(|r| r.replica_id.clone()),
            "address": c.replica.as_ref().map(|r| r.address.clone()),
            "matchedBlocks": c.matched_blocks,
            "matchedTokens": c.matched_tokens,
            "tier": tier_name(c.tier),
        })
    };
    json!({
        "outcome": pb::LookupOutcome::try_from(r.outcome).map(|o| o.as_str_name()).unwrap_or("UNKNOWN"),
        "noHintReason": (r.outcome == pb::LookupOutcome::NoHint as i32).then(|| {
            pb::NoHintReason::try_from(r.no_hint_reason).map(|o| o.as_str_name()).unwrap_or("UNKNOWN")
        }),
        "detail": r.detail,
        "best": r.best.as_ref().map(score),
        "candidates": r.candidates.iter().map(score).collect::<Vec<_>>(),
        "blockSize": r.block_size,
        "promptBlocks": r.prompt_blocks,
    })
}

/// The response for people.
pub fn response_text(r: &pb::LookupRouteResponse) -> String {
    let mut out = String::new();
    if r.outcome == pb::LookupOutcome::PrefixMatch as i32 {
        let best = r.best.as_ref();
        out.push_str(&format!(
            "PREFIX_MATCH: route to {} ({}), {} of {} blocks ({} tokens) at {}\n\n",
            best.and_then(|b| b.replica.as_ref())
                .map_or("?", |r| r.replica_id.as_str()),
            best.and_then(|b| b.replica.as_ref())
                .map_or("?", |r| r.address.as_str()),
            best.map_or(0, |b| b.matched_blocks),
            r.prompt_blocks,
            best.map_or(0, |b| b.matched_tokens),
            best.map_or("?", |b| tier_name(b.tier)),
        ));
        let rows: Vec<Vec<String>> = r
            .candidates
            .iter()
            .map(|c| {
                vec![
                    c.replica
                        .as_ref()
                        .map(|r| r.replica_id.clone())
                        .unwrap_or_default(),
                    c.replica
                        .as_ref()
                        .map(|r| r.address.clone())
                        .unwrap_or_default(),
                    c.matched_blocks.to_string(),
                    c.matched_tokens.to_string(),
                    tier_name(c.tier).to_owned(),
                ]
            })
            .collect();
        out.push_str(&render(
            &["REPLICA", "ADDRESS", ">BLOCKS", ">TOKENS", "TIER"],
            &rows,
        ));
    } else {
        out.push_str(&format!(
            "NO_HINT ({}): {}\nroute by your own policy (e.g. least loaded); prompt has {} blocks of {} tokens\n",
            pb::NoHintReason::try_from(r.no_hint_reason)
                .map(|o| o.as_str_name())
                .unwrap_or("UNKNOWN"),
            r.detail,
            r.prompt_blocks,
            r.block_size
        ));
    }
    out
}

/// The token in `--token-file`, if given.
pub fn read_token(path: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    path.map(|p| {
        std::fs::read_to_string(p)
            .map(|t| t.trim().to_owned())
            .with_context(|| format!("--token-file {}", p.display()))
    })
    .transpose()
}

/// A channel to the index server's gRPC port at `grpc` (`host:port`):
/// TLS trusting `ca_file` when one is given, plaintext otherwise.
pub async fn channel(
    grpc: &str,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<tonic::transport::Channel> {
    let ca = ca_file
        .map(|p| std::fs::read(p).with_context(|| format!("--index-ca-file {}", p.display())))
        .transpose()?;
    let scheme = if ca.is_some() { "https" } else { "http" };
    let endpoint =
        ic_proto::channel::endpoint(&format!("{scheme}://{grpc}"), ca.as_deref(), "--index-grpc")
            .map_err(anyhow::Error::msg)?;
    endpoint.connect().await.map_err(|e| {
        let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
        anyhow::anyhow!(
            "cannot reach the index server's gRPC port at {grpc}: {why} (is it running? set \
             --index-grpc or IC_INDEX_GRPC; --index-ca-file when it serves TLS)"
        )
    })
}

/// Sends a lookup, with `token` as its bearer token.
pub async fn lookup(
    grpc: &str,
    ca_file: Option<&std::path::Path>,
    l: &Lookup,
    token: Option<&str>,
) -> anyhow::Result<pb::LookupRouteResponse> {
    let mut req = tonic::Request::new(request(l)?);
    ic_telemetry::otel::inject_metadata(&tracing::Span::current(), req.metadata_mut());
    if let Some(token) = token {
        let value = ic_proto::bearer::metadata(token).context("--token-file: not a token")?;
        req.metadata_mut().insert("authorization", value);
    }
    let mut client = IndexServiceClient::new(channel(grpc, ca_file).await?);
    match client.lookup_route(req).await {
        Ok(r) => Ok(r.into_inner()),
        Err(status) => bail!(
            "the index server refused the lookup ({:?}): {}",
            status.code(),
            status.message()
        ),
    }
}

/// Fetches `/snapshot`, parsed as the one wire type the index server
/// writes (a field it no longer sends is an error, not a zero).
pub async fn snapshot(http: &str, token: Option<&str>) -> anyhow::Result<Snapshot> {
    let url = format!("http://{http}/snapshot");
    let mut request = reqwest::Client::new()
        .get(&url)
        .headers(crate::trace_headers());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.with_context(|| {
        format!("cannot reach the index server's HTTP port at {http}: is it running? (set --index-http or IC_INDEX_HTTP)")
    })?;
    let status = response.status();
    if !status.is_success() {
        bail!("GET {url}: HTTP {status}");
    }
    response
        .json()
        .await
        .with_context(|| format!("GET {url}: not a snapshot this icctl understands"))
}

/// The snapshot for people.
pub fn snapshot_text(s: &Snapshot) -> String {
    let opt = |v: Option<&str>| v.unwrap_or("-").to_owned();
    let rows: Vec<Vec<String>> = s
        .replicas
        .iter()
        .map(|r| {
            let t2 = match (r.tier2_hits, r.tier2_queries) {
                (Some(h), Some(q)) if q > 0 => format!("{:.1}%", h as f64 * 100.0 / q as f64),
                (Some(_), Some(_)) => "0 queries".into(),
                _ => "-".into(),
            };
            vec![
                r.tenant.clone(),
                format!("{}/{}", r.replica_id, r.dp_rank),
                r.model.clone(),
                r.hash_scheme.clone(),
                r.prefix_count.to_string(),
                r.t1_count.to_string(),
                r.block_size.to_string(),
                opt(r.last_event_at.as_deref()),
                t2,
            ]
        })
        .collect();
    let mut out = format!(
        "{} entries over {} replicas (at {})\n\n",
        s.entries,
        rows.len(),
        s.generated_at
    );
    out.push_str(&render(
        &[
            "TENANT",
            "REPLICA/RANK",
            "MODEL",
            "SCHEME",
            ">BLOCKS",
            ">T1",
            ">BLOCK-SIZE",
            "LAST-EVENT",
            ">T2-HIT",
        ],
        &rows,
    ));
    out
}

/// Fingerprints of the full blocks of `tokens` (docs/fingerprints.md).
pub fn fingerprint_json(tokens: &[u32], block_size: usize, parent: Option<u64>) -> Value {
    let fps = ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(
        parent.map(ic_kvevents::Fingerprint),
        tokens,
        block_size,
    ));
    json!({
        "blockSize": block_size,
        "fullBlocks": fps.len(),
        "ignoredTokens": tokens.len() - fps.len() * block_size.max(1),
        "fingerprints": fps,
        "fingerprintsHex": fps.iter().map(|f| format!("0x{f:016x}")).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_match_the_published_vectors() {
        let v = fingerprint_json(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, None);
        assert_eq!(
            v["fingerprintsHex"],
            json!(["0xcf97adeedb59e05b", "0x73d4d15a627eab4e"])
        );
        assert_eq!(v["ignoredTokens"], 1);
    }

    #[test]
    fn renders_no_hint_with_advice() {
        let r = pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::NoHint as i32,
            no_hint_reason: pb::NoHintReason::UnknownModel as i32,
            detail: "no events".into(),
            block_size: 16,
            ..Default::default()
        };
        let text = response_text(&r);
        assert!(
            text.starts_with("NO_HINT (UNKNOWN_MODEL): no events"),
            "{text}"
        );
        assert_eq!(response_json(&r)["noHintReason"], "UNKNOWN_MODEL");
    }

    #[test]
    fn bad_scheme_is_explained() {
        let l = Lookup {
            tenant: "t".into(),
            model: "m".into(),
            scheme: "llama".into(),
            adapter: String::new(),
            key: PromptKey::Tokens(vec![]),
            candidates: vec![],
        };
        assert!(
            request(&l)
                .unwrap_err()
                .to_string()
                .contains("vllm or sglang")
        );
    }
}
