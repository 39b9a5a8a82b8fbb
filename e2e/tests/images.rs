//! The container images, built with the same recipe `./dev.sh images` uses
//! (images/build-local.sh: the binaries and the libraries they load in a
//! FROM-scratch image, user 65532), from the debug binaries the suite has
//! already compiled, then smoke-run with podman by images/smoke.sh: `--help`,
//! `/live` on loopback, and exit 0 within the grace period after SIGTERM.
//! Every port a server opens is given as `127.0.0.1:0` and the bound admin
//! port read back from its `--listen-report`: on the host network a guessed
//! free port could be taken by another server before the image binds it.
//! Needs buildah and podman (`./dev.sh test` installs them); without them the
//! test fails.

#![allow(clippy::unwrap_used)]

use std::process::Command;

const IMAGES: [&str; 5] = [
    "ic-controller",
    "ic-webhook",
    "ic-index-server",
    "ic-kvevent-subscriber",
    "ic-coordinator",
];

#[test]
fn every_image_builds_from_scratch_and_passes_its_smoke_run() {
    let root = ic_e2e::chart::repo_root();
    let bin_dir = ic_e2e::workspace_binary("ic-controller")
        .parent()
        .unwrap()
        .to_owned();
    let out = tempfile::tempdir().unwrap();
    let tag = format!("test-{}", std::process::id());
    let build = Command::new(root.join("images/build-local.sh"))
        .args(["--profile", "debug", "--bin-dir", bin_dir.to_str().unwrap()])
        .args(["--out", out.path().to_str().unwrap(), "--tag", &tag])
        .output()
        .unwrap();
    let cleanup = || {
        for image in IMAGES {
            let _ = Command::new("podman")
                .args([
                    "rmi",
                    "-f",
                    &format!("localhost/inferencecache/{image}:{tag}"),
                ])
                .output();
        }
    };
    let log = String::from_utf8_lossy(&build.stdout).into_owned()
        + &String::from_utf8_lossy(&build.stderr);
    if !build.status.success() {
        cleanup();
        panic!(
            "images/build-local.sh failed (buildah installed? `./dev.sh test` installs it):\n{log}"
        );
    }
    for image in IMAGES {
        assert!(
            out.path().join(format!("{image}.tar")).is_file(),
            "{image}.tar missing:\n{log}"
        );
    }
    let smoke = Command::new(root.join("images/smoke.sh"))
        .arg(out.path())
        .output()
        .unwrap();
    cleanup();
    let text = String::from_utf8_lossy(&smoke.stdout).into_owned()
        + &String::from_utf8_lossy(&smoke.stderr);
    assert!(smoke.status.success(), "images/smoke.sh failed:\n{text}");
    assert!(text.contains("smoke: 5 images passed"), "{text}");
    for image in IMAGES {
        let line = text
            .lines()
            .find(|l| l.starts_with(image))
            .unwrap_or_else(|| panic!("{image} not smoke-run:\n{text}"));
        assert!(
            line.contains("user 65532:65532") && line.contains("exit 0"),
            "{line}"
        );
    }
}
