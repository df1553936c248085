//! Inline SVG charts (no assets, no script), each 240 × 60 px on a labelled scale with its
//! latest value written beside it: an alias's last five minutes a step per 10 s (requests,
//! time to first token p50 and p95, output tokens per second, errors), and a client's days
//! from the ledger. Laid out here, drawn by `templates/charts.html`.

use serde::Serialize;

use crate::observe::window::Point;

const CW: f64 = 240.0;
const CH: f64 = 60.0;
/// Room for the scale's labels left of the plot, and for the time's under it.
const LEFT: f64 = 44.0;
const BOTTOM: f64 = 12.0;

/// Every chart's frame, as `charts.html` draws it.
#[derive(Debug, Serialize)]
pub(crate) struct Frame {
    w: u32,
    h: u32,
    left: u32,
    /// The x of the scale's labels, and the y of zero.
    label_x: u32,
    y0: u32,
}

const FRAME: Frame = Frame {
    w: CW as u32,
    h: CH as u32,
    left: LEFT as u32,
    label_x: LEFT as u32 - 3,
    y0: (CH - BOTTOM) as u32,
};

/// One chart as `charts.html` draws it: its title, its scale's top, the time under its ends,
/// its bars and lines, and the value written beside it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Chart {
    frame: &'static Frame,
    class: &'static str,
    title: String,
    top: String,
    first: String,
    last: String,
    fill: &'static str,
    bars: Vec<Rect>,
    lines: Vec<Polyline>,
    val: String,
}

/// A bar, in px to a tenth.
#[derive(Clone, Debug, Serialize)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

/// A line through the steps that have a value; a dot where it has a single one.
#[derive(Clone, Debug, Serialize)]
struct Polyline {
    points: String,
    dashed: bool,
    dot: Option<[f64; 2]>,
}

/// `v` to a tenth, as the SVG's coordinates are written.
pub(crate) fn tenth(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// Bars of `values`, one per slot of the plot, scaled to `most`.
fn bars(values: &[f64], most: f64) -> Vec<Rect> {
    let bar = (CW - LEFT) / values.len().max(1) as f64;
    let plot = CH - BOTTOM - 2.0;
    let drawn = values
        .iter()
        .enumerate()
        .filter(|(_, v)| **v > 0.0 && most > 0.0);
    drawn
        .map(|(i, v)| {
            let h = (v / most * plot).max(1.0);
            Rect {
                x: tenth(LEFT + 1.0 + i as f64 * bar),
                y: tenth(CH - BOTTOM - h),
                w: tenth((bar - 1.0).max(0.5)),
                h: tenth(h),
            }
        })
        .collect()
}

/// A line through the steps of `values` that have one, scaled to `most` (none without any).
fn line(values: &[Option<f64>], most: f64, dashed: bool) -> Option<Polyline> {
    let step = (CW - LEFT) / values.len().max(1) as f64;
    let plot = CH - BOTTOM - 2.0;
    let points: Vec<[f64; 2]> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let y = CH - BOTTOM - (*v)? / most.max(f64::MIN_POSITIVE) * plot;
            Some([tenth(LEFT + (i as f64 + 0.5) * step), tenth(y)])
        })
        .collect();
    if points.is_empty() {
        return None;
    }
    let text: Vec<String> = points
        .iter()
        .map(|[x, y]| format!("{x:.1},{y:.1}"))
        .collect();
    Some(Polyline {
        points: text.join(" "),
        dashed,
        // A step alone has no line to draw: a dot shows it.
        dot: match points[..] {
            [only] => Some(only),
            _ => None,
        },
    })
}

/// The last five minutes, as the time under a chart of an alias's window.
const WINDOW: (&str, &str) = ("-5 min", "now");

/// An alias's window as four charts, a step per 10 s: requests, time to first token (p50 a
/// line, p95 dashed), output tokens per second, errors.
pub(crate) fn window(series: &[Point]) -> Vec<Chart> {
    let last = series.last().copied().unwrap_or_default();
    let requests: Vec<f64> = series.iter().map(|p| f64::from(p.requests)).collect();
    let p50: Vec<Option<f64>> = series.iter().map(|p| p.ttft_p50).collect();
    let p95: Vec<Option<f64>> = series.iter().map(|p| p.ttft_p95).collect();
    let most = p95
        .iter()
        .chain(&p50)
        .flatten()
        .fold(0.0_f64, |a, &b| a.max(b));
    let now = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.3} s"));
    let ttft = Chart {
        title: format!("time to first token p50 (line) and p95 (dashed) per 10 s, last 5 min (highest {most:.3} s)"),
        top: format!("{most:.2} s"),
        lines: [line(&p50, most, false), line(&p95, most, true)]
            .into_iter()
            .flatten()
            .collect(),
        val: format!("p50 {} · p95 {}", now(last.ttft_p50), now(last.ttft_p95)),
        ..chart("chart", String::new(), String::new(), WINDOW)
    };
    let tps: Vec<f64> = series.iter().map(|p| p.tokens as f64 / 10.0).collect();
    let errors: Vec<f64> = series.iter().map(|p| f64::from(p.errors)).collect();
    vec![
        steps(
            "requests per 10 s",
            &requests,
            format!("{} req", last.requests),
            "currentColor",
        ),
        ttft,
        steps(
            "output tokens per second",
            &tps,
            format!("{:.1} tok/s", last.tokens as f64 / 10.0),
            "currentColor",
        ),
        steps(
            "errors per 10 s",
            &errors,
            format!("{} errors", last.errors),
            "currentColor",
        ),
    ]
}

/// A chart titled `title` with `top` the scale's top and `ends` the time under it, nothing
/// drawn yet.
fn chart(class: &'static str, title: String, top: String, ends: (&str, &str)) -> Chart {
    Chart {
        frame: &FRAME,
        class,
        title,
        top,
        first: ends.0.to_string(),
        last: ends.1.to_string(),
        fill: "currentColor",
        bars: Vec::new(),
        lines: Vec::new(),
        val: String::new(),
    }
}

/// A client's GPU-seconds of each 10-second step of the last five minutes (oldest first), in
/// its colour `fill`, the window's sum written beside it.
pub(crate) fn gpu(values: &[f64], fill: &'static str) -> Chart {
    let sum: f64 = values.iter().sum();
    steps(
        "GPU-seconds per 10 s",
        values,
        format!("{sum:.1} GPU-s"),
        fill,
    )
}

/// A chart of bars of `values` (a step per 10 s) filled `fill`, `now` written beside it.
fn steps(what: &str, values: &[f64], now: String, fill: &'static str) -> Chart {
    let most = values.iter().copied().fold(0.0_f64, f64::max);
    let top = if most >= 10.0 {
        format!("{most:.0}")
    } else {
        format!("{most:.1}")
    };
    let title = format!("{what}, last 5 min (most {top})");
    Chart {
        fill,
        bars: bars(values, most),
        val: now,
        ..chart("chart", title, top, WINDOW)
    }
}

/// Bars of each day's `values` (oldest first, the first day starting at `first_ms`), 240 × 60
/// px: the scale's top and zero written on its axis, the first and last day under it, and the
/// last day's value beside it (`decimals` places).
pub(crate) fn days(what: &str, values: &[f64], first_ms: i64, decimals: usize) -> Chart {
    let most = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(1);
    let date = |i: usize| {
        let ms = first_ms.max(0) as u64 + i as u64 * 86_400_000;
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        humantime::format_rfc3339_seconds(at).to_string()[5..10].to_string()
    };
    let (first, last) = (date(0), date(n - 1));
    let title = format!("{what} per day, {first} to {last} (most {most:.decimals$})");
    let today = values.last().copied().unwrap_or(0.0);
    Chart {
        bars: bars(values, most),
        val: format!("{today:.decimals$} today"),
        ..chart("days", title, format!("{most:.decimals$}"), (&first, &last))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `charts` as the page draws them.
    fn drawn(charts: &[Chart]) -> String {
        super::super::templates::render_str(
            "{% from 'charts.html' import figure %}{% for c in charts %}{{ figure(c) }}{% endfor %}",
            minijinja::context! { charts },
        )
    }

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
        let out = drawn(&window(&series));
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
        // minijinja's escaper writes `/` as `&#x2f;`.
        assert!(
            out.contains("<span class=\"val\">12.0 tok&#x2f;s</span>"),
            "{out}"
        );
        assert!(out.contains("<span class=\"val\">1 errors</span>"), "{out}");
        // An empty window draws no bar and no line, yet its frame and labels.
        let empty = drawn(&window(&[Point::default(); 30]));
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
    fn a_lone_step_is_a_dot() {
        let mut values = vec![None; 30];
        values[29] = Some(0.5);
        let l = line(&values, 1.0, false).unwrap();
        assert_eq!(l.points, "236.7,25.0");
        assert_eq!(l.dot, Some([236.7, 25.0]));
        assert!(line(&[None; 30], 1.0, false).is_none());
    }

    #[test]
    fn days_are_bars_on_a_labelled_scale() {
        let values = [0.0, 50.0, 100.0];
        let out = drawn(&[days("tokens", &values, 1_796_515_200_000, 0)]);
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
