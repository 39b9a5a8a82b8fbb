//! The Kafka transport of index batches, shared by the subscriber (which
//! produces) and the index server (which consumes):
//!
//! * [`KafkaFlags`], the flags both binaries take under the same names;
//! * [`KafkaFlags::client_config`], the librdkafka settings they imply
//!   (brokers, TLS, SASL), checked before any client is made;
//! * the topic and key convention: one topic, every record keyed by
//!   [`record_key`] (tenant and pod), so one engine's batches land on one
//!   partition and stay in order;
//! * the record value: [`encode`] / [`decode`] of an
//!   [`ic_proto::index_v1::IngestBatch`], the message gRPC streams carry;
//! * [`probe::BrokerProbe`], the lag check every consumer of ours runs off
//!   its reading thread.

use std::path::PathBuf;

pub mod probe;

use ic_proto::index_v1 as pb;
use prost::Message as _;
use rdkafka::config::ClientConfig;

/// The flags' values and checks shared with the webhook (which must not
/// link librdkafka), so both refuse the same values.
pub use ic_kafka_flags::{DEFAULT_TOPIC, SecurityProtocol};

/// The first byte of every record value: the encoding's version, so a
/// later encoding can be told apart instead of misread.
pub const FORMAT_V1: u8 = 1;

/// Largest record the producer sends and the consumer expects (a resync
/// chunk of 4,096 changes stays far below it); the topic's
/// `max.message.bytes` must allow it.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;

/// How batches reach the index servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// gRPC IngestEvents streams, straight to each index server.
    #[default]
    Grpc,
    /// A Kafka topic every index-server replica consumes whole.
    Kafka,
}

/// The Kafka flags the subscriber and the index server share.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KafkaFlags {
    /// How batches travel: gRPC IngestEvents streams, or a Kafka topic
    /// (the index server then consumes it beside its gRPC port).
    #[arg(long, env = "IC_TRANSPORT", value_enum, default_value = "grpc")]
    pub transport: Transport,

    /// Kafka bootstrap brokers, host:port (comma-separated).
    #[arg(long, env = "IC_KAFKA_BROKERS", value_delimiter = ',')]
    pub kafka_brokers: Vec<String>,

    /// The topic of index batches, keyed by engine pod.
    #[arg(long, env = "IC_KAFKA_TOPIC", default_value = DEFAULT_TOPIC)]
    pub kafka_topic: String,

    /// How to reach the brokers.
    #[arg(
        long,
        env = "IC_KAFKA_SECURITY_PROTOCOL",
        value_enum,
        default_value = "plaintext"
    )]
    pub kafka_security_protocol: SecurityProtocol,

    /// SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, env = "IC_KAFKA_SASL_MECHANISM")]
    pub kafka_sasl_mechanism: Option<String>,

    /// SASL user name.
    #[arg(long, env = "IC_KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,

    /// File holding the SASL password (a mounted Secret).
    #[arg(
        long,
        env = "IC_KAFKA_SASL_PASSWORD_FILE",
        conflicts_with = "kafka_sasl_password"
    )]
    pub kafka_sasl_password_file: Option<PathBuf>,

    /// SASL password (prefer --kafka-sasl-password-file).
    #[arg(long, env = "IC_KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub kafka_sasl_password: Option<String>,

    /// CA bundle (PEM file) the brokers' certificates must chain to;
    /// the system's roots when unset.
    #[arg(long, env = "IC_KAFKA_CA_FILE", conflicts_with = "kafka_ca_pem")]
    pub kafka_ca_file: Option<PathBuf>,

    /// CA bundle as PEM text.
    #[arg(long, env = "IC_KAFKA_CA_PEM")]
    pub kafka_ca_pem: Option<String>,
}

/// Why the Kafka flags do not make a client (the flag is named).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag is missing or malformed.
    #[error("{flag}: {detail}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A file a flag names cannot be read.
    #[error("{flag} {path}: {source}")]
    File {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

fn flag_error(flag: &'static str, detail: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        detail: detail.into(),
    }
}

impl KafkaFlags {
    /// Whether the Kafka transport is on.
    pub fn enabled(&self) -> bool {
        self.transport == Transport::Kafka
    }

    /// Checks the flags and returns the client settings they imply
    /// (`client_id` names the process to the brokers). Reads the password
    /// file now, so a missing Secret fails at start.
    pub fn client_config(&self, client_id: &str) -> Result<ClientConfig, ConfigError> {
        let brokers = self.brokers()?;
        if self.kafka_topic.trim().is_empty() {
            return Err(flag_error("--kafka-topic", "must not be empty"));
        }
        ic_kafka_flags::check_topic(&self.kafka_topic)
            .map_err(|detail| flag_error("--kafka-topic", detail))?;
        let protocol = self.kafka_security_protocol;
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers.join(","))
            .set("client.id", client_id)
            .set("security.protocol", protocol.as_str())
            .set("reconnect.backoff.ms", "100")
            .set("reconnect.backoff.max.ms", "10000");
        if protocol.sasl() {
            let mechanism = self.kafka_sasl_mechanism.as_deref().ok_or_else(|| {
                flag_error(
                    "--kafka-sasl-mechanism",
                    "required with a sasl_* security protocol (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
                )
            })?;
            ic_kafka_flags::check_sasl_mechanism(mechanism)
                .map_err(|detail| flag_error("--kafka-sasl-mechanism", detail))?;
            let username = self
                .kafka_sasl_username
                .as_deref()
                .filter(|u| !u.is_empty())
                .ok_or_else(|| {
                    flag_error(
                        "--kafka-sasl-username",
                        "required with a sasl_* security protocol",
                    )
                })?;
            let password = self.password()?;
            config
                .set("sasl.mechanism", mechanism)
                .set("sasl.username", username)
                .set("sasl.password", password);
        } else if self.kafka_sasl_mechanism.is_some()
            || self.kafka_sasl_username.is_some()
            || self.kafka_sasl_password.is_some()
            || self.kafka_sasl_password_file.is_some()
        {
            return Err(flag_error(
                "--kafka-security-protocol",
                "the SASL flags need sasl_plaintext or sasl_ssl",
            ));
        }
        match (&self.kafka_ca_file, &self.kafka_ca_pem) {
            (None, None) => {}
            _ if !protocol.tls() => {
                return Err(flag_error(
                    "--kafka-security-protocol",
                    "--kafka-ca-file and --kafka-ca-pem need ssl or sasl_ssl",
                ));
            }
            (Some(path), _) => {
                if !path.is_file() {
                    return Err(ConfigError::File {
                        flag: "--kafka-ca-file",
                        path: path.display().to_string(),
                        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
                    });
                }
                config.set("ssl.ca.location", path.display().to_string());
            }
            (None, Some(pem)) => {
                if !pem.contains("-----BEGIN CERTIFICATE-----") {
                    return Err(flag_error(
                        "--kafka-ca-pem",
                        "expected PEM text with a CERTIFICATE block",
                    ));
                }
                config.set("ssl.ca.pem", pem);
            }
        }
        Ok(config)
    }

    fn brokers(&self) -> Result<Vec<String>, ConfigError> {
        ic_kafka_flags::parse_brokers(&self.kafka_brokers).map_err(|e| match e {
            ic_kafka_flags::BrokersError::Empty => flag_error(
                "--kafka-brokers",
                "required with --transport kafka (host:port, comma-separated)",
            ),
            malformed => flag_error("--kafka-brokers", malformed.to_string()),
        })
    }

    fn password(&self) -> Result<String, ConfigError> {
        let password = match (&self.kafka_sasl_password_file, &self.kafka_sasl_password) {
            (Some(path), _) => std::fs::read_to_string(path)
                .map_err(|source| ConfigError::File {
                    flag: "--kafka-sasl-password-file",
                    path: path.display().to_string(),
                    source,
                })?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
            (None, Some(p)) => p.clone(),
            (None, None) => {
                return Err(flag_error(
                    "--kafka-sasl-password-file",
                    "required with a sasl_* security protocol (or --kafka-sasl-password)",
                ));
            }
        };
        if password.is_empty() {
            return Err(flag_error("--kafka-sasl-password", "must not be empty"));
        }
        Ok(password)
    }
}

/// The record key of a replica's batches: its tenant and pod, so every
/// rank of one engine lands on one partition, in order.
pub fn record_key(replica: &pb::ReplicaIdentity) -> String {
    let tenant = replica.scope.as_ref().map_or("", |s| s.tenant.as_str());
    format!("{tenant}/{}", replica.replica_id)
}

/// A record's value: the format byte, then the protobuf batch.
pub fn encode(batch: &pb::IngestBatch) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + batch.encoded_len());
    out.push(FORMAT_V1);
    // Encoding into a Vec cannot run out of room.
    let _ = batch.encode(&mut out);
    out
}

/// Why a record value is not a batch.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The record has no value (a tombstone).
    #[error("record value: empty")]
    Empty,
    /// The format byte is not one this build reads.
    #[error("record value: format {0} (this build reads {FORMAT_V1})")]
    Format(u8),
    /// The protobuf does not decode.
    #[error("record value: {0}")]
    Protobuf(String),
}

/// Reads a record's value.
pub fn decode(value: Option<&[u8]>) -> Result<pb::IngestBatch, DecodeError> {
    let value = value.ok_or(DecodeError::Empty)?;
    let (&format, body) = value.split_first().ok_or(DecodeError::Empty)?;
    if format != FORMAT_V1 {
        return Err(DecodeError::Format(format));
    }
    pb::IngestBatch::decode(body).map_err(|e| DecodeError::Protobuf(e.to_string()))
}

#[cfg(test)]
mod tests;
