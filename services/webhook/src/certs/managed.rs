//! Managed certificates: the webhook keeps its CA and serving certificate in
//! one Secret, renews them before they expire ([`super::authority`]), serves
//! the stored pair without a restart, and writes the CA bundle into its
//! webhook configurations' `caBundle`.
//!
//! Every replica runs the same loop. Writes are guarded by the Secret's
//! `resourceVersion`, so when replicas race only one renewal lands and the
//! others adopt it on their next read; between a renewal and a replica's next
//! check it keeps serving its previous certificate, which is still valid (and
//! still trusted: renewals happen with a third of the lifetime left, and a
//! new CA is added to the bundle beside the old one).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ic_clock::Backoff;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

use super::authority::{self, Bundle, Renewal, Settings, keys};
use crate::metrics::Metrics;
use crate::tls::{CertStore, ReloadOutcome};

/// Field manager of our writes.
const MANAGER: &str = "ic-webhook";

/// Where the certificates live and who trusts them.
#[derive(Clone, Debug)]
pub struct ManagedConfig {
    /// The Secret's name.
    pub secret: String,
    /// Its namespace (the webhook's own).
    pub namespace: String,
    /// MutatingWebhookConfigurations whose `caBundle` we keep.
    pub mutating: Vec<String>,
    /// ValidatingWebhookConfigurations likewise.
    pub validating: Vec<String>,
    /// What to issue.
    pub settings: Settings,
}

/// Why one pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ManagedError {
    /// The API server refused or could not be reached.
    #[error("{step}: {source}")]
    Kube {
        /// What we were doing.
        step: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// Certificates could not be issued.
    #[error(transparent)]
    Authority(#[from] authority::AuthorityError),
    /// Replicas kept overwriting each other's renewals.
    #[error("the Secret kept changing under us (write conflicts)")]
    Contended,
    /// The stored serving pair cannot be served.
    #[error("the stored serving certificate cannot be served: {0}")]
    Unservable(String),
}

impl ManagedError {
    /// Metric label.
    pub fn step(&self) -> &'static str {
        match self {
            Self::Kube { step, .. } => step,
            Self::Authority(_) => "issue",
            Self::Contended => "conflict",
            Self::Unservable(_) => "serve",
        }
    }
}

fn kube(step: &'static str) -> impl FnOnce(kube::Error) -> ManagedError {
    move |source| ManagedError::Kube { step, source }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// A renewal this replica wrote.
    pub renewed: Option<Renewal>,
    /// Whether a new pair is now served.
    pub reloaded: bool,
    /// Webhook configurations whose `caBundle` was updated.
    pub ca_bundles_written: usize,
    /// Configured webhook configurations that do not exist.
    pub missing_configurations: Vec<String>,
}

/// The managed-certificate loop's state.
#[derive(Clone)]
pub struct ManagedCertificates {
    client: kube::Client,
    config: ManagedConfig,
    store: Arc<CertStore>,
    metrics: Metrics,
}

impl std::fmt::Debug for ManagedCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedCertificates")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn text(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

fn bundle_of(secret: &Secret) -> Bundle {
    Bundle {
        tls_crt: text(secret, keys::TLS_CRT),
        tls_key: text(secret, keys::TLS_KEY),
        ca_crt: text(secret, keys::CA_CRT),
        ca_key: text(secret, keys::CA_KEY),
    }
}

fn data_of(bundle: &Bundle) -> BTreeMap<String, ByteString> {
    [
        (keys::TLS_CRT, &bundle.tls_crt),
        (keys::TLS_KEY, &bundle.tls_key),
        (keys::CA_CRT, &bundle.ca_crt),
        (keys::CA_KEY, &bundle.ca_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
    .collect()
}

impl ManagedCertificates {
    /// The loop for `config`, serving through `store`.
    pub fn new(
        client: kube::Client,
        config: ManagedConfig,
        store: Arc<CertStore>,
        metrics: Metrics,
    ) -> Self {
        Self {
            client,
            config,
            store,
            metrics,
        }
    }

    fn origin(&self) -> String {
        format!("Secret {}/{}", self.config.namespace, self.config.secret)
    }

    /// Reads the Secret, renews what is due, serves the stored pair and
    /// brings every configured `caBundle` up to date.
    pub async fn sync_once(&self) -> Result<SyncReport, ManagedError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let mut report = SyncReport::default();
        let mut bundle = None;
        for _attempt in 0..3 {
            let stored = secrets
                .get_opt(&self.config.secret)
                .await
                .map_err(kube("read the certificate Secret"))?;
            let current = stored.as_ref().map(bundle_of);
            let Some((next, renewal, why)) =
                authority::renew(current.as_ref(), &self.config.settings, SystemTime::now())?
            else {
                bundle = current;
                break;
            };
            let written = match stored {
                None => {
                    let secret = Secret {
                        metadata: ObjectMeta {
                            name: Some(self.config.secret.clone()),
                            namespace: Some(self.config.namespace.clone()),
                            labels: Some(BTreeMap::from([
                                (
                                    "app.kubernetes.io/part-of".to_owned(),
                                    "inference-cache".to_owned(),
                                ),
                                (
                                    "app.kubernetes.io/component".to_owned(),
                                    "webhook-certificates".to_owned(),
                                ),
                            ])),
                            ..ObjectMeta::default()
                        },
                        type_: Some("kubernetes.io/tls".to_owned()),
                        data: Some(data_of(&next)),
                        ..Secret::default()
                    };
                    secrets.create(&post_params(), &secret).await
                }
                Some(mut secret) => {
                    secret.data = Some(data_of(&next));
                    secret.string_data = None;
                    secrets
                        .replace(&self.config.secret, &post_params(), &secret)
                        .await
                }
            };
            match written {
                Ok(_) => {
                    tracing::info!(
                        secret = %self.origin(),
                        renewal = renewal.label(),
                        reason = why,
                        "issued webhook certificates"
                    );
                    self.metrics.certificate_renewed(renewal.label());
                    report.renewed = Some(renewal);
                    bundle = Some(next);
                    break;
                }
                // Another replica wrote first: read what it wrote.
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(kube("write the certificate Secret")(e)),
            }
        }
        let bundle = bundle.ok_or(ManagedError::Contended)?;
        match self.store.install_pem(
            bundle.tls_crt.as_bytes(),
            bundle.tls_key.as_bytes(),
            &self.origin(),
        ) {
            ReloadOutcome::Unchanged => {}
            ReloadOutcome::Reloaded => {
                self.metrics.tls_reload(true);
                report.reloaded = true;
                tracing::info!(secret = %self.origin(), "serving the stored certificate");
            }
            ReloadOutcome::Failed(e) => {
                self.metrics.tls_reload(false);
                return Err(ManagedError::Unservable(e));
            }
        }
        self.metrics
            .set_certificate_expiry("serving", authority::expiry(&bundle.tls_crt));
        self.metrics
            .set_certificate_expiry("ca", authority::expiry(&bundle.ca_crt));
        self.sync_ca_bundles(&bundle, &mut report).await?;
        Ok(report)
    }

    async fn sync_ca_bundles(
        &self,
        bundle: &Bundle,
        report: &mut SyncReport,
    ) -> Result<(), ManagedError> {
        // The field holds the PEM bytes (base64 only on the wire).
        let ca = ByteString(bundle.ca_crt.clone().into_bytes());
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        for name in &self.config.mutating {
            sync_ca_bundle(&mutating, name, &ca, report).await?;
        }
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        for name in &self.config.validating {
            sync_ca_bundle(&validating, name, &ca, report).await?;
        }
        if report.ca_bundles_written > 0 {
            self.metrics.ca_bundles_written(report.ca_bundles_written);
            tracing::info!(
                count = report.ca_bundles_written,
                "wrote the CA bundle into webhook configurations"
            );
        }
        Ok(())
    }

    /// Syncs until a serving certificate is in place (retrying with a capped
    /// backoff), or `shutdown`.
    pub async fn first_sync(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<SyncReport, ManagedError> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            match self.sync_once().await {
                Ok(report) => return Ok(report),
                Err(e) => {
                    self.metrics.certificate_error(e.step());
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis(), "cannot set up the webhook certificates yet");
                    tokio::select! {
                        () = shutdown.cancelled() => return Err(e),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Syncs every `interval` until `shutdown`.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
            match self.sync_once().await {
                Ok(report) if !report.missing_configurations.is_empty() => {
                    tracing::warn!(missing = ?report.missing_configurations, "webhook configurations to write the CA bundle into do not exist");
                }
                Ok(_) => {}
                Err(e) => {
                    self.metrics.certificate_error(e.step());
                    tracing::warn!(error = %e, "webhook certificate check failed; serving the previous certificate");
                }
            }
        }
    }
}

/// A webhook configuration kind: its webhooks' client configurations.
trait WebhookConfiguration:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
{
    /// What the API server dials for each webhook.
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig>;
}

impl WebhookConfiguration for MutatingWebhookConfiguration {
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig> {
        self.webhooks
            .iter_mut()
            .flatten()
            .map(|w| &mut w.client_config)
            .collect()
    }
}

impl WebhookConfiguration for ValidatingWebhookConfiguration {
    fn client_configs(&mut self) -> Vec<&mut WebhookClientConfig> {
        self.webhooks
            .iter_mut()
            .flatten()
            .map(|w| &mut w.client_config)
            .collect()
    }
}

/// Sets `ca` as every webhook's `caBundle` in configuration `name`, if any
/// differs. A concurrent change (409) or deletion (404) is left to the next pass.
async fn sync_ca_bundle<K: WebhookConfiguration>(
    api: &Api<K>,
    name: &str,
    ca: &ByteString,
    report: &mut SyncReport,
) -> Result<(), ManagedError> {
    let Some(mut config) = api
        .get_opt(name)
        .await
        .map_err(kube("read a webhook configuration"))?
    else {
        report.missing_configurations.push(name.to_owned());
        return Ok(());
    };
    let mut changed = false;
    for client in config.client_configs() {
        if client.ca_bundle.as_ref() != Some(ca) {
            client.ca_bundle = Some(ca.clone());
            changed = true;
        }
    }
    if !changed {
        return Ok(());
    }
    match api.replace(name, &post_params(), &config).await {
        Ok(_) => report.ca_bundles_written += 1,
        Err(e) if is_conflict(&e) || is_not_found(&e) => {}
        Err(e) => return Err(kube("write a webhook configuration")(e)),
    }
    Ok(())
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(MANAGER.to_owned()),
        ..PostParams::default()
    }
}
