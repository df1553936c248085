//! The input kinds an alias takes, and the content parts of a conversation that it does not.
//!
//! Parts are found where each API puts them: chat and Messages `messages[].content[]`,
//! Responses `input[].content[]`, and nested in Messages `tool_result` blocks and Responses
//! `function_call_output` items. A part's kind is read from its `type`, as the token counter
//! reads it (video counts as image).

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ProxyError;
use switchboard_json::scan::{finder, may_escape_word, values};

/// Input kinds an alias accepts besides text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Input {
    pub image: bool,
    pub audio: bool,
}

impl Input {
    /// The kinds, as `/v1/models` and the config name them.
    pub fn names(self) -> Vec<&'static str> {
        let mut kinds = vec!["text"];
        if self.image {
            kinds.push("image");
        }
        if self.audio {
            kinds.push("audio");
        }
        kinds
    }

    /// Kinds taken here but not by `other`.
    pub fn beyond(self, other: Input) -> Input {
        Input {
            image: self.image && !other.image,
            audio: self.audio && !other.audio,
        }
    }

    /// Kinds taken both here and by `other`.
    pub fn and(self, other: Input) -> Input {
        Input {
            image: self.image && other.image,
            audio: self.audio && other.audio,
        }
    }

    fn takes(self, kind: Kind) -> bool {
        match kind {
            Kind::Image => self.image,
            Kind::Audio => self.audio,
        }
    }
}

/// A kind of input other than text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Image,
    Audio,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Image => "image",
            Kind::Audio => "audio",
        }
    }

    /// The kind of a part by its `type`; `None` for text and everything else.
    pub(crate) fn of_part(part_type: &str) -> Option<Kind> {
        match part_type {
            "image_url" | "input_image" | "image" | "image_pil" | "image_embeds" | "video_url" => {
                Some(Kind::Image)
            }
            "input_audio" | "audio_url" | "audio_embeds" => Some(Kind::Audio),
            _ => None,
        }
    }
}

static IMAGE: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"image"));
static VIDEO: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"video"));
static AUDIO: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"audio"));
static IMAGES_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\"images\""));

/// Whether `body` may hold a part of a kind `inputs` refuses, or a legacy `images` member:
/// every such part type and the key hold `image`, `video` or `audio` in their plain spelling,
/// so where these searches find nothing and no word character is escaped, there is none.
pub(super) fn may_need_check(body: &[u8], inputs: Input) -> bool {
    let images = if inputs.image {
        values(body, &IMAGES_KEY).next().is_some()
    } else {
        IMAGE.find(body).is_some() || VIDEO.find(body).is_some()
    };
    images || (!inputs.audio && AUDIO.find(body).is_some()) || may_escape_word(body)
}

/// The first part of `conversation` (the JSON text of `messages` or `input`) whose kind
/// `inputs` does not take: its kind and `type`.
pub(super) fn refused_part(
    conversation: &[u8],
    inputs: Input,
) -> Result<Option<(Kind, String)>, ProxyError> {
    if inputs.image && inputs.audio {
        return Ok(None);
    }
    let items: Items<'_> =
        serde_json::from_slice(conversation).map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
    Ok(first_refused(&items.0, inputs))
}

fn first_refused(items: &[Item<'_>], inputs: Input) -> Option<(Kind, String)> {
    items.iter().find_map(|item| {
        let own = item.kind.as_deref().and_then(|t| {
            Kind::of_part(t)
                .filter(|k| !inputs.takes(*k))
                .map(|k| (k, t))
        });
        match own {
            Some((kind, t)) => Some((kind, t.to_owned())),
            None => [&item.content, &item.output]
                .into_iter()
                .find_map(|inner| first_refused(&inner.0, inputs)),
        }
    })
}

/// The items of a list (messages, parts, blocks); anything but a list holds none.
#[derive(Debug, Default)]
struct Items<'a>(Vec<Item<'a>>);

/// What the search needs of one item: its `type`, and the lists parts nest in.
#[derive(Debug, Default)]
struct Item<'a> {
    kind: Option<Cow<'a, str>>,
    content: Items<'a>,
    output: Items<'a>,
}

impl<'de> Deserialize<'de> for Items<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemsVisitor)
    }
}

impl<'de> Deserialize<'de> for Item<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor)
    }
}

/// Accepts any JSON value: a list gives its items, anything else none.
macro_rules! accept_scalars {
    ($value:ty) => {
        fn visit_bool<E>(self, _: bool) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_str<E>(self, _: &str) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E>(self) -> Result<$value, E> {
            Ok(Default::default())
        }
    };
}

struct ItemsVisitor;

impl<'de> Visitor<'de> for ItemsVisitor {
    type Value = Items<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    accept_scalars!(Items<'de>);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items<'de>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Item<'de>>()? {
            items.push(item);
        }
        Ok(Items(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Items<'de>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Items::default())
    }
}

struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    accept_scalars!(Item<'de>);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Item::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item<'de>, A::Error> {
        let mut item = Item::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "type" => {
                    let raw: &'de RawValue = map.next_value()?;
                    item.kind = serde_json::from_str::<Cow<'de, str>>(raw.get()).ok();
                }
                "content" => item.content = map.next_value()?,
                "output" => item.output = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(item)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TEXT: Input = Input {
        image: false,
        audio: false,
    };

    fn refused(conversation: &str, inputs: Input) -> Option<(Kind, String)> {
        refused_part(conversation.as_bytes(), inputs).unwrap()
    }

    #[test]
    fn parts_are_found_where_each_api_puts_them() {
        let chat = r#"[{"role":"user","content":[{"type":"text","text":"an image_url"},{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]}]"#;
        assert_eq!(
            refused(chat, TEXT),
            Some((Kind::Audio, "input_audio".into()))
        );
        let images = Input {
            image: true,
            ..TEXT
        };
        assert_eq!(
            refused(chat, images),
            Some((Kind::Audio, "input_audio".into()))
        );
        let both = Input {
            image: true,
            audio: true,
        };
        assert_eq!(refused(chat, both), None);
        let responses = r#"[{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:,"}]},{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"x"}]}]"#;
        assert_eq!(
            refused(responses, TEXT),
            Some((Kind::Image, "input_image".into()))
        );
        let tool_result = r#"[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]}]}]"#;
        assert_eq!(
            refused(tool_result, TEXT),
            Some((Kind::Image, "image".into()))
        );
        // A tool's arguments are the model's JSON, not parts; strings are no parts either.
        let args = r#"[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"type":"image"}}]},{"role":"user","content":"image"}]"#;
        assert_eq!(refused(args, TEXT), None);
        assert_eq!(refused(r#""just text""#, TEXT), None);
        let escaped = r#"[{"role":"user","content":[{"t\u0079pe":"im\u0061ge_url","image_url":{"url":"x"}}]}]"#;
        assert_eq!(
            refused(escaped, TEXT),
            Some((Kind::Image, "image_url".into()))
        );
    }

    #[test]
    fn the_byte_gate_lets_through_only_what_cannot_hold_refused_parts() {
        let both = Input {
            image: true,
            audio: true,
        };
        assert!(!may_need_check(
            br#"{"messages":[{"role":"user","content":"an image"}]}"#,
            both
        ));
        assert!(may_need_check(br#"{"images":["AA"]}"#, both));
        assert!(may_need_check(br#"{"images" : ["AA"]}"#, both));
        assert!(may_need_check(br#"{"\u0069mages":["AA"]}"#, both));
        assert!(!may_need_check(
            br#"{"messages":[{"role":"user","content":"hi"}]}"#,
            TEXT
        ));
        assert!(may_need_check(
            br#"{"content":[{"type":"video_url"}]}"#,
            TEXT
        ));
        assert!(may_need_check(
            br#"{"content":[{"type":"audio_url"}]}"#,
            TEXT
        ));
    }
}
