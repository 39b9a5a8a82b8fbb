//! Snapshot files of the Kafka consumer: the index, the next offset of
//! every partition and each partition's ingest session (per replica rank:
//! incarnation, last sequence, an unfinished resync), taken at one point
//! of the log so that a restarted replica loads it and replays only what
//! came after.
//!
//! One file per snapshot in `--kafka-snapshot-dir`: written to a temporary
//! name, synced, renamed (so a crash leaves the previous file whole), the
//! directory synced; the newest two are kept. A file is a header (magic,
//! payload length, BLAKE3 of the payload) and the payload; a file whose
//! checksum or content does not hold is skipped for the next older one.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use ic_index::dump::{Dec, Dump, DumpError, Enc};
use ic_index::ingest::RankState;

const MAGIC: &[u8; 8] = b"ICSNAP02";
/// The form before replicas' last-seen times were kept: still read.
const MAGIC_V1: &[u8; 8] = b"ICSNAP01";
const HEADER: usize = 8 + 8 + 32;
const SUFFIX: &str = ".icsnap";
/// Snapshot files kept.
pub const KEEP: usize = 2;

/// One consistent point of the consumer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The topic the offsets belong to.
    pub topic: String,
    /// When it was taken (Unix ms).
    pub taken_unix_ms: i64,
    /// Per partition: the next offset to consume.
    pub offsets: Vec<(i32, i64)>,
    /// Per partition: its ingest session's ranks.
    pub sessions: Vec<(i32, Vec<RankState>)>,
    /// The index.
    pub index: Dump,
}

/// Why a snapshot file was not used.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a snapshot, or is damaged.
    #[error("{path}: {detail}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl Snapshot {
    /// The file's bytes: header and payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut enc = Enc::default();
        enc.str(&self.topic);
        enc.i64(self.taken_unix_ms);
        enc.len(self.offsets.len());
        for (partition, offset) in &self.offsets {
            enc.u32(u32::from_le_bytes(partition.to_le_bytes()));
            enc.i64(*offset);
        }
        enc.len(self.sessions.len());
        for (partition, ranks) in &self.sessions {
            enc.u32(u32::from_le_bytes(partition.to_le_bytes()));
            enc.len(ranks.len());
            for rank in ranks {
                enc.rank(rank);
            }
        }
        self.index.encode(&mut enc);
        let payload = enc.buf;
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(blake3::hash(&payload).as_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Reads a file's bytes, checking the magic, length and checksum first.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < HEADER || (&bytes[..8] != MAGIC && &bytes[..8] != MAGIC_V1) {
            return Err("not a snapshot file (bad magic)".into());
        }
        let with_seen = &bytes[..8] == MAGIC;
        let mut len = [0; 8];
        len.copy_from_slice(&bytes[8..16]);
        let len = u64::from_le_bytes(len);
        let payload = &bytes[HEADER..];
        if payload.len() as u64 != len {
            return Err(format!(
                "payload is {} bytes, the header says {len} (truncated?)",
                payload.len()
            ));
        }
        if blake3::hash(payload).as_bytes() != &bytes[16..48] {
            return Err("checksum mismatch".into());
        }
        Self::decode_payload(payload, with_seen).map_err(|e| e.to_string())
    }

    fn decode_payload(payload: &[u8], with_seen: bool) -> Result<Self, DumpError> {
        let mut dec = Dec::new(payload);
        let topic = dec.str("topic")?;
        let taken_unix_ms = dec.i64("taken_unix_ms")?;
        let n = dec.len("offsets")?;
        let mut offsets = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let partition = i32::from_le_bytes(dec.u32("offsets.partition")?.to_le_bytes());
            offsets.push((partition, dec.i64("offsets.offset")?));
        }
        let n = dec.len("sessions")?;
        let mut sessions = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let partition = i32::from_le_bytes(dec.u32("sessions.partition")?.to_le_bytes());
            let ranks = dec.len("sessions.ranks")?;
            let mut out = Vec::with_capacity(ranks.min(1 << 16));
            for _ in 0..ranks {
                out.push(dec.rank()?);
            }
            sessions.push((partition, out));
        }
        let index = if with_seen {
            Dump::decode(&mut dec)?
        } else {
            Dump::decode_without_seen(&mut dec)?
        };
        if dec.remaining() != 0 {
            return Err(DumpError::Invalid("trailing bytes", dec.remaining() as u64));
        }
        Ok(Self {
            topic,
            taken_unix_ms,
            offsets,
            sessions,
            index,
        })
    }
}

/// Snapshot files in `dir`, newest first (names sort by time).
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("snapshot-") && n.ends_with(SUFFIX))
        })
        .collect();
    files.sort();
    files.reverse();
    Ok(files)
}

/// The number a snapshot file's name orders it by.
fn stamp_of(path: &Path) -> Option<i64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("snapshot-")?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

/// Writes `bytes` as the newest snapshot, then removes all but the newest
/// [`KEEP`]. Returns the file written. Its name orders it after every file
/// there, whatever the clock says (one stepped back, or a volume carried
/// to a node whose clock is behind, would otherwise name it older than
/// the rest and prune it at once); a temporary file a crash left is
/// removed.
pub fn write(dir: &Path, taken_unix_ms: i64, bytes: &[u8]) -> Result<PathBuf, SnapshotError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    remove_leftovers(dir);
    let newest = list(dir)?.first().and_then(|p| stamp_of(p));
    let stamp = newest.map_or(taken_unix_ms.max(0), |n| {
        taken_unix_ms.max(n.saturating_add(1))
    });
    let name = format!("snapshot-{stamp:020}{SUFFIX}");
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    // The rename is durable only once the directory is.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    for old in list(dir)?.into_iter().skip(KEEP).filter(|p| *p != path) {
        if let Err(error) = std::fs::remove_file(&old) {
            tracing::warn!(path = %old.display(), %error, "cannot remove an old snapshot");
        }
    }
    Ok(path)
}

/// Removes the temporary files of writes a crash interrupted (one writer
/// at a time: none is under way when a write starts).
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(Result::ok).map(|e| e.path()) {
        let leftover = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".snapshot-") && n.ends_with(".tmp"));
        if leftover && let Err(error) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), %error, "cannot remove a leftover snapshot file");
        }
    }
}

/// The newest snapshot of `topic` in `dir` that reads whole, with its file
/// and size; files that do not are reported through `skipped` and passed
/// over.
pub fn load_newest(
    dir: &Path,
    topic: &str,
    mut skipped: impl FnMut(SnapshotError),
) -> Option<(Snapshot, PathBuf, u64)> {
    let files = match list(dir) {
        Ok(files) => files,
        Err(SnapshotError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return None;
        }
        Err(e) => {
            skipped(e);
            return None;
        }
    };
    for path in files {
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(source) => {
                skipped(io(&path)(source));
                continue;
            }
        };
        let corrupt = |detail: String| SnapshotError::Corrupt {
            path: path.display().to_string(),
            detail,
        };
        match Snapshot::decode(&bytes) {
            Ok(s) if s.topic == topic => return Some((s, path, bytes.len() as u64)),
            Ok(s) => skipped(corrupt(format!(
                "taken from topic {:?}, not {topic:?}",
                s.topic
            ))),
            Err(detail) => skipped(corrupt(detail)),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

    fn snapshot(taken: i64) -> Snapshot {
        let index = Index::new(IndexConfig::default());
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: "pod".into(),
            dp_rank: 0,
        };
        let scope = Scope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        };
        let stored = Change::Stored {
            start_depth: 0,
            fingerprints: Fingerprint::from_raw((1..100).collect()),
            block_size: 16,
            tier: Tier::T1,
        };
        index.apply(&key, &scope, "a:1", std::slice::from_ref(&stored), 1);
        Snapshot {
            topic: "events".into(),
            taken_unix_ms: taken,
            offsets: vec![(0, 10), (1, -2)],
            sessions: vec![(
                0,
                vec![RankState {
                    key,
                    incarnation: 4,
                    last_seq: 9,
                    resync: Some(vec![stored]),
                }],
            )],
            index: index.dump(),
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_every_damage_is_caught() {
        let s = snapshot(5);
        let bytes = s.encode();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
        for cut in [0, 7, HEADER, bytes.len() - 1] {
            assert!(Snapshot::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Any flipped bit in the payload fails the checksum.
        for at in [HEADER, HEADER + 40, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert_eq!(Snapshot::decode(&bad).unwrap_err(), "checksum mismatch");
        }
    }

    #[test]
    fn the_newest_whole_file_wins_and_two_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for t in [1, 2, 3] {
            write(dir.path(), t, &snapshot(t).encode()).unwrap();
        }
        let files = list(dir.path()).unwrap();
        assert_eq!(files.len(), KEEP);
        let (s, _, _) = load_newest(dir.path(), "events", |e| panic!("{e}")).unwrap();
        assert_eq!(s.taken_unix_ms, 3);
        // Damage the newest: the older one is loaded and the damage reported.
        let mut bytes = std::fs::read(&files[0]).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&files[0], bytes).unwrap();
        let mut skipped = Vec::new();
        let (s, _, _) = load_newest(dir.path(), "events", |e| skipped.push(e.to_string())).unwrap();
        assert_eq!(s.taken_unix_ms, 2);
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].ends_with("checksum mismatch"), "{skipped:?}");
        // Another topic's snapshots are not used.
        let mut other = Vec::new();
        assert!(load_newest(dir.path(), "other", |e| other.push(e.to_string())).is_none());
        assert_eq!(other.len(), 2);
        // No directory yet: nothing to load, nothing wrong.
        assert!(load_newest(&dir.path().join("none"), "events", |e| panic!("{e}")).is_none());
    }

    #[test]
    fn a_clock_stepped_back_neither_prunes_the_new_file_nor_loads_an_older_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 5_000, &snapshot(5_000).encode()).unwrap();
        write(dir.path(), 6_000, &snapshot(6_000).encode()).unwrap();
        // A crash mid-write left its temporary file.
        let leftover = dir.path().join(".snapshot-00000000000000007000.icsnap.tmp");
        std::fs::write(&leftover, b"half").unwrap();
        // The clock went back: this snapshot is still the newest, kept and
        // loaded; the oldest goes, and so does the leftover.
        let written = write(dir.path(), 1_000, &snapshot(1_000).encode()).unwrap();
        let files = list(dir.path()).unwrap();
        assert_eq!(files.len(), KEEP);
        assert_eq!(files[0], written);
        let (s, path, _) = load_newest(dir.path(), "events", |e| panic!("{e}")).unwrap();
        assert_eq!((s.taken_unix_ms, path), (1_000, written));
        assert!(!leftover.exists());
    }
    #[test]
    fn a_file_of_the_form_before_last_seen_times_is_still_read() {
        let mut enc = Enc::default();
        enc.str("events");
        enc.i64(7);
        enc.len(0);
        enc.len(0);
        // One replica, without the last-seen time the current form has.
        enc.len(1);
        enc.replica_key(&ReplicaKey {
            tenant: "t".into(),
            replica_id: "r".into(),
            dp_rank: 0,
        });
        enc.scope(&Scope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        });
        enc.str("a:1");
        enc.u8(0);
        enc.changes(&[]);
        let payload = enc.buf;
        let mut bytes = MAGIC_V1.to_vec();
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(blake3::hash(&payload).as_bytes());
        bytes.extend_from_slice(&payload);
        let read = Snapshot::decode(&bytes).unwrap();
        assert_eq!(read.taken_unix_ms, 7);
        assert_eq!(read.index.replicas.len(), 1);
        assert_eq!(read.index.replicas[0].last_seen_ms, None);
        // The current form carries it.
        let current = Snapshot::decode(&snapshot(8).encode()).unwrap();
        assert!(
            current
                .index
                .replicas
                .iter()
                .all(|r| r.last_seen_ms.is_some())
        );
    }
}
