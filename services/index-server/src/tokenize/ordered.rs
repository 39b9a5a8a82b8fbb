//! JSON objects as a chat template sees them in Python: keys in the order
//! the request has them (a template that prints a tool's schema with
//! `tojson` prints it in that order). Only the request's values that a
//! template may print whole are read this way; the template's other maps
//! (its variables, the messages) stay minijinja's own, sorted and cheaper.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Maps smaller than this are searched in order; larger ones get an index.
const INDEXED_FROM: usize = 17;

/// A map that keeps its keys' order.
#[derive(Debug, Default)]
pub(crate) struct OrderedMap {
    entries: Vec<(Value, Value)>,
    /// Positions by key, for maps of [`INDEXED_FROM`] entries or more.
    index: HashMap<String, usize>,
}

impl OrderedMap {
    /// The pairs in order; a key given twice keeps its first place and its
    /// last value, as a Python dict built from them does.
    pub(crate) fn from_pairs<K: Into<String>>(
        pairs: impl IntoIterator<Item = (K, Value)>,
    ) -> Value {
        let mut map = Self::default();
        for (key, value) in pairs {
            map.insert(key.into(), value);
        }
        Value::from_object(map)
    }

    /// A map of `unique` pairs (no key twice: not checked), then `rest`
    /// over them as [`Self::from_pairs`] lays pairs over each other.
    pub(crate) fn layered(
        unique: impl IntoIterator<Item = (&'static str, Value)>,
        rest: impl IntoIterator<Item = (String, Value)>,
    ) -> Value {
        let mut map = Self::default();
        map.entries
            .extend(unique.into_iter().map(|(k, v)| (Value::from(k), v)));
        if map.entries.len() >= INDEXED_FROM {
            map.reindex();
        }
        for (key, value) in rest {
            map.insert(key, value);
        }
        Value::from_object(map)
    }

    fn reindex(&mut self) {
        self.index = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.as_str().unwrap_or_default().to_owned(), i))
            .collect();
    }

    fn insert(&mut self, key: String, value: Value) {
        if let Some(at) = self.position(&key) {
            self.entries[at].1 = value;
            return;
        }
        self.entries.push((Value::from(key.as_str()), value));
        if self.entries.len() == INDEXED_FROM {
            self.reindex();
        } else if self.entries.len() > INDEXED_FROM {
            self.index.insert(key, self.entries.len() - 1);
        }
    }

    fn position(&self, key: &str) -> Option<usize> {
        if self.entries.len() >= INDEXED_FROM {
            return self.index.get(key).copied();
        }
        self.entries
            .iter()
            .position(|(k, _)| k.as_str() == Some(key))
    }

    /// The pairs, in order.
    pub(crate) fn pairs(&self) -> &[(Value, Value)] {
        &self.entries
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let at = self.position(key.as_str()?)?;
        Some(self.entries[at].1.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.entries.iter().map(|(k, _)| k.clone())))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// A map value's entries in order: an [`OrderedMap`]'s as they are, any
/// other map's in its own order; `None` for a value that is no map.
pub(crate) fn entries(value: &Value) -> Option<Vec<(Value, Value)>> {
    if let Some(map) = value.downcast_object_ref::<OrderedMap>() {
        return Some(map.pairs().to_vec());
    }
    if value.kind() != minijinja::value::ValueKind::Map {
        return None;
    }
    let keys = value.try_iter().ok()?;
    keys.map(|k| {
        let v = value.get_item(&k).ok()?;
        Some((k, v))
    })
    .collect()
}

/// A map value's entries in order, its keys as text (`None` for a value
/// that is no map, or a key that is no string).
pub(crate) fn named_entries(value: &Value) -> Option<Vec<(String, Value)>> {
    entries(value)?
        .into_iter()
        .map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
        .collect()
}

/// JSON read into a template value, objects as [`OrderedMap`]s.
pub(crate) struct OrderedJson(pub(crate) Value);

impl<'de> Deserialize<'de> for OrderedJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor).map(OrderedJson)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        OrderedJson::deserialize(d).map(|v| v.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(OrderedJson(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::from(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = OrderedMap::default();
        while let Some((key, OrderedJson(value))) = map.next_entry::<String, OrderedJson>()? {
            out.insert(key, value);
        }
        Ok(Value::from_object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(value: &Value) -> Vec<String> {
        entries(value)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn objects_keep_their_order_and_a_repeated_key_its_first_place() {
        let v = serde_json::from_str::<OrderedJson>(
            r#"{"z":1,"a":{"y":2,"b":3},"m":[{"q":1,"c":2}],"z":4}"#,
        )
        .unwrap()
        .0;
        assert_eq!(keys(&v), ["z", "a", "m"]);
        assert_eq!(v.get_attr("z").unwrap(), Value::from(4));
        assert_eq!(keys(&v.get_attr("a").unwrap()), ["y", "b"]);
        let m = v.get_attr("m").unwrap().get_item(&Value::from(0)).unwrap();
        assert_eq!(keys(&m), ["q", "c"]);
        // Templates iterate it in order.
        let env = minijinja::Environment::new();
        let out = env
            .render_str(
                "{% for k in m %}{{ k }};{% endfor %}{% for k, v in m|items %}{{ k }};{% endfor %}{{ m|length }}",
                minijinja::context! { m => v },
            )
            .unwrap();
        assert_eq!(out, "z;a;m;z;a;m;3");
    }

    #[test]
    fn large_maps_are_indexed() {
        let pairs = (0..100).map(|i| (format!("k{i}"), Value::from(i)));
        let v = OrderedMap::from_pairs(pairs.chain([("k3".to_owned(), Value::from(-3))]));
        assert_eq!(v.get_attr("k99").unwrap(), Value::from(99));
        assert_eq!(v.get_attr("k3").unwrap(), Value::from(-3));
        assert_eq!(keys(&v).len(), 100);
        assert_eq!(keys(&v)[3], "k3");
    }
}
