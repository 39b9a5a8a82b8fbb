//! The persistence handle: the checkpoint of derived state and the metadata
//! file of operator intent, both written atomically (temp file, fsync,
//! rename). It reads the views and asks each controller for its sections;
//! nothing it calls reaches back into it.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use ic_coordinator_core::checkpoint::{self, Sections};
use ic_coordinator_core::kafka::Position;
use ic_coordinator_core::metadata::{self, Metadata};
use parking_lot::Mutex;

use crate::clock::Clock;
use crate::controller::{Controller, IntentSink};
use crate::metrics::{MetricsSet, inc};
use crate::settings::Settings;
use crate::views::ViewStore;

/// Checkpoint and metadata files.
#[derive(Debug)]
pub struct Persistence {
    settings: Arc<Settings>,
    clock: Arc<dyn Clock>,
    views: Arc<ViewStore>,
    controllers: Arc<[Arc<dyn Controller>]>,
    metrics: Arc<MetricsSet>,
    /// Serializes metadata writes so the file never goes back in time.
    metadata_order: Mutex<()>,
    /// Wall time of the last successful checkpoint.
    last_checkpoint: Mutex<Option<f64>>,
}

impl Persistence {
    /// Files as the settings name them; sections from `views` and `controllers`.
    pub fn new(
        settings: Arc<Settings>,
        clock: Arc<dyn Clock>,
        views: Arc<ViewStore>,
        controllers: Arc<[Arc<dyn Controller>]>,
        metrics: Arc<MetricsSet>,
    ) -> Self {
        Self {
            settings,
            clock,
            views,
            controllers,
            metrics,
            metadata_order: Mutex::new(()),
            last_checkpoint: Mutex::new(None),
        }
    }

    /// Wall time of the last successful checkpoint.
    pub fn last_checkpoint(&self) -> Option<f64> {
        *self.last_checkpoint.lock()
    }

    /// Captures every section while ingest is paused between two changes
    /// (controllers' sections included, so they agree) and encodes the
    /// file: the directory's part is its compact image, one linear pass over
    /// its records (measured at 10 M keys in docs/benchmarks.md), and the
    /// write happens after ingest resumes. Lookups and other readers go on
    /// during the capture: it holds the views shared.
    pub fn capture_checkpoint(&self) -> Result<Vec<u8>, checkpoint::CheckpointError> {
        let started = std::time::Instant::now();
        let (file, keys) = self.views.read_between_changes(|views| {
            let mut sections = Sections {
                stream_cursors: Some(checkpoint::capture_gate(&views.gate)),
                server_config: Some(checkpoint::capture_capacity(&views.capacity)),
                kafka_stream_position: self
                    .settings
                    .kafka
                    .as_ref()
                    .map(|_| views.kafka.to_section()),
                ..Sections::default()
            };
            for c in self.controllers.iter() {
                c.save_checkpoint(&mut sections);
            }
            (
                checkpoint::encode_file(&sections, &views.directory),
                views.directory.len(),
            )
        });
        tracing::debug!(
            keys,
            held_ms = started.elapsed().as_millis() as u64,
            "checkpoint captured"
        );
        file
    }

    /// Writes a checkpoint if a path is configured. Failures are logged and
    /// counted; the next tick retries.
    pub fn write_checkpoint(&self) -> bool {
        let Some(path) = &self.settings.checkpoint_path else {
            return true;
        };
        let result = self
            .capture_checkpoint()
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|bytes| write_atomic(path, &bytes));
        match result {
            Ok(()) => {
                let now = self.clock.unix_seconds();
                *self.last_checkpoint.lock() = Some(now);
                self.metrics.metrics.checkpoint_last_success.set(now);
                inc(&self.metrics.metrics.checkpoint_writes, "ok");
                tracing::debug!(path = %path.display(), "checkpoint written");
                true
            }
            Err(error) => {
                inc(&self.metrics.metrics.checkpoint_writes, "failed");
                tracing::warn!(path = %path.display(), %error, "checkpoint write failed; will retry");
                false
            }
        }
    }

    /// Restores views and controller state from the checkpoint; a missing or
    /// unreadable file is a cold start.
    pub fn restore_checkpoint(&self) {
        let Some(path) = &self.settings.checkpoint_path else {
            return;
        };
        // Decoded as it is read (a small buffer, not the file's image in
        // memory beside the directory it builds: an allocator that keeps
        // freed pages, mimalloc, would keep that image resident).
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), file = "checkpoint", "no file; cold start");
                return;
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), file = "checkpoint", %error, "file unreadable; cold start");
                return;
            }
        };
        let read = checkpoint::read_file(std::io::BufReader::with_capacity(1 << 16, file));
        let restored = match read {
            Ok(restored) => {
                for s in &restored.skipped {
                    tracing::warn!(path = %path.display(), section = %s.name, reason = %s.reason, "checkpoint section corrupt; that part starts cold");
                }
                restored
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "checkpoint corrupt; cold start");
                return;
            }
        };
        let sections = restored.sections;
        let keys = self.views.write(|views| {
            if let Some(s) = &sections.stream_cursors {
                views.gate = checkpoint::restore_gate(s);
            }
            if let Some(directory) = restored.directory {
                let max = views.directory.max_keys();
                views.directory = directory;
                views.directory.set_max_keys(max);
            }
            // Rebuilt from the (bounded) directory, which holds each
            // placement's bytes.
            views.usage = checkpoint::restore_usage(&views.directory);
            if let Some(s) = &sections.server_config {
                views.capacity = checkpoint::restore_capacity(s);
            }
            if let Some(s) = &sections.kafka_stream_position {
                views.kafka = Position::from_section(s);
            }
            views.directory.len()
        });
        self.views.read(|views| {
            for c in self.controllers.iter() {
                c.restore_checkpoint(&sections, views);
            }
        });
        drop(sections);
        // A checkpoint larger than today's --max-directory-keys: the keys
        // the bound dropped leave the controllers' state too (the usage
        // view was rebuilt without them).
        let dropped: Vec<_> = self.views.write(|views| {
            views
                .directory
                .take_dropped()
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| !views.directory.contains(k))
                .collect()
        });
        if !dropped.is_empty() {
            for c in self.controllers.iter() {
                c.forget(&dropped);
            }
        }
        tracing::info!(path = %path.display(), keys, "checkpoint restored");
    }

    /// Rewrites the metadata file from the controllers' operator intent. A
    /// failed write is logged and counted; the request still succeeds.
    pub fn save_metadata(&self) {
        let Some(path) = &self.settings.metadata_path else {
            return;
        };
        let _order = self.metadata_order.lock();
        let mut meta = Metadata::default();
        for c in self.controllers.iter() {
            c.save_metadata(&mut meta);
        }
        let bytes = metadata::encode(&meta, self.clock.unix_seconds());
        match write_atomic(path, &bytes) {
            Ok(()) => inc(&self.metrics.metrics.metadata_writes, "ok"),
            Err(error) => {
                inc(&self.metrics.metrics.metadata_writes, "failed");
                tracing::warn!(path = %path.display(), %error, "metadata write failed");
            }
        }
    }

    /// Loads the metadata file; an invalid one is ignored with a warning.
    pub fn restore_metadata(&self) {
        let Some(path) = &self.settings.metadata_path else {
            return;
        };
        let Some(raw) = read_optional(path, "metadata") else {
            return;
        };
        match metadata::decode(&raw) {
            Ok(meta) => {
                for c in self.controllers.iter() {
                    c.restore_metadata(&meta);
                }
                tracing::info!(path = %path.display(), pins = meta.pins.len(), quotas = meta.quotas.limits.len(), "metadata restored");
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "metadata invalid; ignoring it")
            }
        }
    }
}

impl IntentSink for Persistence {
    fn intent_changed(&self) {
        self.save_metadata();
    }
}

/// The file's bytes; `None` (logged) when it is missing or unreadable.
fn read_optional(path: &Path, what: &'static str) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(raw) => Some(raw),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), file = what, "no file; cold start");
            None
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), file = what, %error, "file unreadable; cold start");
            None
        }
    }
}

/// Writes `bytes` to `<path>.tmp`, syncs it and renames it over `path`, so a
/// reader sees the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(dir)
    {
        // Persist the rename itself; not every filesystem supports it.
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("state.bin");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!dir.path().join("sub").join("state.bin.tmp").exists());
    }

    #[test]
    fn reports_unwritable_target() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: rename fails.
        let path = dir.path().join("taken");
        std::fs::create_dir_all(path.join("x")).unwrap();
        assert!(write_atomic(&path, b"data").is_err());
    }
}
