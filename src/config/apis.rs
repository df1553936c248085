//! Which wire APIs a backend serves itself (config key `apis`); the others reach it translated
//! to chat completions.

use super::error::ConfigError;
use super::model::Backend;
use crate::flavor::Flavor;
use crate::wire::{Api, Converter};

/// Which wire APIs a backend serves itself, besides chat completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Apis {
    pub messages: bool,
    pub responses: bool,
}

impl Apis {
    /// llama.cpp, vLLM and SGLang serve all three; any other OpenAI-style server chat only.
    pub fn default_for(flavor: Flavor) -> Apis {
        let all = flavor != Flavor::Openai;
        Apis {
            messages: all,
            responses: all,
        }
    }
}

impl Backend {
    /// How a request of `api` reaches this backend: `None` when it is sent as it is (chat, or
    /// an API the backend serves itself, converted there by its own converter) — see
    /// [`Backend::counting`] for what is counted then — else the translation to chat
    /// completions.
    pub fn translation(&self, api: Api) -> Option<Converter> {
        let native = match api {
            Api::Messages => self.apis.messages,
            Api::Responses => self.apis.responses,
            Api::ChatCompletions | Api::Completions | Api::Other => true,
        };
        (!native).then(|| Converter::translate(self.flavor))
    }

    /// The converter whose chat form of an `api` request is what this backend templates.
    pub fn counting(&self, api: Api) -> Converter {
        self.translation(api)
            .unwrap_or_else(|| Converter::native(self.flavor))
    }
}

/// `apis = ["chat", "messages", "responses"]` of backend `name`: chat completions must be
/// among them.
pub fn parse(
    name: &str,
    raw: Option<Vec<String>>,
    flavor: Flavor,
    errs: &mut Vec<ConfigError>,
) -> Apis {
    let Some(list) = raw else {
        return Apis::default_for(flavor);
    };
    let key = format!("backends.{name}.apis");
    let mut out = Apis {
        messages: false,
        responses: false,
    };
    let mut chat = false;
    for v in list {
        match v.as_str() {
            "chat" => chat = true,
            "messages" => out.messages = true,
            "responses" => out.responses = true,
            _ => errs.push(ConfigError::BadValue {
                key: key.clone(),
                value: v,
                reason: "is not an API: expected \"chat\", \"messages\" or \"responses\"".into(),
            }),
        }
    }
    if !chat {
        errs.push(ConfigError::BadValue {
            key,
            value: "[…]".into(),
            reason: "must include \"chat\": the other APIs are translated to it".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_toml;

    fn backend(extra: &str) -> Result<Backend, String> {
        let toml =
            format!("[backends.b]\nurl = \"http://h:1\"\n{extra}\n[aliases.a]\nbackend = \"b\"\n");
        from_toml(&toml)
            .map(|c| (*c.backends["b"]).clone())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn each_flavour_has_its_apis_and_the_key_narrows_them() {
        let native = backend("flavor = \"vllm\"").unwrap();
        assert_eq!(native.translation(Api::Messages), None);
        assert_eq!(native.counting(Api::Responses), Converter::Vllm);
        let chat_only = backend("flavor = \"openai\"").unwrap();
        assert!(chat_only.translation(Api::Responses).is_some());
        let narrowed = backend("flavor = \"llamacpp\"\napis = [\"chat\", \"responses\"]").unwrap();
        assert_eq!(
            narrowed.translation(Api::Messages),
            Some(Converter::translate(Flavor::Llamacpp))
        );
        assert_eq!(narrowed.translation(Api::Responses), None);
        assert_eq!(narrowed.translation(Api::ChatCompletions), None);
        let e = backend("flavor = \"vllm\"\napis = [\"messages\", \"grpc\"]").unwrap_err();
        assert!(e.contains("backends.b.apis"), "{e}");
        assert!(e.contains("\"grpc\""), "{e}");
        assert!(e.contains("must include \"chat\""), "{e}");
    }
}
