//! Inline SVG charts (no assets, no script): an alias's last five minutes, small (requests
//! per 10-second step as bars, the median time to first token per step as a line), and a
//! client's days from the ledger, with a labelled scale.

use std::fmt::Write;

const W: f64 = 90.0;
const H: f64 = 18.0;

/// Bars of the requests of each step, scaled to the busiest one.
pub fn requests(out: &mut String, series: &[(u32, Option<f64>)]) {
    let most = series.iter().map(|s| s.0).max().unwrap_or(0);
    let n = series.len().max(1) as f64;
    let bar = W / n;
    let _ = write!(
        out,
        "<svg class=\"spark\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\">\
         <title>requests per 10 s, last 5 min (most {most})</title>"
    );
    for (i, (count, _)) in series.iter().enumerate() {
        if *count == 0 || most == 0 {
            continue;
        }
        let h = (f64::from(*count) / f64::from(most) * H).max(1.0);
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"currentColor\"/>",
            i as f64 * bar,
            H - h,
            (bar - 0.5).max(0.5)
        );
    }
    out.push_str("</svg>");
}

/// A line through the median time to first token of each step that has one.
pub fn ttft(out: &mut String, series: &[(u32, Option<f64>)]) {
    let most = series.iter().filter_map(|s| s.1).fold(0.0_f64, f64::max);
    let n = series.len().max(2) as f64;
    let _ = write!(
        out,
        "<svg class=\"spark\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\">\
         <title>median time to first token per 10 s, last 5 min (highest {most:.3} s)</title>"
    );
    let points: Vec<String> = series
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let v = s.1?;
            let y = if most > 0.0 {
                H - v / most * (H - 1.0)
            } else {
                H - 1.0
            };
            Some(format!("{:.1},{y:.1}", i as f64 * W / (n - 1.0)))
        })
        .collect();
    if !points.is_empty() {
        let _ = write!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.2\"/>",
            points.join(" ")
        );
    }
    out.push_str("</svg>");
}

/// Bars of each day's `values` (oldest first, the first day starting at `first_ms`), 240 × 60
/// px: the scale's top and zero written on its axis, the first and last day under it, and the
/// last day's value beside it (`decimals` places).
pub fn days(out: &mut String, what: &str, values: &[f64], first_ms: i64, decimals: usize) {
    const DW: f64 = 240.0;
    const DH: f64 = 60.0;
    const LEFT: f64 = 44.0;
    const BOTTOM: f64 = 12.0;
    let most = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(1);
    let bar = (DW - LEFT) / n as f64;
    let plot = DH - BOTTOM - 2.0;
    let date = |i: usize| {
        let ms = first_ms.max(0) as u64 + i as u64 * 86_400_000;
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        humantime::format_rfc3339_seconds(at).to_string()[5..10].to_string()
    };
    let (first, last) = (date(0), date(n - 1));
    let _ = write!(
        out,
        "<svg class=\"days\" width=\"{DW}\" height=\"{DH}\" viewBox=\"0 0 {DW} {DH}\" role=\"img\">\
         <title>{what} per day, {first} to {last} (most {most:.decimals$})</title>\
         <line x1=\"{LEFT}\" y1=\"2\" x2=\"{LEFT}\" y2=\"{y0}\" stroke=\"currentColor\" stroke-width=\"0.5\"/>\
         <text x=\"{lx}\" y=\"9\" text-anchor=\"end\" font-size=\"9\">{most:.decimals$}</text>\
         <text x=\"{lx}\" y=\"{y0}\" text-anchor=\"end\" font-size=\"9\">0</text>",
        y0 = DH - BOTTOM,
        lx = LEFT - 3.0,
    );
    for (i, v) in values.iter().enumerate() {
        if *v <= 0.0 || most <= 0.0 {
            continue;
        }
        let h = (v / most * plot).max(1.0);
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"currentColor\"/>",
            LEFT + 1.0 + i as f64 * bar,
            DH - BOTTOM - h,
            (bar - 1.0).max(0.5)
        );
    }
    let _ = write!(
        out,
        "<text x=\"{LEFT}\" y=\"{DH}\" font-size=\"9\" dy=\"-1\">{first}</text>\
         <text x=\"{DW}\" y=\"{DH}\" font-size=\"9\" dy=\"-1\" text-anchor=\"end\">{last}</text></svg>\
         <span class=\"val\">{:.decimals$} today</span>",
        values.last().copied().unwrap_or(0.0)
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bars_and_line_follow_the_steps() {
        let series = vec![(0, None), (2, Some(0.5)), (4, Some(1.0))];
        let mut out = String::new();
        requests(&mut out, &series);
        assert_eq!(out.matches("<rect").count(), 2);
        assert!(out.contains("height=\"18.0\""), "{out}");
        assert!(out.contains("height=\"9.0\""), "{out}");
        let mut line = String::new();
        ttft(&mut line, &series);
        assert!(line.contains("points=\"45.0,9.5 90.0,1.0\""), "{line}");
        let mut empty = String::new();
        ttft(&mut empty, &[(0, None)]);
        assert!(!empty.contains("polyline"));
    }

    #[test]
    fn days_are_bars_on_a_labelled_scale() {
        let mut out = String::new();
        let values = [0.0, 50.0, 100.0];
        days(&mut out, "tokens", &values, 1_796_515_200_000, 0);
        assert_eq!(out.matches("<rect").count(), 2);
        assert!(out.contains("width=\"240\" height=\"60\""), "{out}");
        assert!(
            out.contains(">100</text>") && out.contains(">0</text>"),
            "{out}"
        );
        assert!(
            out.contains(">12-06</text>") && out.contains(">12-08</text>"),
            "{out}"
        );
        assert!(
            out.ends_with("<span class=\"val\">100 today</span>"),
            "{out}"
        );
    }
}
