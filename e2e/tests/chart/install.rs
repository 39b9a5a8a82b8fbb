//! What a real install needs that a default render does not show (issue
//! 41): private registries, webhooks reachable on managed clusters, a pod
//! webhook that sees only what it must, scaling that keeps the spread, a
//! clean `helm package`, and the chart details users hit.

use std::collections::BTreeSet;

use ic_e2e::chart::{chart_dir, find, helm, helm_run, objects, of_kind, render};
use serde_json::{Value, json};

use super::CHART;

/// Every pod spec of a render: (object name, pod spec).
fn pod_specs(all: &[Value]) -> Vec<(String, &Value)> {
    all.iter()
        .filter_map(|o| {
            let name = o["metadata"]["name"].as_str()?.to_owned();
            match o["kind"].as_str()? {
                "Deployment" | "StatefulSet" => Some((name, &o["spec"]["template"]["spec"])),
                "Pod" => Some((name, &o["spec"])),
                _ => None,
            }
        })
        .collect()
}

fn args(container: &Value) -> Vec<String> {
    serde_json::from_value(container["args"].clone()).unwrap_or_default()
}

fn webhook_container(all: &[Value]) -> &Value {
    &find(all, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]["spec"]["containers"]
        [0]
}

fn refused(extra: &[&str]) -> String {
    let dir = chart_dir(CHART);
    let mut all = vec!["template", "x", dir.to_str().unwrap()];
    all.extend_from_slice(extra);
    let (ok, _, err) = helm_run(&all);
    assert!(!ok, "{extra:?} was accepted");
    err
}

// === 1. private registries ===

#[test]
fn global_registry_and_pull_secrets_reach_every_pod_and_the_wired_ones() {
    let all = objects(&render(
        CHART,
        &[
            "--set",
            "global.imageRegistry=mirror.example/ic",
            "--set",
            "global.imagePullSecrets[0]=regcred",
            "--set",
            "imagePullSecrets[0]=regcred",
            "--set",
            "imagePullSecrets[1].name=team-pull",
        ],
    ));
    let pods = pod_specs(&all);
    assert!(pods.len() >= 5, "{pods:?}");
    for (name, spec) in &pods {
        for c in spec["containers"].as_array().unwrap() {
            let image = c["image"].as_str().unwrap();
            assert!(image.starts_with("mirror.example/ic/"), "{name}: {image}");
        }
        // Each secret once, global first.
        assert_eq!(
            spec["imagePullSecrets"],
            json!([{"name": "regcred"}, {"name": "team-pull"}]),
            "{name}"
        );
    }
    // The webhook hands them, and the registry, to what it wires and
    // defaults: the injected subscriber and the managed providers.
    let webhook = args(webhook_container(&all));
    for want in [
        "--image-pull-secret=regcred",
        "--image-pull-secret=team-pull",
        "--provider-image-registry=mirror.example/ic",
        "--kvevent-subscriber-image=mirror.example/ic/ic-kvevent-subscriber:0.1.0",
    ] {
        assert!(
            webhook.iter().any(|a| a == want),
            "{want} not in {webhook:?}"
        );
    }
    // Without global values nothing of the sort is set.
    let plain = objects(&render(CHART, &[]));
    let webhook = args(webhook_container(&plain));
    assert!(
        !webhook
            .iter()
            .any(|a| a.starts_with("--image-pull-secret") || a.starts_with("--provider-image")),
        "{webhook:?}"
    );
    for (name, spec) in pod_specs(&plain) {
        assert!(spec.get("imagePullSecrets").is_none(), "{name}");
    }
}

// === 2. webhooks reachable on managed clusters; extraArgs override ===

#[test]
fn the_webhook_port_and_host_network_are_values() {
    let default = objects(&render(CHART, &[]));
    let pod = &find(&default, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]
        ["spec"];
    assert!(pod.get("hostNetwork").is_none());
    // GKE private clusters: the control plane reaches pods on 10250.
    let gke = objects(&render(CHART, &["--set", "webhook.port=10250"]));
    let pod =
        &find(&gke, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]["spec"];
    assert!(pod.get("hostNetwork").is_none());
    let c = &pod["containers"][0];
    assert!(
        args(c).contains(&"--https-addr=0.0.0.0:10250".to_owned()),
        "{c}"
    );
    let https = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "https")
        .unwrap();
    assert_eq!(https["containerPort"], 10250);
    // The Service (and so every webhook registration) still names 443,
    // which targets the port by name.
    let svc = find(&gke, "Service", "inferencecache-webhook").unwrap();
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https");
    // EKS with an overlay CNI: the node's network, both ports chosen.
    let eks = objects(&render(
        CHART,
        &[
            "--set",
            "webhook.hostNetwork=true",
            "--set",
            "webhook.port=9443",
            "--set",
            "webhook.adminPort=8089",
        ],
    ));
    let pod =
        &find(&eks, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let a = args(&pod["containers"][0]);
    assert!(a.contains(&"--admin-addr=0.0.0.0:8089".to_owned()), "{a:?}");
}

#[test]
fn extra_args_override_any_flag_the_chart_sets() {
    for (component, deployment, flag) in [
        ("controller", "inferencecache-controller", "--admin-addr"),
        ("webhook", "inferencecache-webhook", "--request-timeout-ms"),
        (
            "indexServer",
            "inferencecache-index-server",
            "--capacity-entries",
        ),
        (
            "coordinator",
            "inferencecache-coordinator",
            "--instance-timeout",
        ),
    ] {
        let all = objects(&render(
            CHART,
            &[
                "--set",
                &format!("{component}.extraArgs[0]=--log-level=debug"),
                "--set",
                &format!("{component}.extraArgs[1]={flag}"),
                "--set-string",
                &format!("{component}.extraArgs[2]=7"),
            ],
        ));
        let c = &find(&all, "Deployment", deployment).unwrap()["spec"]["template"]["spec"]["containers"]
            [0];
        let a = args(c);
        // clap refuses a repeated flag: each appears once, the user's.
        let levels: Vec<&String> = a.iter().filter(|x| x.starts_with("--log-level")).collect();
        assert_eq!(levels, ["--log-level=debug"], "{component}: {a:?}");
        let named: Vec<&String> = a.iter().filter(|x| x.starts_with(flag)).collect();
        assert_eq!(named, [flag], "{component}: {a:?}");
        assert_eq!(a.last().unwrap(), "7", "{component}: {a:?}");
        // The chart's other flags stay.
        assert!(a.iter().any(|x| x.starts_with("--log-format=")), "{a:?}");
    }
}

// === 3. the pod webhook touches only what it must ===

fn pod_webhook(all: &[Value]) -> &Value {
    let m = find(
        all,
        "MutatingWebhookConfiguration",
        "inferencecache-webhook",
    )
    .unwrap();
    m["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "mpod.inferencecache.io")
        .unwrap()
}

#[test]
fn the_pod_webhook_skips_opted_out_and_engine_less_pods_and_answers_fast() {
    let all = objects(&render(CHART, &[]));
    let hook = pod_webhook(&all);
    let opt_out =
        json!({"key": "inferencecache.io/skip-inject", "operator": "NotIn", "values": ["true"]});
    for selector in ["namespaceSelector", "objectSelector"] {
        let terms = hook[selector]["matchExpressions"].as_array().unwrap();
        assert!(terms.contains(&opt_out), "{selector}: {terms:?}");
    }
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(excluded["key"], "kubernetes.io/metadata.name");
    for ns in ["kube-system", "inferencecache-system", "cert-manager"] {
        assert!(
            excluded["values"].as_array().unwrap().contains(&json!(ns)),
            "{ns}: {excluded}"
        );
    }
    // Kubernetes >= 1.28 filters pods without an engine container.
    let conditions = hook["matchConditions"].as_array().expect("matchConditions");
    let expression = conditions[0]["expression"].as_str().unwrap();
    for part in ["'vllm'", "'sglang'", "INFERENCECACHE_INJECTED"] {
        assert!(expression.contains(part), "{expression}");
    }
    // Shorter than the CacheBackend calls, and the server answers inside it.
    let timeout = hook["timeoutSeconds"].as_i64().unwrap();
    assert!(timeout <= 5, "{timeout}");
    let m = find(
        &all,
        "MutatingWebhookConfiguration",
        "inferencecache-webhook",
    )
    .unwrap();
    assert_eq!(m["webhooks"][0]["timeoutSeconds"], 10);
    let a = args(webhook_container(&all));
    let ms = |flag: &str| -> i64 {
        a.iter()
            .find_map(|x| x.strip_prefix(flag))
            .unwrap()
            .parse()
            .unwrap()
    };
    let request = ms("--request-timeout-ms=");
    assert!(request < timeout * 1000, "{request}");
    assert!(ms("--list-timeout-ms=") < request);
}

// === 4. scaling keeps the spread ===

#[test]
fn scaling_from_one_replica_changes_no_pod_template() {
    for (component, deployment) in [
        ("controller", "inferencecache-controller"),
        ("webhook", "inferencecache-webhook"),
        ("indexServer", "inferencecache-index-server"),
    ] {
        let one = objects(&render(CHART, &[]));
        let two = objects(&render(
            CHART,
            &["--set", &format!("{component}.replicas=2")],
        ));
        let template = |all: &[Value]| {
            find(all, "Deployment", deployment).unwrap()["spec"]["template"].clone()
        };
        assert_eq!(template(&one), template(&two), "{component}");
        let spread = &template(&one)["spec"]["topologySpreadConstraints"];
        assert_eq!(
            spread.as_array().map(Vec::len),
            Some(2),
            "{component}: {spread}"
        );
    }
    // values-ha: two webhook replicas behind a disruption budget.
    let ha = objects(&render(
        CHART,
        &[
            "-f",
            chart_dir(CHART).join("values-ha.yaml").to_str().unwrap(),
        ],
    ));
    let d = find(&ha, "Deployment", "inferencecache-webhook").unwrap();
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(find(&ha, "PodDisruptionBudget", "inferencecache-webhook").is_some());
}

// === 5. a clean package ===

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        // Follows the subchart symlink, as a clone's checkout does.
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

#[test]
fn helm_package_leaves_out_dependency_build_leftovers_and_tests() {
    let work = tempfile::tempdir().unwrap();
    let chart = work.path().join(CHART);
    copy_dir(&chart_dir(CHART), &chart);
    // What `helm dependency build` leaves beside the symlinked subchart.
    std::fs::write(chart.join("Chart.lock"), "dependencies: []\n").unwrap();
    std::fs::write(
        chart.join("charts/inference-cache-crds-0.1.0.tgz"),
        b"stale",
    )
    .unwrap();
    let out = work.path().join("out");
    let (ok, _, err) = helm_run(&[
        "package",
        chart.to_str().unwrap(),
        "--destination",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let archive = out.join("inference-cache-0.1.0.tgz");
    let listing = std::process::Command::new("tar")
        .arg("tzf")
        .arg(&archive)
        .output()
        .unwrap();
    let files: BTreeSet<String> = String::from_utf8(listing.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    for bad in ["Chart.lock", ".tgz", "/tests/", "/rbac/"] {
        assert!(
            !files.iter().any(|f| f.contains(bad)),
            "{bad} in the archive: {files:?}"
        );
    }
    assert!(files.contains("inference-cache/charts/inference-cache-crds/Chart.yaml"));
    // The archive renders what the directory renders.
    let (ok, packaged, err) = helm_run(&[
        "template",
        ic_e2e::chart::RELEASE,
        archive.to_str().unwrap(),
        "--namespace",
        ic_e2e::chart::NAMESPACE,
        "--kube-version",
        "1.33.0",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        super::object_set(&packaged),
        super::object_set(&render(CHART, &[]))
    );
    let _ = helm();
}

// === 6. chart details ===

#[test]
fn bad_values_are_refused_by_the_schema_naming_them() {
    // A null list used to pass the schema and fail rendering (nil pointer).
    let err = refused(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.indexServerClients=null",
    ]);
    assert!(
        err.contains("indexServerClients") && !err.contains("nil pointer"),
        "{err}"
    );
    // A selector key repeated in commonLabels.
    let err = refused(&["--set", "commonLabels.app\\.kubernetes\\.io/name=mine"]);
    assert!(err.contains("app.kubernetes.io/name"), "{err}");
    // A selector term without its operator.
    let err = refused(&[
        "--set",
        "webhook.pods.objectSelectorExpressions[0].key=team",
    ]);
    assert!(err.contains("operator"), "{err}");
    let err = refused(&["--set", "webhook.port=0"]);
    assert!(err.contains("port"), "{err}");
}

#[test]
fn every_pod_runs_on_linux_nodes_unless_told_otherwise() {
    let all = objects(&render(
        CHART,
        &["--set", "controller.nodeSelector.pool=system"],
    ));
    for (name, spec) in pod_specs(&all) {
        assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux", "{name}");
    }
    let c =
        &find(&all, "Deployment", "inferencecache-controller").unwrap()["spec"]["template"]["spec"];
    assert_eq!(c["nodeSelector"]["pool"], "system");
}

#[test]
fn strategy_probes_and_extra_objects_are_values() {
    let all = objects(&render(
        CHART,
        &[
            "--set",
            "webhook.strategy.type=Recreate",
            "--set",
            "indexServer.livenessProbe.periodSeconds=31",
            "--set",
            "controller.readinessProbe.failureThreshold=9",
            "--set-json",
            r#"extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"extra-{{ .Release.Name }}","namespace":"x"}}]"#,
        ],
    ));
    let d = |name: &str| find(&all, "Deployment", name).unwrap().clone();
    assert_eq!(
        d("inferencecache-webhook")["spec"]["strategy"]["type"],
        "Recreate"
    );
    let live = &d("inferencecache-index-server")["spec"]["template"]["spec"]["containers"][0]["livenessProbe"];
    assert_eq!(live["periodSeconds"], 31);
    assert_eq!(live["httpGet"]["path"], "/live", "merged, not replaced");
    let ready = &d("inferencecache-controller")["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
    assert_eq!(ready["failureThreshold"], 9);
    // The index server keeps its surge-first strategy unless told.
    assert_eq!(
        d("inferencecache-index-server")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    assert!(find(&all, "ConfigMap", "extra-inferencecache").is_some());
}

#[test]
fn network_policies_can_restrict_egress() {
    let open = objects(&render(CHART, &["--set", "networkPolicy.enabled=true"]));
    for p in of_kind(&open, "NetworkPolicy") {
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]));
    }
    let closed = objects(&render(
        CHART,
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.egress.enabled=true",
            "--set-json",
            r#"networkPolicy.egress.apiServer=[{"ipBlock":{"cidr":"10.0.0.1/32"}}]"#,
        ],
    ));
    let policies = of_kind(&closed, "NetworkPolicy");
    assert_eq!(policies.len(), 4);
    for p in policies {
        let name = &p["metadata"]["name"];
        assert_eq!(
            p["spec"]["policyTypes"],
            json!(["Ingress", "Egress"]),
            "{name}"
        );
        let egress = p["spec"]["egress"].as_array().unwrap();
        assert!(
            egress.iter().any(|r| r["ports"][0]["port"] == 53),
            "{name}: DNS"
        );
        assert!(
            egress
                .iter()
                .any(|r| r["to"][0]["ipBlock"]["cidr"] == "10.0.0.1/32"),
            "{name}: the API server"
        );
    }
}

#[test]
fn the_controllers_workload_rights_can_be_kept_to_chosen_namespaces() {
    let writes = |rules: &Value| -> bool {
        rules.as_array().unwrap().iter().any(|r| {
            r["resources"]
                .as_array()
                .unwrap()
                .contains(&json!("deployments"))
                && r["verbs"].as_array().unwrap().contains(&json!("create"))
        })
    };
    let all = objects(&render(CHART, &[]));
    let role = find(&all, "ClusterRole", "inferencecache-controller").unwrap();
    assert!(writes(&role["rules"]));
    let kept = objects(&render(
        CHART,
        &[
            "--set",
            "controller.rbac.workloadNamespaces={inference,batch}",
        ],
    ));
    let role = find(&kept, "ClusterRole", "inferencecache-controller").unwrap();
    assert!(!writes(&role["rules"]), "{role}");
    let roles: Vec<&Value> = of_kind(&kept, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["name"] == "inferencecache-controller-workloads")
        .collect();
    let namespaces: Vec<&str> = roles
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, ["inference", "batch"]);
    assert!(roles.iter().all(|r| writes(&r["rules"])));
    let bindings = of_kind(&kept, "RoleBinding");
    assert!(
        bindings
            .iter()
            .any(|b| b["metadata"]["namespace"] == "batch"
                && b["subjects"][0]["namespace"] == "inferencecache-system")
    );
}

#[test]
fn the_test_pod_has_its_own_image() {
    let all = objects(&render(
        CHART,
        &["--set", "indexServer.image.name=custom-index-without-icctl"],
    ));
    let pod = find(&all, "Pod", "inferencecache-test").unwrap();
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "localhost/inferencecache/ic-index-server:0.1.0"
    );
    let all = objects(&render(
        CHART,
        &[
            "--set",
            "tests.image.name=icctl",
            "--set-string",
            "tests.image.tag=9",
        ],
    ));
    let pod = find(&all, "Pod", "inferencecache-test").unwrap();
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "localhost/inferencecache/icctl:9"
    );
}

#[test]
fn the_install_guide_names_the_rendered_roles_and_every_alert() {
    let guide =
        std::fs::read_to_string(ic_e2e::chart::repo_root().join("docs/install.md")).unwrap();
    let all = objects(&render(
        CHART,
        &["--set", "controller.rbac.workloadNamespaces={inference}"],
    ));
    for kind in ["ClusterRole", "Role"] {
        for role in of_kind(&all, kind) {
            let name = role["metadata"]["name"].as_str().unwrap();
            assert!(
                guide.contains(&format!("`{name}`")),
                "docs/install.md does not name {kind} {name}"
            );
        }
    }
    let served = objects(&render(
        CHART,
        &["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"],
    ));
    let rule = &of_kind(&served, "PrometheusRule")[0];
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let alert = r["alert"].as_str().unwrap();
            assert!(
                guide.contains(&format!("| `{alert}` |")),
                "docs/install.md's alert table lacks {alert}"
            );
        }
    }
}
