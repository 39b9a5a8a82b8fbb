//! Writes the CRD YAML under `deploy/crds/` and the same CRDs as templates of
//! the `inference-cache-crds` chart (default), or, with `--check`, fails when
//! the committed files differ from what the types generate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage: crdgen [--check] [--out DIR] [--chart-out DIR]";

fn main() -> ExitCode {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut args = std::env::args().skip(1);
    let mut check = false;
    let mut dir = root.join("deploy/crds");
    let mut chart_dir = root.join("charts/inference-cache-crds/templates");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => check = true,
            "--out" | "--chart-out" => match args.next() {
                Some(d) if arg == "--out" => dir = PathBuf::from(d),
                Some(d) => chart_dir = PathBuf::from(d),
                None => return usage(&format!("{arg} needs a directory")),
            },
            "-h" | "--help" => {
                println!(
                    "{USAGE}\n\nWrites deploy/crds/*.yaml and charts/inference-cache-crds/templates/*.yaml \
                     from the Rust types; --check only compares."
                );
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let mut outputs = Vec::new();
    for (file, crd) in ic_api::crds() {
        let plain = ic_api::crd_yaml(&crd).map_err(|e| e.to_string());
        let template = ic_api::crd_chart_template(&crd).map_err(|e| e.to_string());
        for (target, rendered) in [(dir.join(file), plain), (chart_dir.join(file), template)] {
            match rendered {
                Ok(text) => outputs.push((target, text)),
                Err(e) => {
                    eprintln!("crdgen: cannot render {file}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let mut drift = Vec::new();
    for (path, text) in outputs {
        if check {
            if std::fs::read_to_string(&path).unwrap_or_default() != text {
                drift.push(path.display().to_string());
            }
        } else if let Err(e) = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", path.display());
        }
    }
    if drift.is_empty() {
        if check {
            println!("crdgen: the committed CRDs are up to date");
        }
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "crdgen: generated CRDs differ from the committed files:\n  {}\nrun `just generate` and commit the result",
            drift.join("\n  ")
        );
        ExitCode::FAILURE
    }
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("crdgen: {msg}\n{USAGE}");
    ExitCode::from(2)
}
