//! The Kafka flags' values and their checks, with no Kafka client: the
//! subscriber and index server (through `ic-kafka-client`) and the webhook
//! (which only renders a subscriber's flags and must not link librdkafka)
//! check them with this one definition, so the webhook never accepts a
//! value every injected subscriber would then refuse at start.
//!
//! Errors are reasons without the flag's name: each caller names its own
//! flag (`--kafka-topic`, `--subscriber-kafka-topic`).

/// Default topic of index batches.
pub const DEFAULT_TOPIC: &str = "inferencecache.index-events";

/// How clients reach the brokers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SecurityProtocol {
    /// No TLS, no SASL (local runs, a trusted network).
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL without TLS.
    #[value(name = "sasl_plaintext")]
    SaslPlaintext,
    /// SASL over TLS (managed Kafka services).
    #[value(name = "sasl_ssl")]
    SaslSsl,
}

impl SecurityProtocol {
    /// The flag's spelling, which is also librdkafka's `security.protocol`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    /// Whether it authenticates with SASL.
    pub fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    /// Whether it uses TLS.
    pub fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

/// The SASL mechanisms the clients support.
pub const SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Checks a SASL mechanism; the reason names the accepted ones.
pub fn check_sasl_mechanism(mechanism: &str) -> Result<(), String> {
    if SASL_MECHANISMS.contains(&mechanism) {
        Ok(())
    } else {
        Err(format!(
            "{mechanism:?}: expected one of {}",
            SASL_MECHANISMS.join(", ")
        ))
    }
}

/// Kafka's topic name rule: 1 to 249 of `a-z A-Z 0-9 . _ -`, and not `.`
/// or `..` (the brokers refuse those, as they name directories).
pub fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks a topic name; the reason states the rule.
pub fn check_topic(topic: &str) -> Result<(), String> {
    if valid_topic(topic) {
        Ok(())
    } else {
        Err(format!(
            "{topic:?}: 1 to 249 characters of a-z A-Z 0-9 . _ -, not \".\" or \"..\""
        ))
    }
}

/// Why a broker list is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BrokersError {
    /// No broker (blank entries do not count).
    #[error("no broker given")]
    Empty,
    /// An entry is not `host:port` with a port of 1 to 65535.
    #[error("{0:?}: expected host:port")]
    Malformed(String),
}

/// The brokers of a comma-separated flag, trimmed, blanks dropped, each
/// `host:port`.
pub fn parse_brokers(list: &[String]) -> Result<Vec<String>, BrokersError> {
    let brokers: Vec<String> = list
        .iter()
        .map(|b| b.trim())
        .filter(|b| !b.is_empty())
        .map(str::to_owned)
        .collect();
    if brokers.is_empty() {
        return Err(BrokersError::Empty);
    }
    for b in &brokers {
        let ok = b.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(BrokersError::Malformed(b.clone()));
        }
    }
    Ok(brokers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_kafkas_rule() {
        assert!(valid_topic(DEFAULT_TOPIC));
        assert!(valid_topic("a.b_c-D9"));
        assert!(valid_topic("..."));
        assert!(valid_topic(&"t".repeat(249)));
        for bad in ["", ".", "..", "a topic", "a/b", "ü", &"t".repeat(250)] {
            assert!(!valid_topic(bad), "{bad:?}");
            let e = check_topic(bad).unwrap_err();
            assert!(e.contains("249 characters"), "{e}");
        }
    }

    #[test]
    fn brokers_are_host_port_trimmed() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_brokers(&list(&[" a:1 ", "", "[::1]:9092"])).unwrap(),
            vec!["a:1".to_owned(), "[::1]:9092".to_owned()]
        );
        assert_eq!(parse_brokers(&list(&[" ", ""])), Err(BrokersError::Empty));
        for bad in ["b", ":9092", "b:0", "b:65536", "b:x"] {
            assert_eq!(
                parse_brokers(&list(&["a:1", bad])),
                Err(BrokersError::Malformed(bad.to_owned())),
                "{bad}"
            );
        }
    }

    #[test]
    fn protocols_and_mechanisms() {
        assert!(SecurityProtocol::SaslSsl.sasl() && SecurityProtocol::SaslSsl.tls());
        assert!(!SecurityProtocol::Ssl.sasl() && SecurityProtocol::Ssl.tls());
        assert!(SecurityProtocol::SaslPlaintext.sasl() && !SecurityProtocol::SaslPlaintext.tls());
        assert_eq!(SecurityProtocol::SaslPlaintext.as_str(), "sasl_plaintext");
        for m in SASL_MECHANISMS {
            check_sasl_mechanism(m).unwrap();
        }
        let e = check_sasl_mechanism("GSSAPI").unwrap_err();
        assert!(e.contains("expected one of PLAIN"), "{e}");
    }
}
