//! Turns raw config into typed config ([`super::model`]): each section by its own file's
//! validation, then what one section says of another (an alias's backends, its fallbacks),
//! collecting every error with the key and value it concerns. No I/O but reading the
//! environment variables the config names.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::error::{ConfigError, ConfigErrors};
use super::model::Config;
use super::names::name_check;
use super::raw::RawConfig;
use super::routing::{context_fallbacks, fallbacks, replicas};
use super::{aliases, backends, batches, clients, ledger, server, tracing};

/// Validate a raw config. Collects all errors rather than stopping at the first.
pub fn validate(raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Vec::new();
    let server = server::validate(raw.server, &mut errs);
    for name in raw.backends.keys() {
        name_check(&format!("backends.{name}"), name, &mut errs);
    }
    for (name, a) in &raw.aliases {
        name_check(&format!("aliases.{name}"), name, &mut errs);
        for (i, old) in a.old_names.iter().enumerate() {
            name_check(&format!("aliases.{name}.old_names[{i}]"), old, &mut errs);
        }
    }
    let isolated = clients::cache_groups(&raw.clients, server.api_keys.as_deref()) > 1;
    let mut backends = BTreeMap::new();
    for (name, b) in raw.backends {
        let settings = (&server.timeouts, isolated);
        if let Some(b) = backends::validate(&name, b, settings, &mut errs) {
            backends.insert(name, Arc::new(b));
        }
    }
    let mut aliases = BTreeMap::new();
    let mut names: HashMap<String, String> = HashMap::new();
    for name in raw.aliases.keys() {
        names.insert(name.clone(), format!("aliases.{name}"));
    }
    for (name, a) in raw.aliases {
        for old in &a.old_names {
            let key = format!("aliases.{name}.old_names");
            match names.get(old) {
                Some(other) => errs.push(ConfigError::DuplicateName {
                    key,
                    name: old.clone(),
                    other: other.clone(),
                }),
                None => {
                    names.insert(old.clone(), key);
                }
            }
        }
        let Some(replicas) = replicas(&name, &a, &backends, &mut errs) else {
            continue;
        };
        if let Some(a) = aliases::validate(&name, a, replicas, &mut errs) {
            aliases.insert(name, Arc::new(a));
        }
    }
    context_fallbacks(&aliases, &mut errs);
    fallbacks(&aliases, &mut errs);
    let clients = clients::validate(
        raw.clients,
        raw.priority,
        server.api_keys.as_deref(),
        &|a| aliases.contains_key(a),
        &mut errs,
    );
    let tracing = tracing::validate(raw.tracing, &mut errs);
    let ledger = ledger::validate(raw.ledger, server.data_dir.as_deref(), &mut errs);
    let batches = batches::validate(raw.batches, &mut errs);
    budgets(
        &clients,
        ledger.as_ref(),
        server.shared_state.is_some(),
        &mut errs,
    );
    if errs.is_empty() {
        Ok(Config {
            server,
            backends,
            aliases,
            clients: Arc::new(clients),
            tracing,
            ledger,
            batches,
        })
    } else {
        Err(ConfigErrors(errs))
    }
}

/// Budgets of a day and a month with what they are kept by: a month's needs a month of raw
/// rows in the ledger; processes sharing a store share their budgets through a ledger.
fn budgets(
    clients: &clients::Clients,
    ledger: Option<&ledger::Ledger>,
    shared: bool,
    errs: &mut Vec<ConfigError>,
) {
    for c in &clients.named {
        let month = c.set().any(|(l, _)| l.window == super::Window::Month);
        match ledger {
            Some(l) if month && (1..32).contains(&l.retention_days) => {
                errs.push(ConfigError::BadValue {
                    key: "ledger.retention_days".into(),
                    value: l.retention_days.to_string(),
                    reason: format!(
                        "must be 0 or at least 32: clients.{}'s budget of a month is read from \
                         the raw rows",
                        c.name
                    ),
                });
            }
            None if shared && c.counts_days() => errs.push(ConfigError::BadValue {
                key: format!("clients.{}", c.name),
                value: "a budget of a day or a month".into(),
                reason: "needs a [ledger] (or server.data_dir) with server.shared_state: \
                         processes share those budgets through it"
                    .into(),
            }),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::from_toml;
    use crate::config::names::{is_name, NAME_LIMIT};

    const BASE: &str = r#"
    [backends.gpu]
    url = "http://dankclaw:7771"
    flavor = "llamacpp"
    slots = 4
    [aliases.frank-zealot]
    backend = "gpu"
    context_window = 262144
    old_names = ["frank-small"]
"#;

    fn errors(extra: &str) -> String {
        match from_toml(&format!("{BASE}\n{extra}")) {
            Ok(_) => panic!("config with {extra:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn keys_that_cannot_be_sent_are_refused_without_being_shown() {
        let v = crate::config::bearer("sk-backend_1.x~/+=").unwrap();
        assert_eq!(v, "Bearer sk-backend_1.x~/+=");
        assert!(v.is_sensitive());
        assert!(!format!("{v:?}").contains("sk-backend"));
        for (key, what) in [
            ("sk-secret\r", "a line break (CR or LF) at byte 9"),
            ("sk-secret\n", "a line break (CR or LF) at byte 9"),
            ("sk-se cret", "a space or tab at byte 5"),
            ("sk-\tsecret", "a space or tab at byte 3"),
            ("sk-\x7fsecret", "a control character at byte 3"),
            ("sk-\0secret", "a control character at byte 3"),
            ("sk-sécret", "a character that is not ASCII at byte 4"),
            ("", "is empty"),
        ] {
            let e = crate::config::bearer(key).unwrap_err().to_string();
            assert!(e.contains(what), "{key:?}: {e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn names_that_labels_urls_and_the_page_cannot_carry_are_refused() {
        let e = errors("[aliases.\"m\\\"} 1\\ninjected_total{a=\\\"1\"]\nbackend = \"gpu\"");
        assert!(e.contains("is not a name"), "{e}");
        assert!(e.contains("aliases.m\"} 1\ninjected_total"), "{e}");
        let e = errors("[backends.\"g p u\"]\nurl = \"http://h:1\"\nflavor = \"llamacpp\"");
        assert!(e.contains("backends.g p u: \"g p u\" is not a name"), "{e}");
        let e = errors("[aliases.y]\nbackend = \"gpu\"\nold_names = [\"ok\", \"<b>\"]");
        assert!(
            e.contains("aliases.y.old_names[1]: \"<b>\" is not a name"),
            "{e}"
        );
        for good in [
            "qwen3-coder:30b",
            "Qwen/Qwen3-8B",
            "frank_zealot.v2",
            "a@b+c",
            "x",
        ] {
            assert!(is_name(good), "{good}");
        }
        let long = "a".repeat(NAME_LIMIT + 1);
        for bad in [
            "",
            "-lead",
            ".hidden",
            "sp ace",
            "quo\"te",
            "new\nline",
            "é",
            "a?b",
            "a%20",
            &long,
        ] {
            assert!(!is_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn base_config_is_valid() {
        let cfg = from_toml(BASE).unwrap();
        let a = &cfg.aliases["frank-zealot"];
        assert_eq!(a.upstream_model, "frank-zealot");
        assert_eq!(a.backend.url, "http://dankclaw:7771");
        assert_eq!(cfg.server.listen.port(), 7700);
    }

    #[test]
    fn alias_with_undefined_backend_names_the_key() {
        let e = errors("[aliases.x]\nbackend = \"nope\"");
        assert!(
            e.contains("aliases.x.backend: \"nope\" is not a defined backend"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_names_name_both_keys() {
        let e = errors("[aliases.y]\nbackend = \"gpu\"\nold_names = [\"frank-small\"]");
        assert!(e.contains("aliases.y.old_names: name \"frank-small\" is already used by aliases.frank-zealot.old_names"), "{e}");
        let e = errors("[aliases.z]\nbackend = \"gpu\"\nold_names = [\"frank-zealot\"]");
        assert!(
            e.contains(
                "aliases.z.old_names: name \"frank-zealot\" is already used by aliases.frank-zealot"
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_url_names_the_key_and_value() {
        let e = errors("[backends.b2]\nurl = \"dankclaw:7771\"\nflavor = \"vllm\"");
        assert!(
            e.contains("backends.b2.url: \"dankclaw:7771\" is not a valid URL"),
            "{e}"
        );
        let e = errors("[backends.b3]\nurl = \"not a url\"\nflavor = \"vllm\"");
        assert!(e.contains("backends.b3.url: \"not a url\""), "{e}");
    }

    /// Both schemes get an authority and a path prefix; https a server name and its
    /// `ca_file`, which validation does not read; `ca_file` on an http URL is refused.
    #[test]
    fn backends_of_both_schemes_have_an_address() {
        let cfg = from_toml(&format!(
            "{BASE}\n[backends.s]\nurl = \"https://gpu-box.fleet/llm/\"\nflavor = \"vllm\"\nca_file = \"/nowhere/ca.pem\""
        ))
        .unwrap();
        let (http, https) = (&cfg.backends["gpu"], &cfg.backends["s"]);
        assert_eq!(
            (http.authority.as_str(), http.path_prefix.as_str()),
            ("dankclaw:7771", "")
        );
        assert!(http.tls.is_none());
        assert_eq!(
            (https.authority.as_str(), https.path_prefix.as_str()),
            ("gpu-box.fleet:443", "/llm")
        );
        let tls = https.tls.as_ref().unwrap();
        assert_eq!(tls.server_name.to_str(), "gpu-box.fleet");
        assert_eq!(
            tls.ca_file.as_deref(),
            Some(std::path::Path::new("/nowhere/ca.pem"))
        );
        let e =
            errors("[backends.p]\nurl = \"http://h:1\"\nflavor = \"vllm\"\nca_file = \"ca.pem\"");
        assert!(
            e.contains("backends.p.ca_file: \"ca.pem\" is only for an https url"),
            "{e}"
        );
    }

    #[test]
    fn zero_window_and_zero_slots_are_refused() {
        let e = errors("[aliases.w]\nbackend = \"gpu\"\ncontext_window = 0");
        assert!(
            e.contains("aliases.w.context_window: must be greater than zero"),
            "{e}"
        );
        let e = errors("[backends.b4]\nurl = \"http://h:1\"\nflavor = \"sglang\"\nslots = 0");
        assert!(
            e.contains("backends.b4.slots: must be greater than zero"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let e = errors("[server]\nlisten_addr = \"0.0.0.0:1\"");
        assert!(e.contains("listen_addr"), "{e}");
        let e = errors("[aliases.q]\nbackend = \"gpu\"\ncontex_window = 5");
        assert!(e.contains("contex_window"), "{e}");
        let e = errors("[backends.b5]\nurl = \"http://h:1\"\nflavor = \"tgi\"");
        assert!(e.contains("tgi"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = errors("[server]\nlisten = \"nowhere\"\nreasoning_field = \"thoughts\"");
        assert!(e.contains("server.listen: \"nowhere\""), "{e}");
        assert!(
            e.contains("server.reasoning_field: \"thoughts\" is not one of"),
            "{e}"
        );
    }

    #[test]
    fn replicas_fallbacks_and_timeouts_are_checked() {
        let cfg = from_toml(&format!(
            "{BASE}\n[backends.gpu2]\nurl = \"http://h:2\"\nflavor = \"vllm\"\nstream_idle_timeout_ms = 500\n[aliases.r]\nbackends = [\"gpu\", \"gpu2\"]\nfallbacks = [\"frank-zealot\"]"
        ))
        .unwrap();
        let r = &cfg.aliases["r"];
        let names: Vec<&str> = r.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["gpu", "gpu2"]);
        assert_eq!(r.backend.name, "gpu");
        assert_eq!(r.fallbacks, ["frank-zealot"]);
        let idle = cfg.backends["gpu2"].timeouts.idle;
        assert_eq!(idle, std::time::Duration::from_millis(500));
        assert_eq!(cfg.backends["gpu"].timeouts, cfg.server.timeouts);

        let e = errors("[aliases.x]\nbackend = \"gpu\"\nbackends = [\"gpu\"]");
        assert!(
            e.contains("aliases.x.backends: \"set\" and backend are both set"),
            "{e}"
        );
        let e = errors("[aliases.x]\nupstream_model = \"m\"");
        assert!(e.contains("aliases.x.backend: \"unset\" is needed"), "{e}");
        let e = errors("[aliases.x]\nbackends = [\"gpu\", \"nope\", \"gpu\"]");
        assert!(
            e.contains("aliases.x.backends[1]: \"nope\" is not a defined backend"),
            "{e}"
        );
        assert!(
            e.contains("aliases.x.backends[2]: \"gpu\" is named twice"),
            "{e}"
        );
        let e = errors("[aliases.x]\nbackend = \"gpu\"\nfallbacks = [\"x\", \"nope\"]");
        assert!(
            e.contains("aliases.x.fallbacks[0]: \"x\" is the alias itself"),
            "{e}"
        );
        assert!(
            e.contains("aliases.x.fallbacks[1]: \"nope\" is not a defined alias"),
            "{e}"
        );
        let e = errors(
            "[aliases.x]\nbackend = \"gpu\"\nfallbacks = [\"y\"]\n[aliases.y]\nbackend = \"gpu\"\nfallbacks = [\"x\"]",
        );
        assert!(e.contains("\"x -> y -> x\" is a cycle"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let e =
            errors("[backends.z]\nurl = \"http://h:3\"\nflavor = \"vllm\"\ntotal_timeout_secs = 0");
        assert!(
            e.contains("backends.z.total_timeout_secs: must be greater than zero"),
            "{e}"
        );
    }

    #[test]
    fn shaping_keys_are_typed() {
        let cfg = from_toml(&format!(
            "{BASE}\n[aliases.s]\nbackend = \"gpu\"\ncontext_window = 8192\ninputs = [\"text\", \"image\"]\n\
         defaults = {{ temperature = 0.0, chat_template_kwargs = {{ enable_thinking = false }} }}\n\
         strip_params = [\"logprobs\"]\nmax_output_tokens = 1024"
        ))
        .unwrap();
        let s = &cfg.aliases["s"].shape;
        assert_eq!(s.alias, "s");
        assert!(s.inputs.image && !s.inputs.audio);
        assert_eq!(
            serde_json::Value::Object(s.defaults.clone()),
            serde_json::json!({"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": false}})
        );
        assert_eq!(s.strip, ["logprobs"]);
        assert_eq!(s.max_output_tokens.map(|c| c.get()), Some(1024));
        let plain = &cfg.aliases["frank-zealot"].shape;
        assert!(plain.defaults.is_empty() && plain.strip.is_empty());
        assert_eq!(plain.inputs, crate::wire::shape::Input::default());
    }

    #[test]
    fn bad_shaping_keys_name_the_key_and_value() {
        let e = errors("[aliases.s]\nbackend = \"gpu\"\ndefaults = { model = \"x\", temperature = \"hot\", top_p = 0.5 }");
        assert!(
            e.contains("aliases.s.defaults.model: \"x\" is part of each request, not a default"),
            "{e}"
        );
        assert!(
            e.contains("aliases.s.defaults.temperature: \"hot\" is not a number of zero or more"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 2, "{e}");
        let e = errors("[aliases.s]\nbackend = \"gpu\"\nstrip_params = [\"stream\", \"seed\", \"seed\"]\ndefaults = { seed = 1 }");
        assert!(
            e.contains("aliases.s.strip_params[0]: \"stream\" is part of each request"),
            "{e}"
        );
        assert!(
            e.contains("aliases.s.strip_params[2]: \"seed\" is listed twice"),
            "{e}"
        );
        assert!(
            e.contains("aliases.s.defaults.seed: \"1\" is also in strip_params"),
            "{e}"
        );
        let e = errors("[aliases.s]\nbackend = \"gpu\"\nmax_output_tokens = 0");
        assert!(
            e.contains("aliases.s.max_output_tokens: must be greater than zero"),
            "{e}"
        );
        let e =
            errors("[aliases.s]\nbackend = \"gpu\"\ncontext_window = 100\nmax_output_tokens = 100");
        assert!(
            e.contains("aliases.s.max_output_tokens: \"100\" leaves no room for a prompt in context_window 100"),
            "{e}"
        );
    }

    #[test]
    fn auto_window_and_slots_are_typed_and_refused_where_no_backend_reports_them() {
        let cfg = from_toml(&format!(
            "{BASE}\n[backends.a]\nurl = \"http://h:1\"\nflavor = \"sglang\"\nslots = \"auto\"\n\
         [aliases.x]\nbackend = \"a\"\ncontext_window = \"auto\"\nmax_output_tokens = 512"
        ))
        .unwrap();
        let x = &cfg.aliases["x"];
        assert_eq!(x.window_setting, Some(crate::config::Sizing::Auto));
        assert_eq!(x.context_window, None, "no window until discovered");
        assert!(x.guard.is_some(), "the guard settings wait for the window");
        assert_eq!(x.shape.max_output_tokens.map(|m| m.get()), Some(512));
        assert_eq!(cfg.backends["a"].slots_setting, crate::config::Sizing::Auto);
        assert_eq!(cfg.backends["a"].slots.get(), 1, "1 slot until discovered");
        let e = errors("[backends.v]\nurl = \"http://h:1\"\nflavor = \"vllm\"\nslots = \"auto\"");
        assert!(
            e.contains("backends.v.slots: \"auto\" needs a number: vllm"),
            "{e}"
        );
        let e = errors(
            "[backends.o]\nurl = \"http://h:1\"\nflavor = \"openai\"\n\
         [aliases.o]\nbackend = \"o\"\ncontext_window = \"auto\"",
        );
        assert!(
            e.contains("aliases.o.context_window: \"auto\" needs a number"),
            "{e}"
        );
        let e = errors("[aliases.b]\nbackend = \"gpu\"\ncontext_window = \"big\"");
        assert!(
            e.contains("aliases.b.context_window: \"big\" is neither a number nor \"auto\""),
            "{e}"
        );
        let e =
            errors("[aliases.m]\nbackend = \"gpu\"\ncontext_window = 100\nmax_output_tokens = 100");
        assert!(
            e.contains("aliases.m.max_output_tokens: \"100\" leaves no room"),
            "{e}"
        );
        assert!(from_toml(&BASE.replace("slots = 4", "slots = \"4\"")).is_ok());
    }

    #[test]
    fn every_error_is_reported_not_just_the_first() {
        let e = errors(
            "[aliases.x]\nbackend = \"nope\"\n[aliases.w]\nbackend = \"gpu\"\ncontext_window = 0",
        );
        assert_eq!(e.lines().count(), 2, "{e}");
    }

    #[test]
    fn budgets_of_a_day_and_month_are_kept_where_they_can_be() {
        std::env::set_var("SB_T_VALIDATE_BUDGET", "budget-key");
        let client = "[clients.c]\nkey_env = \"SB_T_VALIDATE_BUDGET\"\ntokens_per_month = 1000\n";
        let ledger = "[ledger]\nurl = \"sqlite://u.db\"\n";
        let cfg = from_toml(&format!(
            "{BASE}\n[server]\nbudget_timezone = \"Europe/Berlin\"\n{client}{ledger}"
        ))
        .unwrap();
        assert_eq!(cfg.server.budget_timezone.name(), "Europe/Berlin");
        assert_eq!(
            from_toml(BASE).unwrap().server.budget_timezone.name(),
            "UTC"
        );
        let e = errors("[server]\nbudget_timezone = \"Mars/Olympus\"");
        assert!(
            e.contains("server.budget_timezone") && e.contains("Mars/Olympus"),
            "{e}"
        );
        // A month's budget read from raw rows kept for less than a month.
        let e = errors(&format!("{client}{ledger}retention_days = 7"));
        assert!(
            e.contains("ledger.retention_days") && e.contains("clients.c"),
            "{e}"
        );
        // Processes sharing a store, with nothing to share the budgets through.
        let e = errors(&format!(
            "[server]\nshared_state = \"redis://cache\"\n{client}"
        ));
        assert!(e.contains("clients.c") && e.contains("[ledger]"), "{e}");
        from_toml(&format!(
            "{BASE}\n[server]\nshared_state = \"redis://cache\"\n{client}{ledger}"
        ))
        .unwrap();
    }

    #[test]
    fn the_shared_state_is_a_redis_url_with_a_lease_past_its_timeout() {
        let cfg = from_toml(&format!(
            "{BASE}\n[server]\nshared_state = \"redis://cache:6379/2\"\nshared_state_lease_ms = 3000"
        ))
        .unwrap();
        let shared = cfg.server.shared_state.unwrap();
        assert_eq!(shared.url, "redis://cache:6379/2");
        assert_eq!(shared.lease, std::time::Duration::from_secs(3));
        assert_eq!(shared.timeout, std::time::Duration::from_millis(250));
        assert!(from_toml(BASE).unwrap().server.shared_state.is_none());
        for (value, why) in [
            ("http://cache:6379/0", "expected a redis://HOST:PORT/N URL"),
            ("redis://cache:6379/zero", "the path is the database number"),
            ("cache:6379", "expected a redis://HOST:PORT/N URL"),
        ] {
            let e = errors(&format!("[server]\nshared_state = \"{value}\""));
            assert!(
                e.contains("server.shared_state") && e.contains(why),
                "{value}: {e}"
            );
        }
        let e = errors(
            "[server]\nshared_state = \"redis://cache\"\nshared_state_lease_ms = 1000\n\
         shared_state_timeout_ms = 500",
        );
        assert!(e.contains("server.shared_state_lease_ms"), "{e}");
    }

    #[test]
    fn metrics_and_admin_keys_are_read_from_their_variables_and_named_when_missing() {
        std::env::set_var("SB_UNIT_METRICS_KEYS", "m-1, m-2");
        std::env::set_var("SB_UNIT_ADMIN_KEYS", "admin-1");
        let cfg = from_toml(&format!(
            "[server]\nmetrics_keys_env = \"SB_UNIT_METRICS_KEYS\"\n\
         admin_keys_env = \"SB_UNIT_ADMIN_KEYS\"\n{BASE}"
        ))
        .unwrap();
        assert_eq!(
            cfg.server.metrics_keys.as_deref(),
            Some(&["m-1".to_string(), "m-2".to_string()][..])
        );
        assert_eq!(
            cfg.server.admin_keys.as_deref(),
            Some(&["admin-1".to_string()][..])
        );
        let open = from_toml(BASE).unwrap();
        assert!(open.server.metrics_keys.is_none() && open.server.admin_keys.is_none());
        let e = errors(
            "[server]\nmetrics_keys_env = \"SB_UNIT_UNSET_M\"\nadmin_keys_env = \"SB_UNIT_UNSET_A\"",
        );
        assert!(e.contains("server.metrics_keys_env"), "{e}");
        assert!(e.contains("server.admin_keys_env"), "{e}");
    }
}
