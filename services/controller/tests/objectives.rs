//! InferenceObjectives (the Gateway API Inference Extension's kind) held by
//! the fake API server reach the real index server's endpoint picker with
//! the policies: a request naming an objective is shed by that objective's
//! priority, and follows its edits and deletion.

#![allow(clippy::unwrap_used)]

mod common;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse, external_processor_client::ExternalProcessorClient,
    processing_request, processing_response,
};
use ic_api::inferenceobjective::{InferenceObjective, InferenceObjectiveSpec, PoolReference};
use ic_controller::policy::PolicyPusher;
use ic_fake_apiserver::FakeApi;

const IO: &str = "inference.networking.x-k8s.io/v1alpha2";

fn objective(name: &str, pool: &str, priority: Option<i32>) -> InferenceObjective {
    let mut o = InferenceObjective::new(
        name,
        InferenceObjectiveSpec {
            priority,
            pool_ref: PoolReference {
                name: pool.into(),
                ..Default::default()
            },
        },
    );
    o.metadata.namespace = Some("team-a".into());
    o
}

/// A headers-only request naming `objective`, picked at once.
fn request(objective: &str) -> ProcessingRequest {
    let mut m = ic_e2e::ext_proc::headers("/v1/completions", true);
    if let Some(processing_request::Request::RequestHeaders(h)) = &mut m.request {
        h.headers.as_mut().unwrap().headers.push(HeaderValue {
            key: "x-gateway-inference-objective".into(),
            raw_value: objective.as_bytes().to_vec(),
            ..HeaderValue::default()
        });
    }
    m
}

/// Opens one ext_proc stream with `m` and returns its first answer and the
/// sender that keeps the stream (and a pick's in-flight count) open.
async fn send(
    epp: &str,
    m: ProcessingRequest,
) -> (
    tokio::sync::mpsc::Sender<ProcessingRequest>,
    ProcessingResponse,
) {
    let mut client = ExternalProcessorClient::connect(epp.to_owned())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(m).await.unwrap();
    let mut responses = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), responses.message())
        .await
        .expect("the picker answered in time")
        .unwrap()
        .expect("a response");
    tokio::spawn(async move { while let Ok(Some(_)) = responses.message().await {} });
    (tx, first)
}

fn shed(r: &ProcessingResponse) -> bool {
    match &r.response {
        Some(processing_response::Response::ImmediateResponse(i)) => {
            assert_eq!(i.status.as_ref().unwrap().code, 429, "{i:?}");
            true
        }
        _ => {
            assert!(ic_e2e::ext_proc::destinations(r).is_some(), "{r:?}");
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objective_priorities_reach_the_picker_and_shed_its_requests() {
    // One endpoint; sheddable requests (priority < 0) are refused once it
    // has one request, standard ones never.
    let mut server = common::IndexServer::start_with(&[
        "--epp-addr",
        "127.0.0.1:0",
        "--epp-tenant",
        "team-a",
        "--epp-endpoint",
        "10.0.0.1:8000",
        "--epp-shed-at-requests",
        "1",
        "--pick-half-life-ms",
        "1",
    ]);
    let epp = format!("http://{}", server.process.addr("epp"));
    let (_open, first) = send(&epp, request("none")).await;
    assert!(!shed(&first), "the first request is picked");
    // Nothing pushed yet: "batch" is unknown, priority 0, not shed.
    assert!(!shed(&send(&epp, request("batch")).await.1));

    let fake = FakeApi::new();
    fake.insert(&objective("batch", "chat", Some(-1)));
    fake.insert(&objective("other-pool", "elsewhere", Some(-1)));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    watched.settle(&fake).await;
    let pusher = PolicyPusher::new(
        fake.client(),
        vec![server.grpc_url()],
        metrics.clone(),
        common::clock(),
        watched.stores.clone(),
    );
    pusher.sync_once().await.unwrap();
    // The picker serves static endpoints (no pool name): every objective
    // of its namespace applies. "batch" is sheddable now.
    assert!(shed(&send(&epp, request("batch")).await.1));
    assert!(!shed(&send(&epp, request("standard")).await.1));

    // Edited to critical, then deleted: back to not shed.
    fake.insert(&objective("batch", "chat", Some(5)));
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    assert!(!shed(&send(&epp, request("batch")).await.1));
    fake.insert(&objective("batch", "chat", Some(-3)));
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    assert!(shed(&send(&epp, request("batch")).await.1));
    assert!(fake.remove(IO, "inferenceobjectives", "team-a", "batch"));
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    assert!(!shed(&send(&epp, request("batch")).await.1));
}
