//! The chat template of `tokenizer_config.json`, compiled once and rendered as the backend's Jinja does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use minijinja::value::{from_args, Kwargs, Rest, Value};
use minijinja::{Environment, Error, ErrorKind};

use super::json::{JMap, J};
use super::tojson::tojson;
pub(crate) use super::tojson::FloatStyle;

/// What the template does with its inputs, found by rendering probes once (the way
/// llama.cpp's engine probes a template, and vLLM/SGLang detect the content format).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Caps {
    /// Renders `content` given as a string.
    pub(crate) string_content: bool,
    /// Renders the text of `content` given as a list of `{type, text}` parts.
    pub(crate) typed_content: bool,
    /// Reads tool-call `arguments` given as an object.
    pub(crate) object_arguments: bool,
    /// Renders a leading system message.
    pub(crate) system_role: bool,
}

/// A compiled chat template with the tokenizer's special tokens as template variables.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    /// Whether the template looks like gpt-oss's (llama.cpp keeps `developer` for it).
    pub(crate) harmony: bool,
    /// The thinking tags llama.cpp's template analysis finds for `<think>` templates
    /// (Qwen3, DeepSeek-R1), used when it continues a final assistant message.
    pub(crate) think_tags: Option<(&'static str, &'static str)>,
    pub(crate) caps: Caps,
    /// `bos_token`, `eos_token`, ... as HF passes them to the template.
    pub(crate) specials: Vec<(Arc<str>, J)>,
}

const MARK: &str = "sb_probe_7391";

/// Template steps (minijinja fuel: about one per instruction) a probe render may take at load:
/// the probes are one- or two-message conversations, which Qwen3's template renders in under
/// 200 steps; a template that loops past this fails its load (and `check`) at once.
pub(crate) const PROBE_FUEL: u64 = 1_000_000;
/// Template steps one request's render may take. Qwen3's template takes about 70 steps a
/// message, so this is over 100,000 messages; a render that needs more is refused, not run on.
pub(crate) const RENDER_FUEL: u64 = 10_000_000;
/// Bytes of prompt one render may write: twice the largest body `server.body_limit_bytes`
/// allows by default, since a template writes each message's text once (unescaped, so no
/// longer than its JSON) and `tojson` at most doubles a tool's schema.
pub(crate) const RENDER_MAX_BYTES: usize = 128 << 20;
/// Wall time one render may take, checked at each piece of output it writes: a step can be
/// costly (`"x" * 100000000` is one), so steps alone do not bound the time.
pub(crate) const RENDER_TIME: Duration = Duration::from_secs(5);

/// Which of its bounds a render went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// More than its steps ([`PROBE_FUEL`] at load, [`RENDER_FUEL`] for a request).
    Steps(u64),
    /// More output than [`RENDER_MAX_BYTES`].
    Bytes,
    /// Longer than [`RENDER_TIME`].
    Time,
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::Steps(n) => write!(f, "{n} steps"),
            Budget::Bytes => write!(f, "{} MiB of output", RENDER_MAX_BYTES >> 20),
            Budget::Time => write!(f, "{} s", RENDER_TIME.as_secs()),
        }
    }
}

/// Which bound a render error is the template going past, if it is one.
fn over(e: &Error, fuel: u64) -> Option<Budget> {
    if e.kind() == ErrorKind::OutOfFuel {
        return Some(Budget::Steps(fuel));
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        // `io::Error::source` skips the error it carries, so that is looked at here.
        let carried = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        if let Some(over) = carried.and_then(|e| e.downcast_ref::<Over>()) {
            return Some(over.0);
        }
        source = s.source();
    }
    None
}

/// The error [`Bounded`] stops a render with.
#[derive(Debug, thiserror::Error)]
#[error("the render went past {0}")]
struct Over(Budget);

/// The render's output, refusing a write past [`RENDER_MAX_BYTES`] or its deadline.
struct Bounded {
    out: Vec<u8>,
    deadline: Instant,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let over = if self.out.len() + buf.len() > RENDER_MAX_BYTES {
            Budget::Bytes
        } else if Instant::now() >= self.deadline {
            Budget::Time
        } else {
            self.out.extend_from_slice(buf);
            return Ok(buf.len());
        };
        Err(std::io::Error::other(Over(over)))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Why a render failed.
#[derive(Debug)]
pub(crate) enum RenderError {
    /// It went past one of its bounds.
    Budget(Budget),
    /// The template's own `raise_exception`, or an error of the template engine.
    Template(Error),
}

impl RenderError {
    /// Whether the template refused the request with its own `raise_exception`.
    pub(crate) fn raised(&self) -> bool {
        matches!(self, RenderError::Template(e) if raised(e))
    }
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Budget(b) => {
                write!(f, "the chat template exceeded its render budget ({b})")
            }
            RenderError::Template(e) => e.fmt(f),
        }
    }
}

/// Why a chat template could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateError {
    #[error("tokenizer config is not a JSON object")]
    NotObject,
    #[error("chat_template list has no \"default\"")]
    NoDefault,
    #[error("tokenizer config has no chat_template")]
    NoTemplate,
    #[error("chat template does not compile: {0}")]
    Compile(Error),
    #[error("tool_use chat template does not compile: {0}")]
    CompileToolUse(Error),
    #[error("chat template exceeded its render budget ({0}) on a test conversation of one or two messages")]
    ProbeBudget(Budget),
    #[error("{0}")]
    Probe(Error),
}

/// The source of the error `raise_exception(...)` gives: the template itself refused the
/// request (as it does in the backend's engine), unlike an error of the template engine.
#[derive(Debug, thiserror::Error)]
#[error("raised by the chat template")]
struct Raised;

/// Whether a render error is the template's own `raise_exception`.
fn raised(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<Raised>() {
            return true;
        }
        source = s.source();
    }
    false
}

impl ChatTemplate {
    /// Compiles the `chat_template` of a parsed `tokenizer_config.json`.
    pub(crate) fn from_config(
        config: &J,
        floats: FloatStyle,
    ) -> Result<ChatTemplate, TemplateError> {
        let cfg = config.as_obj().ok_or(TemplateError::NotObject)?;
        let (default, tool_use) = match cfg.get("chat_template") {
            Some(J::Str(s)) => (s.to_string(), None),
            Some(J::Arr(list)) => {
                let named = |name: &str| {
                    list.0.iter().find_map(|t| {
                        let t = t.as_obj()?;
                        (t.get("name")?.as_str()? == name)
                            .then(|| t.get("template")?.as_str().map(str::to_string))
                            .flatten()
                    })
                };
                let default = named("default").ok_or(TemplateError::NoDefault)?;
                (default, named("tool_use"))
            }
            _ => return Err(TemplateError::NoTemplate),
        };
        let mut specials = Vec::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
            "additional_special_tokens",
        ] {
            let value = match cfg.get(key) {
                Some(J::Obj(m)) => m.get("content").cloned().unwrap_or(J::Null),
                Some(J::Null) | None => continue,
                Some(v) => v.clone(),
            };
            specials.push((Arc::from(key), value));
        }
        Self::new(default, tool_use, specials, floats)
    }

    /// Compiles a template source (and the optional tool-use variant).
    pub(crate) fn new(
        default: String,
        tool_use: Option<String>,
        specials: Vec<(Arc<str>, J)>,
        floats: FloatStyle,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", move |v: &Value, args: Rest<Value>| {
            let (ensure_ascii, indent, separators, sort_keys, kw): (
                Option<Value>,
                Option<Value>,
                Option<Value>,
                Option<Value>,
                Kwargs,
            ) = from_args(&args)?;
            tojson(
                v,
                [ensure_ascii, indent, separators, sort_keys],
                &kw,
                floats,
            )
        });
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg).with_source(Raised))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        let harmony = default.contains("<|channel|>");
        let think_tags = (default.contains("<think>") && default.contains("</think>"))
            .then_some(("<think>\n", "\n</think>\n\n"));
        env.add_template_owned("default", default)
            .map_err(TemplateError::Compile)?;
        let has_tool_use = tool_use.is_some();
        if let Some(src) = tool_use {
            env.add_template_owned("tool_use", src)
                .map_err(TemplateError::CompileToolUse)?;
        }
        env.set_fuel(Some(PROBE_FUEL));
        let mut tmpl = ChatTemplate {
            env,
            has_tool_use,
            harmony,
            think_tags,
            caps: Caps::default(),
            specials,
        };
        tmpl.caps = tmpl.probe().map_err(|e| match e {
            RenderError::Budget(b) => TemplateError::ProbeBudget(b),
            RenderError::Template(e) => TemplateError::Probe(e),
        })?;
        tmpl.env.set_fuel(Some(RENDER_FUEL));
        Ok(tmpl)
    }

    /// Renders with the given globals (`messages`, `tools`, `add_generation_prompt`, ...),
    /// within its steps, [`RENDER_MAX_BYTES`] and [`RENDER_TIME`].
    pub(crate) fn render(&self, vars: Arc<JMap>, tool_use: bool) -> Result<String, RenderError> {
        self.render_until(vars, tool_use, Instant::now() + RENDER_TIME)
    }

    fn render_until(
        &self,
        vars: Arc<JMap>,
        tool_use: bool,
        deadline: Instant,
    ) -> Result<String, RenderError> {
        let name = if tool_use && self.has_tool_use {
            "tool_use"
        } else {
            "default"
        };
        let mut out = Bounded {
            out: Vec::new(),
            deadline,
        };
        self.env
            .get_template(name)
            .and_then(|t| {
                t.render_captured_to(Value::from_dyn_object(vars), &mut out)
                    .map(drop)
            })
            .map_err(|e| match over(&e, self.env.fuel().unwrap_or(0)) {
                Some(budget) => RenderError::Budget(budget),
                None => RenderError::Template(e),
            })?;
        // Each write is a whole `str`, so this check passes; it keeps the code free of `unsafe`.
        String::from_utf8(out.out).map_err(|e| {
            RenderError::Template(Error::new(ErrorKind::InvalidOperation, e.to_string()))
        })
    }

    /// What the template does with each kind of input; `Err` when a probe went past its budget.
    fn probe(&self) -> Result<Caps, RenderError> {
        let user = |content: J| J::obj([("role", J::str("user")), ("content", content)]);
        let try_render = |messages: Vec<J>| {
            let vars = JMap(vec![
                (Arc::from("messages"), J::arr(messages)),
                (Arc::from("add_generation_prompt"), J::Bool(true)),
            ]);
            match self.render(Arc::new(vars), false) {
                Ok(out) => Ok(out.contains(MARK)),
                Err(e @ RenderError::Budget(_)) => Err(e),
                Err(_) => Ok(false),
            }
        };
        let part = J::obj([("type", J::str("text")), ("text", J::str(MARK))]);
        let call = J::obj([
            ("id", J::str("call00001")),
            ("type", J::str("function")),
            (
                "function",
                J::obj([
                    ("name", J::str("tool1")),
                    ("arguments", J::obj([("arg", J::str(MARK))])),
                ]),
            ),
        ]);
        let assistant = J::obj([
            ("role", J::str("assistant")),
            ("content", J::str("")),
            ("tool_calls", J::arr(vec![call])),
        ]);
        let system = J::obj([("role", J::str("system")), ("content", J::str(MARK))]);
        Ok(Caps {
            string_content: try_render(vec![user(J::str(MARK))])?,
            system_role: try_render(vec![system, user(J::str("User message"))])?,
            typed_content: try_render(vec![user(J::arr(vec![part]))])?,
            object_arguments: try_render(vec![user(J::str("x")), assistant])?,
        })
    }
}

/// `strftime_now(format)` of HF templates, in UTC, for the common directives.
fn strftime_now(fmt: &str) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let month = MONTHS[usize::try_from(m - 1).unwrap_or(0) % 12];
    let weekday = DAYS[usize::try_from(days.rem_euclid(7)).unwrap_or(0)];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&d.to_string());
            }
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    Ok(Value::from(out))
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Render `src` with the JSON object `vars` (the template tests of this and other modules).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn render_for_test(src: &str, vars: &str) -> String {
    let t = ChatTemplate::new(src.into(), None, vec![], FloatStyle::Python).unwrap();
    let J::Obj(m) = J::parse(vars.as_bytes()).unwrap() else {
        panic!("vars must be a JSON object")
    };
    t.render(m, false).unwrap()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::render_for_test as render;
    use super::*;

    #[test]
    fn pycompat_methods_and_slicing() {
        let out = render(
            "{% for m in messages[::-1] %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}{% endfor %}{{ raise_exception is defined }}",
            r#"{"messages":[{"content":"a</think>\n\nb"},{"content":"c"}]}"#,
        );
        assert_eq!(out, "cbTrue");
    }

    #[test]
    fn tojson_is_python_style() {
        let out = render(
            "{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ s|tojson }}|{{ s|tojson(ensure_ascii=true) }}",
            r#"{"x":{"b":[1,2.5,1.0],"a":{"<&>":null}},"s":"é\u0001\"😀"}"#,
        );
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, 1.0], \"a\": {\"<&>\": null}}|{\n  \"b\": [\n    1,\n    2.5,\n    1.0\n  ],\n  \"a\": {\n    \"<&>\": null\n  }\n}|\"é\\u0001\\\"😀\"|\"\\u00e9\\u0001\\\"\\ud83d\\ude00\""
        );
    }

    #[test]
    fn raise_exception_is_told_from_engine_errors() {
        let t = ChatTemplate::new(
            "{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}{{ messages[0].role.name }}".into(),
            None,
            vec![],
            FloatStyle::Python,
        )
        .unwrap();
        let vars = |m: &str| {
            let J::Obj(m) = J::parse(m.as_bytes()).unwrap() else {
                panic!("an object")
            };
            m
        };
        let refused = t.render(vars(r#"{"messages": []}"#), false).unwrap_err();
        assert!(refused.raised(), "{refused}");
        let engine = t.render(vars(r#"{"messages": [1]}"#), false).unwrap_err();
        assert!(!engine.raised(), "{engine}");
    }

    #[test]
    fn a_template_past_its_probe_budget_does_not_load() {
        let src = "{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}";
        let e = ChatTemplate::new(src.into(), None, vec![], FloatStyle::Python)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("chat template exceeded its render budget (1000000 steps)"),
            "{e}"
        );
        let within = "{% for i in range(1000) %}{% endfor %}{{ messages[0].content }}";
        let t = ChatTemplate::new(within.into(), None, vec![], FloatStyle::Python).unwrap();
        assert!(t.caps.string_content);
    }

    fn budget_of(t: &ChatTemplate, vars: &str, deadline: Instant) -> Option<Budget> {
        let J::Obj(m) = J::parse(vars.as_bytes()).unwrap() else {
            panic!("an object")
        };
        match t.render_until(m, false, deadline) {
            Err(RenderError::Budget(b)) => Some(b),
            Err(e) => panic!("{e}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn a_render_writing_past_its_bytes_is_stopped_in_few_steps() {
        // Each step writes 100 MB (minijinja's largest repeated string): a render the steps
        // alone would let write 10^15 bytes.
        let src = "{{ messages[0].content }}{% if messages[0].role == 'flood' %}{% for i in range(100000) %}{{ 'x' * 100000000 }}{% endfor %}{% endif %}";
        let t = ChatTemplate::new(src.into(), None, vec![], FloatStyle::Python).unwrap();
        let later = Instant::now() + Duration::from_secs(3600);
        let flood = r#"{"messages":[{"role":"flood","content":"hi"}]}"#;
        assert_eq!(budget_of(&t, flood, later), Some(Budget::Bytes));
        let J::Obj(m) = J::parse(flood.as_bytes()).unwrap() else {
            panic!("an object")
        };
        let e = t.render(m, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the chat template exceeded its render budget (128 MiB of output)"
        );
        let calm = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(budget_of(&t, calm, later), None);
    }

    #[test]
    fn a_render_past_its_deadline_is_stopped_at_its_next_write() {
        let t = ChatTemplate::new(
            "{{ messages[0].content }}".into(),
            None,
            vec![],
            FloatStyle::Python,
        )
        .unwrap();
        let vars = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let past = Instant::now();
        assert_eq!(budget_of(&t, vars, past), Some(Budget::Time));
        let later = past + Duration::from_secs(3600);
        assert_eq!(budget_of(&t, vars, later), None);
        assert_eq!(
            RenderError::Budget(Budget::Time).to_string(),
            "the chat template exceeded its render budget (5 s)"
        );
    }

    #[test]
    fn a_render_past_its_steps_names_them() {
        let src = "{% if messages[0].role == 'loop' %}{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}{% endif %}{{ messages[0].content }}";
        let t = ChatTemplate::new(src.into(), None, vec![], FloatStyle::Python).unwrap();
        let later = Instant::now() + Duration::from_secs(3600);
        let looping = r#"{"messages":[{"role":"loop","content":"hi"}]}"#;
        assert_eq!(
            budget_of(&t, looping, later),
            Some(Budget::Steps(RENDER_FUEL))
        );
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
    }
}
