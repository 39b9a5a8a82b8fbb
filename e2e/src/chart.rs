//! The Helm charts as tests see them: rendering with the real `helm`,
//! splitting a render into objects, strict validation with the real
//! `kubernetes-validate`, and the cert-manager / Prometheus-operator
//! validators for the custom resources a render holds. `./dev.sh test`
//! installs the tools and names them in `IC_HELM_BIN` (and `IC_HELM4_BIN`:
//! every render is made with Helm 3 and Helm 4 and must agree),
//! `IC_KUBERNETES_VALIDATE` and `IC_CRD_MODELS`; without those, the tools
//! are looked up on `PATH`, and a missing tool fails the test that needs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `charts/<name>`.
pub fn chart_dir(name: &str) -> PathBuf {
    repo_root().join("charts").join(name)
}

/// The namespace every test render uses: the one the binaries' defaults name.
pub const NAMESPACE: &str = "inferencecache-system";
/// The release name of test renders.
pub const RELEASE: &str = "inferencecache";

fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("{name} is not installed: run the suite with `./dev.sh test` (it installs {name} and sets {env})")
    })
}

/// The `helm` binary.
pub fn helm() -> PathBuf {
    tool("IC_HELM_BIN", "helm")
}

/// The Helm 4 binary (`IC_HELM4_BIN`, installed by `./dev.sh` beside Helm 3).
pub fn helm4() -> PathBuf {
    tool("IC_HELM4_BIN", "helm4")
}

/// Runs helm with `args`; returns (success, stdout, stderr).
pub fn helm_run(args: &[&str]) -> (bool, String, String) {
    helm_run_with(&helm(), args)
}

/// Runs the helm binary `helm` with `args`; returns (success, stdout, stderr).
pub fn helm_run_with(helm: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm)
        .args(args)
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("ic-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("ic-helm-config"),
        )
        .env("HELM_DATA_HOME", std::env::temp_dir().join("ic-helm-data"))
        .output()
        .expect("running helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template` of `chart` with `extra` arguments (values files, --set,
/// --api-versions); panics with helm's message when it fails.
pub fn render(chart: &str, extra: &[&str]) -> String {
    let dir = chart_dir(chart);
    let mut args = vec![
        "template",
        RELEASE,
        dir.to_str().expect("utf-8 path"),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        "1.33.0",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = helm_run(&args);
    assert!(ok, "helm template {chart} {extra:?} failed:\n{err}");
    // Every render is also made with Helm 4 and must hold the same objects
    // (document order may differ), so each chart test holds under both.
    let (ok4, out4, err4) = helm_run_with(&helm4(), &args);
    assert!(ok4, "helm 4 template {chart} {extra:?} failed:\n{err4}");
    assert!(
        object_set(&out) == object_set(&out4),
        "helm 3 and helm 4 render different objects for {chart} {extra:?}"
    );
    out
}

/// The objects of a render as sorted canonical JSON: equal for renders that
/// differ only in document order.
fn object_set(render: &str) -> Vec<String> {
    let mut set: Vec<String> = objects(render).iter().map(Value::to_string).collect();
    set.sort();
    set
}

/// The objects of a render (empty documents dropped).
pub fn objects(render: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(render)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .filter(|v| v.is_object())
        .collect()
}

/// The object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// Every object of `kind`.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// Strict validation of the render at `path` against Kubernetes `version`'s
/// OpenAPI schemas; returns the tool's complaints (empty when valid).
pub fn kubernetes_validate(path: &Path, version: &str) -> Vec<String> {
    let out = Command::new(tool("IC_KUBERNETES_VALIDATE", "kubernetes-validate"))
        .args(["-k", version, "--strict", "--no-warn"])
        .arg(path)
        .output()
        .expect("running kubernetes-validate");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut problems: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("INFO") && !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    if !out.status.success() && problems.is_empty() {
        problems.push(format!("kubernetes-validate exited {}", out.status));
    }
    problems
}

/// Validates every cert-manager.io/v1 and monitoring.coreos.com/v1 object of
/// the render at `path` with the validators compiled from those projects'
/// CRDs; returns the complaints and how many objects were checked.
pub fn custom_resources_validate(path: &Path) -> (Vec<String>, usize) {
    let models = tool("IC_CRD_MODELS", "node_modules");
    let script = repo_root().join("e2e/tools/validate-custom-resources.mjs");
    let out = Command::new("node")
        .arg(&script)
        .arg(path)
        .env("NODE_PATH", &models)
        .env("IC_CRD_MODELS", &models)
        .output()
        .expect("running node");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let checked = stdout
        .lines()
        .find_map(|l| l.strip_prefix("checked "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let mut problems: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("ERROR"))
        .map(str::to_owned)
        .collect();
    if !out.status.success() && problems.is_empty() {
        problems.push(format!(
            "the custom-resource validator failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    (problems, checked)
}
