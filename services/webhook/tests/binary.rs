//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM.

#[test]
fn binary_lifecycle() {
    ic_e2e::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-webhook")),
        &["--admin-addr", "127.0.0.1:0"],
        &[
            "--https-addr",
            "--tls-cert",
            "--tls-key",
            "--kvevent-subscriber-image",
            "--index-server",
        ],
    );
}
