//! An object's key as serde reads it: borrowed from the text where it escapes nothing, so
//! reading a member's name copies nothing (serde's own `Cow<str>` always copies).

use std::borrow::Cow;

use serde::de::{Deserializer, Visitor};
use serde::Deserialize;

/// A key, borrowed from the body when it has no escapes.
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_borrowed_unless_it_escapes() {
        let Key(plain) = serde_json::from_str::<Key>(r#""model""#).unwrap();
        assert!(matches!(plain, Cow::Borrowed("model")));
        let Key(escaped) = serde_json::from_str::<Key>(r#""mod\u0065l""#).unwrap();
        assert!(matches!(escaped, Cow::Owned(ref k) if k == "model"));
    }
}
