//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM.

#[test]
fn binary_lifecycle() {
    ic_e2e::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator")),
        &["--host", "127.0.0.1", "--port", "0"],
        &[
            "--host",
            "--port",
            "--chunk-size",
            "--hash-algorithm",
            "--instance-timeout",
            "--health-check-interval",
            "--checkpoint-path",
            "--checkpoint-interval",
            "--metadata-path",
            "--extra-config",
            "--event-transport",
            "--kafka-bootstrap-servers",
            "--kafka-topic",
            "--kafka-group-id",
            "--max-ready-lag",
        ],
    );
}
