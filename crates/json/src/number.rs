//! JSON numbers read from text as serde_json reads them, for the spellings backends write.
//!
//! A whole answer's `usage` and `timings` hold a dozen numbers. Read each by serde_json's
//! deserializer (its setup, the `Option`, the check that nothing follows), they cost some 250
//! instructions apiece under callgrind; read here, in one pass that also finds where the
//! number ends, a few dozen. The readers take only what they can read exactly and answer
//! `None` for anything else (an exponent, a leading zero, more digits than they hold, text
//! that is not a number): the caller then asks serde_json.
//!
//! A decimal `d.f` is read as serde_json reads it (built, as here, without its
//! `float_roundtrip` feature): its digits as one integer, converted to an `f64`, divided by
//! the power of ten, each step rounded as there. Property tests hold every reading to
//! serde_json's, to the bit.

/// Powers of ten as `f64`, up to 10^22 (exact, and the literals serde_json divides by).
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Where the digits at `b[at..]` end, and `n` with them appended (wrapping past
/// `u64::MAX`: [`checked`] reads long runs again).
fn run(b: &[u8], at: usize, mut n: u64) -> (u64, usize) {
    let mut i = at;
    while let Some(&c) = b.get(i) {
        let d = c.wrapping_sub(b'0');
        if d >= 10 {
            break;
        }
        n = n.wrapping_mul(10).wrapping_add(u64::from(d));
        i += 1;
    }
    (n, i)
}

/// The digits of `text` (its `.` skipped) as one integer; `None` past `u64::MAX`. Nineteen
/// digits never pass it: only longer runs are read so.
fn checked(text: &[u8]) -> Option<u64> {
    text.iter()
        .filter(|c| c.is_ascii_digit())
        .try_fold(0u64, |n, c| {
            n.checked_mul(10)?.checked_add(u64::from(c - b'0'))
        })
}

/// The digits of a number's whole part at `b[at..]` (no leading zero): their value (wrapping)
/// and where they end; `None` when there are none or a leading zero.
fn whole(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let (n, end) = run(b, at, 0);
    let leading_zero = b.get(at) == Some(&b'0') && end > at + 1;
    (end > at && !leading_zero).then_some((n, end))
}

/// The number at `b[at..]` when it is written as plain digits (no sign, fraction, exponent
/// or leading zero) that a `u64` holds, as serde_json reads it into one; and where it ends.
pub fn u64_at(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let (n, end) = whole(b, at)?;
    if matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    let n = if end - at <= 19 {
        n
    } else {
        checked(&b[at..end])?
    };
    Some((n, end))
}

/// The number at `b[at..]` when it is written as an optional `-`, digits and an optional
/// fraction of at most 22 digits (no exponent, no leading zero), all of whose digits make an
/// integer a `u64` holds, as serde_json reads it into an `f64`; and where it ends.
pub fn f64_at(b: &[u8], at: usize) -> Option<(f64, usize)> {
    let negative = b.get(at) == Some(&b'-');
    let whole_at = at + usize::from(negative);
    let (mut n, mut end) = whole(b, whole_at)?;
    let mut places = 0;
    if b.get(end) == Some(&b'.') {
        let after;
        (n, after) = run(b, end + 1, n);
        places = after - end - 1;
        if places == 0 {
            return None;
        }
        end = after;
    }
    if matches!(b.get(end), Some(b'e' | b'E')) {
        return None;
    }
    let digits = end - whole_at - usize::from(places > 0);
    if digits > 19 {
        n = checked(&b[whole_at..end])?;
    }
    let f = n as f64 / *POW10.get(places)?;
    Some((if negative { -f } else { f }, end))
}

#[cfg(test)]
mod tests;
