//! A request body as its top-level members, each kept as the client's JSON text until changed.

use std::borrow::Cow;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::ProxyError;

/// One top-level member: its key (unescaped) and its value's JSON text.
#[derive(Debug)]
struct Member<'a> {
    key: Cow<'a, str>,
    value: Cow<'a, [u8]>,
}

/// The top-level members of a JSON object in their order (a repeated key stays repeated:
/// readers take its last value, as JSON parsers do, and a change sets all of them).
#[derive(Debug)]
pub(super) struct Members<'a> {
    list: Vec<Member<'a>>,
}

impl<'a> Members<'a> {
    /// `body` must be a JSON object.
    pub(super) fn parse(body: &'a [u8]) -> Result<Members<'a>, ProxyError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let list = de
            .deserialize_map(ListVisitor)
            .and_then(|list| de.end().map(|()| list))
            .map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
        Ok(Members { list })
    }

    /// The JSON text of the last member named `key`.
    pub(super) fn get(&self, key: &str) -> Option<&[u8]> {
        self.list
            .iter()
            .rev()
            .find(|m| m.key == key)
            .map(|m| m.value.as_ref())
    }

    /// Set `key` to the JSON text `value`: every member of that name, or a new last one.
    pub(super) fn set(&mut self, key: &str, value: Vec<u8>) {
        let mut found = false;
        for m in self.list.iter_mut().filter(|m| m.key == key) {
            m.value = Cow::Owned(value.clone());
            found = true;
        }
        if !found {
            self.list.push(Member {
                key: Cow::Owned(key.to_owned()),
                value: Cow::Owned(value),
            });
        }
    }

    /// Remove every member named `key`; the last one's value.
    pub(super) fn take(&mut self, key: &str) -> Option<Cow<'a, [u8]>> {
        let mut last = None;
        let mut i = 0;
        while i < self.list.len() {
            if self.list[i].key == key {
                last = Some(self.list.remove(i).value);
            } else {
                i += 1;
            }
        }
        last
    }

    /// Remove every member whose key is in `keys`; whether there was one.
    pub(super) fn remove_all(&mut self, keys: &[impl AsRef<str>]) -> bool {
        let before = self.list.len();
        self.list
            .retain(|m| !keys.iter().any(|k| k.as_ref() == m.key));
        self.list.len() != before
    }

    /// The object written back: keys in JSON, values as they are.
    pub(super) fn write(&self) -> Vec<u8> {
        let size: usize = self
            .list
            .iter()
            .map(|m| m.key.len() + m.value.len() + 4)
            .sum();
        let mut out = Vec::with_capacity(size + 2);
        out.push(b'{');
        for (i, m) in self.list.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_string(&mut out, &m.key);
            out.push(b':');
            out.extend_from_slice(&m.value);
        }
        out.push(b'}');
        out
    }
}

/// `s` as a JSON string.
pub(super) fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = Vec<Member<'de>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut list = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let value: &'de RawValue = map.next_value()?;
            list.push(Member {
                key,
                value: Cow::Borrowed(value.get().as_bytes()),
            });
        }
        Ok(list)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn members_keep_their_text_until_changed() {
        let body = br#" { "model" : "m", "a\u0062" : [1, 2] ,"t":0.5, "t": 1 } "#;
        let mut m = Members::parse(body).unwrap();
        assert_eq!(m.get("ab"), Some(&b"[1, 2]"[..]));
        assert_eq!(m.get("t"), Some(&b"1"[..]));
        assert_eq!(m.get("x"), None);
        m.set("t", b"2".to_vec());
        m.set("new", b"null".to_vec());
        assert_eq!(m.take("model").as_deref(), Some(&b"\"m\""[..]));
        assert_eq!(
            String::from_utf8(m.write()).unwrap(),
            r#"{"ab":[1, 2],"t":2,"t":2,"new":null}"#
        );
        assert!(m.remove_all(&["t", "zz"]));
        assert!(!m.remove_all(&["t"]));
        assert_eq!(m.write(), br#"{"ab":[1, 2],"new":null}"#.to_vec());
        assert!(Members::parse(b"[1]").is_err());
        assert!(Members::parse(b"{} x").is_err());
    }
}
