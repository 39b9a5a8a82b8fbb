//! One event stream from a Mooncake trace: simulated LRU workers, their
//! store/remove events in engine order, and a query per request with the
//! overlap every worker is expected to answer — computed here from the
//! simulation alone, never from either index.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;

use anyhow::{Context, bail};

/// Most workers (the reference holder sets are 256-bit masks).
pub const MAX_WORKERS: usize = 256;

/// One trace request: its block ids (prefix-chained by the trace).
#[derive(Debug)]
pub struct Request {
    pub hash_ids: Vec<u64>,
}

/// Reads a Mooncake trace (JSON lines with `hash_ids`).
pub fn read_trace(path: &std::path::Path) -> anyhow::Result<Vec<Request>> {
    #[derive(serde::Deserialize)]
    struct Line {
        hash_ids: Vec<u64>,
    }
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: hash_ids", path.display(), n + 1))?;
        out.push(Request {
            hash_ids: parsed.hash_ids,
        });
    }
    if out.is_empty() {
        bail!("{}: no requests", path.display());
    }
    Ok(out)
}

/// A block: its prefix-chained hash (what both indexes key on as the
/// sequence hash) and its content-only hash (Dynamo's `LocalBlockHash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub chained: u64,
    pub local: u64,
}

/// One item of the stream, in engine order.
#[derive(Debug)]
pub enum Item {
    /// A worker stored consecutive blocks after `parent` (at `start_depth`).
    Stored {
        worker: u32,
        start_depth: u32,
        parent: Option<u64>,
        blocks: Vec<Block>,
    },
    /// A worker evicted blocks (chained hashes).
    Removed { worker: u32, chained: Vec<u64> },
    /// A lookup of request `prompt` (an index into [`Stream::prompts`]),
    /// with the expected (worker, overlap) pairs of overlap > 0, sorted by
    /// worker.
    Query {
        prompt: u32,
        expected: Vec<(u32, u32)>,
    },
}

/// The generated stream and what the simulation ended with.
#[derive(Debug)]
pub struct Stream {
    pub workers: u32,
    pub capacity: usize,
    pub copies: u32,
    pub prompts: Vec<Vec<Block>>,
    pub items: Vec<Item>,
    pub block_events: u64,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub queries: u64,
    /// Resident (worker, block) pairs at the end.
    pub resident: u64,
    /// Final lookups: prompts with their expected overlaps at the end.
    pub finals: Vec<(u32, Vec<(u32, u32)>)>,
}

/// How much of the prompts a lookup walks (for instructions per block).
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryShape {
    pub queries_unmatched: u64,
    /// Per query, its longest expected overlap plus the block that ends
    /// it (at most the prompt's length): the blocks an exact walk reads.
    pub query_blocks: u64,
    pub finals_unmatched: u64,
    pub final_blocks: u64,
}

impl Stream {
    /// The queries' and final lookups' shape, from the expected overlaps.
    pub fn query_shape(&self) -> QueryShape {
        let walked = |prompt: u32, expected: &[(u32, u32)]| {
            let longest = expected.iter().map(|e| e.1).max().unwrap_or(0);
            let len = self.prompts.get(prompt as usize).map_or(0, Vec::len) as u64;
            (u64::from(longest) + 1).min(len)
        };
        let mut shape = QueryShape::default();
        for item in &self.items {
            if let Item::Query { prompt, expected } = item {
                shape.queries_unmatched += u64::from(expected.is_empty());
                shape.query_blocks += walked(*prompt, expected);
            }
        }
        for (prompt, expected) in &self.finals {
            shape.finals_unmatched += u64::from(expected.is_empty());
            shape.final_blocks += walked(*prompt, expected);
        }
        shape
    }
}

fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 finaliser over the pair: well spread, deterministic.
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One simulated worker: an LRU of blocks, touched tail first so a prefix's
/// head is always more recent than its tail and eviction never leaves a
/// hole in a chain (as vLLM frees a request's blocks tail first).
#[derive(Debug, Default)]
struct Worker {
    last_touch: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    requests: u64,
}

impl Worker {
    fn touch(&mut self, chained: u64, tick: u64) {
        self.last_touch.insert(chained, tick);
        self.order.push_back((tick, chained));
    }

    /// The least recently used resident block, removed.
    fn evict(&mut self) -> Option<u64> {
        while let Some((tick, chained)) = self.order.pop_front() {
            if self.last_touch.get(&chained) == Some(&tick) {
                self.last_touch.remove(&chained);
                return Some(chained);
            }
        }
        None
    }
}

/// The reference holder sets: block → bit set of workers holding it.
#[derive(Debug, Default)]
struct Holders(HashMap<u64, [u64; MAX_WORKERS / 64]>);

impl Holders {
    fn set(&mut self, chained: u64, worker: u32, on: bool) {
        let (w, bit) = ((worker / 64) as usize, 1u64 << (worker % 64));
        if on {
            self.0.entry(chained).or_default()[w] |= bit;
        } else if let Some(mask) = self.0.get_mut(&chained) {
            mask[w] &= !bit;
            if mask.iter().all(|&m| m == 0) {
                self.0.remove(&chained);
            }
        }
    }

    /// Every worker's run of leading blocks of `prompt` held, (worker,
    /// overlap) for overlap > 0, by worker.
    fn overlaps(&self, prompt: &[Block]) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let Some(first) = prompt.first().and_then(|b| self.0.get(&b.chained)) else {
            return out;
        };
        let mut active = *first;
        let mut depth = vec![0u32; MAX_WORKERS];
        for (i, block) in prompt.iter().enumerate() {
            let here = self.0.get(&block.chained).copied().unwrap_or_default();
            let mut any = false;
            for (w, mask) in active.iter_mut().enumerate() {
                let mut gone = *mask & !here[w];
                while gone != 0 {
                    let b = gone.trailing_zeros() as usize;
                    depth[w * 64 + b] = i as u32;
                    gone &= gone - 1;
                }
                *mask &= here[w];
                any |= *mask != 0;
            }
            if !any {
                break;
            }
        }
        for (w, mask) in active.iter().enumerate() {
            let mut left = *mask;
            while left != 0 {
                let b = left.trailing_zeros() as usize;
                depth[w * 64 + b] = prompt.len() as u32;
                left &= left - 1;
            }
        }
        for (worker, &d) in depth.iter().enumerate() {
            if d > 0 {
                out.push((worker as u32, d));
            }
        }
        out
    }
}

/// Parameters of the generated stream.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub workers: u32,
    /// Blocks each worker can hold.
    pub capacity: usize,
    /// Times the trace is replayed under distinct block ids (distinct user
    /// groups), so the working set exceeds the fleet's capacity.
    pub copies: u32,
    /// Final lookups to sample.
    pub finals: usize,
}

/// Generates the stream.
pub fn generate(trace: &[Request], shape: Shape) -> anyhow::Result<Stream> {
    if shape.workers == 0 || shape.workers as usize > MAX_WORKERS {
        bail!("--workers must be 1..={MAX_WORKERS}");
    }
    // A request longer than half a worker's capacity would evict itself.
    let max_len = (shape.capacity / 2).max(1);
    let mut prompts = Vec::new();
    for copy in 0..shape.copies {
        for req in trace {
            let mut chained = u64::from(copy).wrapping_mul(0x2545_f491_4f6c_dd1d);
            let blocks: Vec<Block> = req
                .hash_ids
                .iter()
                .take(max_len)
                .map(|&id| {
                    let local = mix(u64::from(copy) << 40, id);
                    chained = mix(chained, local);
                    Block { chained, local }
                })
                .collect();
            if !blocks.is_empty() {
                prompts.push(blocks);
            }
        }
    }
    // Copies interleaved request by request (as concurrent user groups).
    let per_copy = prompts.len() / shape.copies.max(1) as usize;
    let order: Vec<usize> = (0..per_copy)
        .flat_map(|i| (0..shape.copies as usize).map(move |c| c * per_copy + i))
        .collect();

    let mut workers: Vec<Worker> = (0..shape.workers).map(|_| Worker::default()).collect();
    let mut holders = Holders::default();
    let mut items = Vec::with_capacity(order.len() * 3);
    let (mut stored_blocks, mut removed_blocks, mut tick) = (0u64, 0u64, 0u64);
    for &p in &order {
        let prompt = &prompts[p];
        let expected = holders.overlaps(prompt);
        // A KV-aware router: longest overlap, less the worker's excess load.
        let min_req = workers.iter().map(|w| w.requests).min().unwrap_or(0);
        let score = |w: u32| {
            let overlap = expected
                .iter()
                .find(|&&(x, _)| x == w)
                .map_or(0, |&(_, o)| i64::from(o));
            overlap - (workers[w as usize].requests - min_req) as i64 / 4
        };
        let chosen = (0..shape.workers)
            .max_by_key(|&w| (score(w), std::cmp::Reverse((w + p as u32) % shape.workers)))
            .unwrap_or(0);
        let overlap = expected
            .iter()
            .find(|&&(x, _)| x == chosen)
            .map_or(0, |&(_, o)| o as usize);
        items.push(Item::Query {
            prompt: p as u32,
            expected,
        });
        let worker = &mut workers[chosen as usize];
        worker.requests += 1;
        // Reuse refreshes the held prefix (tail first), then room is made
        // for the new blocks, then they are stored.
        for block in prompt[..overlap].iter().rev() {
            tick += 1;
            worker.touch(block.chained, tick);
        }
        let new = &prompt[overlap..];
        let mut removed = Vec::new();
        while worker.last_touch.len() + new.len() > shape.capacity {
            let Some(gone) = worker.evict() else { break };
            holders.set(gone, chosen, false);
            removed.push(gone);
        }
        if !removed.is_empty() {
            removed_blocks += removed.len() as u64;
            items.push(Item::Removed {
                worker: chosen,
                chained: removed,
            });
        }
        if !new.is_empty() {
            for block in new.iter().rev() {
                tick += 1;
                worker.touch(block.chained, tick);
                holders.set(block.chained, chosen, true);
            }
            // Re-touch the reused prefix so it stays more recent than the
            // new tail.
            for block in prompt[..overlap].iter().rev() {
                tick += 1;
                worker.touch(block.chained, tick);
            }
            stored_blocks += new.len() as u64;
            items.push(Item::Stored {
                worker: chosen,
                start_depth: overlap as u32,
                parent: overlap.checked_sub(1).map(|i| prompt[i].chained),
                blocks: new.to_vec(),
            });
        }
    }
    let resident = workers.iter().map(|w| w.last_touch.len() as u64).sum();
    let step = (prompts.len() / shape.finals.max(1)).max(1);
    let finals = (0..prompts.len())
        .step_by(step)
        .take(shape.finals)
        .map(|p| (p as u32, holders.overlaps(&prompts[p])))
        .collect();
    let queries = order.len() as u64;
    Ok(Stream {
        workers: shape.workers,
        capacity: shape.capacity,
        copies: shape.copies,
        prompts,
        items,
        block_events: stored_blocks + removed_blocks,
        stored_blocks,
        removed_blocks,
        queries,
        resident,
        finals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> Vec<Request> {
        [
            vec![1, 2, 3, 4],
            vec![1, 2, 5],
            vec![1, 2, 3, 6],
            vec![9, 10, 11, 12],
            vec![1, 2, 3, 4],
        ]
        .into_iter()
        .map(|hash_ids| Request { hash_ids })
        .collect()
    }

    #[test]
    fn expected_overlaps_follow_the_simulation() {
        let shape = Shape {
            workers: 1,
            capacity: 8,
            copies: 1,
            finals: 10,
        };
        let s = generate(&trace(), shape).expect("stream");
        let queries: Vec<&Vec<(u32, u32)>> = s
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Query { expected, .. } => Some(expected),
                _ => None,
            })
            .collect();
        let none = Vec::<(u32, u32)>::new();
        // Nothing held; [1,2] of the first; [1,2,3]; nothing for a new
        // prefix, whose four blocks evict the two least recently used (4,
        // the first request's tail, then 5); so the last finds [1,2,3],
        // and storing its 4 evicts 6.
        assert_eq!(
            queries,
            [&none, &vec![(0, 2)], &vec![(0, 3)], &none, &vec![(0, 3)]]
        );
        assert_eq!(s.removed_blocks, 3);
        assert_eq!(s.resident, 8);
        assert_eq!(s.block_events, s.stored_blocks + s.removed_blocks);
        let removed: Vec<&Vec<u64>> = s
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Removed { chained, .. } => Some(chained),
                _ => None,
            })
            .collect();
        let chained = |n: usize, d: usize| s.prompts[n][d].chained;
        assert_eq!(
            removed,
            [&vec![chained(0, 3), chained(1, 2)], &vec![chained(2, 3)]]
        );
    }

    #[test]
    fn eviction_takes_tails_before_heads() {
        let mut w = Worker::default();
        for (t, b) in [(1, 30), (2, 20), (3, 10)] {
            w.touch(b, t);
        }
        w.touch(30, 4);
        assert_eq!(w.evict(), Some(20));
        assert_eq!(w.evict(), Some(10));
        assert_eq!(w.evict(), Some(30));
        assert_eq!(w.evict(), None);
    }
}
