//! A gateway for the HA tests: workers asking the endpoint picker
//! continuously the way Envoy and a Kubernetes Service do — round-robin
//! over the replicas whose `/ready` answers 200 (polled every 100 ms, as
//! endpoints follow readiness), a replica whose connection fails set aside
//! at once (outlier detection) until a readiness check made after the
//! failure passes — counting the picks that fail.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use ic_e2e::ext_proc::{buffered, destination};
use parking_lot::Mutex;
use tonic::transport::Channel;

use crate::fleet::{CONVERGE, MODEL};

/// Gateway workers picking at once.
pub const WORKERS: usize = 4;

/// Where the gateway reaches one replica: its picker and its `/ready`.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint {
    pub epp_port: u16,
    pub http: SocketAddr,
}

/// One replica as the gateway sees it.
struct Backend {
    epp: Channel,
    http: SocketAddr,
    ready: bool,
    /// Its connection failed then: skipped until a `/ready` asked after
    /// that answers 200 (one asked before it, answered after, is stale).
    ejected: Option<Instant>,
}

/// The gateway: workers picking continuously, a poller following `/ready`.
pub struct Gateway {
    backends: Arc<Mutex<Vec<Backend>>>,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    pub failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn backend(endpoint: Endpoint) -> Backend {
    Backend {
        epp: Channel::from_shared(format!("http://127.0.0.1:{}", endpoint.epp_port))
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy(),
        http: endpoint.http,
        ready: false,
        ejected: None,
    }
}

impl Gateway {
    pub fn start(endpoints: impl IntoIterator<Item = Endpoint>) -> Self {
        let backends = Arc::new(Mutex::new(endpoints.into_iter().map(backend).collect()));
        let mut gateway = Self {
            backends,
            stop: Arc::new(AtomicBool::new(false)),
            ok: Arc::default(),
            failed: Arc::default(),
            failures: Arc::default(),
            tasks: Vec::new(),
        };
        let (backends, stop) = (gateway.backends.clone(), gateway.stop.clone());
        gateway.tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let addrs: Vec<SocketAddr> = backends.lock().iter().map(|b| b.http).collect();
                let asked = Instant::now();
                let ready = tokio::task::spawn_blocking(move || {
                    addrs
                        .into_iter()
                        .map(|a| http_get_quiet(a, "/ready") == Some(200))
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap();
                for (b, ready) in backends.lock().iter_mut().zip(ready) {
                    b.ready = ready;
                    if ready && b.ejected.is_some_and(|at| at < asked) {
                        b.ejected = None;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
        for worker in 0..WORKERS {
            let (backends, stop) = (gateway.backends.clone(), gateway.stop.clone());
            let (ok, failed, failures) = (
                gateway.ok.clone(),
                gateway.failed.clone(),
                gateway.failures.clone(),
            );
            gateway.tasks.push(tokio::spawn(async move {
                let mut n = worker;
                while !stop.load(Ordering::Relaxed) {
                    n += WORKERS;
                    // Round-robin over the replicas in the Service's endpoints.
                    let chosen = {
                        let list = backends.lock();
                        let usable: Vec<usize> = (0..list.len())
                            .filter(|&i| list[i].ready && list[i].ejected.is_none())
                            .collect();
                        (!usable.is_empty()).then(|| {
                            let i = usable[n % usable.len()];
                            (i, list[i].epp.clone())
                        })
                    };
                    let Some((i, channel)) = chosen else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    match pick(channel, n).await {
                        Ok(_) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            failures.lock().push(format!("replica {i}: {error}"));
                            backends.lock()[i].ejected = Some(Instant::now());
                        }
                    }
                }
            }));
        }
        gateway
    }

    /// A replica restarted: the Service's endpoint now names the new pod
    /// (not ready until it says so).
    pub fn replace(&self, i: usize, endpoint: Endpoint) {
        self.backends.lock()[i] = backend(endpoint);
    }

    /// Adds a replica that started late.
    pub fn add(&self, endpoint: Endpoint) {
        self.backends.lock().push(backend(endpoint));
    }

    /// Waits until replica `i` is ready in the gateway's eyes.
    pub async fn wait_ready(&self, i: usize, what: &str) -> Duration {
        let started = Instant::now();
        while !self.backends.lock()[i].ready {
            assert!(
                started.elapsed() < CONVERGE,
                "{what}: replica {i} never became ready"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        started.elapsed()
    }

    /// Picks made and failed so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    pub async fn stop(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let (ok, failed) = (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        );
        let failures = self.failures.lock().clone();
        (ok, failed, failures)
    }
}

/// The status of `GET path`, `None` when the replica does not answer (it
/// is dead or gone): what a kubelet's readiness probe sees.
fn http_get_quiet(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// One pick over ext_proc in BUFFERED mode, as Envoy sends it: the body's
/// response must name an endpoint.
///
/// The reply stream is read to its end (the picker ends it once the
/// gateway has half-closed), trailers and status included. Dropping it
/// after the last expected reply instead cancels the stream while the
/// picker's trailers are still on the way; once h2 has forgotten a
/// cancelled stream (more than 50 cancelled within its 1 s memory), the
/// late trailers are a stream error the client answers with its own
/// RST_STREAM, and after 1024 of those on the one connection the client's
/// h2 closes it with GOAWAY `too_many_internal_resets`, failing every pick
/// in flight on it.
async fn pick(channel: Channel, n: usize) -> Result<String, String> {
    let body = serde_json::json!({"model": MODEL, "prompt": format!("hello world {}", n % 7)});
    let messages = buffered("/v1/completions", &serde_json::to_vec(&body).unwrap());
    let mut client = ExternalProcessorClient::new(channel);
    let call = async {
        let mut responses = client
            .process(tokio_stream::iter(messages))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let mut picked = None;
        while let Some(r) = responses.message().await.map_err(|e| e.to_string())? {
            picked = picked.or_else(|| destination(&r));
        }
        picked.ok_or_else(|| "no endpoint picked".to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
}
