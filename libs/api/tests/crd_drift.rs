//! The CRD YAML committed under `deploy/crds/` is exactly what the types
//! generate. On failure run `just generate` (or
//! `cargo run -p ic-api --bin crdgen`) and commit the result.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    for (file, crd) in ic_api::crds() {
        let generated = ic_api::crd_yaml(&crd).unwrap();
        let path = dir.join(file);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `just generate`", path.display()));
        assert!(
            committed == generated,
            "{} is stale: run `just generate` and commit the result",
            path.display()
        );
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = ic_api::crds()
        .into_iter()
        .map(|(f, _)| f.to_owned())
        .collect();
    expected.sort();
    assert_eq!(
        on_disk, expected,
        "deploy/crds holds exactly the generated CRDs"
    );
}
