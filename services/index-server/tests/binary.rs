//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM.

#[test]
fn binary_lifecycle() {
    ic_e2e::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-index-server")),
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
        &[
            "--grpc-addr",
            "--http-addr",
            "--engine-block-size",
            "--capacity-entries",
            "--tokenizer",
            "--probe-audience",
            "--probe-static-token",
            "--replica-gc-after-seconds",
        ],
    );
}
