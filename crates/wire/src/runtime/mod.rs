//! The backend runtimes as data: what differs between llama.cpp, vLLM, SGLang and any other
//! OpenAI-compatible server, one file each, and their registry ([`RUNTIMES`]).
//!
//! A backend's `flavor` names its runtime ([`Flavor::runtime`]); the layers above read its
//! facts (health and load paths, discovery, the reasoning field, counting endpoints, the APIs
//! it serves itself, whose code prepares its chats, its quirks) and match on none of the
//! flavours. Adding a runtime is its file here, its line in [`RUNTIMES`] (and its variant in
//! [`Flavor`], in the same order), and its dialect in the simulator if tests are to serve it.
//!
//! Not runtime facts, because they are not known from the flavour: whether a backend closes
//! its connection after a streamed answer (llama.cpp's `llama-server` does) is learned from
//! its connections (`upstream::watch`), and the `timings` an answer reports are read wherever
//! they are found (`wire::usage`).

pub(crate) mod llamacpp;
pub(crate) mod openai;
pub(crate) mod sglang;
pub(crate) mod vllm;

use crate::flavor::Flavor;

/// What one backend runtime is and does differently from the others.
#[derive(Debug)]
pub struct Runtime {
    /// Its `flavor` in config files and on the command line.
    pub name: &'static str,
    /// The path its health is probed at (`GET`; 2xx up, 503 loading).
    pub health_path: &'static str,
    /// Where its load is read, in the order tried (the first that answers 2xx is used); empty:
    /// it reports none.
    pub load: &'static [Load],
    /// How it is asked what it serves: its window, slots and inputs.
    pub discovery: Discovery,
    /// Why `slots = "auto"` is refused for it, when it does not report its slot count.
    pub slots_unknown: Option<&'static str>,
    /// Why `context_window = "auto"` is refused for it, when it reports no context window.
    pub window_unknown: Option<&'static str>,
    /// The field it reads reasoning from in the assistant messages of a request's history.
    pub reasoning_field: InputField,
    /// How it reads the reasoning items of a Responses request's history.
    pub(crate) reasoning_items: ReasoningItems,
    /// The APIs (by their names in a backend's `apis` list) it serves itself unless that list
    /// says otherwise; the others reach it translated to chat completions.
    pub(crate) serves: &'static [&'static str],
    /// Its own counting endpoints, by the API (its name in `apis`) whose requests they count.
    pub(crate) count_paths: &'static [CountPath],
    /// How it counts a chat request's tokens (`count = "backend"`); `None`: it cannot.
    pub tokenize: Option<Tokenize>,
    /// Whose code prepares and templates its chats (what a local count renders as).
    pub engine: Engine,
    /// Whose conversion its own Messages and Responses endpoints apply; `None`: Switchboard's
    /// translation to chat, the reasoning of the history in [`Runtime::reasoning_field`].
    pub(crate) converts: Option<Engine>,
    /// It answers a streamed request it cannot serve with a 200 whose first event is the
    /// error: the first event is read before the head goes out.
    pub errors_in_first_event: bool,
    /// Each slot has a cache of its own and a request of these APIs (names in `apis`) may
    /// name the slot it runs on (`id_slot`): the scheduler sends each to the slot it took, so
    /// a conversation meets its own prefix (the fleet's slots). Empty: none.
    pub pins_slots: &'static [&'static str],
    /// How a request is kept to its cache group's prompt cache where clients are isolated
    /// (the config's `Backend::isolated`), and for which APIs (names in `apis`; a request
    /// of another API is translated to chat completions there).
    pub privacy: Privacy,
}

/// How a runtime keeps one cache group's prompts from another's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privacy {
    /// Each slot has a cache of its own: a request runs on the slot the proxy chose
    /// (`id_slot`), and uses the slot's cache only where the slot last held its own group's
    /// request and the server keeps no prompts in host memory; else it is sent
    /// `"cache_prompt": false` and processes its whole prompt (llama.cpp).
    Slots(&'static [&'static str]),
    /// One prefix cache, whose namespace a request names (`cache_salt`): one per cache group
    /// (vLLM, SGLang).
    Salt(&'static [&'static str]),
    /// Neither is known: its cache, if it has one, is shared.
    Shared,
}

impl Privacy {
    /// The APIs whose requests it keeps private.
    pub fn apis(self) -> &'static [&'static str] {
        match self {
            Privacy::Slots(apis) | Privacy::Salt(apis) => apis,
            Privacy::Shared => &[],
        }
    }
}

impl Runtime {
    /// Its own counting endpoint for the API named `api` in `apis`, if it has one.
    pub(crate) fn count_path(&self, api: &str) -> Option<&'static str> {
        self.count_paths
            .iter()
            .find(|c| c.api == api)
            .map(|c| c.path)
    }
}

/// One endpoint a backend's load is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// llama.cpp's `GET /slots`: the slots processing a request.
    Slots,
    /// `GET /metrics` in the Prometheus text format: the sum of these families' samples.
    Metrics(&'static [&'static str]),
}

impl Load {
    pub fn path(self) -> &'static str {
        match self {
            Load::Slots => "/slots",
            Load::Metrics(_) => "/metrics",
        }
    }
}

/// The endpoints a runtime is asked what it serves at (`fleet::discovery` reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// llama.cpp: `/props` (window, slots, inputs), then `/slots` and `/v1/models` if served.
    Props,
    /// `/v1/models` alone (its `max_model_len`, where the server gives one).
    Models,
    /// SGLang: `/v1/models`, then `/server_info` and `/model_info` (or their `get_` spellings).
    ServerInfo,
}

/// The field a backend reads reasoning from in assistant messages of the request history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputField {
    /// `reasoning_content` (llama.cpp's and SGLang's; they silently drop `reasoning`).
    ReasoningContent,
    /// `reasoning` (vLLM's and OpenAI-style servers').
    Reasoning,
}

impl InputField {
    /// The field's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            InputField::ReasoningContent => "reasoning_content",
            InputField::Reasoning => "reasoning",
        }
    }

    /// The other field's name (the one this runtime does not read).
    pub(crate) fn other(self) -> &'static str {
        match self {
            InputField::ReasoningContent => InputField::Reasoning.name(),
            InputField::Reasoning => InputField::ReasoningContent.name(),
        }
    }
}

/// How a runtime reads a reasoning item sent back in a Responses history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasoningItems {
    /// Only with a non-empty `content` array whose first part has the text (it refuses the
    /// whole request otherwise): the summary texts become the content, an item with no text
    /// at all is left out.
    ContentRequired,
    /// As sent, but for `encrypted_content`, which no self-hosted backend can read: dropped.
    EncryptedDropped,
}

/// An API's counting endpoint a runtime serves itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CountPath {
    /// The API's name in a backend's `apis` list.
    pub(crate) api: &'static str,
    /// The path the count is forwarded to.
    pub(crate) path: &'static str,
}

/// The Messages API's counting endpoint, at the path Anthropic gives it (llama.cpp, vLLM and
/// SGLang serve it).
pub(crate) const MESSAGES_COUNT: CountPath = CountPath {
    api: "messages",
    path: "/v1/messages/count_tokens",
};

/// How a runtime counts a chat request's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenize {
    /// The chat is templated at `template` (its `prompt`), the prompt tokenized at `tokenize`
    /// (`add_special: false`, `parse_special: true`: what its `usage.prompt_tokens` counts).
    Templated {
        template: &'static str,
        tokenize: &'static str,
    },
    /// The chat's messages form (`messages`, `tools`, template options) is posted to `path`;
    /// `generation_prompt`: `add_generation_prompt` is sent `true` unless the request says.
    Messages {
        path: &'static str,
        generation_prompt: bool,
    },
}

/// Whose code prepares a chat: converts other APIs to it, templates it, tokenizes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// llama.cpp's C++ (its own template engine and number formatting; its tokenizer applies
    /// no normalizer).
    Llamacpp,
    /// vLLM's Python, on Hugging Face tokenizers and templates.
    Vllm,
    /// SGLang's Python, on Hugging Face tokenizers and templates.
    Sglang,
}

/// The runtimes, in the order of [`Flavor`]'s variants (which [`Flavor::runtime`] indexes).
pub(crate) const RUNTIMES: &[&Runtime] = &[
    &llamacpp::LLAMACPP,
    &vllm::VLLM,
    &sglang::SGLANG,
    &openai::OPENAI,
];

impl Flavor {
    /// The runtime a backend of this flavour runs.
    pub fn runtime(self) -> &'static Runtime {
        RUNTIMES[self as usize]
    }
}

/// The names of the runtimes that have `fact`, as a list in words: `"a, b or c"`.
pub fn names_with(fact: impl Fn(&Runtime) -> bool) -> String {
    let names: Vec<&str> = RUNTIMES
        .iter()
        .filter(|r| fact(r))
        .map(|r| r.name)
        .collect();
    crate::words::or_list(&names)
}

#[cfg(test)]
mod tests;
