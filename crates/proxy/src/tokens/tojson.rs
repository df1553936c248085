//! `tojson` as the backends' Jinja engines print it: Python `json.dumps` or llama.cpp's copy.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::json::{JArr, JMap};

/// How `tojson` prints a float: Python's `repr` (HF transformers, vLLM, SGLang) or C++
/// `std::ostream` with its default precision of 6 (llama.cpp's Jinja engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatStyle {
    Python,
    Cpp,
}

/// `tojson` as HF transformers defines it (`json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`) and llama.cpp mirrors; minijinja's own escapes HTML.
pub(super) fn tojson(
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
pub(crate) fn python_float(f: f64) -> String {
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
        push_scientific(&mut s, &digits, exp);
    }
    s
}

/// C++ `std::ostream << double` with the default precision 6 (`%g`).
pub(crate) fn cpp_float(f: f64) -> String {
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
        push_scientific(&mut s, digits, exp);
    }
    s
}

/// `d.ddde±XX`, the exponent form Python and C++ share.
fn push_scientific(s: &mut String, digits: &str, exp: i32) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
}
