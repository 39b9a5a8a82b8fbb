//! The Helm charts: `helm lint --strict`; golden renders of the value sets
//! under `charts/inference-cache/tests/values/` (and `values-ha.yaml`)
//! compared with `tests/golden/` (`UPDATE_GOLDEN=1` rewrites them); every
//! render passes strict schema validation for Kubernetes 1.29 and 1.33, with
//! its cert-manager and Prometheus-operator objects checked against their
//! projects' CRD schemas; the values schema rejects wrong types and unknown
//! keys; monitoring objects render only when their CRDs are served or when
//! forced; the CRDs keep on uninstall and can be left out; replicated
//! components get disruption budgets and spread; the index server rolls
//! out new pods before stopping old ones, is reachable replica by replica
//! through a headless Service (on its certificate too), and every draining
//! server has a termination grace above its drain. Goldens are compared as
//! sets of objects, under Helm 3.17 and Helm 4.1 alike; `chart/install.rs`
//! holds what a real install on a managed cluster needs.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use ic_e2e::chart::{
    chart_dir, custom_resources_validate, find, helm_run, kubernetes_validate, objects, of_kind,
    render,
};

#[path = "chart/install.rs"]
mod install;

#[path = "chart/ha.rs"]
mod ha;

const CHART: &str = "inference-cache";

/// The value sets with golden renders: (name, values file).
fn value_sets() -> Vec<(String, PathBuf)> {
    let dir = chart_dir(CHART).join("tests/values");
    let mut sets: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    sets.push(("ha".into(), chart_dir(CHART).join("values-ha.yaml")));
    sets.sort();
    sets
}

fn render_set(values: &std::path::Path) -> String {
    render(CHART, &["-f", values.to_str().unwrap()])
}

/// The Helm binaries the charts are checked with: 3.17 (`IC_HELM_BIN`) and
/// 4.1 (`IC_HELM4_BIN`), both installed by `./dev.sh` (ensure_helm).
fn helms() -> Vec<(&'static str, PathBuf)> {
    let helm4 = std::env::var_os("IC_HELM4_BIN").unwrap_or_else(|| {
        panic!("IC_HELM4_BIN is not set: run the chart tests with `./dev.sh chart` (it installs helm 4)")
    });
    vec![
        ("helm 3", ic_e2e::chart::helm()),
        ("helm 4", PathBuf::from(helm4)),
    ]
}

/// `helm template` of `chart` with the binary `helm`, as `render` does.
fn render_with(helm: &std::path::Path, chart: &str, extra: &[&str]) -> String {
    let dir = chart_dir(chart);
    let out = std::process::Command::new(helm)
        .args(["template", ic_e2e::chart::RELEASE, dir.to_str().unwrap()])
        .args([
            "--namespace",
            ic_e2e::chart::NAMESPACE,
            "--kube-version",
            "1.33.0",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} template {chart} {extra:?}: {}",
        helm.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A render as a set of objects keyed by kind, namespace and name: Helm
/// versions order documents differently, and the order means nothing.
fn object_set(render: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let mut set = std::collections::BTreeMap::new();
    for o in objects(render) {
        let key = format!(
            "{}/{}/{}",
            o["kind"].as_str().unwrap_or_default(),
            o["metadata"]["namespace"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        );
        assert!(set.insert(key.clone(), o).is_none(), "{key} rendered twice");
    }
    set
}

/// The keys whose objects differ between two sets (or are in only one).
fn differing(
    a: &std::collections::BTreeMap<String, serde_json::Value>,
    b: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Vec<String> {
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn both_charts_lint_clean() {
    for (version, helm) in helms() {
        for chart in [CHART, "inference-cache-crds"] {
            let dir = chart_dir(chart);
            let out = std::process::Command::new(&helm)
                .args(["lint", "--strict", dir.to_str().unwrap()])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{version} lint --strict {chart}:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("0 chart(s) failed"), "{version}: {text}");
        }
    }
}

/// Goldens hold the Helm 3 render; every Helm version must render the same
/// objects (compared by kind/namespace/name, not bytes).
#[test]
fn renders_match_their_golden_files() {
    let sets = value_sets();
    assert!(sets.len() >= 5, "at least five value sets: {sets:?}");
    let golden_dir = chart_dir(CHART).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    let mut cases: Vec<(String, String, Vec<String>)> = sets
        .iter()
        .map(|(name, values)| {
            (
                name.clone(),
                CHART.to_owned(),
                vec!["-f".to_owned(), values.to_str().unwrap().to_owned()],
            )
        })
        .collect();
    // The CRD chart on its own.
    cases.push(("crds-chart".into(), "inference-cache-crds".into(), vec![]));
    for (name, chart, args) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let path = golden_dir.join(format!("{name}.yaml"));
        if update {
            std::fs::write(&path, render(chart, &args)).unwrap();
            continue;
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
        let golden = object_set(&golden);
        for (version, helm) in helms() {
            let diff = differing(&golden, &object_set(&render_with(&helm, chart, &args)));
            if !diff.is_empty() {
                stale.push(format!("{name} ({version}): {diff:?}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "renders differ from charts/inference-cache/tests/golden: {stale:#?}: run `./dev.sh chart-golden` and review the diff"
    );
    // No golden file is left without its value set.
    let mut expected: Vec<String> = sets.iter().map(|(n, _)| format!("{n}.yaml")).collect();
    expected.push("crds-chart.yaml".into());
    expected.sort();
    let mut on_disk: Vec<String> = std::fs::read_dir(&golden_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, expected);
}

#[test]
fn every_render_passes_strict_validation_for_1_29_and_1_33() {
    let dir = tempfile::tempdir().unwrap();
    let mut custom_resources = 0;
    for (name, values) in value_sets() {
        let rendered = render_set(&values);
        // The kubeVersion constraint admits 1.29 and renders the same there.
        assert_eq!(
            render(
                CHART,
                &["-f", values.to_str().unwrap(), "--kube-version", "1.29.0"]
            ),
            rendered,
            "{name}: the render depends on the Kubernetes version"
        );
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, &rendered).unwrap();
        for version in ["1.29.0", "1.33.0"] {
            let problems = kubernetes_validate(&path, version);
            assert!(
                problems.is_empty(),
                "{name} for Kubernetes {version}:\n{}",
                problems.join("\n")
            );
        }
        let (problems, checked) = custom_resources_validate(&path);
        assert!(problems.is_empty(), "{name}: {}", problems.join("\n"));
        custom_resources += checked;
    }
    // The monitoring and cert-manager sets render custom resources, and
    // they were checked.
    assert!(
        custom_resources >= 8,
        "{custom_resources} custom resources checked"
    );
}

#[test]
fn the_values_schema_rejects_wrong_types_and_unknown_keys() {
    let dir = chart_dir(CHART);
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "bogus=1"], "bogus"),
        (&["--set", "controller.replicas=two"], "replicas"),
        (&["--set", "controller.replicaz=2"], "replicaz"),
        (&["--set", "webhook.certificates.mode=selfsigned"], "mode"),
        // An unquoted `off` is YAML for false: the mode is a word.
        (&["--set", "indexServer.tls.mode=off"], "mode"),
        (&["--set", "indexServer.tls.mode=true"], "mode"),
        (&["--set", "indexServer.replicas=0"], "replicas"),
        (&["--set", "indexServer.drainSeconds=-1"], "drainSeconds"),
        (&["--set", "webhook.drainSeconds=soon"], "drainSeconds"),
        (&["--set", "webhook.timeoutSeconds=60"], "timeoutSeconds"),
        (&["--set", "inference-cache-crds.bogus=1"], "bogus"),
        (&["--set", "pods.logFormat=xml"], "logFormat"),
    ];
    for (args, field) in cases {
        let mut all = vec!["template", "x", dir.to_str().unwrap()];
        all.extend_from_slice(args);
        let (ok, _, err) = helm_run(&all);
        assert!(!ok, "{args:?} was accepted");
        assert!(
            err.contains("schema") && err.contains(field),
            "{args:?}: {err}"
        );
    }
    // A secret-mode install without its CA bundle is refused by name.
    let (ok, _, err) = helm_run(&[
        "template",
        "x",
        dir.to_str().unwrap(),
        "--set",
        "webhook.certificates.mode=secret",
    ]);
    assert!(
        !ok && err.contains("webhook.certificates.secret.caBundle"),
        "{err}"
    );
    // Replicas without leader election would fight.
    let (ok, _, err) = helm_run(&[
        "template",
        "x",
        dir.to_str().unwrap(),
        "--set",
        "controller.replicas=2",
        "--set",
        "controller.leaderElection=false",
    ]);
    assert!(!ok && err.contains("leaderElection"), "{err}");
}

#[test]
fn monitoring_objects_render_only_when_their_crds_are_served_or_forced() {
    let kinds = ["ServiceMonitor", "PodMonitor", "PrometheusRule"];
    let plain = objects(&render(CHART, &[]));
    for kind in kinds {
        assert!(
            of_kind(&plain, kind).is_empty(),
            "{kind} rendered without its CRD"
        );
    }
    let served = objects(&render(
        CHART,
        &[
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
        ],
    ));
    assert_eq!(of_kind(&served, "ServiceMonitor").len(), 4);
    assert_eq!(of_kind(&served, "PodMonitor").len(), 1);
    assert_eq!(of_kind(&served, "PrometheusRule").len(), 1);
    let rules = &of_kind(&served, "PrometheusRule")[0]["spec"]["groups"];
    let alerts: Vec<&str> = rules
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    for alert in [
        "InferenceCacheBackendDegraded",
        "InferenceCacheNoKVEventsObserved",
        "InferenceCacheLMCacheT2NoHits",
        "InferenceCacheWebhookFailOpen",
        "InferenceCacheSubscriberLostBatches",
        "InferenceCacheSubscriberReplayFailing",
        "InferenceCacheSubscriberReplicaOverflowing",
        "InferenceCacheIndexNearCapacity",
        "InferenceCacheCoordinatorEventLoss",
        "InferenceCacheCoordinatorViewGaps",
    ] {
        assert!(alerts.contains(&alert), "{alert} missing from {alerts:?}");
    }
    // The dashboard is a ConfigMap: no CRD needed.
    let dashboard = find(&plain, "ConfigMap", "inferencecache-dashboard").unwrap();
    let json: serde_json::Value =
        serde_json::from_str(dashboard["data"]["inferencecache.json"].as_str().unwrap()).unwrap();
    assert_eq!(json["uid"], "inferencecache");
}

#[test]
fn crds_are_kept_on_uninstall_and_can_be_left_out() {
    let all = objects(&render(CHART, &[]));
    let crds = of_kind(&all, "CustomResourceDefinition");
    assert_eq!(crds.len(), 4);
    for crd in &crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}",
            crd["metadata"]["name"]
        );
    }
    let without = objects(&render(CHART, &["--set", "crds.enabled=false"]));
    assert!(of_kind(&without, "CustomResourceDefinition").is_empty());
    let unkept = objects(&render(
        CHART,
        &["--set", "inference-cache-crds.keep=false"],
    ));
    assert!(
        of_kind(&unkept, "CustomResourceDefinition")
            .iter()
            .all(|c| c["metadata"].get("annotations").is_none())
    );
    // The chart's CRDs are the generated ones, byte for byte in their specs.
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap();
        let file = ic_e2e::chart::repo_root()
            .join("deploy/crds")
            .join(format!("{}.yaml", name.split('.').next().unwrap()));
        let plain: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        assert_eq!(crd["spec"], plain["spec"], "{name}");
    }
}

#[test]
fn every_workload_passes_the_restricted_pod_security_level() {
    for (name, values) in value_sets() {
        let all = objects(&render_set(&values));
        let pods: Vec<(&str, &serde_json::Value)> = all
            .iter()
            .filter_map(|o| match o["kind"].as_str()? {
                "Deployment" => Some((
                    o["metadata"]["name"].as_str()?,
                    &o["spec"]["template"]["spec"],
                )),
                "Pod" => Some((o["metadata"]["name"].as_str()?, &o["spec"])),
                _ => None,
            })
            .collect();
        assert!(!pods.is_empty());
        for (pod, spec) in pods {
            let ctx = &spec["securityContext"];
            assert_eq!(ctx["runAsNonRoot"], true, "{name}/{pod}");
            assert_eq!(
                ctx["seccompProfile"]["type"], "RuntimeDefault",
                "{name}/{pod}"
            );
            assert_ne!(spec["hostNetwork"], true, "{name}/{pod}");
            for c in spec["containers"].as_array().unwrap() {
                let sc = &c["securityContext"];
                assert_eq!(
                    sc["allowPrivilegeEscalation"], false,
                    "{name}/{pod}/{}",
                    c["name"]
                );
                assert_eq!(
                    sc["readOnlyRootFilesystem"], true,
                    "{name}/{pod}/{}",
                    c["name"]
                );
                assert_eq!(
                    sc["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{name}/{pod}/{}",
                    c["name"]
                );
                assert!(
                    c["resources"]["requests"].is_object(),
                    "{name}/{pod}: no resources"
                );
                if let Some(p) = c.get("livenessProbe") {
                    assert!(p["httpGet"]["path"] == "/live", "{name}/{pod}");
                }
            }
        }
    }
}

#[test]
fn replicas_bring_disruption_budgets_and_spread_and_the_coordinator_stays_single() {
    let ha = objects(&render_set(&chart_dir(CHART).join("values-ha.yaml")));
    for (name, replicas) in [
        ("inferencecache-controller", 2),
        ("inferencecache-webhook", 2),
        ("inferencecache-index-server", 3),
    ] {
        let d = find(&ha, "Deployment", name).unwrap();
        assert_eq!(d["spec"]["replicas"], replicas, "{name}");
        let selector = &d["spec"]["selector"]["matchLabels"];
        let pdb = find(&ha, "PodDisruptionBudget", name)
            .unwrap_or_else(|| panic!("{name} has no PodDisruptionBudget"));
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{name}");
        assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector, "{name}");
        let spread = d["spec"]["template"]["spec"]["topologySpreadConstraints"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} is not spread"));
        let keys: Vec<&str> = spread
            .iter()
            .map(|c| c["topologyKey"].as_str().unwrap())
            .collect();
        assert_eq!(
            keys,
            ["kubernetes.io/hostname", "topology.kubernetes.io/zone"],
            "{name}"
        );
        for c in spread {
            assert_eq!(&c["labelSelector"]["matchLabels"], selector, "{name}");
        }
    }
    let coordinator = find(&ha, "Deployment", "inferencecache-coordinator").unwrap();
    assert_eq!(coordinator["spec"]["replicas"], 1);
    assert_eq!(coordinator["spec"]["strategy"]["type"], "Recreate");
    let volumes = &coordinator["spec"]["template"]["spec"]["volumes"];
    assert_eq!(
        volumes[0]["persistentVolumeClaim"]["claimName"],
        "inferencecache-coordinator"
    );
    assert!(find(&ha, "PersistentVolumeClaim", "inferencecache-coordinator").is_some());
    let single = objects(&render(CHART, &[]));
    assert!(of_kind(&single, "PodDisruptionBudget").is_empty());
    // Replicas are a count, no longer pinned to one.
    let five = objects(&render(CHART, &["--set", "indexServer.replicas=5"]));
    let d = find(&five, "Deployment", "inferencecache-index-server").unwrap();
    assert_eq!(d["spec"]["replicas"], 5);
}

/// The value of `--flag=` in a container's args.
fn arg<'a>(container: &'a serde_json::Value, flag: &str) -> Option<&'a str> {
    container["args"]
        .as_array()?
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix(&format!("--{flag}=")))
}

#[test]
fn the_index_server_starts_a_new_pod_before_stopping_an_old_one_at_any_replica_count() {
    let ha = chart_dir(CHART).join("values-ha.yaml");
    for (values, replicas) in [(vec![], 1), (vec!["-f", ha.to_str().unwrap()], 3)] {
        let all = objects(&render(CHART, &values));
        let d = find(&all, "Deployment", "inferencecache-index-server").unwrap();
        assert_eq!(d["spec"]["replicas"], replicas);
        let strategy = &d["spec"]["strategy"];
        assert_eq!(strategy["type"], "RollingUpdate", "{replicas}: {strategy}");
        assert_eq!(
            strategy["rollingUpdate"]["maxUnavailable"], 0,
            "{replicas}: {strategy}"
        );
        assert_eq!(
            strategy["rollingUpdate"]["maxSurge"], 1,
            "{replicas}: {strategy}"
        );
        // Ready means what the server says on /ready (warm-up and the
        // subscribers' resyncs done, not draining), on the HTTP port.
        let container = &d["spec"]["template"]["spec"]["containers"][0];
        let probe = &container["readinessProbe"]["httpGet"];
        assert_eq!(probe["path"], "/ready", "{container}");
        let http_port = arg(container, "http-addr")
            .and_then(|a| a.rsplit(':').next())
            .unwrap();
        let named = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == probe["port"])
            .unwrap_or_else(|| panic!("no container port {}", probe["port"]));
        assert_eq!(named["containerPort"].to_string(), http_port);
    }
}

#[test]
fn every_draining_server_gets_a_termination_grace_above_its_drain() {
    let checks = |all: &[serde_json::Value], want: &[(&str, u64)]| {
        for (name, drain) in want {
            let pod = &find(all, "Deployment", name).unwrap()["spec"]["template"]["spec"];
            let container = &pod["containers"][0];
            assert_eq!(
                arg(container, "drain-seconds"),
                Some(drain.to_string().as_str()),
                "{name}"
            );
            let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
            // In-flight streams still finish after the drain, before SIGKILL.
            assert!(
                grace >= drain + 10,
                "{name}: grace {grace} for a drain of {drain}"
            );
        }
    };
    checks(
        &objects(&render(CHART, &[])),
        &[
            ("inferencecache-index-server", 15),
            ("inferencecache-webhook", 10),
        ],
    );
    checks(
        &objects(&render(
            CHART,
            &[
                "--set",
                "indexServer.drainSeconds=45",
                "--set",
                "webhook.drainSeconds=0",
            ],
        )),
        &[
            ("inferencecache-index-server", 45),
            ("inferencecache-webhook", 0),
        ],
    );
}

#[test]
fn subscribers_reach_every_index_replica_through_a_headless_service_and_gateways_the_service() {
    for (tls, values) in [
        (false, vec![]),
        (true, vec!["--set", "indexServer.tls.mode=certManager"]),
    ] {
        let all = objects(&render(CHART, &values));
        let scheme = if tls { "https" } else { "http" };
        let d = find(&all, "Deployment", "inferencecache-index-server").unwrap();
        let headless = find(&all, "Service", "inferencecache-index-server-headless")
            .expect("a headless Service");
        let spec = &headless["spec"];
        assert_eq!(spec["clusterIP"], "None");
        // A replica that is not ready yet must receive the resyncs that
        // make it ready.
        assert_eq!(spec["publishNotReadyAddresses"], true);
        assert_eq!(spec["selector"], d["spec"]["selector"]["matchLabels"]);
        assert_eq!(
            spec["ports"],
            serde_json::json!([if tls {
                serde_json::json!({"name": "grpc", "port": 9090, "targetPort": "grpc", "protocol": "TCP"})
            } else {
                serde_json::json!({"name": "grpc", "port": 9090, "targetPort": "grpc", "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c"})
            }])
        );
        let webhook = &find(&all, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]
            ["spec"]["containers"][0];
        assert_eq!(
            arg(webhook, "index-server"),
            Some(
                format!(
                    "{scheme}://inferencecache-index-server-headless.inferencecache-system:9090"
                )
                .as_str()
            )
        );
        assert_eq!(arg(webhook, "index-server-discovery"), Some("dns"));
        // The controller's CachePolicies go to every replica too (each holds
        // its own); its /snapshot and /probe, and gateways, keep the
        // load-balanced Service.
        let controller = &find(&all, "Deployment", "inferencecache-controller").unwrap()["spec"]["template"]
            ["spec"]["containers"][0];
        assert_eq!(
            arg(controller, "index-server-grpc"),
            Some(
                format!(
                    "{scheme}://inferencecache-index-server-headless.inferencecache-system:9090"
                )
                .as_str()
            )
        );
        assert_eq!(arg(controller, "index-server-discovery"), Some("dns"));
        assert_eq!(
            arg(controller, "snapshot-url"),
            Some("http://inferencecache-index-server.inferencecache-system:8081/snapshot")
        );
        assert_eq!(
            find(&all, "Service", "inferencecache-index-server").unwrap()["spec"]["type"],
            "ClusterIP"
        );
    }
}

#[test]
fn the_index_servers_certificate_names_the_headless_service_too() {
    let all = objects(&render(
        CHART,
        &["--set", "indexServer.tls.mode=certManager"],
    ));
    let cert = find(&all, "Certificate", "inferencecache-index-server").unwrap();
    let names: Vec<&str> = cert["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for service in [
        "inferencecache-index-server",
        "inferencecache-index-server-headless",
    ] {
        for suffix in ["", ".svc", ".svc.cluster.local"] {
            let name = format!("{service}.inferencecache-system{suffix}");
            assert!(
                names.contains(&name.as_str()),
                "{name} missing from {names:?}"
            );
        }
    }
    // The subscribers verify each replica against the host of the URL
    // the webhook injects: that host is on the certificate.
    let webhook = &find(&all, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]
        ["spec"]["containers"][0];
    let url = arg(webhook, "index-server").unwrap();
    let host = url
        .trim_start_matches("https://")
        .rsplit_once(':')
        .unwrap()
        .0;
    assert!(names.contains(&host), "{host} missing from {names:?}");
}

/// Leaf paths of `values` (a map the schema gives no properties is a leaf).
fn value_paths(
    values: &serde_json::Value,
    schema: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<String>,
) {
    let props = schema.get("properties");
    match (values.as_object(), props) {
        (Some(map), Some(props)) if !map.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                value_paths(
                    v,
                    props.get(k).unwrap_or(&serde_json::Value::Null),
                    &path,
                    out,
                );
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

#[test]
fn the_install_guide_lists_every_value_and_the_schema_describes_it() {
    let values: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir(CHART).join("values.yaml")).unwrap(),
    )
    .unwrap();
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir(CHART).join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let guide =
        std::fs::read_to_string(ic_e2e::chart::repo_root().join("docs/install.md")).unwrap();
    let mut paths = Vec::new();
    value_paths(&values, &schema, "", &mut paths);
    // The subchart's value is described by its own schema.
    paths.retain(|p| p != "inference-cache-crds");
    paths.push("inference-cache-crds.keep".into());
    assert!(paths.len() > 100, "{paths:?}");
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !guide.contains(&format!("| `{p}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/install.md does not list {missing:?}"
    );
    // Every key of values.yaml has a description in the schema.
    fn described(
        values: &serde_json::Value,
        schema: &serde_json::Value,
        path: &str,
        bad: &mut Vec<String>,
    ) {
        let Some(map) = values.as_object() else {
            return;
        };
        for (k, v) in map {
            let sub = &schema["properties"][k];
            if k != "inference-cache-crds" && sub["description"].as_str().is_none_or(str::is_empty)
            {
                bad.push(format!("{path}{k}"));
            }
            if sub.get("properties").is_some() {
                described(v, sub, &format!("{path}{k}."), bad);
            }
        }
    }
    let mut bad = Vec::new();
    described(&values, &schema, "", &mut bad);
    assert!(
        bad.is_empty(),
        "values.schema.json has no description for {bad:?}"
    );
}
