//! Replays every committed input of every fuzz target (`corpus/<target>/`
//! and the `regressions/<target>/` inputs of crashes found and fixed), so
//! the default suite keeps what fuzzing learnt. `cargo run -p ic-fuzz
//! --example seed_corpora` rewrites the seed inputs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use ic_fuzz::TARGETS;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

#[test]
fn every_committed_input_replays_cleanly() {
    let mut total = 0;
    for (name, target) in TARGETS {
        let corpus = inputs(&root().join("corpus").join(name));
        assert!(
            corpus.len() >= 3,
            "corpus/{name} holds {} inputs; seed it (cargo run -p ic-fuzz --example seed_corpora)",
            corpus.len()
        );
        let regressions = inputs(&root().join("regressions").join(name));
        for path in corpus.iter().chain(&regressions) {
            let data = std::fs::read(path).unwrap();
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name} panicked on {}", path.display());
            total += 1;
        }
    }
    eprintln!("replayed {total} inputs");
}
