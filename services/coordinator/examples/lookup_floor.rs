//! The floor under `/directory/lookup` at 1 in flight: a server that
//! reads each body and answers a fixed lookup answer of the same shape and
//! size (16 results, one placement each) from one current-thread runtime,
//! with no directory, decoding, middleware or metrics. Driven by the same
//! load generator as the coordinator (`ic-coordinator-loadgen --target`),
//! what it measures is the client, the kernel's loopback and hyper:
//! what any server pays before its own work (docs/benchmarks.md).
//!
//! `cargo run --release -p ic-coordinator --example lookup_floor -- PORT`

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::routing::post;

const JSON: [(header::HeaderName, &str); 1] = [(header::CONTENT_TYPE, "application/json")];

/// A lookup answer as the coordinator writes it, 16 hits.
fn answer() -> String {
    let results: Vec<String> = (0..16)
        .map(|i| {
            format!(
                r#"{{"access_count":1,"key":{{"cache_salt":"","chunk_hash_hex":"{i:016x}{i:016x}","kv_rank":0,"model_name":"loadgen-model","object_group_id":0}},"placements":[{{"backend":"fs","incarnation":1,"instance_id":"mp-{i}","shared":false,"size_bytes":65536,"tier":"l2"}}],"token_ids":[]}}"#
            )
        })
        .collect();
    format!(r#"{{"chunks":16,"results":[{}]}}"#, results.join(","))
}

fn main() -> anyhow::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "0".into())
        .parse()?;
    let lookup: &'static str = Box::leak(answer().into_boxed_str());
    let router = Router::new()
        .route(
            "/instances",
            post(move |_: Bytes| async move { (JSON, "{}") }),
        )
        .route(
            "/events",
            post(
                move |_: Bytes| async move { (JSON, r#"{"applied":1,"duplicates":0,"stale":0}"#) },
            ),
        )
        .route(
            "/directory/lookup",
            post(move |_: Bytes| async move { (JSON, lookup) }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            use axum::serve::ListenerExt;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
            println!("listening on {}", listener.local_addr()?);
            // As the coordinator's accept loop does.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, router).await?;
            anyhow::Ok(())
        })
}
