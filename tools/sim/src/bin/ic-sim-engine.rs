//! A stand-in engine for the cluster suite: serves `/health` on the HTTP
//! port a vLLM pod would, and publishes one known prompt's blocks over the
//! real KV-event wire (PUB on 5557, replay ROUTER on 5558, topic
//! `kv-events`), again every few seconds, as an engine does when it runs.
//! Its prompt is the token ids 0..64 in blocks of 16.

use std::time::Duration;

use ic_kvevents::KvEvent;
use ic_kvevents::encode::Era;
use ic_kvevents::wire::{BlockStored, Medium};
use ic_sim::engine::FakeEngine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Tokens of the prompt the engine reports holding.
pub const PROMPT: std::ops::Range<u32> = 0..64;

#[tokio::main]
async fn main() {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8000);
    let http = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .expect("bind the HTTP port");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = http.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                    )
                    .await;
            });
        }
    });
    let mut engine = FakeEngine::start_on(Era::VllmMap, "kv-events", 5557, 5558).await;
    let stored = KvEvent::BlockStored(BlockStored {
        block_hashes: vec![101, 102, 103, 104],
        parent_block_hash: None,
        token_ids: PROMPT.collect(),
        block_size: 16,
        lora_id: None,
        medium: Medium::Gpu,
        lora_name: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        cache_salt: None,
        extra_keys: None,
    });
    loop {
        engine.publish(std::slice::from_ref(&stored)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
