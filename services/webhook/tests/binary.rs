//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

#[test]
fn binary_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = common::TestCa::new().write_pair(dir.path(), "ic-webhook");
    // Nothing listens there: start-up does not contact the API.
    let kubeconfig = common::write_kubeconfig(
        dir.path(),
        format!("127.0.0.1:{}", ic_e2e::free_port())
            .parse()
            .unwrap(),
    );
    ic_e2e::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-webhook")),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
        &[
            "--https-addr",
            "--tls-cert",
            "--tls-key",
            "--kvevent-subscriber-image",
            "--index-server",
            "--kubeconfig",
            "--max-request-bytes",
            "--request-timeout-ms",
        ],
    );
}
