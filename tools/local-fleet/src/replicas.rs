//! Several index-server replicas behind the fleet's gateways, all active:
//! every subscriber streams to each of them (`--index-server` takes the
//! comma-separated list), and the gateways spread their requests over them
//! round-robin, as a Kubernetes Service would. Also the checks that the
//! replicas answer alike once caught up: identical `/snapshot` rows, and the
//! same LookupRoute holders for the same prompt on each replica.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use ic_sim::{ServiceProcess, http_get};
use serde::Serialize;

use crate::fleet::lookup_request;

/// With more than one replica, each replica's arguments: its own gRPC port
/// (reserved now, so each can be given the others' URLs) and `--peer` with
/// every replica's URL (a replica skips its own), so the replicas share
/// their pick-level load. Empty for one replica.
fn peered_args(args: &[&str], count: usize) -> Vec<Vec<String>> {
    if count < 2 {
        return Vec::new();
    }
    let ports: Vec<u16> = (0..count)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free loopback port")
        })
        .collect();
    let peers = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    ports
        .iter()
        .map(|port| {
            let mut own: Vec<String> = Vec::with_capacity(args.len() + 4);
            let mut rest = args.iter();
            while let Some(arg) = rest.next() {
                if *arg == "--grpc-addr" {
                    rest.next();
                } else {
                    own.push((*arg).to_owned());
                }
            }
            own.extend([
                "--grpc-addr".to_owned(),
                format!("127.0.0.1:{port}"),
                "--peer".to_owned(),
                peers.clone(),
            ]);
            own
        })
        .collect()
}

/// The running index-server replicas, in start order.
#[derive(Debug)]
pub struct IndexReplicas {
    processes: Vec<ServiceProcess>,
    /// gRPC URL of each replica (`http://ip:port`).
    pub grpc_urls: Vec<String>,
    /// HTTP (admin) address of each replica: /snapshot, /metrics.
    pub http: Vec<SocketAddr>,
    /// Endpoint-picker URL of each replica, when started with one.
    pub epp_urls: Vec<String>,
}

impl IndexReplicas {
    /// Starts `count` `ic-index-server` processes with the same `args`.
    pub fn start(
        binary: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        count: usize,
        epp: bool,
    ) -> Self {
        let mut replicas = Self {
            processes: Vec::with_capacity(count),
            grpc_urls: Vec::with_capacity(count),
            http: Vec::with_capacity(count),
            epp_urls: Vec::new(),
        };
        let peered = peered_args(args, count);
        for i in 0..count {
            let own: Vec<&str> = peered
                .get(i)
                .map_or_else(|| args.to_vec(), |a| a.iter().map(String::as_str).collect());
            let mut process = ServiceProcess::start_with_env(binary, &own, env);
            replicas
                .grpc_urls
                .push(format!("http://{}", process.addr("grpc")));
            replicas.http.push(process.admin_addr());
            if epp {
                replicas
                    .epp_urls
                    .push(format!("http://{}", process.addr("epp")));
            }
            replicas.processes.push(process);
        }
        replicas
    }

    /// The subscribers' `--index-server`: every replica, comma-separated.
    pub fn subscriber_target(&self) -> String {
        self.grpc_urls.join(",")
    }

    /// Stops every replica; one line per replica that did not exit cleanly.
    pub fn stop(&mut self) -> Vec<String> {
        self.processes
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| {
                let status = p.stop();
                (!status.success()).then(|| format!("ic-index-server #{i} exited with {status}"))
            })
            .collect()
    }
}

/// One replica's `/snapshot`, reduced to what must match across replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Index entries.
    pub entries: u64,
    /// Blocks held per engine replica (`replicaId` → `prefixCount`).
    pub prefix_counts: BTreeMap<String, u64>,
}

impl SnapshotCounts {
    /// Reads the `/snapshot` of the replica at `addr`.
    pub fn read(addr: SocketAddr) -> anyhow::Result<Self> {
        let (status, body) = http_get(addr, "/snapshot");
        if status != 200 {
            anyhow::bail!("GET http://{addr}/snapshot answered {status}: {body}");
        }
        let snapshot: serde_json::Value = serde_json::from_str(&body)?;
        let prefix_counts = snapshot["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                Some((
                    r["replicaId"].as_str()?.to_owned(),
                    r["prefixCount"].as_u64()?,
                ))
            })
            .collect();
        Ok(Self {
            entries: snapshot["entries"].as_u64().unwrap_or(0),
            prefix_counts,
        })
    }

    /// Whether engine `engine-{i}` is listed holding `blocks[i]` blocks, for
    /// every engine.
    pub fn matches_engines(&self, blocks: &[usize]) -> bool {
        blocks.iter().enumerate().all(|(i, &held)| {
            self.prefix_counts.get(&format!("engine-{i}")) == Some(&(held as u64))
        })
    }

    /// The names `engine-0` .. `engine-{engines - 1}` this replica does not
    /// list yet.
    pub fn missing_engines(&self, engines: usize) -> Vec<String> {
        (0..engines)
            .map(|i| format!("engine-{i}"))
            .filter(|n| !self.prefix_counts.contains_key(n))
            .collect()
    }
}

/// How alike the replicas answered after the replay.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AlikeCheck {
    /// The routed variant checked.
    pub variant: String,
    /// Index-server replicas compared.
    pub replicas: usize,
    /// Every replica's `/snapshot` has the same entries and per-engine
    /// block counts.
    pub snapshots_identical: bool,
    /// Prompts asked of every replica (observe-only LookupRoute).
    pub probes: usize,
    /// Probes some replica answered with a prefix match.
    pub probes_matched: usize,
    /// Probes whose holders (engine, matched blocks, tier of every
    /// non-speculative candidate) differed between replicas.
    pub holders_differ: usize,
    /// Probes with one longest holder, where every replica must name it
    /// `best` (counted only when the variant ranks by prefix alone: with
    /// load in the score each replica weighs its own share of the picks).
    pub best_checked: usize,
    /// Of those, probes whose `best` differed between replicas.
    pub best_differ: usize,
}

/// The outcome of [`compare_answers`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compared {
    /// Probes some replica answered with a holder.
    pub matched: usize,
    /// Probes whose holders differed between replicas.
    pub holders_differ: usize,
    /// Probes with one longest holder whose `best` was compared.
    pub best_checked: usize,
    /// Of those, probes whose `best` differed.
    pub best_differ: usize,
}

/// What one replica said about one prompt, reduced to the index's part.
#[derive(Debug, PartialEq, Eq)]
struct Holders {
    /// (engine, matched blocks, tier) of every reported holder, sorted.
    held: Vec<(String, u32, i32)>,
    best: Option<String>,
}

impl Holders {
    fn of(answer: &pb::LookupRouteResponse) -> Self {
        let mut held: Vec<(String, u32, i32)> = answer
            .candidates
            .iter()
            .filter(|c| !c.speculative && c.matched_blocks > 0)
            .filter_map(|c| {
                let id = c.replica.as_ref()?.replica_id.clone();
                Some((id, c.matched_blocks, c.tier))
            })
            .collect();
        held.sort();
        let best = answer
            .best
            .as_ref()
            .and_then(|b| b.replica.as_ref())
            .map(|r| r.replica_id.clone());
        Self { held, best }
    }

    /// Whether exactly one engine holds the longest match.
    fn unique_longest(&self) -> bool {
        let longest = self.held.iter().map(|h| h.1).max().unwrap_or(0);
        longest > 0 && self.held.iter().filter(|h| h.1 == longest).count() == 1
    }
}

/// Asks every replica the same observe-only LookupRoute for each prompt of
/// `probes` and compares the answers; `prefix_decides` when the variant
/// ranks by prefix alone (then a unique longest holder must be `best`
/// everywhere).
pub async fn compare_answers(
    grpc_urls: &[String],
    tenant: &str,
    model: &str,
    probes: &[Vec<u32>],
    prefix_decides: bool,
) -> anyhow::Result<Compared> {
    let mut clients = Vec::with_capacity(grpc_urls.len());
    for url in grpc_urls {
        clients.push(IndexServiceClient::connect(url.clone()).await?);
    }
    let mut out = Compared::default();
    for tokens in probes {
        let mut answers = Vec::with_capacity(clients.len());
        for client in &mut clients {
            let answer = client
                .lookup_route(lookup_request(tenant, model, tokens, true))
                .await?
                .into_inner();
            answers.push(Holders::of(&answer));
        }
        let Some(first) = answers.first() else {
            continue;
        };
        if answers.iter().any(|a| !a.held.is_empty()) {
            out.matched += 1;
        }
        if answers.iter().any(|a| a.held != first.held) {
            out.holders_differ += 1;
        } else if prefix_decides && first.unique_longest() {
            out.best_checked += 1;
            if answers.iter().any(|a| a.best != first.best) {
                out.best_differ += 1;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(id: &str, blocks: u32, speculative: bool) -> pb::CandidateScore {
        pb::CandidateScore {
            replica: Some(pb::ReplicaRef {
                replica_id: id.to_owned(),
                ..Default::default()
            }),
            matched_blocks: blocks,
            speculative,
            ..Default::default()
        }
    }

    #[test]
    fn several_replicas_get_their_own_port_and_every_peer() {
        assert!(peered_args(&["--grpc-addr", "127.0.0.1:0"], 1).is_empty());
        let args = peered_args(
            &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
            3,
        );
        assert_eq!(args.len(), 3);
        let value = |a: &[String], flag: &str| {
            let i = a.iter().position(|x| x == flag).unwrap();
            a[i + 1].clone()
        };
        let peers = value(&args[0], "--peer");
        for a in &args {
            assert_eq!(a.iter().filter(|x| *x == "--grpc-addr").count(), 1);
            assert_eq!(value(a, "--peer"), peers);
            let own = format!("http://{}", value(a, "--grpc-addr"));
            assert!(peers.split(',').any(|p| p == own), "{peers} lacks {own}");
        }
        assert_eq!(peers.split(',').count(), 3);
    }

    #[test]
    fn holders_ignore_order_load_and_speculation() {
        let a = pb::LookupRouteResponse {
            best: Some(candidate("engine-1", 4, false)),
            candidates: vec![
                candidate("engine-1", 4, false),
                candidate("engine-0", 2, false),
                candidate("engine-2", 4, true),
            ],
            ..Default::default()
        };
        let b = pb::LookupRouteResponse {
            best: Some(candidate("engine-1", 4, false)),
            candidates: vec![
                candidate("engine-0", 2, false),
                candidate("engine-1", 4, false),
            ],
            ..Default::default()
        };
        let (ha, hb) = (Holders::of(&a), Holders::of(&b));
        assert_eq!(ha, hb);
        assert!(ha.unique_longest());
        let tied = Holders::of(&pb::LookupRouteResponse {
            candidates: vec![
                candidate("engine-0", 3, false),
                candidate("engine-1", 3, false),
            ],
            ..Default::default()
        });
        assert!(!tied.unique_longest());
    }

    #[test]
    fn snapshot_counts_match_engines_by_name() {
        let counts = SnapshotCounts {
            entries: 5,
            prefix_counts: [("engine-0".to_owned(), 3), ("engine-1".to_owned(), 2)].into(),
        };
        assert!(counts.matches_engines(&[3, 2]));
        assert!(!counts.matches_engines(&[3, 1]));
        assert!(!counts.matches_engines(&[3, 2, 0]), "a missing engine");
    }

    #[test]
    fn missing_engines_are_named() {
        let counts = SnapshotCounts {
            entries: 0,
            prefix_counts: [("engine-0".to_owned(), 0), ("engine-2".to_owned(), 4)].into(),
        };
        assert_eq!(counts.missing_engines(4), ["engine-1", "engine-3"]);
        assert!(counts.missing_engines(1).is_empty());
    }
}
