//! Inline SVG charts (no assets, no script), each 240 × 60 px on a labelled scale with its
//! latest value written beside it: an alias's last five minutes a step per 10 s (requests,
//! time to first token p50 and p95, output tokens per second, errors), and a client's days
//! from the ledger.

use std::fmt::Write;

use crate::observe::window::Point;

const CW: f64 = 240.0;
const CH: f64 = 60.0;
/// Room for the scale's labels left of the plot, and for the time's under it.
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 12.0;

/// The frame of a chart titled `title`: the axis with `top` and zero written on it, `first`
/// and `last` under it.
fn frame(out: &mut String, class: &str, title: &str, top: &str, ends: (&str, &str)) {
    let _ = write!(
        out,
        "<span class=\"fig\"><svg class=\"{class}\" width=\"{CW}\" height=\"{CH}\" viewBox=\"0 0 {CW} {CH}\" role=\"img\">\
         <title>{title}</title>\
         <line x1=\"{LEFT}\" y1=\"2\" x2=\"{LEFT}\" y2=\"{y0}\" stroke=\"currentColor\" stroke-width=\"0.5\"/>\
         <line x1=\"{LEFT}\" y1=\"{y0}\" x2=\"{CW}\" y2=\"{y0}\" stroke=\"currentColor\" stroke-width=\"0.5\"/>\
         <text x=\"{lx}\" y=\"9\" text-anchor=\"end\" font-size=\"9\">{top}</text>\
         <text x=\"{lx}\" y=\"{y0}\" text-anchor=\"end\" font-size=\"9\">0</text>\
         <text x=\"{LEFT}\" y=\"{CH}\" font-size=\"9\" dy=\"-1\">{first}</text>\
         <text x=\"{CW}\" y=\"{CH}\" font-size=\"9\" dy=\"-1\" text-anchor=\"end\">{last}</text>",
        y0 = CH - BOTTOM,
        lx = LEFT - 3.0,
        first = ends.0,
        last = ends.1,
    );
}

/// Bars of `values`, one per slot of the plot, scaled to `most`, filled `fill`.
fn bars(out: &mut String, values: &[f64], most: f64, fill: &str) {
    let bar = (CW - LEFT) / values.len().max(1) as f64;
    let plot = CH - BOTTOM - 2.0;
    for (i, v) in values.iter().enumerate() {
        if *v <= 0.0 || most <= 0.0 {
            continue;
        }
        let h = (v / most * plot).max(1.0);
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{fill}\"/>",
            LEFT + 1.0 + i as f64 * bar,
            CH - BOTTOM - h,
            (bar - 1.0).max(0.5)
        );
    }
}

/// A line through the steps of `values` that have one, scaled to `most`.
fn line(out: &mut String, values: &[Option<f64>], most: f64, dashed: bool) {
    let step = (CW - LEFT) / values.len().max(1) as f64;
    let plot = CH - BOTTOM - 2.0;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let y = CH - BOTTOM - (*v)? / most.max(f64::MIN_POSITIVE) * plot;
            Some(format!("{:.1},{y:.1}", LEFT + (i as f64 + 0.5) * step))
        })
        .collect();
    if points.is_empty() {
        return;
    }
    let dash = if dashed {
        " stroke-dasharray=\"3 2\""
    } else {
        ""
    };
    let _ = write!(
        out,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.2\"{dash}/>",
        points.join(" ")
    );
    // A step alone has no line to draw: a dot shows it.
    if points.len() == 1 {
        let (x, y) = points[0].split_once(',').unwrap_or(("0", "0"));
        let _ = write!(
            out,
            "<circle cx=\"{x}\" cy=\"{y}\" r=\"1.5\" fill=\"currentColor\"/>"
        );
    }
}

/// The last five minutes, as the time under a chart of an alias's window.
const WINDOW: (&str, &str) = ("-5 min", "now");

/// An alias's window as four charts, a step per 10 s: requests, time to first token (p50 a
/// line, p95 dashed), output tokens per second, errors.
pub(crate) fn window(out: &mut String, series: &[Point]) {
    let last = series.last().copied().unwrap_or_default();
    let requests: Vec<f64> = series.iter().map(|p| f64::from(p.requests)).collect();
    counts(
        out,
        "requests per 10 s",
        &requests,
        &format!("{} req", last.requests),
    );
    let p50: Vec<Option<f64>> = series.iter().map(|p| p.ttft_p50).collect();
    let p95: Vec<Option<f64>> = series.iter().map(|p| p.ttft_p95).collect();
    let most = p95
        .iter()
        .chain(&p50)
        .flatten()
        .fold(0.0_f64, |a, &b| a.max(b));
    frame(
        out,
        "chart",
        &format!("time to first token p50 (line) and p95 (dashed) per 10 s, last 5 min (highest {most:.3} s)"),
        &format!("{most:.2} s"),
        WINDOW,
    );
    line(out, &p50, most, false);
    line(out, &p95, most, true);
    let now = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.3} s"));
    let _ = write!(
        out,
        "</svg><span class=\"val\">p50 {} · p95 {}</span></span>",
        now(last.ttft_p50),
        now(last.ttft_p95)
    );
    let tps: Vec<f64> = series.iter().map(|p| p.tokens as f64 / 10.0).collect();
    counts(
        out,
        "output tokens per second",
        &tps,
        &format!("{:.1} tok/s", last.tokens as f64 / 10.0),
    );
    let errors: Vec<f64> = series.iter().map(|p| f64::from(p.errors)).collect();
    counts(
        out,
        "errors per 10 s",
        &errors,
        &format!("{} errors", last.errors),
    );
}

/// A client's GPU-seconds of each 10-second step of the last five minutes (oldest first), in
/// its colour `fill`, the window's sum written beside it.
pub(crate) fn gpu(out: &mut String, values: &[f64], fill: &str) {
    let sum: f64 = values.iter().sum();
    steps(
        out,
        "GPU-seconds per 10 s",
        values,
        &format!("{sum:.1} GPU-s"),
        fill,
    );
}

/// A chart of bars of `values` (a step per 10 s), `now` written beside it.
fn counts(out: &mut String, what: &str, values: &[f64], now: &str) {
    steps(out, what, values, now, "currentColor");
}

/// A chart of bars of `values` (a step per 10 s) filled `fill`, `now` written beside it.
fn steps(out: &mut String, what: &str, values: &[f64], now: &str, fill: &str) {
    let most = values.iter().copied().fold(0.0_f64, f64::max);
    let top = if most >= 10.0 {
        format!("{most:.0}")
    } else {
        format!("{most:.1}")
    };
    frame(
        out,
        "chart",
        &format!("{what}, last 5 min (most {top})"),
        &top,
        WINDOW,
    );
    bars(out, values, most, fill);
    let _ = write!(out, "</svg><span class=\"val\">{now}</span></span>");
}

/// Bars of each day's `values` (oldest first, the first day starting at `first_ms`), 240 × 60
/// px: the scale's top and zero written on its axis, the first and last day under it, and the
/// last day's value beside it (`decimals` places).
pub(crate) fn days(out: &mut String, what: &str, values: &[f64], first_ms: i64, decimals: usize) {
    let most = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(1);
    let date = |i: usize| {
        let ms = first_ms.max(0) as u64 + i as u64 * 86_400_000;
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        humantime::format_rfc3339_seconds(at).to_string()[5..10].to_string()
    };
    let (first, last) = (date(0), date(n - 1));
    let title = format!("{what} per day, {first} to {last} (most {most:.decimals$})");
    frame(
        out,
        "days",
        &title,
        &format!("{most:.decimals$}"),
        (&first, &last),
    );
    bars(out, values, most, "currentColor");
    let _ = write!(
        out,
        "</svg><span class=\"val\">{:.decimals$} today</span></span>",
        values.last().copied().unwrap_or(0.0)
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_alias_window_is_four_labelled_charts() {
        let mut series = vec![Point::default(); 30];
        series[28] = Point {
            requests: 2,
            errors: 0,
            tokens: 40,
            ttft_p50: Some(0.5),
            ttft_p95: Some(1.0),
        };
        series[29] = Point {
            requests: 4,
            errors: 1,
            tokens: 120,
            ttft_p50: Some(0.25),
            ttft_p95: Some(0.5),
        };
        let mut out = String::new();
        window(&mut out, &series);
        assert_eq!(
            out.matches("<svg class=\"chart\" width=\"240\" height=\"60\"")
                .count(),
            4
        );
        assert_eq!(out.matches(">-5 min</text>").count(), 4, "{out}");
        assert_eq!(out.matches(">now</text>").count(), 4, "{out}");
        // Requests: the busiest step is the scale's top, each step with requests a bar.
        assert!(out.contains(">4.0</text>"), "{out}");
        assert!(out.contains("<span class=\"val\">4 req</span>"), "{out}");
        assert!(
            out.contains("<span class=\"val\">p50 0.250 s · p95 0.500 s</span>"),
            "{out}"
        );
        assert!(out.contains(">1.00 s</text>"), "{out}");
        assert_eq!(out.matches("<polyline").count(), 2, "{out}");
        assert!(out.contains("stroke-dasharray"), "{out}");
        assert!(
            out.contains("<span class=\"val\">12.0 tok/s</span>"),
            "{out}"
        );
        assert!(out.contains("<span class=\"val\">1 errors</span>"), "{out}");
        // An empty window draws no bar and no line, yet its frame and labels.
        let mut empty = String::new();
        window(&mut empty, &[Point::default(); 30]);
        assert!(
            !empty.contains("<rect") && !empty.contains("<polyline"),
            "{empty}"
        );
        assert!(
            empty.contains("<span class=\"val\">p50 – · p95 –</span>"),
            "{empty}"
        );
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
            out.ends_with("<span class=\"val\">100 today</span></span>"),
            "{out}"
        );
    }
}
