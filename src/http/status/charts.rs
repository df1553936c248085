//! Small inline SVG charts of an alias's last five minutes (no assets, no script): requests
//! per 10-second step as bars, and the median time to first token per step as a line.

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
}
