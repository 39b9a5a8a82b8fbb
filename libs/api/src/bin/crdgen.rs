//! Writes the CRD YAML under `deploy/crds/` (default) or, with `--check`,
//! fails when the committed files differ from what the types generate.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut check = false;
    let mut dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/crds"));
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => check = true,
            "--out" => match args.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return usage("--out needs a directory"),
            },
            "-h" | "--help" => {
                println!(
                    "usage: crdgen [--check] [--out DIR]\n\nWrites deploy/crds/*.yaml from the Rust types; --check only compares."
                );
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let mut drift = Vec::new();
    for (file, crd) in ic_api::crds() {
        let yaml = match ic_api::crd_yaml(&crd) {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: cannot render {file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let path = dir.join(file);
        if check {
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != yaml {
                drift.push(path.display().to_string());
            }
        } else if let Err(e) =
            std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, yaml))
        {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", path.display());
        }
    }
    if drift.is_empty() {
        if check {
            println!("crdgen: deploy/crds is up to date");
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
    eprintln!("crdgen: {msg}\nusage: crdgen [--check] [--out DIR]");
    ExitCode::from(2)
}
