//! Dumping the index's content and restoring it, for snapshots that let a
//! restarted index server replay only the tail of its event log.
//!
//! A [`Dump`] is what the engines told the index, per replica: its scope,
//! address, block size, tier-2 counters and the blocks it holds, as runs of
//! consecutive depths (the `Stored` changes that rebuild them). Holders are
//! read from the store in record order, so runs mostly follow the prompts
//! they were stored with. The eviction clock is not kept: restored entries
//! all count as stored at restore time.
//!
//! [`Enc`] and [`Dec`] are the byte form: fixed-width little-endian
//! integers and length-prefixed strings, with every read bounds-checked
//! and every failure naming what was being read, since a snapshot file is
//! input like any other.

use crate::arena::Holder;
use crate::index::{Index, entry_key};
use crate::ingest::RankState;
use crate::types::{Change, ContentError, Fingerprint, HashScheme, ReplicaKey, Scope, Tier};

/// One replica's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaDump {
    /// Which replica.
    pub key: ReplicaKey,
    /// Its scope.
    pub scope: Scope,
    /// Its serving address.
    pub address: String,
    /// Tier-2 counters `(hits, queries)`, when reported.
    pub tier2: Option<(u64, u64)>,
    /// When anything last came from it (Unix ms); `None` in a dump of an
    /// older form, which kept no such time.
    pub last_seen_ms: Option<i64>,
    /// `Stored` changes that rebuild its holdings.
    pub changes: Vec<Change>,
}

impl ReplicaDump {
    /// Entries the replica holds.
    pub fn entries(&self) -> u64 {
        self.changes
            .iter()
            .map(|c| match c {
                Change::Stored { fingerprints, .. } => fingerprints.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

/// The index's content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    /// Every replica, sorted by key.
    pub replicas: Vec<ReplicaDump>,
}

impl Dump {
    /// Entries in all.
    pub fn entries(&self) -> u64 {
        self.replicas.iter().map(ReplicaDump::entries).sum()
    }

    /// Appends the byte form.
    pub fn encode(&self, enc: &mut Enc) {
        enc.len(self.replicas.len());
        for r in &self.replicas {
            enc.replica_key(&r.key);
            enc.scope(&r.scope);
            enc.str(&r.address);
            match r.tier2 {
                Some((hits, queries)) => {
                    enc.u8(1);
                    enc.u64(hits);
                    enc.u64(queries);
                }
                None => enc.u8(0),
            }
            enc.i64(r.last_seen_ms.unwrap_or(0));
            enc.changes(&r.changes);
        }
    }

    /// Reads the byte form.
    pub fn decode(dec: &mut Dec<'_>) -> Result<Self, DumpError> {
        Self::decode_form(dec, true)
    }

    /// Reads the byte form written before replicas' last-seen times were
    /// kept (their `last_seen_ms` is `None`).
    pub fn decode_without_seen(dec: &mut Dec<'_>) -> Result<Self, DumpError> {
        Self::decode_form(dec, false)
    }

    fn decode_form(dec: &mut Dec<'_>, with_seen: bool) -> Result<Self, DumpError> {
        let n = dec.len("replicas")?;
        let mut replicas = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let key = dec.replica_key()?;
            let scope = dec.scope()?;
            let address = dec.str("replica.address")?;
            let tier2 = match dec.u8("replica.tier2")? {
                0 => None,
                1 => Some((
                    dec.u64("replica.tier2.hits")?,
                    dec.u64("replica.tier2.queries")?,
                )),
                other => return Err(DumpError::Invalid("replica.tier2", u64::from(other))),
            };
            let last_seen_ms = if with_seen {
                Some(dec.i64("replica.last_seen_ms")?).filter(|&t| t > 0)
            } else {
                None
            };
            let changes = dec.changes()?;
            replicas.push(ReplicaDump {
                key,
                scope,
                address,
                tier2,
                last_seen_ms,
                changes,
            });
        }
        Ok(Self { replicas })
    }
}

impl Index {
    /// The index's content. Holds the writer lock throughout, so the dump
    /// is one consistent state (writes wait; lookups do not).
    pub fn dump(&self) -> Dump {
        let writes = self.hold_writes();
        let reg = self.registry.read();
        // Slot -> (position in `out`, the scope id its keys are mixed with).
        let mut slots: Vec<Option<(usize, u32)>> = vec![None; reg.replicas.len()];
        let mut out: Vec<ReplicaDump> = Vec::new();
        let mut block_sizes: Vec<u32> = Vec::new();
        for (i, meta) in reg.replicas.iter().enumerate() {
            let Some(meta) = meta else { continue };
            let Some(scope) = reg.scope_list.get(meta.scope as usize) else {
                continue;
            };
            let (block_size, tier2) = writes.slot_facts(i);
            slots[i] = Some((out.len(), meta.scope));
            block_sizes.push(block_size);
            out.push(ReplicaDump {
                key: meta.key.clone(),
                scope: scope.clone(),
                address: meta.address.clone(),
                tier2,
                last_seen_ms: Some(meta.last_seen_ms.load(std::sync::atomic::Ordering::Relaxed)),
                changes: Vec::new(),
            });
        }
        for (_, page) in self.store.directory().iter() {
            let page = page.read();
            for offset in page.live_offsets() {
                let Some(view) = page.view(offset) else {
                    continue;
                };
                for &raw in view.holders() {
                    let holder = Holder::from_raw(raw);
                    let Some(Some((n, scope))) = slots.get(holder.replica() as usize).copied()
                    else {
                        continue;
                    };
                    let fp = Fingerprint(entry_key(scope, Fingerprint(view.key)));
                    push_block(
                        &mut out[n].changes,
                        fp,
                        view.depth,
                        holder.tier(),
                        block_sizes[n],
                    );
                }
            }
        }
        drop(reg);
        drop(writes);
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Dump { replicas: out }
    }

    /// Adds `dump`'s replicas to the index (meant for an empty one), as if
    /// each had reported its holdings when it was last seen (at `now_ms`
    /// when the dump does not say, never later), so a replica silent before
    /// the dump is not answered again, nor kept longer, for having been
    /// restored; returns what did not apply.
    pub fn restore(&self, dump: &Dump, now_ms: i64) -> Vec<ContentError> {
        let mut errors = Vec::new();
        for r in &dump.replicas {
            let seen = r.last_seen_ms.map_or(now_ms, |t| t.min(now_ms));
            errors.extend(self.replace(&r.key, &r.scope, &r.address, &r.changes, seen));
            self.set_tier2(&r.key, r.tier2);
        }
        errors
    }
}

/// Extends the last run when `fp` continues it, else starts one.
fn push_block(changes: &mut Vec<Change>, fp: Fingerprint, depth: u32, tier: Tier, block_size: u32) {
    if let Some(Change::Stored {
        start_depth,
        fingerprints,
        tier: run_tier,
        ..
    }) = changes.last_mut()
        && *run_tier == tier
        && u64::from(*start_depth) + fingerprints.len() as u64 == u64::from(depth)
        // A saturated depth repeats: such blocks get runs of their own.
        && depth < crate::arena::MAX_DEPTH
    {
        fingerprints.push(fp);
        return;
    }
    changes.push(Change::Stored {
        start_depth: depth,
        fingerprints: vec![fp],
        block_size,
        tier,
    });
}

/// Why bytes are not a dump (the part being read is named).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// The bytes end inside this part.
    #[error("{0}: truncated")]
    Truncated(&'static str),
    /// This part holds a value it cannot hold.
    #[error("{0}: invalid value {1}")]
    Invalid(&'static str, u64),
    /// This string is not UTF-8.
    #[error("{0}: not UTF-8")]
    NotUtf8(&'static str),
}

/// Writes the byte form.
#[derive(Debug, Default)]
pub struct Enc {
    /// The bytes so far.
    pub buf: Vec<u8>,
}

impl Enc {
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// Four bytes, little-endian.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// Eight bytes, little-endian.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// Eight bytes, little-endian, two's complement.
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// A count.
    pub fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, s: &str) {
        self.len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }
    /// A replica key.
    pub fn replica_key(&mut self, key: &ReplicaKey) {
        self.str(&key.tenant);
        self.str(&key.replica_id);
        self.u32(key.dp_rank);
    }
    /// A scope.
    pub fn scope(&mut self, scope: &Scope) {
        self.str(&scope.tenant);
        self.str(&scope.model);
        self.u8(match scope.hash_scheme {
            HashScheme::Vllm => 0,
            HashScheme::Sglang => 1,
        });
        self.str(&scope.adapter);
    }
    /// Changes of any kind.
    pub fn changes(&mut self, changes: &[Change]) {
        self.len(changes.len());
        for c in changes {
            match c {
                Change::Stored {
                    start_depth,
                    fingerprints,
                    block_size,
                    tier,
                } => {
                    self.u8(0);
                    self.u32(*start_depth);
                    self.u32(*block_size);
                    self.u8(tier_byte(*tier));
                    self.fingerprints(fingerprints);
                }
                Change::Evicted { fingerprints } => {
                    self.u8(1);
                    self.fingerprints(fingerprints);
                }
                Change::Cleared { tier } => {
                    self.u8(2);
                    self.u8(tier_byte(*tier));
                }
            }
        }
    }
    fn fingerprints(&mut self, fps: &[Fingerprint]) {
        self.len(fps.len());
        self.buf.reserve(fps.len() * 8);
        for fp in fps {
            self.u64(fp.0);
        }
    }
    /// One ingest session rank.
    pub fn rank(&mut self, rank: &RankState) {
        self.replica_key(&rank.key);
        self.u64(rank.incarnation);
        self.u64(rank.last_seq);
        match &rank.resync {
            Some(changes) => {
                self.u8(1);
                self.changes(changes);
            }
            None => self.u8(0),
        }
    }
}

fn tier_byte(tier: Tier) -> u8 {
    match tier {
        Tier::T1 => 1,
        Tier::T2 => 2,
    }
}

/// Reads the byte form.
#[derive(Debug)]
pub struct Dec<'a> {
    bytes: &'a [u8],
}

impl<'a> Dec<'a> {
    /// Reads `bytes` from the start.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DumpError> {
        if self.bytes.len() < n {
            return Err(DumpError::Truncated(what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DumpError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }
    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DumpError> {
        Ok(self.array::<1>(what)?[0])
    }
    /// Four bytes, little-endian.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DumpError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    /// Eight bytes, little-endian.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DumpError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// Eight bytes, little-endian, two's complement.
    pub fn i64(&mut self, what: &'static str) -> Result<i64, DumpError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    /// A count of items of at least `min_bytes` each: never more than the
    /// bytes left could hold, so a corrupt count cannot allocate.
    fn count(&mut self, what: &'static str, min_bytes: usize) -> Result<usize, DumpError> {
        let n = self.u64(what)?;
        let fits = (self.bytes.len() / min_bytes.max(1)) as u64;
        if n > fits {
            return Err(DumpError::Truncated(what));
        }
        usize::try_from(n).map_err(|_| DumpError::Invalid(what, n))
    }
    /// A count.
    pub fn len(&mut self, what: &'static str) -> Result<usize, DumpError> {
        self.count(what, 1)
    }
    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, what: &'static str) -> Result<String, DumpError> {
        let n = self.len(what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DumpError::NotUtf8(what))
    }
    /// A replica key.
    pub fn replica_key(&mut self) -> Result<ReplicaKey, DumpError> {
        Ok(ReplicaKey {
            tenant: self.str("replica_key.tenant")?,
            replica_id: self.str("replica_key.replica_id")?,
            dp_rank: self.u32("replica_key.dp_rank")?,
        })
    }
    /// A scope.
    pub fn scope(&mut self) -> Result<Scope, DumpError> {
        let tenant = self.str("scope.tenant")?;
        let model = self.str("scope.model")?;
        let hash_scheme = match self.u8("scope.hash_scheme")? {
            0 => HashScheme::Vllm,
            1 => HashScheme::Sglang,
            other => return Err(DumpError::Invalid("scope.hash_scheme", u64::from(other))),
        };
        Ok(Scope {
            tenant,
            model,
            hash_scheme,
            adapter: self.str("scope.adapter")?,
        })
    }
    fn tier(&mut self, what: &'static str) -> Result<Tier, DumpError> {
        match self.u8(what)? {
            1 => Ok(Tier::T1),
            2 => Ok(Tier::T2),
            other => Err(DumpError::Invalid(what, u64::from(other))),
        }
    }
    fn fingerprints(&mut self) -> Result<Vec<Fingerprint>, DumpError> {
        let n = self.count("change.fingerprints", 8)?;
        let bytes = self.take(n * 8, "change.fingerprints")?;
        Ok(bytes
            .chunks_exact(8)
            .map(|b| {
                let mut a = [0; 8];
                a.copy_from_slice(b);
                Fingerprint(u64::from_le_bytes(a))
            })
            .collect())
    }
    /// Changes of any kind.
    pub fn changes(&mut self) -> Result<Vec<Change>, DumpError> {
        let n = self.count("changes", 2)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(match self.u8("change.kind")? {
                0 => Change::Stored {
                    start_depth: self.u32("change.start_depth")?,
                    block_size: self.u32("change.block_size")?,
                    tier: self.tier("change.tier")?,
                    fingerprints: self.fingerprints()?,
                },
                1 => Change::Evicted {
                    fingerprints: self.fingerprints()?,
                },
                2 => Change::Cleared {
                    tier: self.tier("change.tier")?,
                },
                other => return Err(DumpError::Invalid("change.kind", u64::from(other))),
            });
        }
        Ok(out)
    }
    /// One ingest session rank.
    pub fn rank(&mut self) -> Result<RankState, DumpError> {
        let key = self.replica_key()?;
        let incarnation = self.u64("rank.incarnation")?;
        let last_seq = self.u64("rank.last_seq")?;
        let resync = match self.u8("rank.resync")? {
            0 => None,
            1 => Some(self.changes()?),
            other => return Err(DumpError::Invalid("rank.resync", u64::from(other))),
        };
        Ok(RankState {
            key,
            incarnation,
            last_seq,
            resync,
        })
    }
}

#[cfg(test)]
#[path = "dump_tests.rs"]
mod tests;
