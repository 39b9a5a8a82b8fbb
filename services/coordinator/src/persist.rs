//! Atomic file writes: a temp file beside the target, fsynced, then renamed.

use std::io::Write;
use std::path::Path;

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
        std::fs::create_dir(path.join("x")).ok();
        std::fs::create_dir_all(path.join("x")).unwrap();
        assert!(write_atomic(&path, b"data").is_err());
    }
}
