//! `icctl check`: does an installation answer? The index server (HTTP
//! readiness, gRPC health, one LookupRoute round trip), the coordinator, and
//! the webhook's HTTPS endpoint with the certificate its CA bundle must
//! verify for the Service name (what the API server checks). The chart's
//! `helm test` pod runs it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::index::{self, Lookup, PromptKey};
use crate::table;

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct CheckTargets {
    /// Index server gRPC `host:port`.
    pub index_grpc: String,
    /// CA bundle of a TLS gRPC port.
    pub index_ca_file: Option<std::path::PathBuf>,
    /// Index server HTTP `host:port`.
    pub index_http: String,
    /// Coordinator base URL, unless skipped.
    pub coordinator: Option<String>,
    /// Webhook `https://host:port`, unless skipped.
    pub webhook: Option<String>,
    /// PEM of the CA(s) the webhook's certificate must chain to.
    pub webhook_ca: Option<String>,
    /// Time allowed per check.
    pub timeout: Duration,
}

/// A failed check run: the report is still worth printing.
#[derive(Debug, thiserror::Error)]
#[error("{failed} of {total} checks failed")]
pub struct ChecksFailed {
    /// The rendered report.
    pub report: String,
    /// How many failed.
    pub failed: usize,
    /// How many ran.
    pub total: usize,
}

struct Outcome {
    name: &'static str,
    target: String,
    result: anyhow::Result<String>,
    took: Duration,
}

async fn timed<F>(name: &'static str, target: String, limit: Duration, check: F) -> Outcome
where
    F: Future<Output = anyhow::Result<String>>,
{
    let start = Instant::now();
    let result = match tokio::time::timeout(limit, check).await {
        Ok(r) => r,
        Err(_) => Err(anyhow::anyhow!("no answer within {limit:?}")),
    };
    Outcome {
        name,
        target,
        result,
        took: start.elapsed(),
    }
}

async fn http_status(url: &str) -> anyhow::Result<String> {
    let response = reqwest::get(url)
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("GET {url} answered {status}");
    }
    Ok(format!("{status}"))
}

async fn grpc_health(grpc: &str, ca_file: Option<&std::path::Path>) -> anyhow::Result<String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let channel = index::channel(grpc, ca_file).await?;
    let mut client = HealthClient::new(channel);
    let answer = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .context("grpc.health.v1.Health/Check")?
        .into_inner();
    match ServingStatus::try_from(answer.status) {
        Ok(ServingStatus::Serving) => Ok("SERVING".to_owned()),
        other => bail!("health status {other:?}"),
    }
}

async fn lookup_round_trip(
    grpc: &str,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    // Anonymous: with access control on, a refusal is the server answering.
    let answer = index::lookup(
        grpc,
        ca_file,
        &Lookup {
            tenant: "icctl-check".into(),
            model: "icctl-check".into(),
            scheme: "vllm".into(),
            adapter: String::new(),
            key: PromptKey::Hashes(vec![1]),
            candidates: Vec::new(),
        },
        None,
    )
    .await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) if e.to_string().contains("(Unauthenticated)") => {
            return Ok("answered UNAUTHENTICATED (access control is on)".to_owned());
        }
        Err(e) => return Err(e),
    };
    Ok(format!(
        "answered {}",
        ic_proto::index_v1::LookupOutcome::try_from(answer.outcome).map_or_else(
            |_| answer.outcome.to_string(),
            |o| o.as_str_name().to_owned()
        )
    ))
}

/// A TLS connection that trusts only `ca_pem` and checks the certificate for
/// the URL's host, then `GET /healthz`.
async fn webhook_tls(url: &str, ca_pem: Option<&str>) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("https://")
        .with_context(|| format!("--webhook {url:?} is not an https:// URL"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .with_context(|| format!("port of {url:?}"))?,
        ),
        None => (authority, 443),
    };
    let ca_pem =
        ca_pem.context("the webhook check needs its CA (--webhook-ca or --webhook-ca-base64)")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.context("the webhook CA is not PEM")?)
            .context("the webhook CA is not a usable certificate")?;
    }
    if roots.is_empty() {
        bail!("the webhook CA holds no certificate");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .with_context(|| format!("connecting to {host}:{port}"))?;
    let name =
        ServerName::try_from(host.to_owned()).with_context(|| format!("{host:?} as a TLS name"))?;
    let mut tls = connector.connect(name, tcp).await.with_context(|| {
        format!("TLS with {host}:{port} (the certificate must verify with the CA for {host})")
    })?;
    tls.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.ok();
    let text = String::from_utf8_lossy(&answer);
    let status = text.lines().next().unwrap_or_default().to_owned();
    if !status.contains(" 200") {
        bail!("GET /healthz answered {status:?}");
    }
    Ok("TLS verified, /healthz 200".to_owned())
}

/// Runs every check; `json` renders for machines.
pub async fn run(targets: &CheckTargets, json: bool) -> anyhow::Result<String> {
    let limit = targets.timeout;
    let mut outcomes = vec![
        timed(
            "index server /ready",
            targets.index_http.clone(),
            limit,
            http_status(&format!("http://{}/ready", targets.index_http)),
        )
        .await,
        timed(
            "index server gRPC health",
            targets.index_grpc.clone(),
            limit,
            grpc_health(&targets.index_grpc, targets.index_ca_file.as_deref()),
        )
        .await,
        timed(
            "index server LookupRoute",
            targets.index_grpc.clone(),
            limit,
            lookup_round_trip(&targets.index_grpc, targets.index_ca_file.as_deref()),
        )
        .await,
    ];
    if let Some(coordinator) = &targets.coordinator {
        let base = coordinator.trim_end_matches('/');
        outcomes.push(
            timed(
                "coordinator /ready",
                base.to_owned(),
                limit,
                http_status(&format!("{base}/ready")),
            )
            .await,
        );
    }
    if let Some(webhook) = &targets.webhook {
        outcomes.push(
            timed(
                "webhook HTTPS",
                webhook.clone(),
                limit,
                webhook_tls(webhook, targets.webhook_ca.as_deref()),
            )
            .await,
        );
    }
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let report = if json {
        let rows: Vec<Value> = outcomes
            .iter()
            .map(|o| match &o.result {
                Ok(detail) => json!({"check": o.name, "target": o.target, "ok": true, "detail": detail, "ms": o.took.as_millis()}),
                Err(e) => json!({"check": o.name, "target": o.target, "ok": false, "detail": format!("{e:#}"), "ms": o.took.as_millis()}),
            })
            .collect();
        format!("{}\n", serde_json::to_string_pretty(&rows)?)
    } else {
        let rows: Vec<Vec<String>> = outcomes
            .iter()
            .map(|o| {
                let (state, detail) = match &o.result {
                    Ok(d) => ("ok", d.clone()),
                    Err(e) => ("FAILED", format!("{e:#}")),
                };
                vec![
                    o.name.to_owned(),
                    o.target.clone(),
                    state.to_owned(),
                    detail,
                    format!("{}", o.took.as_millis()),
                ]
            })
            .collect();
        table::render(&["CHECK", "TARGET", "RESULT", "DETAIL", ">MS"], &rows)
    };
    if failed > 0 {
        return Err(ChecksFailed {
            report,
            failed,
            total: outcomes.len(),
        }
        .into());
    }
    Ok(report)
}
