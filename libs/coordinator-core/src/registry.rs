//! The instance registry: who is registered, how to reach them, and when
//! they last sent a heartbeat. Time is passed in, so timeouts are tested
//! without sleeping.

use std::collections::BTreeMap;
use std::time::Duration;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// A registered MP server, as `GET /instances` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// Id.
    pub instance_id: String,
    /// Address to reach its HTTP API.
    pub ip: String,
    /// Port of its HTTP API.
    pub http_port: u16,
    /// Wall-clock registration time, epoch seconds.
    pub registration_time: f64,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// P2P URL it advertises.
    pub p2p_advertised_url: String,
    /// Message-queue port.
    pub mq_port: u16,
}

impl InstanceRecord {
    /// Base URL of the instance's HTTP API.
    pub fn base_url(&self) -> String {
        if self.ip.contains(':') && !self.ip.starts_with('[') {
            format!("http://[{}]:{}", self.ip, self.http_port)
        } else {
            format!("http://{}:{}", self.ip, self.http_port)
        }
    }
}

#[derive(Clone, Debug)]
struct Slot {
    record: InstanceRecord,
    last_heartbeat: Duration,
}

/// The registry, in first-registration order.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    instances: IndexMap<String, Slot>,
}

impl Registry {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers or replaces a record; `now` is monotonic time. Returns
    /// whether the id was already registered.
    pub fn register(&mut self, record: InstanceRecord, now: Duration) -> bool {
        let id = record.instance_id.clone();
        let slot = Slot {
            record,
            last_heartbeat: now,
        };
        self.instances.insert(id, slot).is_some()
    }

    /// Refreshes the liveness timer; false for an unknown id.
    pub fn heartbeat(&mut self, id: &str, now: Duration) -> bool {
        match self.instances.get_mut(id) {
            Some(slot) => {
                slot.last_heartbeat = now;
                true
            }
            None => false,
        }
    }

    /// Removes an instance; returns whether it was registered.
    pub fn deregister(&mut self, id: &str) -> bool {
        self.instances.shift_remove(id).is_some()
    }

    /// Removes and returns every instance silent for longer than `timeout`.
    pub fn expire(&mut self, now: Duration, timeout: Duration) -> Vec<String> {
        let expired: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.last_heartbeat) > timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.instances.shift_remove(id);
        }
        expired
    }

    /// One record.
    pub fn get(&self, id: &str) -> Option<&InstanceRecord> {
        self.instances.get(id).map(|s| &s.record)
    }

    /// Whether the id is registered.
    pub fn contains(&self, id: &str) -> bool {
        self.instances.contains_key(id)
    }

    /// Every record, in first-registration order.
    pub fn records(&self) -> impl Iterator<Item = &InstanceRecord> {
        self.instances.values().map(|s| &s.record)
    }

    /// Seconds since the last heartbeat of each instance.
    pub fn heartbeat_ages(&self, now: Duration) -> impl Iterator<Item = (&str, Duration)> {
        self.instances
            .iter()
            .map(move |(id, s)| (id.as_str(), now.saturating_sub(s.last_heartbeat)))
    }

    /// Registered instances.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Whether nobody is registered.
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> InstanceRecord {
        InstanceRecord {
            instance_id: id.into(),
            ip: "127.0.0.1".into(),
            http_port: 8000,
            registration_time: 1.0,
            metadata: BTreeMap::new(),
            p2p_advertised_url: String::new(),
            mq_port: 0,
        }
    }

    const fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn register_reregister_keeps_first_order() {
        let mut r = Registry::new();
        assert!(!r.register(record("a"), s(0)));
        assert!(!r.register(record("b"), s(0)));
        let mut again = record("a");
        again.http_port = 9;
        assert!(r.register(again, s(1)));
        let ids: Vec<&str> = r.records().map(|r| r.instance_id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
        assert_eq!(r.get("a").unwrap().http_port, 9);
    }

    #[test]
    fn heartbeat_timeout_with_injected_clock() {
        let mut r = Registry::new();
        r.register(record("a"), s(0));
        r.register(record("b"), s(0));
        assert!(r.heartbeat("b", s(25)));
        assert!(!r.heartbeat("nobody", s(25)));
        assert!(
            r.expire(s(30), s(30)).is_empty(),
            "exactly at the timeout is still alive"
        );
        assert_eq!(r.expire(s(31), s(30)), vec!["a".to_owned()]);
        assert!(r.contains("b"));
        assert_eq!(r.expire(s(56), s(30)), vec!["b".to_owned()]);
        assert!(r.is_empty());
    }

    #[test]
    fn base_url_brackets_ipv6() {
        let mut rec = record("a");
        assert_eq!(rec.base_url(), "http://127.0.0.1:8000");
        rec.ip = "::1".into();
        assert_eq!(rec.base_url(), "http://[::1]:8000");
    }
}
