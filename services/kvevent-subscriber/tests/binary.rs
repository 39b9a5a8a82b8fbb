//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM.

#[test]
fn binary_lifecycle() {
    ic_e2e::assert_service_lifecycle(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-kvevent-subscriber")),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--model-id",
            "m",
            "--replica-id",
            "pod-0",
            "--tenant",
            "ns",
        ],
        &[
            "--engine-endpoint",
            "--replay-endpoint",
            "--topic",
            "--dp-ranks",
            "--model-id",
            "--hash-scheme",
            "--ignore-block-removed",
            "--index-server",
            "--replica-id",
            "--tenant",
            "--address",
            "--engine-metrics-url",
            "--transport",
        ],
    );
}
