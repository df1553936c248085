//! Lists in words, for messages: `a, b or c`.

/// `names` as a list in words: `"a, b or c"`, `"a or b"`, `"a"`, or empty.
pub fn or_list<S: AsRef<str>>(names: &[S]) -> String {
    let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_joined_by_commas_and_its_last_by_or() {
        assert_eq!(or_list(&["a", "b", "c"]), "a, b or c");
        assert_eq!(or_list(&["a", "b"]), "a or b");
        assert_eq!(or_list(&["a"]), "a");
        assert_eq!(or_list::<&str>(&[]), "");
    }
}
