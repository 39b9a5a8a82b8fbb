//! What the injected subscriber sidecar is given: its listen address, index-server discovery, token, CA, collector, and the pod security it runs under.

use super::*;

fn subscriber_args(a: &ic_adapters::admission::PodAdmission) -> Vec<String> {
    a.pod
        .spec
        .as_ref()
        .expect("spec")
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .and_then(|c| c.args.clone())
        .expect("a subscriber")
}

#[test]
fn the_subscriber_listens_where_the_engine_publishes() {
    let engine = engine_pod(json!({"args": ["--model", "m", "--kv-events-config",
        r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:6200","replay_endpoint":"tcp://*:6201","topic":"kv"}"#]}));
    let a = admit_pod(&engine, &[backend("cb", json!({}))], &config());
    let args = subscriber_args(&a);
    for want in [
        "--engine-endpoint=tcp://127.0.0.1:6200",
        "--replay-endpoint=tcp://127.0.0.1:6201",
        "--topic=kv",
    ] {
        assert!(
            args.iter().any(|a| a == want),
            "{want} missing from {args:?}"
        );
    }
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
}

#[test]
fn an_engine_without_a_publisher_is_wired_with_a_warning() {
    let silent = engine_pod(json!({"args": ["--model", "m"]}));
    for b in [
        backend("cb", json!({})),
        backend("cb", json!({"integration": {"mode": "EventsOnly"}})),
    ] {
        let a = admit_pod(&silent, &[b], &config());
        assert!(
            a.pod
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("inferencecache.io/wired")
        );
        assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
        assert!(
            a.warnings[0].contains("will hear no KV events"),
            "{}",
            a.warnings[0]
        );
        assert!(
            a.warnings[0].contains("--kv-events-config"),
            "{}",
            a.warnings[0]
        );
        // Defaults: the engines' own endpoint, no replay, no topic.
        let args = subscriber_args(&a);
        assert!(args.contains(&"--engine-endpoint=tcp://127.0.0.1:5557".to_owned()));
        assert!(!args.iter().any(|a| a.starts_with("--replay-endpoint")));
    }
}

#[test]
fn injected_containers_pass_the_restricted_pod_security_level() {
    // A pod that passes the restricted level on its own.
    let restricted = json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4",
            "args": ["--model-path", "m", "--kv-events-config", common::SGLANG_KV_EVENTS],
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
            "securityContext": {"allowPrivilegeEscalation": false, "runAsUser": 1000,
                                "capabilities": {"drop": ["ALL"]}},
        }],
    });
    let vllm = patched(
        &engine_pod(json!({
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
            "securityContext": {"allowPrivilegeEscalation": false, "runAsUser": 1000,
                                "capabilities": {"drop": ["ALL"]}},
        })),
        json!({"spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}}}),
    );
    let cases = [
        (pod(restricted), backend("cb", json!({"runtime": "SGLang"}))),
        (vllm, backend("cb", json!({}))),
    ];
    for (engine, b) in cases {
        let a = admit_pod(&engine, &[b], &config());
        let spec = a.pod.spec.as_ref().expect("spec");
        let injected: Vec<_> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter(|c| ic_adapters::runtime::is_injected(c))
            .collect();
        assert!(
            injected.len() >= 2,
            "{:?}",
            injected.iter().map(|c| &c.name).collect::<Vec<_>>()
        );
        for c in injected {
            let sc = c
                .security_context
                .as_ref()
                .unwrap_or_else(|| panic!("{} has no securityContext", c.name));
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(
                sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
                Some(vec!["ALL".to_owned()]),
                "{}",
                c.name
            );
            assert!(
                sc.capabilities
                    .as_ref()
                    .and_then(|c| c.add.as_ref())
                    .is_none_or(|a| a.is_empty()),
                "{}",
                c.name
            );
            assert_eq!(
                sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
                Some("RuntimeDefault"),
                "{}",
                c.name
            );
            assert_ne!(sc.run_as_user, Some(0), "{}", c.name);
            assert!(sc.privileged != Some(true), "{}", c.name);
            if c.name == "kvevent-subscriber" {
                assert_eq!(sc.run_as_non_root, Some(true));
                assert_eq!(sc.read_only_root_filesystem, Some(true));
            } else {
                // Engine-image containers run as the engine's user.
                assert_eq!(sc.run_as_user, Some(1000), "{}", c.name);
            }
        }
    }
}

#[test]
fn unwired_pods_lose_a_stale_wired_label() {
    let stale = patched(
        &engine_pod(json!({})),
        json!({"metadata": {"labels": {"inferencecache.io/wired": "true"}}}),
    );
    let a = admit_pod(&stale, &[], &config());
    assert!(
        !a.pod
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("inferencecache.io/wired")
    );
}

#[test]
fn the_subscriber_gets_a_projected_token_for_the_index_server_and_loses_it_with_the_audience() {
    use ic_api::consts::injected::{SUBSCRIBER_TOKEN_DIR, SUBSCRIBER_TOKEN_VOLUME};
    let engine = engine_pod(json!({"args": ["--model", "m"]}));
    let b = backend("cb", json!({}));
    let a = admit_pod(&engine, std::slice::from_ref(&b), &config());
    let spec = a.pod.spec.as_ref().unwrap();
    let volume = spec
        .volumes
        .as_ref()
        .and_then(|v| v.iter().find(|v| v.name == SUBSCRIBER_TOKEN_VOLUME))
        .expect("token volume");
    let projection = volume.projected.as_ref().unwrap().sources.as_ref().unwrap();
    let token = projection[0].service_account_token.as_ref().unwrap();
    assert_eq!(token.audience.as_deref(), Some("inferencecache"));
    assert_eq!(token.path, "token");
    let sub = spec
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .unwrap();
    let mount = &sub.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(mount.mount_path, SUBSCRIBER_TOKEN_DIR);
    assert_eq!(mount.read_only, Some(true));
    let file = format!("--index-server-token-file={SUBSCRIBER_TOKEN_DIR}/token");
    assert!(subscriber_args(&a).contains(&file));
    // The engine does not see the token.
    assert!(spec.containers[0].volume_mounts.is_none());
    // Admitting again changes nothing; without an audience the volume goes.
    let again = admit_pod(&a.pod, std::slice::from_ref(&b), &config());
    assert_eq!(again.pod, a.pod);
    let open = InjectionConfig {
        index_server_audience: None,
        ..config()
    };
    let without = admit_pod(&a.pod, std::slice::from_ref(&b), &open);
    let spec = without.pod.spec.as_ref().unwrap();
    assert!(
        spec.volumes.as_ref().is_none_or(|v| v.is_empty()),
        "{:?}",
        spec.volumes
    );
    assert!(!subscriber_args(&without).contains(&file));
}

#[test]
fn an_https_index_server_hands_the_subscriber_its_ca_inline_and_only_the_subscriber() {
    let engine = engine_pod(json!({"args": ["--model", "m"]}));
    let b = backend("cb", json!({}));
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let tls = InjectionConfig {
        index_server: "https://ic-index-server.inferencecache-system:9090".into(),
        index_server_ca_pem: Some(pem.into()),
        ..config()
    };
    let a = admit_pod(&engine, std::slice::from_ref(&b), &tls);
    let spec = a.pod.spec.as_ref().unwrap();
    let ca_env = |c: &k8s_openapi::api::core::v1::Container| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "IC_INDEX_SERVER_CA_PEM")
            .and_then(|e| e.value.clone())
    };
    let sub = spec
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .unwrap();
    assert_eq!(ca_env(sub).as_deref(), Some(pem));
    assert!(
        subscriber_args(&a)
            .contains(&"--index-server=https://ic-index-server.inferencecache-system:9090".into())
    );
    assert_eq!(ca_env(&spec.containers[0]), None, "the engine is untouched");
    // Admitting again is a no-op; a plaintext index server drops the CA.
    assert_eq!(admit_pod(&a.pod, std::slice::from_ref(&b), &tls).pod, a.pod);
    let plain = admit_pod(&a.pod, std::slice::from_ref(&b), &config());
    let sub = plain
        .pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .unwrap();
    assert_eq!(ca_env(sub), None);
}

#[test]
fn a_configured_collector_reaches_the_subscriber_with_the_nodes_address() {
    let engine = engine_pod(json!({"args": ["--model", "m"]}));
    let b = backend("cb", json!({}));
    let traced = InjectionConfig {
        subscriber_otlp_endpoint: Some("http://$(HOST_IP):4317".into()),
        ..config()
    };
    let a = admit_pod(&engine, std::slice::from_ref(&b), &traced);
    assert!(subscriber_args(&a).contains(&"--otlp-endpoint=http://$(HOST_IP):4317".into()));
    let spec = a.pod.spec.as_ref().unwrap();
    let sub = spec
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .unwrap();
    let host_ip = sub
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "HOST_IP")
        .unwrap();
    let field = host_ip
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "status.hostIP");
    assert!(
        spec.containers[0]
            .env
            .iter()
            .flatten()
            .all(|e| e.name != "HOST_IP"),
        "the engine is untouched"
    );
    // Admitting again is a no-op; without a collector nothing is added.
    assert_eq!(
        admit_pod(&a.pod, std::slice::from_ref(&b), &traced).pod,
        a.pod
    );
    let plain = admit_pod(&engine, std::slice::from_ref(&b), &config());
    assert!(
        !subscriber_args(&plain)
            .iter()
            .any(|a| a.starts_with("--otlp-endpoint"))
    );
}

#[test]
fn dns_discovery_reaches_the_subscriber_with_the_headless_url_and_static_adds_nothing() {
    let engine = engine_pod(json!({"args": ["--model", "m"]}));
    let b = backend("cb", json!({}));
    let headless = "http://ic-index-server-headless.inferencecache-system:9090";
    let replicated = InjectionConfig {
        index_server: headless.into(),
        index_server_discovery: ic_adapters::admission::IndexServerDiscovery::Dns,
        ..config()
    };
    let a = admit_pod(&engine, std::slice::from_ref(&b), &replicated);
    let args = subscriber_args(&a);
    assert!(
        args.contains(&format!("--index-server={headless}")),
        "{args:?}"
    );
    assert!(
        args.contains(&"--index-server-discovery=dns".to_owned()),
        "{args:?}"
    );
    // Admitting again is a no-op.
    assert_eq!(
        admit_pod(&a.pod, std::slice::from_ref(&b), &replicated).pod,
        a.pod
    );
    // Static is the subscriber's own default: pods wired without replicas
    // keep exactly the args they had.
    let plain = admit_pod(&engine, std::slice::from_ref(&b), &config());
    assert!(
        !subscriber_args(&plain)
            .iter()
            .any(|a| a.starts_with("--index-server-discovery")),
        "{:?}",
        subscriber_args(&plain)
    );
}

fn kafka_config() -> InjectionConfig {
    InjectionConfig {
        subscriber_kafka: Some(ic_adapters::admission::SubscriberKafka {
            brokers: "b-1.kafka.example:9096,b-2.kafka.example:9096".into(),
            topic: "inferencecache.index-events".into(),
            security_protocol: "sasl_ssl".into(),
            sasl_mechanism: Some("SCRAM-SHA-512".into()),
            sasl_username: Some("producer".into()),
            sasl_password_secret: Some(ic_adapters::admission::SecretKeyRef {
                name: "inferencecache-kafka".into(),
                key: "pw".into(),
            }),
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into()),
        }),
        index_server_ca_pem: Some(
            "-----BEGIN CERTIFICATE-----\nINDEX\n-----END CERTIFICATE-----\n".into(),
        ),
        ..config()
    }
}

#[test]
fn a_kafka_transport_makes_the_subscriber_produce_with_its_secret_and_ca_and_drops_the_grpc_wiring()
{
    use ic_adapters::sidecars::{SUBSCRIBER_KAFKA_SASL_DIR, SUBSCRIBER_KAFKA_SASL_VOLUME};
    use ic_api::consts::injected::SUBSCRIBER_TOKEN_VOLUME;
    let engine = engine_pod(json!({"args": ["--model", "m"]}));
    for b in [
        backend("cb", json!({})),
        backend("cb", json!({"integration": {"mode": "EventsOnly"}})),
    ] {
        let kafka = kafka_config();
        let a = admit_pod(&engine, std::slice::from_ref(&b), &kafka);
        let args = subscriber_args(&a);
        for want in [
            "--transport=kafka",
            "--kafka-brokers=b-1.kafka.example:9096,b-2.kafka.example:9096",
            "--kafka-topic=inferencecache.index-events",
            "--kafka-security-protocol=sasl_ssl",
            "--kafka-sasl-mechanism=SCRAM-SHA-512",
            "--kafka-sasl-username=producer",
            &format!("--kafka-sasl-password-file={SUBSCRIBER_KAFKA_SASL_DIR}/password"),
        ] {
            assert!(
                args.iter().any(|a| a == want),
                "{want} missing from {args:?}"
            );
        }
        // No gRPC destination, token or index-server CA: the topic replaces them.
        assert!(
            !args.iter().any(|a| a.starts_with("--index-server")),
            "{args:?}"
        );
        let spec = a.pod.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        assert!(volumes.iter().all(|v| v.name != SUBSCRIBER_TOKEN_VOLUME));
        let sasl = volumes
            .iter()
            .find(|v| v.name == SUBSCRIBER_KAFKA_SASL_VOLUME)
            .expect("the SASL volume");
        let secret = sasl.secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("inferencecache-kafka"));
        let item = &secret.items.as_ref().unwrap()[0];
        assert_eq!((item.key.as_str(), item.path.as_str()), ("pw", "password"));
        let sub = spec
            .containers
            .iter()
            .find(|c| c.name == "kvevent-subscriber")
            .unwrap();
        let mounts = sub.volume_mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(mounts[0].name, SUBSCRIBER_KAFKA_SASL_VOLUME);
        assert_eq!(mounts[0].mount_path, SUBSCRIBER_KAFKA_SASL_DIR);
        let env = |name: &str| {
            sub.env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert!(env("IC_KAFKA_CA_PEM").unwrap().contains("MIIB"));
        assert_eq!(env("IC_INDEX_SERVER_CA_PEM"), None);
        assert!(
            spec.containers[0].volume_mounts.is_none(),
            "the engine does not see the password"
        );
        // Admitting again is a no-op; back on gRPC the Kafka wiring goes and
        // the token comes back.
        assert_eq!(
            admit_pod(&a.pod, std::slice::from_ref(&b), &kafka).pod,
            a.pod
        );
        let grpc = admit_pod(&a.pod, std::slice::from_ref(&b), &config());
        assert_eq!(
            grpc.pod,
            admit_pod(&engine, std::slice::from_ref(&b), &config()).pod,
            "switching back renders what a fresh gRPC admission does"
        );
    }
}
