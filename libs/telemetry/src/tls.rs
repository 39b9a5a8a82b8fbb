//! Serving certificates and trust roots shared by every TLS server and
//! client here.
//!
//! A serving pair is loaded from mounted PEM files at start-up and re-read
//! when the files change (cert-manager rotates the Secret, the kubelet swaps
//! the mounted files). A broken new pair never replaces a working one: the
//! old certificate keeps serving and the failure is logged and reported.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// Why a certificate pair cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{path} holds no PEM certificate")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no usable PEM private key.
    #[error("{path} holds no usable PEM private key: {detail}")]
    BadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The key does not belong to the certificate, or is of an unsupported type.
    #[error("certificate {cert} and key {key} cannot be served together: {source}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
    /// The TLS configuration could not be built.
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// The crypto provider we serve with (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a certificate chain and key from PEM and checks they match.
pub fn parse_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::BadKey {
        path: key_path.to_owned(),
        detail: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::Mismatch {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// What one check of the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The files are as last seen.
    Unchanged,
    /// A new pair is now served.
    Reloaded,
    /// The files changed but cannot be served; the old pair stays.
    Failed(String),
}

/// The certificate currently served: re-read from disk on change (files
/// mode), or installed from the managed Secret ([`CertStore::install_pem`]).
#[derive(Debug)]
pub struct CertStore {
    /// `(cert, key)` paths in files mode.
    files: Option<(PathBuf, PathBuf)>,
    provider: Arc<CryptoProvider>,
    /// `None` until a first pair is installed (managed mode before its
    /// first sync): handshakes fail rather than serve nothing valid.
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// The file contents last tried (served or rejected), so an unchanged
    /// broken pair is reported once, not on every poll.
    last_seen: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
}

impl CertStore {
    /// Loads the pair; failing here fails start-up.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let provider = provider();
        let cert_pem = read(cert_path)?;
        let key_pem = read(key_path)?;
        let key = parse_pair(&cert_pem, &key_pem, cert_path, key_path, &provider)?;
        Ok(Self {
            files: Some((cert_path.to_owned(), key_path.to_owned())),
            provider,
            current: RwLock::new(Some(Arc::new(key))),
            last_seen: Mutex::new(Some((cert_pem, key_pem))),
        })
    }

    /// A store with nothing to serve yet, filled by [`CertStore::install_pem`].
    pub fn empty() -> Self {
        Self {
            files: None,
            provider: provider(),
            current: RwLock::new(None),
            last_seen: Mutex::new(None),
        }
    }

    /// The end-entity certificate currently served (DER).
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|k| k.cert.first().cloned())
    }

    /// Serves `cert_pem`/`key_pem` from now on unless they are what is
    /// served already; a pair that does not parse or match keeps the old one.
    /// `origin` names where the pair came from, for errors.
    pub fn install_pem(&self, cert_pem: &[u8], key_pem: &[u8], origin: &str) -> ReloadOutcome {
        let mut last = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last
            .as_ref()
            .is_some_and(|(c, k)| c.as_slice() == cert_pem && k.as_slice() == key_pem)
        {
            return ReloadOutcome::Unchanged;
        }
        let cert_label = PathBuf::from(format!("{origin} tls.crt"));
        let key_label = PathBuf::from(format!("{origin} tls.key"));
        let parsed = parse_pair(cert_pem, key_pem, &cert_label, &key_label, &self.provider);
        *last = Some((cert_pem.to_vec(), key_pem.to_vec()));
        match parsed {
            Ok(key) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(key));
                ReloadOutcome::Reloaded
            }
            Err(error) => ReloadOutcome::Failed(error.to_string()),
        }
    }

    /// Re-reads the files and swaps in a new pair when they changed (files
    /// mode; a managed store is never changed here).
    pub fn reload_if_changed(&self) -> ReloadOutcome {
        let Some((cert_path, key_path)) = &self.files else {
            return ReloadOutcome::Unchanged;
        };
        let pair = read(cert_path).and_then(|c| Ok((c, read(key_path)?)));
        let mut last = self
            .last_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (cert_pem, key_pem) = match pair {
            Ok(pair) => pair,
            Err(error) => {
                // Missing files mid-rotation: report once per disappearance.
                if last.take().is_some() {
                    return ReloadOutcome::Failed(error.to_string());
                }
                return ReloadOutcome::Unchanged;
            }
        };
        if last
            .as_ref()
            .is_some_and(|(c, k)| *c == cert_pem && *k == key_pem)
        {
            return ReloadOutcome::Unchanged;
        }
        let parsed = parse_pair(&cert_pem, &key_pem, cert_path, key_path, &self.provider);
        *last = Some((cert_pem, key_pem));
        match parsed {
            Ok(key) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(key));
                ReloadOutcome::Reloaded
            }
            Err(error) => ReloadOutcome::Failed(error.to_string()),
        }
    }

    /// The rustls server configuration serving from this store, with ALPN
    /// for HTTP/2 and HTTP/1.1.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Polls the files every `interval` until `shutdown` (returns at once
    /// for a managed store).
    /// `reloaded` hears of every reload: `true` when a new pair is served,
    /// `false` when a changed pair was refused.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        reloaded: impl Fn(bool) + Send + 'static,
        shutdown: CancellationToken,
    ) {
        let Some((cert_path, _)) = self.files.clone() else {
            return;
        };
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let store = self.clone();
            let outcome = tokio::task::spawn_blocking(move || store.reload_if_changed())
                .await
                .unwrap_or_else(|e| ReloadOutcome::Failed(format!("reload task failed: {e}")));
            match outcome {
                ReloadOutcome::Unchanged => {}
                ReloadOutcome::Reloaded => {
                    reloaded(true);
                    tracing::info!(cert = %cert_path.display(), "serving certificate reloaded");
                }
                ReloadOutcome::Failed(error) => {
                    reloaded(false);
                    tracing::error!(%error, cert = %cert_path.display(), "serving certificate reload failed; keeping the previous certificate");
                }
            }
        }
    }
}

/// The CA certificates in `pem` (read from `origin`, named in errors).
pub fn roots(pem: &[u8], origin: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem).filter_map(Result::ok) {
        roots.add(cert).map_err(|source| TlsError::Mismatch {
            cert: origin.to_owned(),
            key: origin.to_owned(),
            source,
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            path: origin.to_owned(),
        });
    }
    Ok(roots)
}

/// Reads a CA bundle file (PEM), failing with the file named when it
/// cannot be read or holds no certificate.
pub fn read_ca_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(path)?;
    roots(&pem, path)?;
    Ok(pem)
}

/// A client configuration trusting only the CAs in `ca_pem`, offering
/// `alpn` (HTTP clients: `h2`, `http/1.1`; empty for none).
pub fn client_config(
    ca_pem: &[u8],
    origin: &Path,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, TlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots(ca_pem, origin)?)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn reloads_changed_pairs_and_keeps_the_old_one_on_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = pair("one");
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let store = CertStore::load(&cert, &key).unwrap();
        let first = store.current_leaf().unwrap();
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Unchanged);

        // A half-written rotation (new cert, old key) is refused once.
        let (c2, k2) = pair("two");
        std::fs::write(&cert, &c2).unwrap();
        assert!(matches!(
            store.reload_if_changed(),
            ReloadOutcome::Failed(_)
        ));
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Unchanged);
        assert_eq!(store.current_leaf().unwrap(), first);

        std::fs::write(&key, &k2).unwrap();
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Reloaded);
        assert_ne!(store.current_leaf().unwrap(), first);

        std::fs::write(&key, "garbage").unwrap();
        assert!(matches!(
            store.reload_if_changed(),
            ReloadOutcome::Failed(_)
        ));
        assert_ne!(
            store.current_leaf().unwrap(),
            first,
            "still serving pair two"
        );
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.crt");
        let err = CertStore::load(&missing, &missing).unwrap_err();
        assert!(err.to_string().contains("nope.crt"), "{err}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let err = CertStore::load(&junk, &junk).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
    }
}
