//! Which wire APIs a backend serves itself (config key `apis`, by the names the registered
//! APIs give, [`crate::wire::APIS`]); the others reach it translated to chat completions.

use super::error::ConfigError;
use crate::flavor::Flavor;
use crate::wire::{Adapter, APIS};

/// The registered APIs a backend serves itself, by their place in [`APIS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Apis {
    served: u32,
}

impl Apis {
    /// What a backend of `flavor` serves when its `apis` list is not given: each API's own
    /// say ([`crate::wire::ApiSpec::served_by_default`]: its runtime's).
    pub(crate) fn default_for(flavor: Flavor) -> Apis {
        let mut out = Apis { served: 0 };
        for (i, api) in APIS.iter().enumerate() {
            if api.spec().served_by_default(flavor) {
                out.served |= 1 << i;
            }
        }
        out
    }

    /// Where caches are isolated: the APIs `privacy` cannot keep private are no longer
    /// served itself (they are translated to chat completions, which every runtime that keeps
    /// any API private keeps private).
    pub(crate) fn keep_private(&mut self, privacy: crate::runtime::Privacy) {
        let private = privacy.apis();
        if private.is_empty() {
            return;
        }
        for (i, api) in APIS.iter().enumerate() {
            let name = api.spec().config_name;
            if name.is_some_and(|n| !private.contains(&n)) && !api.spec().speaks_chat {
                self.served &= !(1 << i);
            }
        }
    }

    /// Whether the backend serves `api` itself: an API with no name in `apis` always is.
    pub(crate) fn serves(&self, api: &dyn Adapter) -> bool {
        if api.spec().config_name.is_none() {
            return true;
        }
        APIS.iter()
            .position(|a| a.spec().routes.label == api.spec().routes.label)
            .is_some_and(|i| self.served & (1 << i) != 0)
    }
}

/// The names of the registered APIs in `apis` lists, quoted: `"chat", "messages" or …`.
fn names() -> String {
    let names: Vec<String> = APIS
        .iter()
        .filter_map(|a| a.spec().config_name)
        .map(|n| format!("\"{n}\""))
        .collect();
    crate::words::or_list(&names)
}

/// `apis = ["chat", "messages", "responses"]` of backend `name`: the API the others are
/// translated to (chat completions) must be among them.
pub(crate) fn parse(
    name: &str,
    raw: Option<Vec<String>>,
    flavor: Flavor,
    errs: &mut Vec<ConfigError>,
) -> Apis {
    let Some(list) = raw else {
        return Apis::default_for(flavor);
    };
    let key = format!("backends.{name}.apis");
    let mut out = Apis { served: 0 };
    for v in list {
        match APIS
            .iter()
            .position(|a| a.spec().config_name == Some(v.as_str()))
        {
            Some(i) => out.served |= 1 << i,
            None => errs.push(ConfigError::BadValue {
                key: key.clone(),
                value: v,
                reason: format!("is not an API: expected {}", names()),
            }),
        }
    }
    for chat in APIS.iter().filter(|a| a.spec().speaks_chat) {
        if !out.serves(*chat) {
            errs.push(ConfigError::BadValue {
                key: key.clone(),
                value: "[…]".into(),
                reason: format!(
                    "must include \"{}\": the other APIs are translated to it",
                    chat.spec().config_name.unwrap_or_default()
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{from_toml, Backend, ConfigErrors};
    use crate::wire::{adapter, Converter, Endpoint};

    fn backend(extra: &str) -> Result<Backend, ConfigErrors> {
        let toml =
            format!("[backends.b]\nurl = \"http://h:1\"\n{extra}\n[aliases.a]\nbackend = \"b\"\n");
        from_toml(&toml).map(|c| (*c.backends["b"]).clone())
    }

    #[test]
    fn each_flavour_has_its_apis_and_the_key_narrows_them() {
        let api = |path| adapter(Endpoint::from_path(path));
        let (messages, responses) = (api("/v1/messages"), api("/v1/responses"));
        let (chat, embeddings) = (api("/v1/chat/completions"), api("/v1/embeddings"));
        let native = backend("flavor = \"vllm\"").unwrap();
        assert_eq!(native.translation(messages), None);
        assert_eq!(native.counting(responses), Converter::Vllm);
        let chat_only = backend("flavor = \"openai\"").unwrap();
        assert!(chat_only.translation(responses).is_some());
        assert_eq!(chat_only.translation(chat), None);
        assert_eq!(chat_only.translation(embeddings), None);
        let narrowed = backend("flavor = \"llamacpp\"\napis = [\"chat\", \"responses\"]").unwrap();
        assert_eq!(
            narrowed.translation(messages),
            Some(Converter::translate(Flavor::Llamacpp))
        );
        assert_eq!(narrowed.translation(responses), None);
        assert_eq!(narrowed.translation(chat), None);
        let e = backend("flavor = \"vllm\"\napis = [\"messages\", \"grpc\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("backends.b.apis"), "{e}");
        assert!(e.contains("\"grpc\""), "{e}");
        assert!(
            e.contains("expected \"chat\", \"messages\" or \"responses\""),
            "{e}"
        );
        assert!(e.contains("must include \"chat\""), "{e}");
    }
}
