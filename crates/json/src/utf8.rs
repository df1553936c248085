//! Cutting UTF-8 text at a character boundary (`str::floor_char_boundary` is newer than the
//! crate's minimum Rust).

/// The last character boundary of `s` at or before byte `at` (its length when `at` is past
/// its end).
pub fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The longest start of `s` within `max` bytes that ends at a character boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    &s[..floor_char_boundary(s, max)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_never_falls_inside_a_character() {
        assert_eq!(
            floor_char_boundary("héllo", 2),
            1,
            "not inside the two bytes of é"
        );
        assert_eq!(floor_char_boundary("héllo", 3), 3);
        assert_eq!(floor_char_boundary("hi", 64), 2);
        assert_eq!(floor_char_boundary("😀", 3), 0);
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("hi", 64), "hi");
    }
}
