//! LookupRoute as a lean gateway client sends it (`--lookup-client lean`,
//! the default): every distinct request body of a run encoded once before
//! the phase and cycled (as ghz and wrk send pre-built requests), and each
//! answer decoded into the fields a gateway acts on — `outcome` and
//! `best.replica.address` — with the rest (`candidates`, `detail`, ...)
//! skipped undecoded. The server receives the same bytes, in the same
//! order, as from `--lookup-client full` (the generated client, which
//! builds and encodes each request and decodes the whole answer), and
//! answers both alike.

use std::marker::PhantomData;

use bytes::{BufMut, Bytes, BytesMut};
use ic_proto::index_v1 as pb;
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use crate::{Fleet, fresh_fingerprint};

/// LookupRoute's gRPC path.
pub const LOOKUP_ROUTE: &str = "/inferencecache.index.v1.IndexService/LookupRoute";

/// Most bodies kept ahead (~1.1 KB each at 128 blocks); a run with more
/// distinct prompts encodes each request as it sends it.
pub const MAX_POOL: u64 = 1 << 16;

/// The answer's fields a gateway routing by `best` reads: field numbers of
/// `LookupRouteResponse`; every other field is skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeanAnswer {
    /// `outcome`.
    #[prost(int32, tag = "1")]
    pub outcome: i32,
    /// `best`.
    #[prost(message, optional, tag = "2")]
    pub best: Option<LeanCandidate>,
}

/// Of `CandidateScore`, its replica only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeanCandidate {
    /// `replica`.
    #[prost(message, optional, tag = "1")]
    pub replica: Option<LeanReplica>,
}

/// Of `ReplicaRef`, where to send the request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeanReplica {
    /// `address`.
    #[prost(string, tag = "2")]
    pub address: String,
}

impl LeanAnswer {
    /// Whether the answer is a prefix match naming where to send.
    pub fn routed_by_prefix(&self) -> bool {
        self.outcome == pb::LookupOutcome::PrefixMatch as i32
            && self
                .best
                .as_ref()
                .and_then(|b| b.replica.as_ref())
                .is_some_and(|r| !r.address.is_empty())
    }
}

/// The request bodies of a run: the `i`-th request is
/// `build(fleet.lookup_prompt_with_new(i, prompt_blocks, new_blocks))`,
/// encoded.
pub struct Bodies<B> {
    pool: Vec<Bytes>,
    /// With a new tail: where each pooled body's tail starts (`fixed64`
    /// hashes, 8 bytes each), rewritten for each request.
    tails: Vec<usize>,
    fleet: Fleet,
    prompt_blocks: u32,
    new_blocks: u32,
    build: B,
}

impl<B: Fn(Vec<u64>) -> pb::LookupRouteRequest> Bodies<B> {
    /// Encodes every distinct body ahead when there are at most
    /// [`MAX_POOL`] (a new tail, `new_blocks` > 0, is written into a copy
    /// of its body for each request).
    pub fn new(fleet: Fleet, prompt_blocks: u32, new_blocks: u32, build: B) -> Self {
        let new_blocks = new_blocks.min(prompt_blocks);
        let distinct = fleet.distinct_prompts();
        let mut pool = Vec::new();
        let mut tails = Vec::new();
        if distinct <= MAX_POOL {
            for i in 0..distinct {
                let body = encode(&build(fleet.lookup_prompt_with_new(
                    i,
                    prompt_blocks,
                    new_blocks,
                )));
                if new_blocks > 0 {
                    // Found where it was written: 8 random bytes.
                    let first = fresh_fingerprint(i, 0).to_le_bytes();
                    let at = body
                        .windows(first.len())
                        .position(|w| w == first)
                        .unwrap_or(usize::MAX);
                    tails.push(at);
                }
                pool.push(body);
            }
            if tails.contains(&usize::MAX) {
                // Not found (the field's encoding changed): encoded as
                // sent instead.
                pool.clear();
                tails.clear();
            }
        }
        Self {
            pool,
            tails,
            fleet,
            prompt_blocks,
            new_blocks,
            build,
        }
    }

    /// Bodies encoded ahead.
    pub fn pooled(&self) -> usize {
        self.pool.len()
    }

    /// The `i`-th request's body.
    pub fn get(&self, i: u64) -> Bytes {
        let n = self.pool.len() as u64;
        if n == 0 {
            return encode(&(self.build)(self.fleet.lookup_prompt_with_new(
                i,
                self.prompt_blocks,
                self.new_blocks,
            )));
        }
        let k = usize::try_from(i % n).unwrap_or(0);
        if self.new_blocks == 0 {
            return self.pool[k].clone();
        }
        let mut body = BytesMut::from(&self.pool[k][..]);
        let mut at = self.tails[k];
        for j in 0..self.new_blocks {
            body[at..at + 8].copy_from_slice(&fresh_fingerprint(i, j).to_le_bytes());
            at += 8;
        }
        body.freeze()
    }
}

impl<B> std::fmt::Debug for Bodies<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bodies")
            .field("pooled", &self.pool.len())
            .field("fleet", &self.fleet)
            .field("prompt_blocks", &self.prompt_blocks)
            .field("new_blocks", &self.new_blocks)
            .finish_non_exhaustive()
    }
}

fn encode(req: &pb::LookupRouteRequest) -> Bytes {
    Bytes::from(req.encode_to_vec())
}

/// Sends a body encoded ahead; decodes the answer as `D`.
#[derive(Debug)]
pub struct PreEncoded<D>(PhantomData<D>);

impl<D> Default for PreEncoded<D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<D: Message + Default + Send + 'static> Codec for PreEncoded<D> {
    type Encode = Bytes;
    type Decode = D;
    type Encoder = BodyEncoder;
    type Decoder = LeanDecoder<D>;

    fn encoder(&mut self) -> BodyEncoder {
        BodyEncoder
    }

    fn decoder(&mut self) -> LeanDecoder<D> {
        LeanDecoder(PhantomData)
    }
}

/// Copies the body into the frame.
#[derive(Debug)]
pub struct BodyEncoder;

impl Encoder for BodyEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

/// Decodes `D`, skipping fields it does not name.
#[derive(Debug)]
pub struct LeanDecoder<D>(PhantomData<D>);

impl<D: Message + Default> Decoder for LeanDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("decoding the answer: {e}")))
    }
}

/// One LookupRoute with a body encoded ahead, the answer read lean.
pub async fn lookup_route(channel: Channel, body: Bytes) -> Result<LeanAnswer, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("the channel is not ready: {e}")))?;
    grpc.unary(
        tonic::Request::new(body),
        PathAndQuery::from_static(LOOKUP_ROUTE),
        PreEncoded::<LeanAnswer>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(hashes: Vec<u64>) -> pb::LookupRouteRequest {
        pb::LookupRouteRequest {
            scope: Some(pb::IndexScope {
                tenant: "t".into(),
                model: "m".into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            key: Some(pb::lookup_route_request::Key::BlockHashes(
                pb::BlockHashes { hashes },
            )),
            ..Default::default()
        }
    }

    #[test]
    fn pooled_bodies_are_the_requests_the_full_client_sends_in_order() {
        for (replicas, entries) in [(4, 40_000), (16, 200_000), (256, 1_000_000)] {
            let fleet = Fleet {
                replicas,
                entries,
                chain: 1024,
            };
            let bodies = Bodies::new(fleet, 16, 0, request);
            let distinct = fleet.distinct_prompts();
            assert_eq!(bodies.pooled() as u64, distinct);
            let mut seen = std::collections::HashSet::new();
            for i in (0..3 * distinct).chain([1_000_003, 7_000_021]) {
                let sent = pb::LookupRouteRequest::decode(bodies.get(i)).unwrap();
                // What the full client builds for the i-th request.
                let groups = u64::from(fleet.groups());
                let full =
                    request(fleet.prompt(u32::try_from(i % groups).unwrap(), i / groups, 16));
                assert_eq!(sent, full, "request {i}");
                if i < distinct {
                    assert!(
                        seen.insert(bodies.get(i)),
                        "request {i} repeats one before it"
                    );
                }
            }
        }
    }

    #[test]
    fn without_a_pool_each_body_is_encoded_alike() {
        let fleet = Fleet {
            replicas: 4 * u32::try_from(MAX_POOL).unwrap() + 4,
            entries: 4 * MAX_POOL + 4,
            chain: 1024,
        };
        let bodies = Bodies::new(fleet, 4, 0, request);
        assert_eq!(bodies.pooled(), 0);
        assert!(fleet.distinct_prompts() > MAX_POOL);
        let groups = u64::from(fleet.groups());
        for i in [0, 1, groups + 5, 3 * groups + 1] {
            let full = request(fleet.prompt(u32::try_from(i % groups).unwrap(), i / groups, 4));
            assert_eq!(pb::LookupRouteRequest::decode(bodies.get(i)).unwrap(), full);
        }
    }

    #[test]
    fn a_new_tail_is_each_request_s_own_pooled_or_not() {
        for (replicas, entries) in [(16, 200_000), (4 * 70_000, 4 * 70_000)] {
            let fleet = Fleet {
                replicas,
                entries,
                chain: 1024,
            };
            let bodies = Bodies::new(fleet, 16, 5, request);
            assert_eq!(bodies.pooled() > 0, fleet.distinct_prompts() <= MAX_POOL);
            let mut tails = std::collections::HashSet::new();
            for i in [0, 1, 7, 1_000_003, 7_000_021, u64::MAX] {
                let sent = pb::LookupRouteRequest::decode(bodies.get(i)).unwrap();
                assert_eq!(
                    sent,
                    request(fleet.lookup_prompt_with_new(i, 16, 5)),
                    "request {i}"
                );
                let Some(pb::lookup_route_request::Key::BlockHashes(h)) = sent.key else {
                    panic!("request {i} has no block hashes");
                };
                assert!(
                    tails.insert(h.hashes[11..].to_vec()),
                    "request {i}'s tail repeats"
                );
            }
        }
    }

    #[test]
    fn the_lean_answer_reads_outcome_and_best_address_and_skips_the_rest() {
        let candidate = |i: u32| pb::CandidateScore {
            replica: Some(pb::ReplicaRef {
                replica_id: format!("engine-{i}"),
                address: format!("10.0.0.{i}:8000"),
            }),
            matched_blocks: 128,
            matched_tokens: 2048,
            tier: pb::Tier::T1 as i32,
            score: 1.5 - f64::from(i),
            speculative: i == 3,
            load: f64::from(i),
        };
        let full = pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::PrefixMatch as i32,
            best: Some(candidate(2)),
            candidates: (0..5).map(candidate).collect(),
            no_hint_reason: 0,
            detail: "d".into(),
            block_size: 16,
            prompt_blocks: 128,
        };
        let lean = LeanAnswer::decode(full.encode_to_vec().as_slice()).unwrap();
        assert_eq!(lean.outcome, full.outcome);
        assert_eq!(
            lean.best
                .as_ref()
                .unwrap()
                .replica
                .as_ref()
                .unwrap()
                .address,
            "10.0.0.2:8000"
        );
        assert!(lean.routed_by_prefix());
        let no_hint = pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::NoHint as i32,
            ..full
        };
        let lean = LeanAnswer::decode(no_hint.encode_to_vec().as_slice()).unwrap();
        assert!(!lean.routed_by_prefix());
        // A prefix match without a best (a server bug) is not a routed answer.
        let bare = pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::PrefixMatch as i32,
            ..Default::default()
        };
        assert!(
            !LeanAnswer::decode(bare.encode_to_vec().as_slice())
                .unwrap()
                .routed_by_prefix()
        );
    }
}
