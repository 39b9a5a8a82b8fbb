//! `icctl check` against the real index server, coordinator and webhook
//! binaries: every check passes on a working installation, and a dead
//! component or a certificate its CA does not sign fails with exit code 1
//! and a report that says which.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use ic_e2e::{ServiceProcess, workspace_binary};
use serde_json::Value;

struct Installation {
    _fleet: common::Fleet,
    _webhook: ServiceProcess,
    grpc: String,
    http: String,
    coordinator: String,
    webhook: String,
    ca: std::path::PathBuf,
    other_ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn ca() -> (rcgen::CertifiedIssuer<'static, rcgen::KeyPair>, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let issuer =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let pem = issuer.pem();
    (issuer, pem)
}

fn start() -> Installation {
    let dir = tempfile::tempdir().unwrap();
    let (issuer, ca_pem) = ca();
    let (_, other_pem) = ca();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &*issuer)
        .unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("tls.crt"), cert.pem()).unwrap();
    std::fs::write(path("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(path("ca.crt"), ca_pem).unwrap();
    std::fs::write(path("other.crt"), other_pem).unwrap();
    std::fs::write(
        path("kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();

    let fleet = common::start();
    let (grpc, http, coordinator_url) = (
        fleet.grpc.clone(),
        fleet.http.clone(),
        fleet.coordinator_url.clone(),
    );
    let mut webhook = ServiceProcess::start(
        &workspace_binary("ic-webhook"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--tls-cert",
            path("tls.crt").to_str().unwrap(),
            "--tls-key",
            path("tls.key").to_str().unwrap(),
            "--kubeconfig",
            path("kubeconfig").to_str().unwrap(),
        ],
    );
    let https: std::net::SocketAddr = webhook.addr("https");
    Installation {
        _fleet: fleet,
        _webhook: webhook,
        grpc,
        http,
        coordinator: coordinator_url,
        webhook: format!("https://localhost:{}", https.port()),
        ca: path("ca.crt"),
        other_ca: path("other.crt"),
        _dir: dir,
    }
}

fn icctl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_icctl"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_working_installation_passes_every_check() {
    let i = start();
    let (ok, out, err) = icctl(&[
        "--index-grpc",
        &i.grpc,
        "--index-http",
        &i.http,
        "--coordinator",
        &i.coordinator,
        "-o",
        "json",
        "check",
        "--webhook",
        &i.webhook,
        "--webhook-ca",
        i.ca.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["check"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "index server /ready",
            "index server gRPC health",
            "index server LookupRoute",
            "coordinator /ready",
            "webhook HTTPS"
        ]
    );
    assert!(rows.iter().all(|r| r["ok"] == true), "{out}");
    assert!(
        rows[2]["detail"].as_str().unwrap().contains("NO_HINT"),
        "{out}"
    );
}

#[test]
fn failures_name_the_component_and_exit_1() {
    let i = start();
    // The webhook's certificate is not signed by this CA.
    let (ok, out, err) = icctl(&[
        "--index-grpc",
        &i.grpc,
        "--index-http",
        &i.http,
        "--coordinator",
        &i.coordinator,
        "check",
        "--webhook",
        &i.webhook,
        "--webhook-ca",
        i.other_ca.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("1 of 5 checks failed"), "{err}");
    let webhook_line = out
        .lines()
        .find(|l| l.starts_with("webhook HTTPS"))
        .unwrap();
    assert!(
        webhook_line.contains("FAILED") && webhook_line.contains("TLS"),
        "{out}"
    );
    // Nothing listens on the coordinator's address; it is skipped on request.
    let dead = format!("http://127.0.0.1:{}", ic_e2e::free_port());
    let (ok, out, _) = icctl(&[
        "--index-grpc",
        &i.grpc,
        "--index-http",
        &i.http,
        "--coordinator",
        &dead,
        "check",
    ]);
    assert!(!ok);
    assert!(
        out.lines()
            .any(|l| l.starts_with("coordinator /ready") && l.contains("FAILED")),
        "{out}"
    );
    let (ok, out, err) = icctl(&[
        "--index-grpc",
        &i.grpc,
        "--index-http",
        &i.http,
        "check",
        "--skip-coordinator",
    ]);
    assert!(ok, "{out}\n{err}");
}
