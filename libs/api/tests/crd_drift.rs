//! The CRD YAML committed under `deploy/crds/`, and the same CRDs as
//! templates of the `inference-cache-crds` chart, are exactly what the types
//! generate. On failure run `just generate` (or
//! `cargo run -p ic-api --bin crdgen`) and commit the result.

#![allow(clippy::unwrap_used)]

use std::path::Path;

fn yaml_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

fn assert_committed(path: &Path, generated: &str) {
    let committed = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `just generate`", path.display()));
    assert!(
        committed == generated,
        "{} is stale: run `just generate` and commit the result",
        path.display()
    );
}

#[test]
fn committed_crds_match_the_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("deploy/crds");
    let chart = root.join("charts/inference-cache-crds/templates");
    for (file, crd) in ic_api::crds() {
        assert_committed(&dir.join(file), &ic_api::crd_yaml(&crd).unwrap());
        assert_committed(
            &chart.join(file),
            &ic_api::crd_chart_template(&crd).unwrap(),
        );
    }
    let mut expected: Vec<String> = ic_api::crds()
        .into_iter()
        .map(|(f, _)| f.to_owned())
        .collect();
    expected.sort();
    assert_eq!(
        yaml_files(&dir),
        expected,
        "deploy/crds holds exactly the generated CRDs"
    );
    assert_eq!(
        yaml_files(&chart),
        expected,
        "the CRD chart's templates are exactly the generated CRDs"
    );
}

#[test]
fn chart_templates_keep_the_crds_and_label_them() {
    for (file, crd) in ic_api::crds() {
        let template = ic_api::crd_chart_template(&crd).unwrap();
        let plain = ic_api::crd_yaml(&crd).unwrap();
        assert!(
            template.contains(&format!(
                "\n  name: {}\n  {{{{- include \"inference-cache-crds.metadata\" . | nindent 2 }}}}\n",
                crd.metadata.name.as_deref().unwrap()
            )),
            "{file}: the chart's metadata follows metadata.name"
        );
        // Nothing else changes: removing the inserted line gives the plain CRD.
        let stripped: String = template
            .lines()
            .filter(|l| !l.contains("inference-cache-crds.metadata"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(stripped, plain, "{file}");
    }
}
