//! An ordered JSON tree whose strings and containers the template engine shares without copies.

use std::fmt;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value as a chat template sees it: object keys keep their wire order (Python `dict`
/// semantics: a repeated key keeps its first position and its last value), integers stay
/// integers, and strings and containers are reference-counted so rendering shares them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum J {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(Arc<str>),
    Arr(Arc<JArr>),
    Obj(Arc<JMap>),
}

/// A JSON array.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JArr(pub(crate) Vec<J>);

/// A JSON object with its keys in insertion order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JMap(pub(crate) Vec<(Arc<str>, J)>);

impl J {
    pub(crate) fn str(s: &str) -> J {
        J::Str(Arc::from(s))
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_obj(&self) -> Option<&JMap> {
        match self {
            J::Obj(m) => Some(m),
            _ => None,
        }
    }

    pub(crate) fn as_arr(&self) -> Option<&[J]> {
        match self {
            J::Arr(a) => Some(&a.0),
            _ => None,
        }
    }

    pub(crate) fn is_null(&self) -> bool {
        matches!(self, J::Null)
    }

    /// Builds an object from pairs in the given order.
    pub(crate) fn obj<I: IntoIterator<Item = (&'static str, J)>>(pairs: I) -> J {
        let mut map = JMap::default();
        for (k, v) in pairs {
            map.insert(k, v);
        }
        J::Obj(Arc::new(map))
    }

    pub(crate) fn arr(items: Vec<J>) -> J {
        J::Arr(Arc::new(JArr(items)))
    }

    /// The value as the template engine sees it; containers are shared, not copied.
    pub(crate) fn to_value(&self) -> Value {
        match self {
            J::Null => Value::from(()),
            J::Bool(b) => Value::from(*b),
            J::Int(i) => Value::from(*i),
            J::UInt(u) => Value::from(*u),
            J::Float(f) => Value::from(*f),
            J::Str(s) => Value::from(s.clone()),
            J::Arr(a) => Value::from_dyn_object(a.clone()),
            J::Obj(m) => Value::from_dyn_object(m.clone()),
        }
    }

    /// Parses JSON bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Result<J, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

impl JMap {
    pub(crate) fn get(&self, key: &str) -> Option<&J> {
        self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| v)
    }

    /// Sets `key`, keeping its position when it already exists.
    pub(crate) fn insert(&mut self, key: &str, value: J) {
        match self.0.iter_mut().find(|(k, _)| &**k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((Arc::from(key), value)),
        }
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<J> {
        let pos = self.0.iter().position(|(k, _)| &**k == key)?;
        Some(self.0.remove(pos).1)
    }
}

impl Object for JMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get(key.as_str()?).map(J::to_value)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.get(key).map(J::to_value)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let keys: Vec<Value> = self.0.iter().map(|(k, _)| Value::from(k.clone())).collect();
        Enumerator::Values(keys)
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

impl Object for JArr {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let idx = key.as_usize()?;
        self.0.get(idx).map(J::to_value)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.0.len())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<J, E> {
        Ok(J::Null)
    }
    fn visit_none<E>(self) -> Result<J, E> {
        Ok(J::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<J, E> {
        Ok(J::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<J, E> {
        Ok(J::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<J, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => J::Int(i),
            Err(_) => J::UInt(v),
        })
    }
    fn visit_f64<E>(self, v: f64) -> Result<J, E> {
        Ok(J::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<J, E> {
        Ok(J::str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(J::arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J, A::Error> {
        let mut pairs: Vec<(Arc<str>, J)> = Vec::new();
        while let Some((Key(k), v)) = map.next_entry::<Key, J>()? {
            pairs.push((k, v));
        }
        Ok(J::Obj(Arc::new(dedup(pairs))))
    }
}

/// An object key, read without an intermediate `String`.
struct Key(Arc<str>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(Key(intern(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Keys every chat message carries, shared instead of allocated per message.
const COMMON_KEYS: [&str; 12] = [
    "role",
    "content",
    "type",
    "text",
    "name",
    "tool_calls",
    "tool_call_id",
    "function",
    "arguments",
    "id",
    "reasoning_content",
    "reasoning",
];

fn intern(key: &str) -> Arc<str> {
    static SHARED: std::sync::OnceLock<Vec<Arc<str>>> = std::sync::OnceLock::new();
    let shared = SHARED.get_or_init(|| COMMON_KEYS.iter().map(|k| Arc::from(*k)).collect());
    match COMMON_KEYS.iter().position(|k| *k == key) {
        Some(i) => shared[i].clone(),
        None => Arc::from(key),
    }
}

/// Python `dict` semantics for repeated keys: first position, last value.
fn dedup(pairs: Vec<(Arc<str>, J)>) -> JMap {
    let unique = if pairs.len() <= 32 {
        pairs
            .iter()
            .enumerate()
            .all(|(i, (k, _))| pairs[..i].iter().all(|(p, _)| p != k))
    } else {
        let mut seen = std::collections::HashSet::with_capacity(pairs.len());
        pairs.iter().all(|(k, _)| seen.insert(k.clone()))
    };
    if unique {
        return JMap(pairs);
    }
    let mut map = JMap::default();
    for (k, v) in pairs {
        map.insert(&k, v);
    }
    map
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order_and_python_duplicates() {
        let j = J::parse(br#"{"b":1,"a":2,"b":3}"#).unwrap();
        let m = j.as_obj().unwrap();
        let keys: Vec<&str> = m.0.iter().map(|(k, _)| &**k).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(m.get("b"), Some(&J::Int(3)));
    }

    #[test]
    fn numbers_keep_their_kind() {
        let j = J::parse(br#"[1, 1.0, -2, 18446744073709551615]"#).unwrap();
        assert_eq!(
            j.as_arr().unwrap(),
            &[J::Int(1), J::Float(1.0), J::Int(-2), J::UInt(u64::MAX)]
        );
    }

    #[test]
    fn template_sees_maps_and_sequences() {
        let j = J::parse(br#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        let mut env = minijinja::Environment::new();
        env.add_template("t", "{{ messages|length }} {{ messages[-1].role }} {% for k in messages[0] %}{{ k }},{% endfor %}{{ messages[0].missing is defined }}")
            .unwrap();
        let out = env
            .get_template("t")
            .unwrap()
            .render(
                j.as_obj()
                    .unwrap()
                    .get("messages")
                    .map(|m| minijinja::context! { messages => m.to_value() })
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(out, "1 user role,content,False");
    }
}
