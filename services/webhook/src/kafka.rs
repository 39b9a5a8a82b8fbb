//! `--subscriber-transport kafka`: the settings the webhook hands every
//! injected subscriber so it produces to the index's Kafka topic (the
//! subscriber's own `--transport kafka` flags) instead of streaming to the
//! index server over gRPC. Checked at start, naming the flag, so a typo
//! fails the webhook's rollout rather than every engine pod's sidecar.
//!
//! The webhook has no Kafka client of its own (nothing here links
//! librdkafka): it only renders flags, checked by `ic-kafka-flags`, the
//! definition the subscriber's own checks use, so the two cannot disagree.

use std::path::PathBuf;

use ic_adapters::admission::{SecretKeyRef, SubscriberKafka};
use ic_kafka_flags::{BrokersError, DEFAULT_TOPIC, SecurityProtocol};

/// How the injected subscribers reach the index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SubscriberTransport {
    /// gRPC streams to `--index-server` (the wiring as before).
    #[default]
    Grpc,
    /// The Kafka topic every index replica consumes.
    Kafka,
}

/// The subscribers' Kafka flags (used with `--subscriber-transport kafka`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SubscriberKafkaFlags {
    /// How the injected subscribers reach the index: `grpc` streams to
    /// --index-server; `kafka` produces to --subscriber-kafka-topic (their
    /// --transport kafka) and drops the gRPC wiring (URL, token, CA).
    #[arg(long, env = "IC_SUBSCRIBER_TRANSPORT", value_enum, default_value_t = SubscriberTransport::Grpc)]
    pub subscriber_transport: SubscriberTransport,
    /// Bootstrap brokers the subscribers produce to, host:port
    /// (comma-separated or repeated).
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_BROKERS", value_delimiter = ',')]
    pub subscriber_kafka_brokers: Vec<String>,
    /// The topic of index batches.
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_TOPIC", default_value = DEFAULT_TOPIC)]
    pub subscriber_kafka_topic: String,
    /// How the subscribers reach the brokers.
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_SECURITY_PROTOCOL", value_enum, default_value_t = SecurityProtocol::Plaintext)]
    pub subscriber_kafka_security_protocol: SecurityProtocol,
    /// SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_SASL_MECHANISM")]
    pub subscriber_kafka_sasl_mechanism: Option<String>,
    /// SASL user name the subscribers produce as.
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_SASL_USERNAME")]
    pub subscriber_kafka_sasl_username: Option<String>,
    /// The Secret holding the SASL password, in each engine pod's own
    /// namespace (mounted into the subscriber, never read by the webhook).
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_SASL_PASSWORD_SECRET")]
    pub subscriber_kafka_sasl_password_secret: Option<String>,
    /// That Secret's key.
    #[arg(
        long,
        env = "IC_SUBSCRIBER_KAFKA_SASL_PASSWORD_KEY",
        default_value = "password"
    )]
    pub subscriber_kafka_sasl_password_key: String,
    /// The brokers' CA bundle (PEM file), read at start and handed to each
    /// subscriber inline; the system's roots when unset.
    #[arg(long, env = "IC_SUBSCRIBER_KAFKA_CA_FILE")]
    pub subscriber_kafka_ca_file: Option<PathBuf>,
}

/// Why the subscribers' Kafka flags are refused (the flag is named).
#[derive(Debug, thiserror::Error)]
pub enum KafkaFlagError {
    /// A flag is missing, malformed or does not fit the others.
    #[error("{flag}: {reason}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The CA file cannot be read.
    #[error("--subscriber-kafka-ca-file {path}: {source}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn flag(flag: &'static str, reason: impl Into<String>) -> KafkaFlagError {
    KafkaFlagError::Flag {
        flag,
        reason: reason.into(),
    }
}

fn nonblank(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

impl SubscriberKafkaFlags {
    /// The settings every subscriber gets, or `None` with the gRPC
    /// transport (where the Kafka flags are ignored, as their defaults).
    pub fn injection(&self) -> Result<Option<SubscriberKafka>, KafkaFlagError> {
        if self.subscriber_transport == SubscriberTransport::Grpc {
            return Ok(None);
        }
        let brokers =
            ic_kafka_flags::parse_brokers(&self.subscriber_kafka_brokers).map_err(|e| match e {
                BrokersError::Empty => flag(
                    "--subscriber-kafka-brokers",
                    "required with --subscriber-transport kafka (host:port, comma-separated)",
                ),
                malformed => flag("--subscriber-kafka-brokers", malformed.to_string()),
            })?;
        let topic = self.subscriber_kafka_topic.trim();
        ic_kafka_flags::check_topic(topic).map_err(|r| flag("--subscriber-kafka-topic", r))?;
        let protocol = self.subscriber_kafka_security_protocol;
        let mechanism = nonblank(&self.subscriber_kafka_sasl_mechanism);
        let username = nonblank(&self.subscriber_kafka_sasl_username);
        let secret = nonblank(&self.subscriber_kafka_sasl_password_secret);
        if protocol.sasl() {
            let mechanism = mechanism.ok_or_else(|| {
                flag(
                    "--subscriber-kafka-sasl-mechanism",
                    "required with a sasl_* security protocol (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
                )
            })?;
            ic_kafka_flags::check_sasl_mechanism(mechanism)
                .map_err(|r| flag("--subscriber-kafka-sasl-mechanism", r))?;
            if username.is_none() {
                return Err(flag(
                    "--subscriber-kafka-sasl-username",
                    "required with a sasl_* security protocol",
                ));
            }
            if secret.is_none() {
                return Err(flag(
                    "--subscriber-kafka-sasl-password-secret",
                    "required with a sasl_* security protocol (a Secret in each engine namespace)",
                ));
            }
            if self.subscriber_kafka_sasl_password_key.trim().is_empty() {
                return Err(flag(
                    "--subscriber-kafka-sasl-password-key",
                    "must not be empty",
                ));
            }
        } else if mechanism.is_some() || username.is_some() || secret.is_some() {
            return Err(flag(
                "--subscriber-kafka-security-protocol",
                "the SASL flags need sasl_plaintext or sasl_ssl",
            ));
        }
        let ca_pem = match &self.subscriber_kafka_ca_file {
            None => None,
            Some(_) if !protocol.tls() => {
                return Err(flag(
                    "--subscriber-kafka-security-protocol",
                    "--subscriber-kafka-ca-file needs ssl or sasl_ssl",
                ));
            }
            Some(path) => {
                let pem =
                    std::fs::read_to_string(path).map_err(|source| KafkaFlagError::CaFile {
                        path: path.display().to_string(),
                        source,
                    })?;
                if !pem.contains("-----BEGIN CERTIFICATE-----") {
                    return Err(flag(
                        "--subscriber-kafka-ca-file",
                        format!("{}: no PEM CERTIFICATE block", path.display()),
                    ));
                }
                Some(pem)
            }
        };
        Ok(Some(SubscriberKafka {
            brokers: brokers.join(","),
            topic: topic.to_owned(),
            security_protocol: protocol.as_str().to_owned(),
            sasl_mechanism: mechanism.filter(|_| protocol.sasl()).map(str::to_owned),
            sasl_username: username.filter(|_| protocol.sasl()).map(str::to_owned),
            sasl_password_secret: secret.filter(|_| protocol.sasl()).map(|name| SecretKeyRef {
                name: name.to_owned(),
                key: self.subscriber_kafka_sasl_password_key.trim().to_owned(),
            }),
            ca_pem,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: SubscriberKafkaFlags,
    }

    fn parse(args: &[&str]) -> Result<Option<SubscriberKafka>, KafkaFlagError> {
        let mut all = vec!["x"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().kafka.injection()
    }

    fn refused(args: &[&str]) -> String {
        parse(args).unwrap_err().to_string()
    }

    #[test]
    fn grpc_injects_nothing_and_kafka_needs_brokers() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(
            parse(&["--subscriber-kafka-brokers", "b:9092"]).unwrap(),
            None,
            "the Kafka flags alone change nothing"
        );
        let e = refused(&["--subscriber-transport", "kafka"]);
        assert!(e.starts_with("--subscriber-kafka-brokers"), "{e}");
        let e = refused(&[
            "--subscriber-transport",
            "kafka",
            "--subscriber-kafka-brokers",
            "b",
        ]);
        assert!(e.contains("expected host:port"), "{e}");
        let e = refused(&[
            "--subscriber-transport=kafka",
            "--subscriber-kafka-brokers=b:9092",
            "--subscriber-kafka-topic=a topic",
        ]);
        assert!(e.starts_with("--subscriber-kafka-topic"), "{e}");
        // Kafka refuses these names, so the subscriber would too: the
        // webhook must not start with them.
        for dots in [".", ".."] {
            let e = refused(&[
                "--subscriber-transport=kafka",
                "--subscriber-kafka-brokers=b:9092",
                "--subscriber-kafka-topic",
                dots,
            ]);
            assert!(e.starts_with("--subscriber-kafka-topic"), "{e}");
        }
        let k = parse(&[
            "--subscriber-transport=kafka",
            "--subscriber-kafka-brokers= a:1 , b:2",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(k.brokers, "a:1,b:2");
        assert_eq!(k.topic, "inferencecache.index-events");
        assert_eq!(k.security_protocol, "plaintext");
        assert_eq!(k.sasl_password_secret, None);
    }

    #[test]
    fn sasl_needs_its_mechanism_user_and_secret_and_only_with_a_sasl_protocol() {
        let base = [
            "--subscriber-transport=kafka",
            "--subscriber-kafka-brokers=b:9096",
        ];
        let with = |more: &[&'static str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(more);
            v
        };
        let e = refused(&with(&["--subscriber-kafka-security-protocol=sasl_ssl"]));
        assert!(e.starts_with("--subscriber-kafka-sasl-mechanism"), "{e}");
        let e = refused(&with(&[
            "--subscriber-kafka-security-protocol=sasl_ssl",
            "--subscriber-kafka-sasl-mechanism=GSSAPI",
        ]));
        assert!(e.contains("expected one of"), "{e}");
        let e = refused(&with(&[
            "--subscriber-kafka-security-protocol=sasl_ssl",
            "--subscriber-kafka-sasl-mechanism=SCRAM-SHA-512",
            "--subscriber-kafka-sasl-username=u",
        ]));
        assert!(
            e.starts_with("--subscriber-kafka-sasl-password-secret"),
            "{e}"
        );
        let e = refused(&with(&["--subscriber-kafka-sasl-username=u"]));
        assert!(e.starts_with("--subscriber-kafka-security-protocol"), "{e}");
        let k = parse(&with(&[
            "--subscriber-kafka-security-protocol=sasl_plaintext",
            "--subscriber-kafka-sasl-mechanism=PLAIN",
            "--subscriber-kafka-sasl-username=u",
            "--subscriber-kafka-sasl-password-secret=kafka-user",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            k.sasl_password_secret,
            Some(SecretKeyRef {
                name: "kafka-user".into(),
                key: "password".into()
            })
        );
        assert_eq!(k.security_protocol, "sasl_plaintext");
    }

    #[test]
    fn the_ca_file_is_read_at_start_and_needs_tls() {
        let dir = std::env::temp_dir().join(format!("ic-webhook-kafka-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("ca.crt");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(&good, pem).unwrap();
        let bad = dir.join("bad.crt");
        std::fs::write(&bad, "not pem").unwrap();
        let args = |protocol: &str, file: &std::path::Path| {
            vec![
                "--subscriber-transport=kafka".to_owned(),
                "--subscriber-kafka-brokers=b:9093".to_owned(),
                format!("--subscriber-kafka-security-protocol={protocol}"),
                format!("--subscriber-kafka-ca-file={}", file.display()),
            ]
        };
        let run = |a: Vec<String>| {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            parse(&a)
        };
        let k = run(args("ssl", &good)).unwrap().unwrap();
        assert_eq!(k.ca_pem.as_deref(), Some(pem));
        let e = run(args("plaintext", &good)).unwrap_err().to_string();
        assert!(e.starts_with("--subscriber-kafka-security-protocol"), "{e}");
        let e = run(args("ssl", &bad)).unwrap_err().to_string();
        assert!(e.starts_with("--subscriber-kafka-ca-file"), "{e}");
        let e = run(args("ssl", &dir.join("missing")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--subscriber-kafka-ca-file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
