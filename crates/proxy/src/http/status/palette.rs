//! The clients' colours on the status page, the same on the slot timelines and the clients'
//! charts: Okabe and Ito's palette, told apart with the common colour-vision deficiencies.

pub(crate) const PALETTE: [&str; 7] = [
    "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#F0E442",
];
/// Another client's requests, unnamed to the viewer.
pub(crate) const OTHER: &str = "#9aa4af";

/// The colour of client `name` among the configured `names` (requests of no named client the
/// palette's first).
pub(crate) fn colour(names: &[&str], name: &str) -> &'static str {
    let i = names.iter().position(|n| *n == name).map_or(0, |i| i + 1);
    PALETTE[i % PALETTE.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_has_its_colour_and_no_client_the_first() {
        let names = ["ann", "bob"];
        assert_eq!(colour(&names, "no client"), PALETTE[0]);
        assert_eq!(colour(&names, "ann"), PALETTE[1]);
        assert_eq!(colour(&names, "bob"), PALETTE[2]);
        assert_ne!(colour(&names, "ann"), OTHER);
    }
}
