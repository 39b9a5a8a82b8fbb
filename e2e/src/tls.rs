//! Test certificate authorities: a CA and serving certificates it signs,
//! written as the PEM files servers and clients are pointed at.

use std::path::{Path, PathBuf};

/// A self-signed CA that signs serving certificates.
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// A new CA with a fresh key.
    ///
    /// # Panics
    /// If rcgen cannot issue (it always can for these parameters).
    #[allow(clippy::expect_used)]
    pub fn new() -> Self {
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let key = rcgen::KeyPair::generate().expect("CA key");
        Self {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).expect("self-signed CA"),
        }
    }

    /// The CA certificate (PEM).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate and key (PEM) for `names` (DNS names or IP
    /// addresses).
    ///
    /// # Panics
    /// If rcgen cannot issue.
    #[allow(clippy::expect_used)]
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .expect("leaf parameters")
            .signed_by(&key, &*self.issuer)
            .expect("signed leaf");
        (cert.pem(), key.serialize_pem())
    }

    /// Writes a loopback serving pair (`localhost`, `127.0.0.1`) as
    /// `tls.crt`/`tls.key` and this CA as `ca.crt` into `dir`; returns the
    /// three paths.
    ///
    /// # Panics
    /// If the files cannot be written.
    #[allow(clippy::expect_used)]
    pub fn write_loopback(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let (cert, key) = self.issue(&["localhost", "127.0.0.1"]);
        let paths = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
        std::fs::write(&paths.0, cert).expect("write tls.crt");
        std::fs::write(&paths.1, key).expect("write tls.key");
        std::fs::write(&paths.2, self.pem()).expect("write ca.crt");
        paths
    }
}
