//! The index server's HA settings in the chart: replicas share their
//! pick-level load through the headless Service (authenticated with their
//! own token, reachable through the NetworkPolicy), readiness waits for the
//! controller's first push, and the Kafka transport gets its flags, its
//! Secrets and its snapshot volume.

use ic_e2e::chart::{chart_dir, find, objects, render};
use serde_json::Value;

use super::{CHART, arg};

fn index_server(all: &[Value]) -> (&Value, &Value) {
    let d = find(all, "Deployment", "inferencecache-index-server").unwrap();
    let pod = &d["spec"]["template"]["spec"];
    (pod, &pod["containers"][0])
}

fn volume<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)
}

fn mount<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name)?["mountPath"]
        .as_str()
}

#[test]
fn replicas_share_their_load_through_the_headless_service() {
    // Peers at any replica count (a single replica finds only itself), so
    // scaling changes no pod template.
    let single = objects(&render(CHART, &[]));
    let (pod, c) = index_server(&single);
    assert_eq!(arg(c, "peer-discovery"), Some("dns"));
    assert!(volume(pod, "peer-token").is_some());
    assert_eq!(arg(c, "ready-policies-seconds"), Some("30"));

    let ha = chart_dir(CHART).join("values-ha.yaml");
    for (tls, extra) in [
        (false, vec![]),
        (true, vec!["--set", "indexServer.tls.mode=certManager"]),
    ] {
        let mut values = vec![
            "-f",
            ha.to_str().unwrap(),
            "--set",
            "networkPolicy.enabled=true",
        ];
        values.extend(extra);
        let all = objects(&render(CHART, &values));
        let (pod, c) = index_server(&all);
        let scheme = if tls { "https" } else { "http" };
        assert_eq!(
            arg(c, "peer"),
            Some(
                format!(
                    "{scheme}://inferencecache-index-server-headless.inferencecache-system:9090"
                )
                .as_str()
            )
        );
        assert_eq!(arg(c, "peer-discovery"), Some("dns"));
        assert_eq!(arg(c, "peer-ca-file").is_some(), tls);
        // Its own service account's token, for the API's audience.
        assert_eq!(
            arg(c, "peer-identity"),
            Some("system:serviceaccount:inferencecache-system:inferencecache-index-server")
        );
        let token = arg(c, "peer-token-file").unwrap();
        let dir = mount(c, "peer-token").unwrap();
        assert_eq!(token, format!("{dir}/token"));
        let source = &volume(pod, "peer-token").unwrap()["projected"]["sources"][0];
        assert_eq!(
            source["serviceAccountToken"]["audience"].as_str(),
            arg(c, "api-audience")
        );
        // The replicas may reach each other's gRPC port.
        let np = find(&all, "NetworkPolicy", "inferencecache-index-server").unwrap();
        let grpc = np["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["ports"][0]["port"] == "grpc")
            .unwrap();
        let own = &find(&all, "Deployment", "inferencecache-index-server").unwrap()["spec"]["selector"]
            ["matchLabels"];
        assert!(
            grpc["from"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| &f["podSelector"]["matchLabels"] == own),
            "{grpc}"
        );
    }
}

#[test]
fn the_kafka_transport_gets_its_flags_secrets_and_snapshot_volume() {
    let kafka = chart_dir(CHART).join("tests/values/kafka.yaml");
    let all = objects(&render(CHART, &["-f", kafka.to_str().unwrap()]));
    let (pod, c) = index_server(&all);
    assert_eq!(arg(c, "transport"), Some("kafka"));
    assert_eq!(
        arg(c, "kafka-brokers"),
        Some("b-1.kafka.example:9096,b-2.kafka.example:9096")
    );
    assert_eq!(arg(c, "kafka-security-protocol"), Some("sasl_ssl"));
    assert_eq!(arg(c, "kafka-sasl-mechanism"), Some("SCRAM-SHA-512"));
    assert_eq!(arg(c, "kafka-ready-lag-messages"), Some("500"));
    for (flag, volume_name, secret, key) in [
        (
            "kafka-sasl-password-file",
            "kafka-sasl",
            "inferencecache-kafka",
            "password",
        ),
        (
            "kafka-ca-file",
            "kafka-ca",
            "inferencecache-kafka-ca",
            "ca.crt",
        ),
    ] {
        let dir = mount(c, volume_name).unwrap();
        assert_eq!(arg(c, flag), Some(format!("{dir}/{key}").as_str()));
        assert_eq!(
            volume(pod, volume_name).unwrap()["secret"]["secretName"],
            secret
        );
    }
    // Snapshots go to a writable volume (the root filesystem is read-only).
    let dir = mount(c, "kafka-snapshots").unwrap();
    assert_eq!(arg(c, "kafka-snapshot-dir"), Some(dir));
    assert!(volume(pod, "kafka-snapshots").unwrap()["emptyDir"].is_object());

    // The webhook makes the engine pods' subscribers produce to the same
    // topic: the brokers and protocol of the replicas, a SASL user of their
    // own with its password from a Secret of each engine namespace, the CA
    // read from its own mount.
    let w = find(&all, "Deployment", "inferencecache-webhook").unwrap();
    let wpod = &w["spec"]["template"]["spec"];
    let wc = &wpod["containers"][0];
    assert_eq!(arg(wc, "subscriber-transport"), Some("kafka"));
    assert_eq!(
        arg(wc, "subscriber-kafka-brokers"),
        Some("b-1.kafka.example:9096,b-2.kafka.example:9096")
    );
    assert_eq!(arg(wc, "subscriber-kafka-topic"), arg(c, "kafka-topic"));
    assert_eq!(
        arg(wc, "subscriber-kafka-security-protocol"),
        Some("sasl_ssl")
    );
    assert_eq!(
        arg(wc, "subscriber-kafka-sasl-mechanism"),
        Some("SCRAM-SHA-512")
    );
    assert_eq!(
        arg(wc, "subscriber-kafka-sasl-username"),
        Some("inferencecache-producer")
    );
    assert_eq!(
        arg(wc, "subscriber-kafka-sasl-password-secret"),
        Some("inferencecache-kafka-producer")
    );
    let ca_dir = mount(wc, "kafka-ca").unwrap();
    assert_eq!(
        arg(wc, "subscriber-kafka-ca-file"),
        Some(format!("{ca_dir}/ca.crt").as_str())
    );
    assert_eq!(
        volume(wpod, "kafka-ca").unwrap()["secret"]["secretName"],
        "inferencecache-kafka-ca"
    );
    // The subscribers may produce as a user and Secret of their own.
    let own = objects(&render(
        CHART,
        &[
            "-f",
            kafka.to_str().unwrap(),
            "--set",
            "indexServer.kafka.subscribers.saslUsername=producer",
            "--set",
            "indexServer.kafka.subscribers.saslPasswordSecret.name=kafka-producer",
            "--set",
            "indexServer.kafka.subscribers.saslPasswordSecret.key=pw",
        ],
    ));
    let wc = &find(&own, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]["spec"]
        ["containers"][0];
    assert_eq!(arg(wc, "subscriber-kafka-sasl-username"), Some("producer"));
    assert_eq!(
        arg(wc, "subscriber-kafka-sasl-password-secret"),
        Some("kafka-producer")
    );
    assert_eq!(arg(wc, "subscriber-kafka-sasl-password-key"), Some("pw"));
    // Never the index servers' principal (READ) nor its Secret copied into
    // every engine namespace: SASL without a producing user of the
    // subscribers' own is refused, naming the values.
    for (sets, named) in [
        (
            &[
                "indexServer.kafka.subscribers.saslUsername=",
                "indexServer.kafka.subscribers.saslPasswordSecret.name=",
            ][..],
            "indexServer.kafka.subscribers.saslUsername",
        ),
        (
            &["indexServer.kafka.subscribers.saslPasswordSecret.name="][..],
            "indexServer.kafka.subscribers.saslPasswordSecret.name",
        ),
        (
            &["indexServer.kafka.subscribers.saslUsername=inferencecache"][..],
            "must differ from indexServer.kafka.saslUsername",
        ),
    ] {
        let chart = chart_dir(CHART);
        let mut args = vec![
            "template",
            "t",
            chart.to_str().unwrap(),
            "-f",
            kafka.to_str().unwrap(),
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        let (ok, _, err) = ic_e2e::chart::helm_run(&args);
        assert!(!ok && err.contains(named), "{sets:?}: {err}");
    }

    // The default stays gRPC; kafka without brokers is refused, naming the value.
    let defaults = objects(&render(CHART, &[]));
    let (_, c) = index_server(&defaults);
    assert_eq!(arg(c, "transport"), None);
    let wc = &find(&defaults, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]
        ["spec"]["containers"][0];
    assert_eq!(arg(wc, "subscriber-transport"), None);
    let (ok, _, err) = ic_e2e::chart::helm_run(&[
        "template",
        "t",
        chart_dir(CHART).to_str().unwrap(),
        "--set",
        "indexServer.transport=kafka",
    ]);
    assert!(!ok && err.contains("indexServer.kafka.brokers"), "{err}");
    // values-kafka.yaml renders over values-ha.yaml.
    let ha = chart_dir(CHART).join("values-ha.yaml");
    let over = chart_dir(CHART).join("values-kafka.yaml");
    let all = objects(&render(
        CHART,
        &["-f", ha.to_str().unwrap(), "-f", over.to_str().unwrap()],
    ));
    let (_, c) = index_server(&all);
    assert_eq!(arg(c, "transport"), Some("kafka"));
    assert!(arg(c, "peer").is_some());
}

#[test]
fn one_picker_serves_several_pools_with_rbac_in_each_namespace() {
    let gateway = chart_dir(CHART).join("tests/values/gateway.yaml");
    let all = objects(&render(CHART, &["-f", gateway.to_str().unwrap()]));
    let (_, c) = index_server(&all);
    let pools: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--epp-pool="))
        .collect();
    assert_eq!(pools, ["chat", "batch/summaries"]);
    assert_eq!(arg(c, "epp-tenant"), Some("serving"));
    // The picker watches pods and pools in each pool's namespace.
    for kind in ["Role", "RoleBinding"] {
        let mut namespaces: Vec<&str> = all
            .iter()
            .filter(|o| {
                o["kind"] == kind && o["metadata"]["name"] == "inferencecache-index-server-epp"
            })
            .map(|o| o["metadata"]["namespace"].as_str().unwrap())
            .collect();
        namespaces.sort_unstable();
        assert_eq!(namespaces, ["batch", "serving"], "{kind}");
    }
    // A pool name the API would refuse is refused by the schema.
    let (ok, _, err) = ic_e2e::chart::helm_run(&[
        "template",
        "t",
        chart_dir(CHART).to_str().unwrap(),
        "-f",
        gateway.to_str().unwrap(),
        "--set",
        "indexServer.epp.pools={Bad_Pool}",
    ]);
    assert!(!ok && err.contains("pools"), "{err}");
}
