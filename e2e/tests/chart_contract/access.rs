//! The chart's access control against the binaries: RBAC granted exactly as each binary's tests recorded, token audiences, wired pods' validity, access control on by default.

use super::*;

/// Every (group, resource, verb) the roles bound to `account` grant.
fn granted(objects: &[Value], account: &str) -> BTreeSet<Permission> {
    let mut roles: Vec<(&str, &str)> = Vec::new();
    for binding in objects.iter().filter(|o| {
        matches!(
            o["kind"].as_str(),
            Some("ClusterRoleBinding" | "RoleBinding")
        )
    }) {
        let bound = binding["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account);
        if bound {
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
            roles.push((role_kind, binding["roleRef"]["name"].as_str().unwrap()));
        }
    }
    let mut out = BTreeSet::new();
    for (kind, name) in roles {
        let role = find(objects, kind, name)
            .unwrap_or_else(|| panic!("{kind} {name} is bound but not rendered"));
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        out.insert(Permission::new(&group, &resource, &verb));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn rbac_grants_exactly_what_each_binarys_tests_recorded() {
    let rbac = chart_dir(CHART).join("rbac");
    for (values, managed) in [
        (None, true),
        (Some("webhook.certificates.mode=certManager"), false),
        // Writes kept to chosen namespaces: the ClusterRole's reads and the
        // Roles' writes together are still exactly the contract.
        (Some("controller.rbac.workloadNamespaces={inference}"), true),
    ] {
        let args: Vec<&str> = values.map_or_else(Vec::new, |v| vec!["--set", v]);
        let all = objects(&render(CHART, &args));
        for (binary, account) in [
            ("ic-controller", "inferencecache-controller"),
            ("ic-webhook", "inferencecache-webhook"),
            ("ic-index-server", "inferencecache-index-server"),
        ] {
            let contract: BTreeSet<Permission> = read_contract(&rbac.join(format!("{binary}.txt")))
                .unwrap()
                .into_iter()
                .filter(|l| managed || !l.note.contains("managed certificates only"))
                .map(|l| l.permission)
                .collect();
            let got = granted(&all, account);
            let extra: Vec<String> = got.difference(&contract).map(ToString::to_string).collect();
            let missing: Vec<String> = contract.difference(&got).map(ToString::to_string).collect();
            assert!(
                extra.is_empty() && missing.is_empty(),
                "{account} ({values:?}): grants {extra:?} beyond {binary}'s recorded calls and lacks {missing:?}"
            );
        }
        // With the endpoint picker on, its pool's namespace grants what the
        // picker's own test recorded, on top of the index server's calls.
        let args: Vec<&str> = values.map_or_else(Vec::new, |v| vec!["--set", v]);
        let with_epp = objects(&render(
            CHART,
            &[
                args.as_slice(),
                &[
                    "--set",
                    "indexServer.epp.enabled=true",
                    "--set",
                    "indexServer.epp.pool=chat",
                ],
            ]
            .concat(),
        ));
        let epp_contract: BTreeSet<Permission> = read_contract(&rbac.join("ic-index-server.txt"))
            .unwrap()
            .into_iter()
            .chain(read_contract(&rbac.join("ic-index-server-epp.txt")).unwrap())
            .map(|l| l.permission)
            .collect();
        let got = granted(&with_epp, "inferencecache-index-server");
        assert_eq!(
            got, epp_contract,
            "the index server with the endpoint picker"
        );
        // The coordinator (by default) and the test pod call no API: no
        // token at all.
        if managed {
            let sa = find(&all, "ServiceAccount", "inferencecache-coordinator").unwrap();
            assert_eq!(sa["automountServiceAccountToken"], false);
            assert!(granted(&all, "inferencecache-coordinator").is_empty());
            let test = find(&all, "Pod", "inferencecache-test").unwrap();
            assert_eq!(test["spec"]["automountServiceAccountToken"], false);
        }
        // With its operator endpoints guarded it reviews tokens, exactly.
        let guarded = objects(&render(
            CHART,
            &[
                args.as_slice(),
                &["--set", "coordinator.api.accessControl=true"],
            ]
            .concat(),
        ));
        let contract: BTreeSet<Permission> = read_contract(&rbac.join("ic-coordinator.txt"))
            .unwrap()
            .into_iter()
            .map(|l| l.permission)
            .collect();
        assert_eq!(
            granted(&guarded, "inferencecache-coordinator"),
            contract,
            "the coordinator with coordinator.api.accessControl"
        );
    }
    // Names in resourceNames are the ones the binaries are told to use.
    let all = objects(&render(CHART, &[]));
    let lease_role = find(&all, "Role", "inferencecache-controller-leader-election").unwrap();
    assert!(lease_role.to_string().contains("\"ic-controller\""));
    let controller = &find(&all, "Deployment", "inferencecache-controller").unwrap()["spec"]["template"]
        ["spec"]["containers"][0];
    assert!(strings(&controller["args"]).contains(&"--lease-name=ic-controller".to_owned()));
    // The three binaries' roles, and the route reader tenants bind.
    assert_eq!(of_kind(&all, "ClusterRole").len(), 4);
    assert!(
        find(
            &all,
            "ClusterRole",
            "inferencecache-index-server-route-reader"
        )
        .is_some()
    );
}

#[test]
fn the_probe_token_audience_is_the_one_the_index_server_checks() {
    for audience in [None, Some("my-audience")] {
        let args: Vec<String> = audience.map_or_else(Vec::new, |a| {
            vec!["--set".into(), format!("indexServer.probe.audience={a}")]
        });
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let all = objects(&render(CHART, &args));
        let index = &find(&all, "Deployment", "inferencecache-index-server").unwrap()["spec"]["template"]
            ["spec"]["containers"][0];
        let checked = strings(&index["args"])
            .iter()
            .find_map(|a| a.strip_prefix("--probe-audience=").map(str::to_owned))
            .unwrap();
        let pod = &find(&all, "Deployment", "inferencecache-controller").unwrap()["spec"]["template"]
            ["spec"];
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "probe-token")
            .unwrap();
        let projected = &volume["projected"]["sources"][0]["serviceAccountToken"];
        assert_eq!(projected["audience"].as_str(), Some(checked.as_str()));
        // The controller reads the token where the volume puts it.
        let mount = pod["containers"][0]["volumeMounts"][0]["mountPath"]
            .as_str()
            .unwrap();
        let path = format!("{mount}/{}", projected["path"].as_str().unwrap());
        assert!(
            strings(&pod["containers"][0]["args"]).contains(&format!("--probe-token-path={path}"))
        );
        assert_eq!(path, default_of("ic-controller", "--probe-token-path"));
        if let Some(a) = audience {
            assert_eq!(checked, a);
        }
    }
}

/// With the coordinator's operator endpoints guarded, the controller's
/// token is for the audience the coordinator checks, sits where the
/// controller reads it, and belongs to an identity the coordinator admits.
#[test]
fn the_coordinator_admits_the_controllers_token() {
    let all = objects(&render(
        CHART,
        &["--set", "coordinator.api.accessControl=true"],
    ));
    let coordinator = strings(
        &find(&all, "Deployment", "inferencecache-coordinator").unwrap()["spec"]["template"]["spec"]
            ["containers"][0]["args"],
    );
    let checked = coordinator
        .iter()
        .find_map(|a| a.strip_prefix("--api-audience="))
        .unwrap();
    assert!(
        coordinator
            .iter()
            .any(|a| a.starts_with("--api-admin=system:serviceaccount:")
                && a.ends_with(":inferencecache-controller")),
        "{coordinator:?}"
    );
    let pod =
        &find(&all, "Deployment", "inferencecache-controller").unwrap()["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "coordinator-token")
        .unwrap();
    let projected = &volume["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(projected["audience"].as_str(), Some(checked));
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "coordinator-token")
        .unwrap()["mountPath"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("{mount}/{}", projected["path"].as_str().unwrap());
    assert!(
        strings(&pod["containers"][0]["args"])
            .contains(&format!("--coordinator-token-path={path}"))
    );
}

#[test]
fn every_wired_pod_of_the_adapters_golden_files_passes_strict_validation() {
    // What the webhook admits (the adapters' golden pods: every runtime ×
    // binding × mode) must be a valid Pod for the API server.
    let dir = ic_e2e::chart::repo_root().join("libs/adapters/tests/fixtures");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut pod = golden["pod"].clone();
        let name = path
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .replace('_', "-");
        pod["metadata"]["name"] = json!(name);
        // JSON is YAML, and keeps strings such as `off` strings for YAML 1.1 readers.
        docs.push(serde_json::to_string(&pod).unwrap() + "\n");
    }
    assert!(docs.len() >= 15, "{} golden pods", docs.len());
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("pods.yaml");
    std::fs::write(&path, docs.join("---\n")).unwrap();
    for version in ["1.29.0", "1.33.0"] {
        let problems = ic_e2e::chart::kubernetes_validate(&path, version);
        assert!(problems.is_empty(), "{version}:\n{}", problems.join("\n"));
    }
}

#[test]
fn access_control_is_on_by_default_and_route_readers_are_bound() {
    let args_of = |all: &[Value], deployment: &str| {
        strings(
            &find(all, "Deployment", deployment).unwrap()["spec"]["template"]["spec"]["containers"]
                [0]["args"],
        )
    };
    let all = objects(&render(
        CHART,
        &[
            "--set",
            "indexServer.api.routeReaders[0].kind=ServiceAccount",
            "--set",
            "indexServer.api.routeReaders[0].name=envoy",
            "--set",
            "indexServer.api.routeReaders[0].namespace=gateway",
        ],
    ));
    let index = args_of(&all, "inferencecache-index-server");
    assert!(index.iter().any(|a| a.starts_with("--api-audience=")));
    let binding = find(
        &all,
        "ClusterRoleBinding",
        "inferencecache-index-server-route-reader",
    )
    .unwrap();
    assert_eq!(binding["subjects"][0]["name"], "envoy");
    assert_eq!(binding["subjects"][0]["namespace"], "gateway");
    assert_eq!(
        binding["roleRef"]["name"],
        "inferencecache-index-server-route-reader"
    );
    // The admin named is the controller's own service account.
    let controller_sa =
        find(&all, "Deployment", "inferencecache-controller").unwrap()["spec"]["template"]["spec"]
            ["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(
        index
            .iter()
            .any(|a| a.starts_with("--api-admin=") && a.ends_with(&format!(":{controller_sa}")))
    );

    let open = objects(&render(
        CHART,
        &["--set", "indexServer.api.accessControl=false"],
    ));
    assert!(
        !args_of(&open, "inferencecache-index-server")
            .iter()
            .any(|a| a.starts_with("--api-"))
    );
    assert!(
        !args_of(&open, "inferencecache-webhook")
            .iter()
            .any(|a| a.starts_with("--index-server-audience"))
    );
    assert!(
        find(
            &open,
            "ClusterRole",
            "inferencecache-index-server-route-reader"
        )
        .is_none()
    );
}
