//! A request's conversation, as every process reads it from the request alone: its key —
//! its client's, and the id it carries (a harness's own header, its `prompt_cache_key`,
//! Switchboard's `x-switchboard-session`), else its leading messages — and whether it is a
//! later turn. Two clients sending the same id or the same first messages are two
//! conversations: neither joins the other's place in the fair order or its cached slot.
//!
//! The key is XXH3-64 over length-prefixed pieces, fixed by its specification: every process,
//! build and platform computes the same.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};
use xxhash_rust::xxh3::xxh3_64;

use crate::wire::request::History;
use switchboard_json::walk as json_walk;

/// A client's own conversation id; without it the key comes from the leading messages.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-switchboard-session");

/// The conversation ids harnesses send of their own accord, read in this order before
/// [`SESSION_HEADER`]: Claude Code's session, Codex CLI's thread (a sub-agent has a thread of
/// its own in its parent's session) and session.
pub static HARNESS_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-claude-code-session-id"),
    HeaderName::from_static("thread-id"),
    HeaderName::from_static("session-id"),
];

/// The conversation id a request carries, first found: a harness's own header
/// ([`HARNESS_HEADERS`]), the body's `prompt_cache_key` (`cache_key`: Responses and chat),
/// then [`SESSION_HEADER`]. With the id, the label it is hashed under (one per source, so the
/// same id from two sources is two conversations; [`SESSION_HEADER`]'s is `session`).
pub(crate) fn conversation_id<'a>(
    headers: &'a HeaderMap,
    cache_key: Option<&'a [u8]>,
) -> Option<(&'static str, &'a [u8])> {
    // One pass over the request's headers costs less than a hashed lookup of each name.
    let mut found: [Option<&[u8]>; 4] = [None; 4];
    let session = [&SESSION_HEADER];
    for (name, value) in headers {
        let mut named = HARNESS_HEADERS.iter().chain(session);
        if let Some(i) = named.position(|h| h == name) {
            found[i].get_or_insert(value.as_bytes());
        }
    }
    let harness = HARNESS_HEADERS
        .iter()
        .zip(found)
        .map(|(h, id)| (h.as_str(), id));
    let ids = harness.chain([("prompt_cache_key", cache_key), ("session", found[3])]);
    ids.filter_map(|(label, id)| Some((label, id?)))
        .find(|(_, id)| !id.is_empty())
}

/// A request's conversation, as every process reads it from the request alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conversation {
    /// What the order of its replicas is computed from.
    pub key: u64,
    /// Its history holds an answer of the model or a tool's result ([`Item::answers`]): a later
    /// turn, whose prefix its replica may hold cached. More user messages alone are not one.
    pub(crate) later: bool,
}

/// The conversation id a request carries ([`conversation_id`]), read once per request: its
/// label and the id, the body's `prompt_cache_key` unescaped where it has escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConversationId<'a> {
    pub(crate) label: &'static str,
    pub(crate) id: Cow<'a, [u8]>,
}

impl<'a> ConversationId<'a> {
    /// The id of the request of `headers` and `body` (`history`: the body's members as its
    /// parse found them), if it carries one.
    pub(crate) fn read(headers: &'a HeaderMap, body: &'a [u8], history: &History) -> Option<Self> {
        let [.., cache_key] = history.members(body);
        let cache_key = cache_key.and_then(json_walk::string);
        // Borrowed from the headers or the body; copied only beside an escaped cache key.
        if let Some(Cow::Owned(key)) = &cache_key {
            let (label, id) = conversation_id(headers, Some(key))?;
            let id = Cow::Owned(id.to_vec());
            return Some(ConversationId { label, id });
        }
        let cache_key = cache_key.and_then(|k| match k {
            Cow::Borrowed(k) => Some(k),
            Cow::Owned(_) => None,
        });
        let (label, id) = conversation_id(headers, cache_key)?;
        let id = Cow::Borrowed(id);
        Some(ConversationId { label, id })
    }
}

/// The conversation of a request of `client` (its owner's id, [`crate::clients::Caller::owner_id`];
/// 0 for a request of no client) for `alias`: its key from the id it carries
/// ([`ConversationId::read`], read once by the caller), else from its leading messages (system prompt and messages up to the
/// first user message, which every later turn repeats), and whether it is a later turn
/// ([`Item::answers`]). `None` when the request has neither.
/// The key is XXH3-64 over the pieces, each after its length (so no two different sequences
/// of pieces hash alike by their joins): the alias, the client's id (8 bytes, little-endian),
/// then the id's label and the id, else the system prompt (when there is one) and each
/// leading item.
pub(crate) fn conversation_key(
    alias: &str,
    client: u64,
    id: Option<&ConversationId>,
    body: &[u8],
    history: &History,
) -> Option<Conversation> {
    let [system, messages, input, _] = history.members(body);
    let mut h = Pieces::new();
    h.piece(alias.as_bytes());
    h.piece(&client.to_le_bytes());
    match id {
        Some(id) => {
            h.piece(id.label.as_bytes());
            h.piece(&id.id);
        }
        None => system.into_iter().for_each(|s| h.piece(s)),
    }
    let mut led = false;
    let later = read_items(messages, input, |item| {
        led = true;
        if id.is_none() {
            h.piece(item);
        }
    });
    (id.is_some() || led).then(|| Conversation {
        key: h.digest(),
        later,
    })
}

/// Whether a request's items — its `messages` (chat, Messages), else its `input` items
/// (Responses; an input that is no array is one item, the whole conversation's start) — hold
/// an answer of the model or a tool's result; each leading item (up to and with the first
/// user message, all of them when none is a user's) given to `lead` in order. One walk, from
/// the start, that ends once both are known (a later turn's first answer follows its first
/// user message closely).
fn read_items<'a>(
    messages: Option<&'a [u8]>,
    input: Option<&'a [u8]>,
    mut lead: impl FnMut(&'a [u8]),
) -> bool {
    let items = match (messages, input) {
        (Some(m), _) => json_walk::elements(m),
        (None, Some(input)) => match json_walk::elements(input) {
            Some(items) => Some(items),
            None => {
                lead(input);
                return Item::of(input).answers();
            }
        },
        (None, None) => None,
    };
    let Some(mut items) = items else {
        return false;
    };
    let (mut leading, mut later) = (true, false);
    loop {
        let mut item = Item::default();
        let text = match plain_message(items.rest()) {
            Some((len, plain)) => {
                item = plain;
                items.read(len)
            }
            None => match items.next_object(|key, value| item.member(key, value)) {
                Some(text) => text,
                None => return later,
            },
        };
        if leading {
            lead(text);
            leading = item.role.as_deref() != Some(b"user");
        }
        later = later || item.answers();
        if later && !leading {
            return true;
        }
    }
}

/// A chat message as most clients write one, `{"role":"…","content":"…"}`: these two members
/// in this order, no whitespace, a role without escapes, string content. Its text's length
/// and the item it reads as (what [`Item::member`] reads of it); `None` for any other text,
/// which the walk reads. Under callgrind (`benches/load/instructions.sh`, a chat of two such
/// messages) the conversation cost some 2,200 instructions walked, 1,300 read here.
fn plain_message(text: &[u8]) -> Option<(usize, Item<'_>)> {
    let rest = text.strip_prefix(br#"{"role":""#)?;
    let q = json_walk::quote_or_escape(rest)?;
    let role = rest.get(..q).filter(|_| rest[q] == b'"')?;
    let after = rest[q + 1..].strip_prefix(br#","content":"#)?;
    let start = text.len() - after.len();
    if after.first() != Some(&b'"') {
        return None;
    }
    let end = json_walk::string_end(text, start);
    (text.get(end) == Some(&b'}')).then(|| {
        let item = Item {
            role: Some(Cow::Borrowed(role)),
            kind: None,
            content: Some(&text[start..end]),
        };
        (end + 1, item)
    })
}

/// One message or input item, as much as tells whose it is: the client's, the model's or a
/// tool's (a member that is not of its type, or an item that is no object, reads as unset;
/// the last of a name given twice counts, as in a full parse).
#[derive(Default)]
struct Item<'a> {
    role: Option<Cow<'a, [u8]>>,
    kind: Option<Cow<'a, [u8]>>,
    content: Option<&'a [u8]>,
}

impl<'a> Item<'a> {
    fn of(text: &'a [u8]) -> Item<'a> {
        let mut item = Item::default();
        for (key, value) in json_walk::members(text).into_iter().flatten() {
            item.member(key, value);
        }
        item
    }

    /// A member of the item, its key as written (with its quotes).
    fn member(&mut self, key: &'a [u8], value: &'a [u8]) {
        let unescaped;
        let name = match key {
            br#""role""# | br#""type""# | br#""content""# => &key[1..key.len() - 1],
            _ if key.contains(&b'\\') => match json_walk::string(key) {
                Some(k) => {
                    unescaped = k;
                    &*unescaped
                }
                None => return,
            },
            _ => return,
        };
        match name {
            b"role" => self.role = json_walk::string(value),
            b"type" => self.kind = json_walk::string(value),
            b"content" => self.content = Some(value).filter(|v| *v != b"null"),
            _ => {}
        }
    }

    /// Whether it is an answer of the model or a tool's result, what makes a later turn: a
    /// chat message of role `assistant`, `tool` (or the old `function`); an Anthropic
    /// `assistant` message or a `tool_result` block; a Responses item of role `assistant`, a
    /// `reasoning` item, or a call or its output (`function_call`, `function_call_output`,
    /// any `*_call` and `*_call_output`).
    fn answers(&self) -> bool {
        let kind = self.kind.as_deref().unwrap_or_default();
        matches!(
            self.role.as_deref(),
            Some(b"assistant" | b"tool" | b"function")
        ) || kind == b"reasoning"
            || kind.ends_with(b"_call")
            || kind.ends_with(b"_call_output")
            || self.content.is_some_and(holds_tool_result)
    }
}

/// Whether message content is a list of blocks with a `tool_result` among them.
fn holds_tool_result(content: &[u8]) -> bool {
    json_walk::elements(content).is_some_and(|mut blocks| {
        blocks.any(|b| {
            json_walk::member(b, "type")
                .and_then(json_walk::string)
                .as_deref()
                == Some(&b"tool_result"[..])
        })
    })
}

/// Length-prefixed pieces, hashed at once: the one-shot XXH3 of a few hundred bytes costs
/// less than a streaming hash fed piece by piece, and is the same hash.
struct Pieces(Vec<u8>);

impl Pieces {
    /// Room for the key of a short conversation's pieces without growing.
    fn new() -> Pieces {
        Pieces(Vec::with_capacity(256))
    }

    fn piece(&mut self, bytes: &[u8]) {
        self.0
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    fn digest(&self) -> u64 {
        xxh3_64(&self.0)
    }
}

/// [`conversation_key`] of a body of no client read for it alone (the pipeline reads the
/// body's history in its one parse of the body).
pub fn conversation_of(alias: &str, headers: &HeaderMap, body: &[u8]) -> Option<Conversation> {
    let history = History::of(body);
    let id = ConversationId::read(headers, body, &history);
    conversation_key(alias, 0, id.as_ref(), body, &history)
}

#[cfg(test)]
mod tests;
