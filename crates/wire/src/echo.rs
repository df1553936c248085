//! Client input as an error message repeats it: a model name, a path or a parse error,
//! bounded and cut at a character boundary, with its whole length when it was longer.

use std::fmt;

/// Most bytes of one piece of client input (a model name, a path, a header value) that an
/// error message, and so a log line, repeats.
pub const ECHO_LIMIT: usize = 256;
/// Most bytes of a free-form message, which may quote input (as serde's errors do).
pub const MESSAGE_LIMIT: usize = 1024;

/// Client input as an error repeats it: its first `ECHO_LIMIT` bytes (cut at a character
/// boundary), then, if there was more, `…` and the input's whole length. Made from the input
/// without copying more than it shows.
#[derive(Clone, PartialEq, Eq)]
pub struct Echo {
    shown: String,
    len: usize,
}

impl Echo {
    pub fn new(input: &str) -> Echo {
        Echo::of(input, ECHO_LIMIT)
    }

    /// The first `limit` bytes of what `input` displays as.
    pub(crate) fn of(input: impl fmt::Display, limit: usize) -> Echo {
        let mut w = Capped {
            shown: String::new(),
            limit,
            len: 0,
            cut: false,
        };
        let _ = fmt::write(&mut w, format_args!("{input}"));
        Echo {
            shown: w.shown,
            len: w.len,
        }
    }

    fn suffix(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len > self.shown.len() {
            write!(f, "… ({} bytes)", self.len)?;
        }
        Ok(())
    }
}

impl fmt::Display for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)?;
        self.suffix(f)
    }
}

impl fmt::Debug for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.shown)?;
        self.suffix(f)
    }
}

/// A writer that keeps the first `limit` bytes written to it and counts the rest.
struct Capped {
    shown: String,
    limit: usize,
    len: usize,
    /// Something was left out: nothing more is kept, so what is shown is a prefix.
    cut: bool,
}

impl fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.len += s.len();
        if !self.cut {
            let mut n = s.len().min(self.limit - self.shown.len());
            self.cut = n < s.len();
            while !s.is_char_boundary(n) {
                n -= 1;
            }
            self.shown.push_str(&s[..n]);
        }
        Ok(())
    }
}

/// A free-form message displayed with at most `MESSAGE_LIMIT` of its bytes.
pub(crate) struct Clip<'a>(pub(crate) &'a str);

impl fmt::Display for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= MESSAGE_LIMIT {
            return f.write_str(self.0);
        }
        fmt::Display::fmt(&Echo::of(self.0, MESSAGE_LIMIT), f)
    }
}

/// A message made from `e` (a parse error, say, which may quote the input), bounded.
pub fn bounded(e: impl fmt::Display) -> String {
    Echo::of(e, MESSAGE_LIMIT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_are_cut_at_a_character_boundary_with_the_length() {
        assert_eq!(Echo::new("frank").to_string(), "frank");
        assert_eq!(format!("{:?}", Echo::new("a\"b")), "\"a\\\"b\"");
        let huge = "é".repeat(20 << 20);
        let e = Echo::new(&huge);
        assert_eq!(
            e.to_string(),
            format!("{}… (41943040 bytes)", "é".repeat(128))
        );
        // 255 bytes: the 128th `é` does not fit and is left out, not split.
        let e = Echo::of(&huge, 255);
        assert_eq!(
            e.to_string(),
            format!("{}… (41943040 bytes)", "é".repeat(127))
        );
        assert_eq!(
            Echo::of(format_args!("{}{}", "ab", "é"), 3).to_string(),
            "ab… (4 bytes)"
        );
        assert_eq!(
            Echo::of(format_args!("{}{}", "é", "x"), 1).to_string(),
            "… (3 bytes)"
        );
    }
}
