//! Where the tests find `tansu`, the Kafka-protocol broker they run on
//! loopback. No broker is a failure, never a skip.

use std::path::PathBuf;

/// How to get the broker, for every message about a missing or failed one.
pub const INSTALL: &str = "install tansu 0.6.0 with `./dev.sh test` (it installs it into \
     ~/.cache/inferencecache/tools), or `cargo install tansu --version 0.6.0 --features dynostore,libsql \
     --locked --debug --root ~/.cache/inferencecache/tools`, or point IC_TANSU_BIN at a tansu binary";

/// The tansu binary: `IC_TANSU_BIN`, the dev.sh tool cache, then PATH.
///
/// # Panics
/// When there is none, saying how to install it.
pub fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("IC_TANSU_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "IC_TANSU_BIN={} does not exist; {INSTALL}",
            bin.display()
        );
        return bin;
    }
    let mut candidates = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/inferencecache/tools/bin/tansu"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("tansu")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("tansu (Kafka broker) not found; {INSTALL}"))
}
