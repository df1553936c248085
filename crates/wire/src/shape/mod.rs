//! Shapes a request for its alias: defaults, stripped fields, the output cap, the inputs it takes.
//!
//! Pure functions of the body's bytes and the alias's [`ShapeSpec`]. The common case reads
//! the body with byte searches only and copies nothing; a body that needs a change is read
//! as its top-level members, and only the members that change are written anew.

mod body;
mod defaults;
mod images;
mod inputs;
pub(crate) mod owned;

use std::num::NonZeroU32;

use serde_json::{Map, Value};

use crate::error::ProxyError;

pub use defaults::{has_field, is_request_field};
pub use inputs::{Input, Kind};

/// What shaping knows of one API, its adapter's ([`crate::ApiSpec::shaping`]): where its
/// conversation and output limits are, which fields it has, how it writes an image part.
#[derive(Debug)]
pub struct Form {
    /// The member holding the conversation (where content parts are).
    pub(crate) conversation: Option<&'static str>,
    /// The output limits it reads, in the order they take effect (the first sent wins).
    pub(crate) limits: &'static [&'static str],
    /// The one of `limits` a cap (`max_output_tokens`) sets when the request sends none.
    pub(crate) cap_sets: &'static str,
    /// The fields it has of those only some APIs have (every other field, sampling controls
    /// such as `temperature` and backend extensions such as `chat_template_kwargs`, every
    /// shaped API takes).
    pub(crate) own: &'static [&'static str],
    /// An image of the legacy `images` field as one of its content parts, from the image's URL
    /// (a `data:` URL for base64 data) and, for base64 data, its media type and data.
    pub(crate) image_part: fn(&str, Option<(&str, &str)>) -> Value,
    /// The `type` of its text parts.
    pub(crate) text_part: &'static str,
    /// Its conversation is a list of typed items or one string (Responses' `input`): images
    /// for a string make it a user message item, and a user item given parts is typed.
    pub(crate) typed_items: bool,
}

/// The chat completions way of writing an image part, which most APIs share.
pub(crate) fn image_url_part(url: &str, _data: Option<(&str, &str)>) -> Value {
    serde_json::json!({"type": "image_url", "image_url": {"url": url}})
}

/// One alias's shaping (config keys `defaults`, `strip_params`, `max_output_tokens`, `inputs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShapeSpec {
    /// The alias, as refusals name it.
    pub alias: String,
    /// Input kinds besides text: a part of another kind is refused.
    pub inputs: Input,
    /// Members set when the client sent none (or `null`); an object default fills in the
    /// members the client's object lacks, at any depth.
    pub defaults: Map<String, Value>,
    /// Top-level members removed before forwarding.
    pub strip: Vec<String>,
    /// The most output tokens a request may ask for: a larger limit is lowered, a missing
    /// one is set.
    pub max_output_tokens: Option<NonZeroU32>,
}

impl ShapeSpec {
    /// Whether shaping may change a body or refuse it for reasons other than its inputs.
    fn edits(&self) -> bool {
        !self.defaults.is_empty() || !self.strip.is_empty() || self.max_output_tokens.is_some()
    }
}

/// The body as the alias's backend should get it: `None` when it needs no change, an error
/// when it sends an input the alias does not take (or a malformed legacy `images`). The
/// members the proxy owns ([`owned::OWNED`]) are removed from every body; the rest of
/// shaping is for the shaped APIs (`api` is `None` for the others).
pub fn shape(
    body: &[u8],
    spec: &ShapeSpec,
    api: Option<&Form>,
) -> Result<Option<Vec<u8>>, ProxyError> {
    let owned = owned::may_hold(body);
    let Some(api) = api else {
        // Not a JSON object: not a body the backend reads members of.
        let members = owned.then(|| body::Members::parse(body).ok()).flatten();
        return Ok(members.and_then(|mut m| m.remove_all(&owned::OWNED).then(|| m.write())));
    };
    let check_inputs = inputs::may_need_check(body, spec.inputs);
    if !spec.edits() && !check_inputs && !owned {
        return Ok(None);
    }
    let mut members = body::Members::parse(body)?;
    let mut changed = members.remove_all(&spec.strip);
    if owned {
        changed |= members.remove_all(&owned::OWNED);
    }
    if check_inputs {
        if let Some(images) = members.take("images") {
            changed = true;
            images::attach(&mut members, images, spec, api)?;
        }
        if let Some(conversation) = api.conversation.and_then(|c| members.get(c)) {
            if let Some((kind, part)) = inputs::refused_part(conversation, spec.inputs)? {
                return Err(ProxyError::UnsupportedInput {
                    alias: spec.alias.clone(),
                    kind: kind.name(),
                    part,
                    param: api.conversation.unwrap_or("messages"),
                });
            }
        }
    }
    changed |= defaults::apply(&mut members, &spec.defaults, api)?;
    if let Some(cap) = spec.max_output_tokens {
        changed |= defaults::cap(&mut members, cap.get(), api.limits, api.cap_sets);
    }
    Ok(changed.then(|| members.write()))
}

#[cfg(test)]
mod tests {
    //! `shape` over each API: what changes, what stays the same bytes, what is refused.
    #![allow(clippy::unwrap_used)]

    use std::num::NonZeroU32;

    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    /// The forms of the registered APIs, by name (`None`: not shaped), read from the registry.
    mod api {
        use super::Form;

        fn form(name: &str) -> Option<&'static Form> {
            let api = crate::APIS.iter().find(|a| a.spec().name == name);
            Some(
                api.and_then(|a| a.spec().shaping)
                    .expect("a registered API's form"),
            )
        }
        pub(crate) fn chat_completions() -> Option<&'static Form> {
            form("chat")
        }
        pub(crate) fn completions() -> Option<&'static Form> {
            form("completions")
        }
        pub(crate) fn messages() -> Option<&'static Form> {
            form("messages")
        }
        pub(crate) fn responses() -> Option<&'static Form> {
            form("responses")
        }
    }

    fn spec(inputs: Input) -> ShapeSpec {
        ShapeSpec {
            alias: "a".into(),
            inputs,
            ..ShapeSpec::default()
        }
    }

    const TEXT: Input = Input {
        image: false,
        audio: false,
    };
    const ALL: Input = Input {
        image: true,
        audio: true,
    };

    fn shaped(body: &Value, spec: &ShapeSpec, api: Option<&Form>) -> Option<Value> {
        let out = shape(body.to_string().as_bytes(), spec, api).unwrap();
        out.map(|b| serde_json::from_slice(&b).unwrap())
    }

    fn refusal(body: &Value, spec: &ShapeSpec, api: Option<&Form>) -> ProxyError {
        shape(body.to_string().as_bytes(), spec, api).unwrap_err()
    }

    #[test]
    fn nothing_configured_and_nothing_refused_is_unchanged() {
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": "describe an image"}]});
        for api in [
            api::chat_completions(),
            api::messages(),
            api::responses(),
            api::completions(),
        ] {
            assert_eq!(shaped(&body, &spec(TEXT), api), None);
            assert_eq!(shaped(&body, &spec(ALL), api), None);
        }
        let parts = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}},
            {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}]});
        assert_eq!(shaped(&parts, &spec(ALL), api::chat_completions()), None);
    }

    #[test]
    fn defaults_fill_what_the_client_did_not_send() {
        let mut s = spec(TEXT);
        s.defaults =
            json!({"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": false}})
                .as_object()
                .cloned()
                .unwrap();
        let bare = json!({"model": "m", "messages": []});
        assert_eq!(
            shaped(&bare, &s, api::chat_completions()).unwrap(),
            json!({"model": "m", "messages": [], "temperature": 0.0, "chat_template_kwargs": {"enable_thinking": false}})
        );
        let own = json!({"model": "m", "messages": [], "temperature": 0.7,
            "chat_template_kwargs": {"enable_thinking": true}});
        assert_eq!(shaped(&own, &s, api::chat_completions()), None);
        let partial = json!({"model": "m", "messages": [], "temperature": null,
            "chat_template_kwargs": {"other": 1}});
        assert_eq!(
            shaped(&partial, &s, api::chat_completions()).unwrap(),
            json!({"model": "m", "messages": [], "temperature": 0.0,
                "chat_template_kwargs": {"other": 1, "enable_thinking": false}})
        );
        // Every generation API has these; embeddings are not shaped.
        for api in [api::messages(), api::responses(), api::completions()] {
            assert_eq!(shaped(&bare, &s, api).unwrap()["temperature"], 0.0);
        }
        assert_eq!(shaped(&bare, &s, None), None);
        // A field of one API is not added to another.
        s.defaults = json!({"stop_sequences": ["x"]})
            .as_object()
            .cloned()
            .unwrap();
        assert_eq!(shaped(&bare, &s, api::chat_completions()), None);
        assert_eq!(
            shaped(&bare, &s, api::messages()).unwrap()["stop_sequences"],
            json!(["x"])
        );
    }

    #[test]
    fn stripped_fields_are_removed() {
        let mut s = spec(TEXT);
        s.strip = vec!["logprobs".into(), "user".into()];
        let body = json!({"model": "m", "messages": [], "logprobs": true, "user": "u", "n": 1});
        assert_eq!(
            shaped(&body, &s, api::chat_completions()).unwrap(),
            json!({"model": "m", "messages": [], "n": 1})
        );
        assert_eq!(shaped(&json!({"model": "m"}), &s, api::completions()), None);
    }

    #[test]
    fn a_clients_slot_and_cache_members_are_removed_however_spelled() {
        let body = br#"{"id_slot":0,"model":"m","messages":[],"cache_prompt":true,"id\u005fslot":1,"cache_salt":"x","extra_key":"y","n":1}"#;
        for api in [
            api::chat_completions(),
            api::responses(),
            api::messages(),
            None,
        ] {
            let out = shape(body, &spec(TEXT), api).unwrap().unwrap();
            assert_eq!(
                out,
                br#"{"model":"m","messages":[],"n":1}"#.to_vec(),
                "{api:?}"
            );
        }
        // Nothing to remove: the client's bytes.
        let plain = br#"{"model":"m","messages":[{"role":"user","content":"caf\u00e9"}]}"#;
        assert_eq!(
            shape(plain, &spec(TEXT), api::chat_completions()).unwrap(),
            None
        );
        // A body that is no object is left to the backend.
        assert_eq!(shape(br#"["id_slot"]"#, &spec(TEXT), None).unwrap(), None);
    }

    #[test]
    fn the_cap_lowers_or_sets_each_api_limit() {
        let mut s = spec(TEXT);
        s.max_output_tokens = NonZeroU32::new(100);
        let cases = [
            (
                api::chat_completions(),
                json!({"max_tokens": 500}),
                json!({"max_tokens": 100}),
            ),
            (
                api::chat_completions(),
                json!({"max_completion_tokens": 500, "max_tokens": 50}),
                json!({"max_completion_tokens": 100, "max_tokens": 50}),
            ),
            (
                api::chat_completions(),
                json!({}),
                json!({"max_tokens": 100}),
            ),
            (
                api::chat_completions(),
                json!({"max_tokens": null}),
                json!({"max_tokens": 100}),
            ),
            (
                api::completions(),
                json!({"max_tokens": 101}),
                json!({"max_tokens": 100}),
            ),
            (
                api::responses(),
                json!({}),
                json!({"max_output_tokens": 100}),
            ),
            (
                api::responses(),
                json!({"max_output_tokens": 1e6}),
                json!({"max_output_tokens": 100}),
            ),
            (
                api::messages(),
                json!({"max_tokens": 4096}),
                json!({"max_tokens": 100}),
            ),
        ];
        for (api, limits, want) in cases {
            let mut body = json!({"model": "m"});
            let mut expected = body.clone();
            body.as_object_mut()
                .unwrap()
                .extend(limits.as_object().cloned().unwrap());
            expected
                .as_object_mut()
                .unwrap()
                .extend(want.as_object().cloned().unwrap());
            assert_eq!(shaped(&body, &s, api), Some(expected), "{api:?} {body}");
        }
        let under = json!({"model": "m", "max_tokens": 99});
        assert_eq!(shaped(&under, &s, api::chat_completions()), None);
        // A default limit is capped too.
        s.defaults = json!({"max_tokens": 4000}).as_object().cloned().unwrap();
        assert_eq!(
            shaped(&json!({"model": "m"}), &s, api::messages()).unwrap(),
            json!({"model": "m", "max_tokens": 100})
        );
    }

    #[test]
    fn parts_of_kinds_not_taken_are_refused_on_each_api() {
        let image_only = Input {
            image: true,
            audio: false,
        };
        let cases = [
            (
                api::chat_completions(),
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}),
                "image_url",
                "messages",
            ),
            (
                api::chat_completions(),
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}]}),
                "input_audio",
                "messages",
            ),
            (
                api::responses(),
                json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}),
                "input_image",
                "input",
            ),
            (
                api::responses(),
                json!({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "mp3"}}]}]}),
                "input_audio",
                "input",
            ),
            (
                api::messages(),
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}]}),
                "image",
                "messages",
            ),
        ];
        for (api, body, part, param) in cases {
            match refusal(&body, &spec(TEXT), api) {
                ProxyError::UnsupportedInput {
                    alias,
                    part: p,
                    param: at,
                    ..
                } => assert_eq!((alias.as_str(), p.as_str(), at), ("a", part, param)),
                other => panic!("{other:?}"),
            }
            let takes = if part.contains("audio") {
                ALL
            } else {
                image_only
            };
            assert_eq!(shaped(&body, &spec(takes), api), None, "{body}");
        }
    }

    #[test]
    fn legacy_images_become_parts_of_the_last_user_message() {
        let s = spec(Input {
            image: true,
            audio: false,
        });
        let body = json!({"model": "m", "images": ["iVBORw0KGgo", "https://x/y.jpg"],
            "messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                         {"role": "user", "content": "what is this?"}]});
        let out = shaped(&body, &s, api::chat_completions()).unwrap();
        assert_eq!(
            out,
            json!({"model": "m", "messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo"}},
                    {"type": "image_url", "image_url": {"url": "https://x/y.jpg"}}]}]})
        );
        let responses = json!({"model": "m", "input": "what is this?", "images": ["/9j/AA"]});
        assert_eq!(
            shaped(&responses, &s, api::responses()).unwrap(),
            json!({"model": "m", "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/AA", "detail": "auto"}]}]})
        );
        let messages = json!({"model": "m", "max_tokens": 5, "images": ["data:image/gif;base64,R0lGOD"],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "this?"}]}]});
        assert_eq!(
            shaped(&messages, &s, api::messages()).unwrap()["messages"][0]["content"][1],
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGOD"}})
        );
        // Empty or null: removed, nothing attached.
        let empty = json!({"model": "m", "images": [], "messages": []});
        assert_eq!(
            shaped(&empty, &spec(TEXT), api::chat_completions()).unwrap(),
            json!({"model": "m", "messages": []})
        );
    }

    #[test]
    fn legacy_images_are_refused_with_a_reason() {
        let body = json!({"model": "m", "images": ["iVBORw0KGgo"], "messages": [{"role": "user", "content": "?"}]});
        for api in [
            api::chat_completions(),
            api::responses(),
            api::messages(),
            api::completions(),
        ] {
            assert!(matches!(
                refusal(&body, &spec(TEXT), api),
                ProxyError::LegacyImages { .. }
            ));
        }
        let s = spec(ALL);
        let e = refusal(&body, &s, api::completions());
        assert!(
            e.to_string().starts_with("invalid value for images: "),
            "{e}"
        );
        let e = refusal(
            &json!({"images": ["iVBORw0KGgo"], "messages": [{"role": "system", "content": "s"}]}),
            &s,
            api::chat_completions(),
        );
        assert!(e.to_string().contains("no user message"), "{e}");
        let e = refusal(
            &json!({"images": [3], "messages": []}),
            &s,
            api::chat_completions(),
        );
        assert!(e.to_string().contains("images[0]"), "{e}");
        let e = refusal(
            &json!({"images": "AA", "messages": []}),
            &s,
            api::chat_completions(),
        );
        assert!(
            matches!(
                e,
                ProxyError::InvalidParam {
                    param: "images",
                    ..
                }
            ),
            "{e}"
        );
    }

    proptest! {
        /// Shaping reads a request the same in any spelling (whitespace, member order,
        /// escapes in keys and strings): the same refusals, the same shaped request.
        #[test]
        fn shape_agrees_in_any_spelling(
            kind in 0u8..5,
            sent_temperature: bool,
            sent_kwargs: bool,
            limit in prop::option::of(0u32..3000),
            inputs in (any::<bool>(), any::<bool>()),
            seed: u64,
        ) {
            use switchboard_json::respell::{respell, Style};
            let mut s = spec(Input { image: inputs.0, audio: inputs.1 });
            s.defaults = json!({"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": false}})
                .as_object().cloned().unwrap();
            s.strip = vec!["logprobs".into()];
            s.max_output_tokens = NonZeroU32::new(1000);
            let content = match kind {
                0 => json!("an image of audio"),
                1 => json!([{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:,"}}]),
                2 => json!([{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]),
                3 => json!([{"type": "video_url", "video_url": {"url": "https://v"}}]),
                _ => json!("plain"),
            };
            let mut body = json!({"model": "m", "logprobs": true,
                "messages": [{"role": "user", "content": content}]});
            if kind == 4 {
                body["images"] = json!(["iVBORw0KGgo"]);
            }
            if sent_temperature {
                body["temperature"] = json!(0.5);
            }
            if sent_kwargs {
                body["chat_template_kwargs"] = json!({"x": "y"});
            }
            if let Some(l) = limit {
                body["max_tokens"] = json!(l);
            }
            let read = |bytes: &[u8]| match shape(bytes, &s, api::chat_completions()) {
                Ok(Some(b)) => Ok(serde_json::from_slice::<Value>(&b).unwrap()),
                Ok(None) => Ok(serde_json::from_slice::<Value>(bytes).unwrap()),
                Err(e) => Err(e.to_string()),
            };
            let compact = read(body.to_string().as_bytes());
            let text = respell(&body, Style::body(seed));
            prop_assert_eq!(read(text.as_bytes()), compact, "{}", text);
        }
    }
}
