//! Cross-language: a Python engine stand-in (pyzmq + msgspec, the engines'
//! own encoding library, with structs of several engine eras) publishes to
//! the real `ic-kvevent-subscriber` binary, which forwards to a real gRPC
//! server. The index view that arrives must be exactly the one the scenario
//! (libs/kvevents/tests/fixtures/publish_scenario.py) documents.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{RecordingIndex, free_port, wait_until};
use ic_e2e::ServiceProcess;
use ic_kvevents::chain_fingerprints;
use ic_proto::index_v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_msgspec_publisher_is_read_exactly_by_the_real_binary() {
    let check = Command::new("python3")
        .args(["-c", "import zmq, msgspec"])
        .output()
        .expect("python3 is required for this test");
    assert!(
        check.status.success(),
        "this test needs pyzmq and msgspec (`./dev.sh test` installs them): {}",
        String::from_utf8_lossy(&check.stderr)
    );

    let index = RecordingIndex::start().await;
    let port = free_port();
    let mut subscriber = ServiceProcess::start(
        Path::new(env!("CARGO_BIN_EXE_ic-kvevent-subscriber")),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--engine-endpoint",
            &format!("tcp://127.0.0.1:{port}"),
            "--index-server",
            &index.url(),
            "--model-id",
            "test/model",
            "--replica-id",
            "engine-py",
            "--tenant",
            "team-a",
        ],
    );
    subscriber.admin_addr();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../libs/kvevents/tests/fixtures/publish_scenario.py");
    let publisher = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args(["--port", &port.to_string()])
            .output()
            .expect("run publisher")
    });

    let fps = ic_kvevents::Fingerprint::to_raw(chain_fingerprints(
        None,
        &(0..96).collect::<Vec<u32>>(),
        16,
    ));
    let (t1, t2) = (pb::Tier::T1 as i32, pb::Tier::T2 as i32);
    let want: BTreeMap<u64, i32> = [
        (fps[0], t1),
        (fps[1], t1),
        (fps[2], t1),
        (fps[3], t1),
        (fps[4], t2),
    ]
    .into_iter()
    .collect();
    wait_until(Duration::from_secs(60), "the scenario's index view", || {
        index.tiers("engine-py", 0) == want
    })
    .await;
    let out = publisher.await.unwrap();
    assert!(
        out.status.success(),
        "publisher failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(subscriber.stop().success());
}
