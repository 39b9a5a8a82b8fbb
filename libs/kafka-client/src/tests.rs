#![allow(clippy::unwrap_used)]

use super::*;

fn flags(args: &[&str]) -> KafkaFlags {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaFlags,
    }
    let mut argv = vec!["x", "--transport", "kafka"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv).unwrap().kafka
}

fn err(args: &[&str]) -> String {
    flags(args).client_config("t").unwrap_err().to_string()
}

#[test]
fn plaintext_brokers_make_a_config() {
    let f = flags(&["--kafka-brokers", "127.0.0.1:9092, 127.0.0.1:9093"]);
    assert!(f.enabled());
    let c = f.client_config("ic-test").unwrap();
    assert_eq!(
        c.get("bootstrap.servers"),
        Some("127.0.0.1:9092,127.0.0.1:9093")
    );
    assert_eq!(c.get("security.protocol"), Some("plaintext"));
    assert_eq!(c.get("client.id"), Some("ic-test"));
    assert_eq!(f.kafka_topic, DEFAULT_TOPIC);
}

#[test]
fn bad_flags_name_the_flag() {
    assert!(err(&[]).starts_with("--kafka-brokers: required"));
    assert!(err(&["--kafka-brokers", "nohost"]).starts_with("--kafka-brokers: \"nohost\""));
    assert!(err(&["--kafka-brokers", "h:1", "--kafka-topic", "a b"]).starts_with("--kafka-topic"));
    for dots in [".", ".."] {
        let e = err(&["--kafka-brokers", "h:1", "--kafka-topic", dots]);
        assert!(e.starts_with("--kafka-topic"), "{e}");
    }
    assert!(
        err(&[
            "--kafka-brokers",
            "h:1",
            "--kafka-security-protocol",
            "sasl_ssl"
        ])
        .starts_with("--kafka-sasl-mechanism: required")
    );
    assert!(
        err(&[
            "--kafka-brokers",
            "h:1",
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-mechanism",
            "GSSAPI",
        ])
        .starts_with("--kafka-sasl-mechanism: \"GSSAPI\"")
    );
    assert!(
        err(&[
            "--kafka-brokers",
            "h:1",
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-mechanism",
            "PLAIN",
            "--kafka-sasl-username",
            "u",
        ])
        .starts_with("--kafka-sasl-password-file: required")
    );
    assert!(
        err(&["--kafka-brokers", "h:1", "--kafka-sasl-username", "u"])
            .contains("the SASL flags need sasl_plaintext or sasl_ssl")
    );
    assert!(
        err(&["--kafka-brokers", "h:1", "--kafka-ca-pem", "x"]).contains("need ssl or sasl_ssl")
    );
    assert!(
        err(&[
            "--kafka-brokers",
            "h:1",
            "--kafka-security-protocol",
            "ssl",
            "--kafka-ca-pem",
            "x",
        ])
        .starts_with("--kafka-ca-pem: expected PEM")
    );
    assert!(
        err(&[
            "--kafka-brokers",
            "h:1",
            "--kafka-security-protocol",
            "ssl",
            "--kafka-ca-file",
            "/nonexistent/ca.pem",
        ])
        .starts_with("--kafka-ca-file /nonexistent/ca.pem")
    );
}

#[test]
fn sasl_over_tls_reads_the_password_file() {
    let dir = std::env::temp_dir().join(format!("ic-kafka-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let f = flags(&[
        "--kafka-brokers",
        "broker.example:9096",
        "--kafka-security-protocol",
        "sasl_ssl",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "ic",
        "--kafka-sasl-password-file",
        file.to_str().unwrap(),
        "--kafka-ca-pem=-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    ]);
    let c = f.client_config("t").unwrap();
    assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
    assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
    assert_eq!(c.get("sasl.username"), Some("ic"));
    assert_eq!(
        c.get("sasl.password"),
        Some("s3cret"),
        "the newline is not part of it"
    );
    assert!(c.get("ssl.ca.pem").unwrap().contains("BEGIN CERTIFICATE"));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn batch() -> pb::IngestBatch {
    pb::IngestBatch {
        replica: Some(pb::ReplicaIdentity {
            scope: Some(pb::IndexScope {
                tenant: "team-a".into(),
                model: "m".into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            replica_id: "pod-1".into(),
            address: "10.0.0.1:8000".into(),
            dp_rank: 3,
            incarnation: 42,
        }),
        seq: 7,
        resync_begin: true,
        ..Default::default()
    }
}

#[test]
fn records_round_trip_and_bad_values_are_named() {
    let b = batch();
    assert_eq!(record_key(b.replica.as_ref().unwrap()), "team-a/pod-1");
    let value = encode(&b);
    assert_eq!(value[0], FORMAT_V1);
    assert_eq!(decode(Some(&value)).unwrap(), b);
    assert_eq!(decode(None).unwrap_err(), DecodeError::Empty);
    assert_eq!(decode(Some(&[])).unwrap_err(), DecodeError::Empty);
    assert_eq!(decode(Some(&[9, 1])).unwrap_err(), DecodeError::Format(9));
    assert!(matches!(
        decode(Some(&[FORMAT_V1, 0xff, 0xff])).unwrap_err(),
        DecodeError::Protobuf(_)
    ));
}
