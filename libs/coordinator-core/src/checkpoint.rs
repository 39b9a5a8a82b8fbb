//! The checkpoint file of derived state: a 12-byte header (`LMCKPT\0\0` and a
//! u32 little-endian version), then
//!
//! * version 2 (written): frames `[u8 kind][u64 LE length][bytes]` — kind 1,
//!   the small sections as one msgpack map (the reference's layout, without
//!   `key_directory`, `cache_usage` and `lru_order`); kind 2, the directory's
//!   image ([`KeyDirectory::encode_image`]: its compact table, LRU order
//!   included), which loads by one linear scan. Unknown kinds are skipped.
//! * version 1 (read, never written): LMCache 0.5.6's own file, one msgpack
//!   map from section name to section, so a coordinator switched from the
//!   reference restarts warm.
//!
//! Capture and restore helpers for each view live here too, so the service
//! only copies and writes bytes.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::StorageLevel;
use crate::capacity::{CapacityRegistry, Compartment, Declaration};
use crate::directory::{Binding, KeyDirectory, Placement};
use crate::gate::{Cursor, Gate};
use crate::key::ObjectKey;
use crate::usage::UsageView;

/// File magic.
pub const MAGIC: &[u8; 8] = b"LMCKPT\0\0";
/// Format version written.
pub const VERSION: u32 = 2;
/// The reference's format version (read).
pub const VERSION_V1: u32 = 1;
/// Frame of the small sections (msgpack).
const FRAME_SECTIONS: u8 = 1;
/// Frame of the directory image.
const FRAME_DIRECTORY: u8 = 2;

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Too short or wrong magic.
    #[error("not a checkpoint file (bad header)")]
    Header,
    /// A version this build does not read.
    #[error("unsupported checkpoint version {0}")]
    Version(u32),
    /// The body is not a msgpack map.
    #[error("checkpoint body does not decode: {0}")]
    Value(String),
    /// The sections could not be encoded.
    #[error("checkpoint does not encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

/// `[chunk_hash bytes, model_name, kv_rank, object_group_id, cache_salt]`.
pub type KeyTuple = (ByteBuf, String, i64, i64, String);
/// `[instance_id, incarnation, tier, backend, size_bytes, shared]`.
pub type PlacementTuple = (String, u64, StorageLevel, String, u64, bool);
/// `[tier, backend, capacity, shared]`.
pub type CompartmentTuple = (StorageLevel, String, u64, bool);
/// `[instance_id, incarnation, revision, [compartment…]]`.
pub type DeclarationTuple = (String, u64, u64, Vec<CompartmentTuple>);

fn key_tuple(k: &ObjectKey) -> KeyTuple {
    (
        ByteBuf::from(k.chunk_hash.clone()),
        k.model_name.clone(),
        k.kv_rank,
        k.object_group_id,
        k.cache_salt.clone(),
    )
}

fn from_tuple(t: &KeyTuple) -> ObjectKey {
    ObjectKey {
        chunk_hash: t.0.to_vec(),
        model_name: t.1.clone(),
        kv_rank: t.2,
        object_group_id: t.3,
        cache_salt: t.4.clone(),
    }
}

/// Every section; absent ones start cold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sections {
    /// Gate cursors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_cursors: Option<StreamCursors>,
    /// Key directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_directory: Option<DirectorySection>,
    /// Usage view. Written in the reference's layout, never read back: the
    /// rollups are rebuilt from the directory, which holds the same bytes,
    /// so decoding skips it rather than allocate a row per placement.
    #[serde(default, skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub cache_usage: Option<UsageSection>,
    /// Capacity declarations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_config: Option<ServerConfigSection>,
    /// Eviction LRU order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lru_order: Option<LruSection>,
    /// Kafka offsets the views include (Kafka transport only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_stream_position: Option<KafkaPositionSection>,
}

/// `{"offsets": [[topic, partition, last_offset]]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KafkaPositionSection {
    /// Last consumed offset per partition.
    pub offsets: Vec<(String, i32, i64)>,
}

/// `{"cursors": {id: [incarnation, last_seq, gap_detected]}}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamCursors {
    /// Cursors by instance.
    pub cursors: BTreeMap<String, (u64, u64, bool)>,
}

/// The directory section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectorySection {
    /// `[key, last_access, access_count, [placement…]]`, insertion order.
    pub keys: Vec<(KeyTuple, f64, u64, Vec<PlacementTuple>)>,
    /// `[chunk_hash, token_offset, u32-LE token bytes]`.
    pub bindings: Vec<(ByteBuf, i64, ByteBuf)>,
    /// Indexes into `keys` of each instance's L1 keys.
    pub l1_keys_by_instance: BTreeMap<String, Vec<u64>>,
}

/// `{"placements": [[tier, key, owner, backend, size]]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageSection {
    /// Placements.
    pub placements: Vec<(StorageLevel, KeyTuple, String, String, u64)>,
}

/// `{"declarations": [[id, incarnation, revision, [[tier, backend, capacity, shared]]]]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerConfigSection {
    /// Declarations.
    pub declarations: Vec<DeclarationTuple>,
}

/// `{"buckets": {salt: [key…]}}`, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LruSection {
    /// Buckets.
    pub buckets: BTreeMap<String, Vec<KeyTuple>>,
}

/// Serializes a version-1 file, the reference's format (tests and tools
/// that hand a file to LMCache; the service writes [`encode_file`]).
pub fn encode(sections: &Sections) -> Result<Vec<u8>, CheckpointError> {
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION_V1.to_le_bytes());
    out.extend_from_slice(&rmp_serde::to_vec_named(sections)?);
    Ok(out)
}

/// Serializes a version-2 file: the small sections of `sections` (its
/// directory, usage and LRU sections are not written) and `directory`'s
/// image. One linear pass over the directory's records, so the service
/// runs it under the views lock and writes the bytes after releasing it.
pub fn encode_file(
    sections: &Sections,
    directory: &KeyDirectory,
) -> Result<Vec<u8>, CheckpointError> {
    let small = Sections {
        key_directory: None,
        cache_usage: None,
        lru_order: None,
        ..sections.clone()
    };
    let meta = rmp_serde::to_vec_named(&small)?;
    let mut out = Vec::with_capacity(64 + meta.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(FRAME_SECTIONS);
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    out.extend_from_slice(&meta);
    out.push(FRAME_DIRECTORY);
    let len_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    directory.encode_image(&mut out);
    let len = (out.len() - len_at - 8) as u64;
    out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

/// A checkpoint file read back: the small sections, the directory (with
/// its LRU order), and the sections that did not decode (they start cold).
#[derive(Debug, Default)]
pub struct Restored {
    /// Sections other than the directory's.
    pub sections: Sections,
    /// The directory, `None` when absent or corrupt (cold).
    pub directory: Option<KeyDirectory>,
    /// What did not decode.
    pub skipped: Vec<SkippedSection>,
}

/// Reads a checkpoint file of either version. A bad header, an unknown
/// version or an unreadable frame layout is an error (a cold start); a
/// section that does not decode is skipped and reported.
pub fn decode_file(raw: &[u8]) -> Result<Restored, CheckpointError> {
    read_file(raw)
}

/// [`decode_file`] from a reader (the service's buffered file): a version-2
/// file is decoded as it is read, frame by frame, so a restore's memory
/// never holds the file's image (~94 B a key) beside the directory it
/// builds. A version-1 file (the reference's msgpack, no frames) is read
/// whole.
pub fn read_file<R: Read>(mut src: R) -> Result<Restored, CheckpointError> {
    let io = |e: std::io::Error| CheckpointError::Value(format!("read failed: {e}"));
    let mut head = [0u8; 12];
    let mut got = 0;
    while got < head.len() {
        match src.read(&mut head[got..]) {
            Ok(0) => return Err(CheckpointError::Header),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if &head[..8] != MAGIC {
        return Err(CheckpointError::Header);
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&head[8..12]);
    match u32::from_le_bytes(v) {
        VERSION_V1 => {
            let mut raw = Vec::new();
            src.read_to_end(&mut raw).map_err(io)?;
            let (mut sections, skipped) = decode_body(&raw)?;
            drop(raw);
            let directory = sections.key_directory.take().map(|s| {
                let mut dir = restore_directory(s);
                if let Some(lru) = &sections.lru_order {
                    restore_lru(lru, &mut dir);
                }
                dir
            });
            sections.lru_order = None;
            Ok(forget_positions_if_cold(Restored {
                sections,
                directory,
                skipped,
            }))
        }
        VERSION => {
            let mut out = Restored::default();
            while let Some((kind, len)) = frame_header(&mut src)? {
                let mut frame = (&mut src).take(len);
                let truncated = || CheckpointError::Value(format!("frame {kind} truncated"));
                match kind {
                    FRAME_SECTIONS => {
                        // Small (no directory in it): read as it arrives,
                        // not sized from the length the file claims.
                        let mut raw = Vec::new();
                        frame.read_to_end(&mut raw).map_err(io)?;
                        if raw.len() as u64 != len {
                            return Err(truncated());
                        }
                        let (sections, skipped) = decode_body(&raw)?;
                        out.sections = Sections {
                            key_directory: None,
                            lru_order: None,
                            ..sections
                        };
                        out.skipped.extend(skipped);
                    }
                    FRAME_DIRECTORY => {
                        let n = usize::try_from(len).unwrap_or(usize::MAX);
                        match KeyDirectory::read_image(&mut frame, n) {
                            Ok(dir) => out.directory = Some(dir),
                            Err(e) => out.skipped.push(SkippedSection {
                                name: "key_directory".into(),
                                reason: e.to_string(),
                            }),
                        }
                    }
                    // Frames of a later build.
                    _ => {}
                }
                // The rest of a frame not read (a later build's, or an
                // image that failed part-way); a file that ends inside a
                // frame is an error, as it was when read whole.
                std::io::copy(&mut frame, &mut std::io::sink()).map_err(io)?;
                if frame.limit() != 0 {
                    return Err(truncated());
                }
            }
            Ok(forget_positions_if_cold(out))
        }
        other => Err(CheckpointError::Version(other)),
    }
}

/// The next frame's kind and length, `None` at the end of the file.
fn frame_header<R: Read>(src: &mut R) -> Result<Option<(u8, u64)>, CheckpointError> {
    let mut h = [0u8; 9];
    let mut got = 0;
    while got < h.len() {
        match src.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(CheckpointError::Value("truncated frame header".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CheckpointError::Value(format!("read failed: {e}"))),
        }
    }
    let mut l = [0u8; 8];
    l.copy_from_slice(&h[1..9]);
    Ok(Some((h[0], u64::from_le_bytes(l))))
}

/// A directory that did not decode starts cold, and so must the positions
/// saying which events it holds: kept, the gate would refuse the replayed
/// events as duplicates and the Kafka consumer seek past them, their
/// effect lost for good. Without them the whole log replays.
fn forget_positions_if_cold(mut r: Restored) -> Restored {
    if r.skipped.iter().any(|s| s.name == "key_directory") {
        r.sections.stream_cursors = None;
        r.sections.kafka_stream_position = None;
    }
    r
}

/// A section that was present but did not decode; it starts cold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSection {
    /// Section name.
    pub name: String,
    /// Why it was skipped.
    pub reason: String,
}

/// Parses a version-1 file (the reference's format). A bad header or an
/// undecodable body is an error; a section that does not decode is skipped
/// (and reported) so the other sections still restore. Unknown sections are
/// ignored.
pub fn decode(raw: &[u8]) -> Result<(Sections, Vec<SkippedSection>), CheckpointError> {
    if raw.len() < 12 || &raw[..8] != MAGIC {
        return Err(CheckpointError::Header);
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&raw[8..12]);
    let version = u32::from_le_bytes(v);
    if version != VERSION_V1 {
        return Err(CheckpointError::Version(version));
    }
    decode_body(&raw[12..])
}

/// A msgpack map of sections.
fn decode_body(raw: &[u8]) -> Result<(Sections, Vec<SkippedSection>), CheckpointError> {
    // The common case, a file this build wrote: decode the typed sections
    // straight from the bytes. Only when that fails is the body read as a
    // value tree, section by section, so one bad section starts cold alone.
    if let Ok(sections) = rmp_serde::from_slice::<Sections>(raw) {
        return Ok((sections, Vec::new()));
    }
    let mut body = raw;
    let value =
        rmpv::decode::read_value(&mut body).map_err(|e| CheckpointError::Value(e.to_string()))?;
    let rmpv::Value::Map(entries) = value else {
        return Err(CheckpointError::Value("body is not a map".into()));
    };
    let mut sections = Sections::default();
    let mut skipped = Vec::new();
    for (name, section) in entries {
        let Some(name) = name.as_str().map(str::to_owned) else {
            continue;
        };
        fn take<T: serde::de::DeserializeOwned>(
            v: rmpv::Value,
            slot: &mut Option<T>,
            name: &str,
            skipped: &mut Vec<SkippedSection>,
        ) {
            match rmpv::ext::from_value::<T>(v) {
                Ok(s) => *slot = Some(s),
                Err(e) => skipped.push(SkippedSection {
                    name: name.to_owned(),
                    reason: e.to_string(),
                }),
            }
        }
        match name.as_str() {
            "stream_cursors" => take(section, &mut sections.stream_cursors, &name, &mut skipped),
            "key_directory" => take(section, &mut sections.key_directory, &name, &mut skipped),
            "server_config" => take(section, &mut sections.server_config, &name, &mut skipped),
            "lru_order" => take(section, &mut sections.lru_order, &name, &mut skipped),
            "kafka_stream_position" => take(
                section,
                &mut sections.kafka_stream_position,
                &name,
                &mut skipped,
            ),
            // Sections of components this build does not have.
            _ => {}
        }
    }
    Ok((sections, skipped))
}

// === capture / restore per view ===

/// Captures gate cursors.
pub fn capture_gate(gate: &Gate) -> StreamCursors {
    StreamCursors {
        cursors: gate
            .cursors()
            .iter()
            .map(|(id, c)| (id.clone(), (c.incarnation, c.last_seq, c.gap_detected)))
            .collect(),
    }
}

/// Restores gate cursors.
pub fn restore_gate(section: &StreamCursors) -> Gate {
    let mut gate = Gate::new();
    gate.restore(
        section
            .cursors
            .iter()
            .map(|(id, &(incarnation, last_seq, gap_detected))| {
                (
                    id.clone(),
                    Cursor {
                        incarnation,
                        last_seq,
                        gap_detected,
                    },
                )
            })
            .collect::<HashMap<_, _>>(),
    );
    gate
}

/// Captures the directory.
pub fn capture_directory(dir: &KeyDirectory) -> DirectorySection {
    let mut index_of: HashMap<ObjectKey, u64> = HashMap::new();
    let mut keys = Vec::with_capacity(dir.len());
    for (i, (key, entry)) in dir.iter().enumerate() {
        keys.push((
            key_tuple(&key),
            entry.last_access,
            entry.access_count,
            entry
                .placements
                .iter()
                .map(|p| {
                    (
                        p.instance_id.to_string(),
                        p.incarnation,
                        p.tier,
                        p.backend.to_string(),
                        p.size_bytes,
                        p.shared,
                    )
                })
                .collect(),
        ));
        index_of.insert(key, i as u64);
    }
    let bindings = dir
        .bindings()
        .map(|(hash, b)| {
            let bytes: Vec<u8> = b.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            (
                ByteBuf::from(hash.clone()),
                b.token_offset,
                ByteBuf::from(bytes),
            )
        })
        .collect();
    let l1_keys_by_instance = dir
        .l1_index()
        .map(|(id, set)| {
            let mut idx: Vec<u64> = set
                .iter()
                .filter_map(|k| index_of.get(k).copied())
                .collect();
            idx.sort_unstable();
            (id.clone(), idx)
        })
        .collect();
    DirectorySection {
        keys,
        bindings,
        l1_keys_by_instance,
    }
}

/// Restores the directory, moving the decoded strings into the keys.
pub fn restore_directory(section: DirectorySection) -> KeyDirectory {
    let mut dir = KeyDirectory::new();
    dir.reserve(section.keys.len());
    for (
        (hash, model_name, kv_rank, object_group_id, cache_salt),
        last_access,
        access_count,
        placements,
    ) in section.keys
    {
        let key = ObjectKey {
            chunk_hash: hash.into_vec(),
            model_name,
            kv_rank,
            object_group_id,
            cache_salt,
        };
        for (instance_id, incarnation, tier, backend, size_bytes, shared) in placements {
            let (instance_id, backend) = (dir.intern(&instance_id), dir.intern(&backend));
            dir.store(
                &key,
                Placement {
                    instance_id,
                    incarnation,
                    tier,
                    backend,
                    size_bytes,
                    shared,
                },
            );
        }
        dir.set_access(&key, access_count, last_access);
    }
    for (hash, offset, bytes) in section.bindings {
        let tokens = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // Captured bindings belong to live keys only, so none is orphaned here.
        dir.bind(
            hash.into_vec(),
            Binding {
                token_offset: offset,
                tokens,
            },
        );
    }
    for id in section.l1_keys_by_instance.keys() {
        dir.touch_instance(id);
    }
    dir
}

/// Captures the usage section (the reference's layout: one row per
/// placement) from the directory, where each placement's bytes live.
pub fn capture_usage(dir: &KeyDirectory) -> UsageSection {
    let mut placements = Vec::with_capacity(dir.len());
    for (key, entry) in dir.iter() {
        for p in &entry.placements {
            let owner = if p.shared { "" } else { &p.instance_id };
            placements.push((
                p.tier,
                key_tuple(&key),
                owner.to_owned(),
                p.backend.to_string(),
                p.size_bytes,
            ));
        }
    }
    UsageSection { placements }
}

/// Restores the usage view: its rollups are rebuilt from the restored
/// directory (the section repeats the directory's bytes, so it is not
/// read; a directory that starts cold takes its usage with it).
pub fn restore_usage(dir: &KeyDirectory) -> UsageView {
    UsageView::rebuild(dir)
}

/// Captures capacity declarations.
pub fn capture_capacity(caps: &CapacityRegistry) -> ServerConfigSection {
    let mut declarations: Vec<_> = caps
        .declarations()
        .iter()
        .map(|(id, d)| {
            (
                id.clone(),
                d.stamp.0,
                d.stamp.1,
                d.compartments
                    .iter()
                    .map(|((tier, backend), c)| {
                        (*tier, backend.clone(), c.capacity_bytes, c.shared)
                    })
                    .collect(),
            )
        })
        .collect();
    declarations.sort_by(|a, b| a.0.cmp(&b.0));
    ServerConfigSection { declarations }
}

/// Restores capacity declarations.
pub fn restore_capacity(section: &ServerConfigSection) -> CapacityRegistry {
    let mut caps = CapacityRegistry::new();
    for (id, inc, rev, comps) in &section.declarations {
        caps.restore(
            id.clone(),
            Declaration {
                stamp: (*inc, *rev),
                compartments: comps
                    .iter()
                    .map(|(tier, backend, capacity_bytes, shared)| {
                        (
                            (*tier, backend.clone()),
                            Compartment {
                                capacity_bytes: *capacity_bytes,
                                shared: *shared,
                            },
                        )
                    })
                    .collect(),
            },
        );
    }
    caps
}

/// Captures the L2 LRU order the directory keeps.
pub fn capture_lru(dir: &KeyDirectory) -> LruSection {
    LruSection {
        buckets: dir
            .lru_salts()
            .into_iter()
            .map(|(salt, _)| {
                let keys = dir.lru_oldest(&salt).map(|k| key_tuple(&k)).collect();
                (salt, keys)
            })
            .collect(),
    }
}

/// Restores the LRU order into a restored directory: its L2 keys are filed
/// already (in insertion order); touching the saved keys oldest first puts
/// them in the saved order. A saved key the directory does not hold is
/// skipped (a directory that starts cold takes its LRU with it).
pub fn restore_lru(section: &LruSection, dir: &mut KeyDirectory) {
    for keys in section.buckets.values() {
        for kt in keys {
            dir.lru_touch(&from_tuple(kt));
        }
    }
}

#[cfg(test)]
mod tests;
