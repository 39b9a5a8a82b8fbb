//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM.

#[test]
fn binary_lifecycle() {
    ic_e2e::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-controller")),
        &["--admin-addr", "127.0.0.1:0"],
        &[
            "--server-probe-url",
            "--snapshot-url",
            "--coordinator-url",
            "--kvevent-subscriber-image",
            "--probe-token-path",
            "--index-server-grpc",
            "--leader-election-namespace",
            "--lease-name",
            "--identity",
        ],
    );
}
