//! The webhook's own small certificate authority, as pure functions over the
//! PEM the Secret holds and the current time: whether what is stored is still
//! good, and what to store instead when it is not. No I/O.
//!
//! Rules:
//! * the serving certificate names the webhook Service (`<svc>`,
//!   `<svc>.<ns>`, `<svc>.<ns>.svc`, `<svc>.<ns>.svc.<domain>`), is signed by
//!   the current CA and is renewed once less than a third of its lifetime is
//!   left (never outliving the CA);
//! * the CA is renewed likewise; `ca.crt` (what goes into every webhook
//!   configuration's `caBundle`) then holds the new CA and every older one
//!   that has not expired, so an API server that still sees a replica serving
//!   the old certificate keeps trusting it through the rollover;
//! * anything unreadable is replaced, never trusted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Keys of the Secret.
pub mod keys {
    /// The serving certificate (PEM).
    pub const TLS_CRT: &str = "tls.crt";
    /// Its private key (PEM).
    pub const TLS_KEY: &str = "tls.key";
    /// Every CA to trust (PEM bundle): the current one first.
    pub const CA_CRT: &str = "ca.crt";
    /// The current CA's private key (PEM).
    pub const CA_KEY: &str = "ca.key";
}

/// Clock skew tolerated between this webhook and the API server: new
/// certificates are valid from this long ago (at most a tenth of their life).
const BACKDATE: Duration = Duration::from_secs(300);
/// Most CA certificates kept in the bundle.
const MAX_TRUSTED_CAS: usize = 3;

/// What the authority issues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The webhook Service's name.
    pub service: String,
    /// Its namespace.
    pub namespace: String,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// Lifetime of a serving certificate.
    pub serving_validity: Duration,
    /// Lifetime of a CA.
    pub ca_validity: Duration,
}

impl Settings {
    /// The names a serving certificate must carry.
    pub fn dns_names(&self) -> Vec<String> {
        let (svc, ns) = (&self.service, &self.namespace);
        vec![
            svc.clone(),
            format!("{svc}.{ns}"),
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.{}", self.cluster_domain),
        ]
    }
}

/// The Secret's contents, as PEM text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bundle {
    /// `tls.crt`.
    pub tls_crt: String,
    /// `tls.key`.
    pub tls_key: String,
    /// `ca.crt`: the current CA first, then older ones still valid.
    pub ca_crt: String,
    /// `ca.key`.
    pub ca_key: String,
}

/// What had to change, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing was stored yet.
    Created,
    /// A new CA (and a serving certificate signed by it).
    Ca,
    /// A new serving certificate under the same CA.
    Serving,
}

impl Renewal {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Ca => "ca",
            Self::Serving => "serving",
        }
    }
}

/// Why certificates could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// rcgen refused.
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// One parsed certificate's facts.
#[derive(Debug)]
struct Facts {
    not_before: i64,
    not_after: i64,
    dns_names: Vec<String>,
    is_ca: bool,
}

impl Facts {
    /// Whether less than a third of its lifetime is left at `now`.
    fn due(&self, now: i64) -> bool {
        let life = (self.not_after - self.not_before).max(1);
        self.not_after - now < life / 3
    }
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn ders(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

fn facts(der: &[u8]) -> Option<Facts> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some((*d).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Facts {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        dns_names,
        is_ca: cert.is_ca(),
    })
}

/// Whether `leaf` is signed by `ca`.
fn signed_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (Ok((_, leaf)), Ok((_, ca))) = (
        X509Certificate::from_der(leaf),
        X509Certificate::from_der(ca),
    ) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// When a certificate issued at `now` for `validity` starts and ends.
fn window(
    now: SystemTime,
    validity: Duration,
    cap: Option<i64>,
) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let back = BACKDATE.min(validity / 10);
    let start = unix(now - back);
    let mut end = unix(now + validity);
    if let Some(cap) = cap {
        end = end.min(cap);
    }
    let at = |s: i64| {
        time::OffsetDateTime::from_unix_timestamp(s).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    };
    (at(start), at(end))
}

fn ca_params(settings: &Settings, now: SystemTime) -> Result<CertificateParams, AuthorityError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!(
            "{}.{} CA {}",
            settings.service,
            settings.namespace,
            unix(now)
        ),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.not_before, params.not_after) = window(now, settings.ca_validity, None);
    Ok(params)
}

/// A new CA: (certificate PEM, key PEM).
pub fn issue_ca(settings: &Settings, now: SystemTime) -> Result<(String, String), AuthorityError> {
    let key = KeyPair::generate()?;
    let cert = ca_params(settings, now)?.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving certificate signed by the CA (`ca_crt` may be a bundle: its
/// first certificate is the CA): (certificate PEM, key PEM).
pub fn issue_serving(
    settings: &Settings,
    ca_crt: &str,
    ca_key: &str,
    now: SystemTime,
) -> Result<(String, String), AuthorityError> {
    let ca_key = KeyPair::from_pem(ca_key)?;
    let ca_der = ders(ca_crt)
        .into_iter()
        .next()
        .ok_or(rcgen::Error::CouldNotParseCertificate)?;
    let ca_end = facts(&ca_der).map(|f| f.not_after);
    let issuer = Issuer::from_ca_cert_der(&ca_der, &ca_key)?;
    let mut params = CertificateParams::new(settings.dns_names())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{}.{}.svc", settings.service, settings.namespace),
    );
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    (params.not_before, params.not_after) = window(now, settings.serving_validity, ca_end);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Why the stored CA cannot stay, if it cannot.
fn ca_problem(bundle: &Bundle, now: i64) -> Option<&'static str> {
    let Some(first) = ders(&bundle.ca_crt).into_iter().next() else {
        return Some("no CA certificate");
    };
    if KeyPair::from_pem(&bundle.ca_key).is_err() {
        return Some("no usable CA key");
    }
    match facts(&first) {
        None => Some("an unreadable CA certificate"),
        Some(f) if !f.is_ca => Some("a CA certificate that is not a CA"),
        Some(f) if f.due(now) => Some("a CA near its expiry"),
        Some(_) => None,
    }
}

/// Why the stored serving certificate cannot stay, if it cannot.
fn serving_problem(bundle: &Bundle, settings: &Settings, now: i64) -> Option<&'static str> {
    let Some(leaf) = ders(&bundle.tls_crt).into_iter().next() else {
        return Some("no serving certificate");
    };
    if KeyPair::from_pem(&bundle.tls_key).is_err() {
        return Some("no usable serving key");
    }
    let Some(f) = facts(&leaf) else {
        return Some("an unreadable serving certificate");
    };
    if f.due(now) {
        return Some("a serving certificate near its expiry");
    }
    let mut want = settings.dns_names();
    let mut have = f.dns_names.clone();
    want.sort();
    have.sort();
    if want != have {
        return Some("a serving certificate for other names");
    }
    let ca = ders(&bundle.ca_crt).into_iter().next();
    if !ca.is_some_and(|ca| signed_by(&leaf, &ca)) {
        return Some("a serving certificate not signed by the current CA");
    }
    None
}

/// The CA bundle after `new_ca` takes over: it first, then the CAs of
/// `old_bundle` that are still valid at `now`.
fn rolled_bundle(new_ca: &str, old_bundle: &str, now: i64) -> String {
    let mut out = new_ca.trim_end().to_owned();
    out.push('\n');
    let mut kept = 1;
    for der in ders(old_bundle) {
        if kept >= MAX_TRUSTED_CAS {
            break;
        }
        if facts(&der).is_some_and(|f| f.is_ca && f.not_after > now) {
            out.push_str(&pem_of(&der));
            kept += 1;
        }
    }
    out
}

/// PEM text of one DER certificate.
pub fn pem_of(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// A bundle of the CA (`ca_crt` may hold older CAs after it) and a new
/// serving certificate it signs.
fn with_serving(
    settings: &Settings,
    ca_crt: String,
    ca_key: String,
    now: SystemTime,
) -> Result<Bundle, AuthorityError> {
    let (tls_crt, tls_key) = issue_serving(settings, &ca_crt, &ca_key, now)?;
    Ok(Bundle {
        tls_crt,
        tls_key,
        ca_crt,
        ca_key,
    })
}

/// What to store instead of `current` at `now`, and why; `None` when the
/// stored bundle is good as it is.
pub fn renew(
    current: Option<&Bundle>,
    settings: &Settings,
    now: SystemTime,
) -> Result<Option<(Bundle, Renewal, &'static str)>, AuthorityError> {
    let at = unix(now);
    let Some(current) = current else {
        let (ca_crt, ca_key) = issue_ca(settings, now)?;
        let bundle = with_serving(settings, ca_crt, ca_key, now)?;
        return Ok(Some((bundle, Renewal::Created, "no certificates yet")));
    };
    if let Some(why) = ca_problem(current, at) {
        let (ca, ca_key) = issue_ca(settings, now)?;
        let bundle = with_serving(
            settings,
            rolled_bundle(&ca, &current.ca_crt, at),
            ca_key,
            now,
        )?;
        return Ok(Some((bundle, Renewal::Ca, why)));
    }
    if let Some(why) = serving_problem(current, settings, at) {
        let bundle = with_serving(
            settings,
            current.ca_crt.clone(),
            current.ca_key.clone(),
            now,
        )?;
        return Ok(Some((bundle, Renewal::Serving, why)));
    }
    Ok(None)
}

/// Unix time at which the first certificate of `pem` expires.
pub fn expiry(pem: &str) -> Option<i64> {
    ders(pem)
        .first()
        .and_then(|d| facts(d))
        .map(|f| f.not_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            service: "inferencecache-webhook".into(),
            namespace: "ic".into(),
            cluster_domain: "cluster.local".into(),
            serving_validity: Duration::from_secs(90 * 24 * 3600),
            ca_validity: Duration::from_secs(3650 * 24 * 3600),
        }
    }

    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    fn day(n: u64) -> Duration {
        Duration::from_secs(n * 24 * 3600)
    }

    #[test]
    fn a_fresh_bundle_is_kept_until_a_third_of_the_serving_life_is_left() {
        let s = settings();
        let (bundle, why, _) = renew(None, &s, t0()).unwrap().unwrap();
        assert_eq!(why, Renewal::Created);
        assert!(renew(Some(&bundle), &s, t0()).unwrap().is_none());
        assert!(renew(Some(&bundle), &s, t0() + day(59)).unwrap().is_none());
        let (next, why, _) = renew(Some(&bundle), &s, t0() + day(61)).unwrap().unwrap();
        assert_eq!(why, Renewal::Serving);
        assert_eq!(next.ca_crt, bundle.ca_crt);
        assert_eq!(next.ca_key, bundle.ca_key);
        assert_ne!(next.tls_crt, bundle.tls_crt);
        assert!(renew(Some(&next), &s, t0() + day(61)).unwrap().is_none());
    }

    #[test]
    fn the_serving_certificate_names_the_service_and_chains_to_the_ca() {
        let s = settings();
        let (b, _, _) = renew(None, &s, t0()).unwrap().unwrap();
        let leaf = ders(&b.tls_crt).remove(0);
        let f = facts(&leaf).unwrap();
        let mut names = f.dns_names.clone();
        names.sort();
        let mut want = s.dns_names();
        want.sort();
        assert_eq!(names, want);
        assert!(!f.is_ca);
        assert!(signed_by(&leaf, &ders(&b.ca_crt)[0]));
    }

    #[test]
    fn a_ca_rollover_keeps_the_old_ca_trusted_until_it_expires() {
        let s = Settings {
            ca_validity: day(30),
            serving_validity: day(10),
            ..settings()
        };
        let (b1, _, _) = renew(None, &s, t0()).unwrap().unwrap();
        let (b2, why, _) = renew(Some(&b1), &s, t0() + day(21)).unwrap().unwrap();
        assert_eq!(why, Renewal::Ca);
        let cas = ders(&b2.ca_crt);
        assert_eq!(cas.len(), 2, "new CA first, the old one still trusted");
        assert_eq!(cas[1], ders(&b1.ca_crt)[0]);
        assert!(signed_by(&ders(&b2.tls_crt)[0], &cas[0]));
        // Once the old CA has expired it leaves the bundle at the next rollover.
        let (b3, why, _) = renew(Some(&b2), &s, t0() + day(42)).unwrap().unwrap();
        assert_eq!(why, Renewal::Ca);
        assert_eq!(ders(&b3.ca_crt).len(), 2);
        assert_eq!(ders(&b3.ca_crt)[1], cas[0]);
    }

    #[test]
    fn serving_certificates_never_outlive_their_ca() {
        let s = Settings {
            ca_validity: day(30),
            serving_validity: day(90),
            ..settings()
        };
        let (b, _, _) = renew(None, &s, t0()).unwrap().unwrap();
        assert!(expiry(&b.tls_crt).unwrap() <= expiry(&b.ca_crt).unwrap());
    }

    #[test]
    fn broken_or_foreign_contents_are_replaced() {
        let s = settings();
        let (good, _, _) = renew(None, &s, t0()).unwrap().unwrap();
        let cases = [
            (
                Bundle {
                    tls_key: "junk".into(),
                    ..good.clone()
                },
                Renewal::Serving,
            ),
            (
                Bundle {
                    tls_crt: String::new(),
                    ..good.clone()
                },
                Renewal::Serving,
            ),
            (
                Bundle {
                    ca_key: "junk".into(),
                    ..good.clone()
                },
                Renewal::Ca,
            ),
            (Bundle::default(), Renewal::Ca),
        ];
        for (bundle, want) in cases {
            let (_, why, _) = renew(Some(&bundle), &s, t0()).unwrap().unwrap();
            assert_eq!(why, want);
        }
        // A certificate for another Service, or signed by another CA.
        let other = Settings {
            service: "other".into(),
            ..settings()
        };
        let (foreign, _, _) = renew(None, &other, t0()).unwrap().unwrap();
        let names = Bundle {
            tls_crt: foreign.tls_crt.clone(),
            tls_key: foreign.tls_key.clone(),
            ..good.clone()
        };
        let (_, why, detail) = renew(Some(&names), &s, t0()).unwrap().unwrap();
        assert_eq!(
            (why, detail),
            (Renewal::Serving, "a serving certificate for other names")
        );
        let (alien, _, _) = renew(None, &s, t0()).unwrap().unwrap();
        let unsigned = Bundle {
            tls_crt: alien.tls_crt,
            tls_key: alien.tls_key,
            ..good
        };
        let (_, _, detail) = renew(Some(&unsigned), &s, t0()).unwrap().unwrap();
        assert_eq!(detail, "a serving certificate not signed by the current CA");
    }
}
