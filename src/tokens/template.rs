//! The chat template of `tokenizer_config.json`, compiled once and rendered as the backend's Jinja does.

use std::sync::Arc;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use super::json::{JArr, JMap, J};

/// How `tojson` prints a float: Python's `repr` (HF transformers, vLLM, SGLang) or C++
/// `std::ostream` with its default precision of 6 (llama.cpp's Jinja engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatStyle {
    Python,
    Cpp,
}

/// What the template does with its inputs, found by rendering probes once (the way
/// llama.cpp's engine probes a template, and vLLM/SGLang detect the content format).
#[derive(Debug, Clone, Copy, Default)]
pub struct Caps {
    /// Renders `content` given as a string.
    pub string_content: bool,
    /// Renders the text of `content` given as a list of `{type, text}` parts.
    pub typed_content: bool,
    /// Reads tool-call `arguments` given as an object.
    pub object_arguments: bool,
    /// Renders a leading system message.
    pub system_role: bool,
}

/// A compiled chat template with the tokenizer's special tokens as template variables.
pub struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    /// Whether the template looks like gpt-oss's (llama.cpp keeps `developer` for it).
    pub harmony: bool,
    /// The thinking tags llama.cpp's template analysis finds for `<think>` templates
    /// (Qwen3, DeepSeek-R1), used when it continues a final assistant message.
    pub think_tags: Option<(&'static str, &'static str)>,
    pub caps: Caps,
    /// `bos_token`, `eos_token`, ... as HF passes them to the template.
    pub specials: Vec<(Arc<str>, J)>,
}

const MARK: &str = "sb_probe_7391";

impl ChatTemplate {
    /// Compiles the `chat_template` of a parsed `tokenizer_config.json`.
    pub fn from_config(config: &J, floats: FloatStyle) -> Result<ChatTemplate, String> {
        let cfg = config
            .as_obj()
            .ok_or("tokenizer config is not a JSON object")?;
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
                let default = named("default").ok_or("chat_template list has no \"default\"")?;
                (default, named("tool_use"))
            }
            _ => return Err("tokenizer config has no chat_template".into()),
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
    pub fn new(
        default: String,
        tool_use: Option<String>,
        specials: Vec<(Arc<str>, J)>,
        floats: FloatStyle,
    ) -> Result<ChatTemplate, String> {
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
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        let harmony = default.contains("<|channel|>");
        let think_tags = (default.contains("<think>") && default.contains("</think>"))
            .then_some(("<think>\n", "\n</think>\n\n"));
        env.add_template_owned("default", default)
            .map_err(|e| format!("chat template does not compile: {e}"))?;
        let has_tool_use = tool_use.is_some();
        if let Some(src) = tool_use {
            env.add_template_owned("tool_use", src)
                .map_err(|e| format!("tool_use chat template does not compile: {e}"))?;
        }
        let mut tmpl = ChatTemplate {
            env,
            has_tool_use,
            harmony,
            think_tags,
            caps: Caps::default(),
            specials,
        };
        tmpl.caps = tmpl.probe();
        Ok(tmpl)
    }

    /// Renders with the given globals (`messages`, `tools`, `add_generation_prompt`, ...).
    pub fn render(&self, vars: Arc<JMap>, tool_use: bool) -> Result<String, Error> {
        let name = if tool_use && self.has_tool_use {
            "tool_use"
        } else {
            "default"
        };
        self.env
            .get_template(name)?
            .render(Value::from_dyn_object(vars))
    }

    fn probe(&self) -> Caps {
        let user = |content: J| J::obj([("role", J::str("user")), ("content", content)]);
        let try_render = |messages: Vec<J>| {
            let vars = JMap(vec![
                (Arc::from("messages"), J::arr(messages)),
                (Arc::from("add_generation_prompt"), J::Bool(true)),
            ]);
            self.render(Arc::new(vars), false)
                .map(|out| out.contains(MARK))
                .unwrap_or(false)
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
        Caps {
            system_role: try_render(vec![system, user(J::str("User message"))]),
            string_content: try_render(vec![user(J::str(MARK))]),
            typed_content: try_render(vec![user(J::arr(vec![part]))]),
            object_arguments: try_render(vec![user(J::str("x")), assistant]),
        }
    }
}

/// `tojson` as HF transformers defines it (`json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`) and llama.cpp mirrors; minijinja's own escapes HTML.
fn tojson(
    v: &Value,
    pos: [Option<Value>; 4],
    kw: &Kwargs,
    floats: FloatStyle,
) -> Result<Value, Error> {
    let [ensure_ascii, indent, separators, sort_keys] = pos;
    let pick = |p: Option<Value>, key: &str| -> Result<Option<Value>, Error> {
        match p {
            Some(v) => Ok(Some(v)),
            None => kw.get::<Option<Value>>(key),
        }
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        Some(v) if v.kind() == ValueKind::Number => Some(v.as_usize().unwrap_or(0)),
        _ => None,
    };
    let separators = pick(separators, "separators")?;
    let sort_keys = pick(sort_keys, "sort_keys")?.is_some_and(|v| v.is_true());
    kw.assert_all_used()?;
    let sep = |i: usize, default: &str| -> String {
        separators
            .as_ref()
            .and_then(|s| s.get_item_by_index(i).ok())
            .and_then(|s| s.as_str().map(str::to_string))
            .unwrap_or_else(|| default.to_string())
    };
    let fmt = JsonFmt {
        item_sep: sep(0, if indent.is_some() { "," } else { ", " }),
        key_sep: sep(1, ": "),
        indent,
        ensure_ascii,
        sort_keys,
        floats,
    };
    let mut out = String::new();
    fmt.value(&mut out, v, 0)?;
    Ok(Value::from(out))
}

struct JsonFmt {
    item_sep: String,
    key_sep: String,
    indent: Option<usize>,
    ensure_ascii: bool,
    sort_keys: bool,
    floats: FloatStyle,
}

impl JsonFmt {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }

    fn seq<T>(
        &self,
        out: &mut String,
        items: impl Iterator<Item = T>,
        level: usize,
        mut each: impl FnMut(&Self, &mut String, T) -> Result<(), Error>,
        open: char,
        close: char,
    ) -> Result<(), Error> {
        out.push(open);
        let mut any = false;
        for item in items {
            if any {
                out.push_str(&self.item_sep);
            }
            any = true;
            self.newline(out, level + 1);
            each(self, out, item)?;
        }
        if any {
            self.newline(out, level);
        }
        out.push(close);
        Ok(())
    }

    fn map(
        &self,
        out: &mut String,
        mut pairs: Vec<(String, Value)>,
        level: usize,
    ) -> Result<(), Error> {
        if self.sort_keys {
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
        }
        self.seq(
            out,
            pairs.into_iter(),
            level,
            |f, out, (k, v)| {
                f.string(out, &k);
                out.push_str(&f.key_sep);
                f.value(out, &v, level + 1)
            },
            '{',
            '}',
        )
    }

    fn value(&self, out: &mut String, v: &Value, level: usize) -> Result<(), Error> {
        if let Some(m) = v.downcast_object_ref::<JMap>() {
            if !self.sort_keys {
                return self.seq(
                    out,
                    m.0.iter(),
                    level,
                    |f, out, (k, v)| {
                        f.string(out, k);
                        out.push_str(&f.key_sep);
                        f.value(out, &v.to_value(), level + 1)
                    },
                    '{',
                    '}',
                );
            }
        }
        if let Some(a) = v.downcast_object_ref::<JArr>() {
            return self.seq(
                out,
                a.0.iter(),
                level,
                |f, out, v| f.value(out, &v.to_value(), level + 1),
                '[',
                ']',
            );
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&match self.floats {
                    FloatStyle::Python => python_float(f),
                    FloatStyle::Cpp => cpp_float(f),
                });
            }
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for k in v.try_iter()? {
                    let val = v.get_item(&k)?;
                    let key = match k.as_str() {
                        Some(s) => s.to_string(),
                        None => k.to_string(),
                    };
                    pairs.push((key, val));
                }
                self.map(out, pairs, level)?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.seq(
                    out,
                    items.iter(),
                    level,
                    |f, out, v| f.value(out, v, level + 1),
                    '[',
                    ']',
                )?;
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("cannot serialize {} to JSON", v.kind()),
                ))
            }
        }
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in
/// [-4, 16), otherwise scientific with a signed two-digit exponent; always a `.0` or digits.
pub fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let (neg, digits, exp) = decompose(&format!("{:e}", f));
    let mut s = String::from(if neg { "-" } else { "" });
    if (-4..16).contains(&exp) {
        s.push_str(&fixed(&digits, exp));
        if !s.contains('.') {
            s.push_str(".0");
        }
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        s.push_str(&format!(
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        ));
    }
    s
}

/// C++ `std::ostream << double` with the default precision 6 (`%g`).
pub fn cpp_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let (neg, digits, exp) = decompose(&format!("{:.5e}", f));
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    let mut s = String::from(if neg { "-" } else { "" });
    if (-4..6).contains(&exp) {
        s.push_str(&fixed(digits, exp));
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        s.push_str(&format!(
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        ));
    }
    s
}

/// Splits Rust's `{:e}` output into sign, significant digits and decimal exponent.
fn decompose(e: &str) -> (bool, String, i32) {
    let (neg, e) = match e.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, e),
    };
    let (mant, exp) = e.split_once('e').unwrap_or((e, "0"));
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    (neg, digits, exp.parse().unwrap_or(0))
}

/// Places the decimal point in `digits` (d.ddd × 10^exp) without trailing zeros after it.
fn fixed(digits: &str, exp: i32) -> String {
    if exp < 0 {
        let zeros = usize::try_from(-exp - 1).unwrap_or(0);
        format!("0.{}{}", "0".repeat(zeros), digits)
    } else {
        let int_len = usize::try_from(exp).unwrap_or(0) + 1;
        if digits.len() <= int_len {
            format!("{}{}", digits, "0".repeat(int_len - digits.len()))
        } else {
            format!("{}.{}", &digits[..int_len], &digits[int_len..])
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn render(src: &str, vars: &str) -> String {
        let t = ChatTemplate::new(src.into(), None, vec![], FloatStyle::Python).unwrap();
        let J::Obj(m) = J::parse(vars.as_bytes()).unwrap() else {
            panic!()
        };
        t.render(m, false).unwrap()
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
    fn floats_print_like_python_and_cpp() {
        for (f, py, cpp) in [
            (1.0, "1.0", "1"),
            (0.1, "0.1", "0.1"),
            (1e16, "1e+16", "1e+16"),
            (123456.0, "123456.0", "123456"),
            (1234567.0, "1234567.0", "1.23457e+06"),
            (0.0001, "0.0001", "0.0001"),
            (0.00001, "1e-05", "1e-05"),
            (-2.5, "-2.5", "-2.5"),
            (std::f64::consts::PI, "3.141592653589793", "3.14159"),
        ] {
            assert_eq!(python_float(f), py, "python {f}");
            assert_eq!(cpp_float(f), cpp, "cpp {f}");
        }
    }

    #[test]
    fn pycompat_methods_and_slicing() {
        let out = render(
            "{% for m in messages[::-1] %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}{% endfor %}{{ raise_exception is defined }}",
            r#"{"messages":[{"content":"a</think>\n\nb"},{"content":"c"}]}"#,
        );
        assert_eq!(out, "cbTrue");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
    }
}
