//! The status page as HTML: one self-contained document (inline CSS, a small inline script),
//! every value from the config or the fleet escaped on the way out.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::escape::E;
use super::span::span;
use super::view::{AliasView, BackendView, Fleet};
use crate::live::reload::ReloadOutcome;

/// How often the script fetches the page again and swaps in its `#status` part.
pub const REFRESH_SECS: u64 = 5;
/// With JavaScript off, the whole page reloads itself this often instead.
const NOSCRIPT_REFRESH_SECS: u64 = 30;

/// The CSS class and the words of a backend state. A breaker state is one more arm here
/// (its class, `breaker`, is styled already).
fn state_cell(state: &str) -> (&'static str, &'static str) {
    match state {
        "up" => ("up", "up"),
        "loading" => ("loading", "loading"),
        "down" => ("down", "down"),
        "breaker_open" => ("breaker", "breaker open"),
        _ => ("unknown", "not probed yet"),
    }
}

/// The whole document. `nonce` is the Content-Security-Policy nonce of its style and script.
pub(crate) fn render(fleet: &Fleet, nonce: &str) -> String {
    let mut out = String::with_capacity(8 * 1024 + fleet.aliases.len() * 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>Switchboard status</title>\n<link rel=\"icon\" href=\"data:,\">\n\
         <noscript><meta http-equiv=\"refresh\" content=\"{NOSCRIPT_REFRESH_SECS}\"></noscript>\n\
         <style nonce=\"{n}\">{STYLE}</style>\n</head>\n<body>\n<header><h1>Switchboard</h1>\
         <span class=\"version\">version {v}</span>\
         <span id=\"stale\" class=\"stale-note\" hidden></span></header>\n",
        n = E(nonce),
        v = E(fleet.version),
    );
    status_section(&mut out, fleet);
    let _ = write!(
        out,
        "<footer><p>Requests, errors and context rejections: the last 5 minutes, in \
         10-second steps. Errors: 5xx answers and streams that ended in an error. \
         Medians come from bins four to an octave wide, so they can differ a little from \
         those of the histograms in <a href=\"/metrics\">/metrics</a>. \
         In flight counts requests waiting for a slot too.</p>\
         <p><span class=\"js-only\">Refreshes every {REFRESH_SECS} s.</span>\
         <noscript>JavaScript is off: the page reloads every {NOSCRIPT_REFRESH_SECS} s.</noscript> \
         Also: <a href=\"/v1/models\">/v1/models</a> · <a href=\"/health\">/health</a></p></footer>\n\
         <script nonce=\"{n}\">{SCRIPT}({ms});</script>\n</body>\n</html>\n",
        n = E(nonce),
        ms = REFRESH_SECS * 1000,
    );
    out
}

/// The part the script replaces on each refresh.
fn status_section(out: &mut String, fleet: &Fleet) {
    let now = unix(fleet.now);
    let now_ms = fleet
        .now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let _ = write!(
        out,
        "<main id=\"status\" data-generated=\"{now_ms}\">\n<p class=\"meta\">As of {} · up {} · ",
        utc(now),
        span(Duration::from_secs(now.saturating_sub(fleet.started))),
    );
    match fleet.reload {
        None => out.push_str("config as loaded at start, no reload since"),
        Some(r) => {
            let at = unix(r.at);
            let ago = span(Duration::from_secs(now.saturating_sub(at)));
            let _ = match r.outcome {
                ReloadOutcome::Applied => write!(
                    out,
                    "last reload: <span class=\"ok\">applied</span> at {} ({ago} ago)",
                    utc(at)
                ),
                ReloadOutcome::Refused { errors } => write!(
                    out,
                    "last reload: <span class=\"bad\">refused</span> at {} ({ago} ago), \
                     {errors} error{} in the log; the config before it stays in force",
                    utc(at),
                    if errors == 1 { "" } else { "s" }
                ),
            };
        }
    }
    match &fleet.shared {
        None => {}
        Some(sh) if sh.up => {
            let _ = write!(
                out,
                " · shared state {}: <span class=\"ok\">up</span>, slots and client limits counted across processes",
                E(&sh.store)
            );
        }
        Some(sh) => {
            let _ = write!(
                out,
                " · shared state {}: <span class=\"bad\">unreachable</span>, slots and client limits counted by this process alone",
                E(&sh.store)
            );
        }
    }
    if let Some(l) = &fleet.ledger {
        super::usage::line(out, l);
    }
    out.push_str("</p>\n");
    if fleet.aliases.is_empty() {
        out.push_str("<p>No aliases are configured.</p>\n</main>\n");
        return;
    }
    out.push_str(
        "<table>\n<thead><tr><th>alias</th><th>backend</th><th class=\"n\">in flight</th>\
         <th class=\"n\">queued</th><th class=\"n\">requests<br>5 min</th>\
         <th class=\"n\">errors<br>5 min</th><th class=\"n\">TTFT<br>p50</th>\
         <th class=\"n\">decode<br>tok/s p50</th><th class=\"n\">context<br>rejections</th>\
         <th class=\"n\">window</th></tr></thead>\n<tbody>\n",
    );
    for a in &fleet.aliases {
        alias_row(out, a);
    }
    out.push_str("</tbody>\n</table>\n");
    super::slots::render(out, &fleet.timelines);
    super::clients::render(out, &fleet.clients);
    super::batches::render(out, &fleet.batches, now);
    if let Some(l) = &fleet.ledger {
        super::usage::render(out, l);
    }
    out.push_str("</main>\n");
}

fn alias_row(out: &mut String, a: &AliasView) {
    let w = &a.last_5m;
    let _ = write!(
        out,
        "<tr data-alias=\"{n}\"><td class=\"alias\"><b>{n}</b>",
        n = E(&a.name)
    );
    if let Some(d) = &a.description {
        let _ = write!(out, "<div class=\"desc\">{}</div>", E(d));
    }
    if !a.old_names.is_empty() {
        out.push_str("<div class=\"old\">also answers to ");
        for (i, old) in a.old_names.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(out, "{sep}{}", E(old));
        }
        out.push_str("</div>");
    }
    if a.prompt_tokens > 0 {
        let share = a.cached_tokens as f64 / a.prompt_tokens as f64;
        let _ = write!(
            out,
            "<div class=\"cached\">prompt tokens from cache: {:.0} %</div>",
            share * 100.0
        );
    }
    out.push_str("</td><td>");
    for b in &a.backends {
        backend_cell(out, b);
    }
    let errors = if w.errors > 0 { " bad" } else { "" };
    let rejections = if w.rejections > 0 { " warn" } else { "" };
    let _ = writeln!(
        out,
        "</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n{errors}\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n{rejections}\">{}</td><td class=\"n\">{}</td></tr>",
        a.inflight,
        a.queued,
        w.requests,
        w.errors,
        w.ttft_p50.map_or("–".into(), seconds),
        w.decode_p50.map_or("–".into(), |v| format!("{v:.0}")),
        w.rejections,
        a.context_window.map_or("–".into(), |n| n.to_string()),
    );
    if !a.series.is_empty() {
        let _ = write!(
            out,
            "<tr class=\"charts\" data-charts=\"{}\"><td colspan=\"10\">",
            E(&a.name)
        );
        super::charts::window(out, &a.series);
        out.push_str("</td></tr>\n");
    }
}

fn backend_cell(out: &mut String, b: &BackendView) {
    let (class, words) = state_cell(b.state);
    let _ = write!(
        out,
        "<div class=\"backend\" data-backend=\"{n}\"><span class=\"state {class}\">{words}</span> \
         <b>{n}</b> <span class=\"dim\">{f} · {busy}/{slots} slots busy · queue {q}</span>\
         <div class=\"url\">{u}</div>",
        n = E(&b.name),
        f = E(b.flavor),
        busy = b.busy,
        slots = b.slots,
        q = b.queue_limit,
        u = E(&b.url),
    );
    let c = &b.cost;
    let half = c.prefill_half_depth.map_or(String::new(), |d| {
        format!(", half at {}k deep", (d / 1000.0).round())
    });
    let _ = write!(
        out,
        "<div class=\"dim cost\">prefill {:.0} tok/s{half} · decode {:.1} tok/s · learned from {:.0} answers</div>",
        c.prefill_tps, c.decode_tps, c.learned,
    );
    if !b.queue.is_empty() {
        out.push_str("<div class=\"dim waits\">waiting:");
        for (class, wait) in b.queue.iter().take(8) {
            let _ = write!(out, " {class} {}", seconds(wait.as_secs_f64()));
        }
        if b.queue.len() > 8 {
            let _ = write!(out, " and {} more", b.queue.len() - 8);
        }
        out.push_str("</div>");
    }
    out.push_str("</div>");
}

/// Seconds as the TTFT column shows them.
fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `2025-01-31 23:59:59 UTC`.
fn utc(secs: u64) -> String {
    let t = UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let iso = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} UTC", iso.trim_end_matches('Z').replace('T', " "))
}

const STYLE: &str = "\
.charts svg{vertical-align:middle;margin:2px 4px 2px 0;color:#4a7}\
.progress{vertical-align:middle}.progress .left{fill:var(--line)}.progress .done{fill:var(--up)}\
.progress .failed{fill:var(--down)}\
.fig{display:inline-block;white-space:nowrap;margin-right:.75rem}\
.fig svg{vertical-align:middle;margin:2px 4px 2px 0}\
.timeline h3{font-size:14px;margin:.6rem 0 .2rem}.timeline svg{max-width:100%}\
.timeline .slots{vertical-align:top}.queue{display:inline-block;vertical-align:top;\
margin-left:1rem;font-size:12px;max-width:22rem}.queue ol{margin:.2rem 0;padding-left:1.4rem}\
.queue ul{margin:.2rem 0;padding-left:.4rem;list-style:none}\
.legend{font-size:12px}.legend span{margin-right:.9rem}\
.fig .val{font-size:12px;font-variant-numeric:tabular-nums}\
tr.charts td{border-bottom:1px solid var(--line)}\
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--dim:#5b6470;--line:#d8dde3;\
--up:#1a7f37;--loading:#9a6700;--down:#cf222e;--breaker:#8250df;--head:#f3f5f7}\
@media (prefers-color-scheme:dark){:root{--bg:#0f1216;--fg:#e6e9ed;--dim:#9aa4af;\
--line:#2c333b;--up:#3fb950;--loading:#d29922;--down:#f85149;--breaker:#a371f7;--head:#171b21}}\
body{margin:0;padding:1rem 1.5rem;background:var(--bg);color:var(--fg);\
font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif}\
header{display:flex;align-items:baseline;gap:1rem;flex-wrap:wrap}\
h1{font-size:1.4rem;margin:0 0 .25rem}.version,.meta,.dim,.desc,.old,.url,footer{color:var(--dim)}\
.url{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}\
table{border-collapse:collapse;width:100%;margin:.5rem 0 1rem}\
th,td{border-bottom:1px solid var(--line);padding:.45rem .6rem;vertical-align:top;text-align:left}\
th{background:var(--head);font-weight:600;font-size:12px}\
.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
.alias b{font-size:15px}.backend+.backend{margin-top:.4rem}\
.state{display:inline-block;min-width:4.5em;text-align:center;border-radius:1em;\
padding:0 .55em;font-size:12px;font-weight:600;color:#fff;background:var(--dim)}\
.state.up{background:var(--up)}.state.loading{background:var(--loading)}\
.state.down{background:var(--down)}.state.breaker{background:var(--breaker)}\
.bad{color:var(--down);font-weight:600}.warn{color:var(--loading);font-weight:600}\
.ok{color:var(--up);font-weight:600}.stale-note{color:var(--down)}\
#status.stale{opacity:.6}.js-only{display:none}html.js .js-only{display:inline}\
footer{font-size:12px;max-width:60rem}a{color:inherit}";

/// Fetch the page again every few seconds and swap in its `#status` part; on failure keep
/// the last one, dimmed, with the reason. `data-refreshes` on `<html>` counts the swaps.
/// Called with the interval in milliseconds.
const SCRIPT: &str = "(function(every){\
var root=document.documentElement,n=0;root.classList.add('js');\
function note(t){var s=document.getElementById('stale');s.textContent=t;s.hidden=!t;}\
function tick(){fetch(location.pathname+location.search,{cache:'no-store',\
credentials:'same-origin',headers:{accept:'text/html'}})\
.then(function(r){if(!r.ok){throw new Error('HTTP '+r.status);}return r.text();})\
.then(function(t){var fresh=new DOMParser().parseFromString(t,'text/html')\
.getElementById('status'),old=document.getElementById('status');\
if(!fresh||!old){throw new Error('no status in the answer');}\
old.replaceWith(fresh);n+=1;root.dataset.refreshes=String(n);note('');})\
.catch(function(e){var old=document.getElementById('status');\
if(old){old.classList.add('stale');}note('not refreshed: '+e.message);})\
.then(function(){setTimeout(tick,every);});}\
setTimeout(tick,every);})";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::status::view::CostView;
    use crate::observe::window::Summary;

    fn fleet(description: &str) -> Fleet {
        Fleet {
            version: "0.0.0",
            now: UNIX_EPOCH + Duration::from_secs(1_735_689_599),
            started: 1_735_689_000,
            reload: None,
            shared: None,
            clients: Vec::new(),
            ledger: None,
            timelines: Vec::new(),
            batches: Vec::new(),
            aliases: vec![AliasView {
                name: "a<b>".into(),
                description: Some(description.into()),
                old_names: vec!["old\"name".into()],
                context_window: Some(4096),
                backends: vec![BackendView {
                    name: "gpu'1".into(),
                    flavor: "llamacpp",
                    url: "http://gpu1:8000/?<x>".into(),
                    state: "down",
                    busy: 1,
                    slots: 4,
                    queue_limit: 64,
                    cost: CostView {
                        prefill_tps: 3950.4,
                        prefill_half_depth: Some(98_000.0),
                        decode_tps: 40.04,
                        learned: 12.0,
                    },
                    queue: vec![("batch", Duration::from_millis(4200))],
                }],
                inflight: 2,
                queued: 1,
                prompt_tokens: 1000,
                cached_tokens: 630,
                last_5m: Summary {
                    requests: 10,
                    errors: 1,
                    rejections: 0,
                    ttft_p50: Some(0.25),
                    decode_p50: Some(41.6),
                },
                series: vec![crate::observe::window::Point {
                    requests: 1,
                    ttft_p50: Some(0.25),
                    ..Default::default()
                }],
            }],
        }
    }

    #[test]
    fn a_script_in_a_description_comes_out_escaped() {
        let html = render(&fleet("<script>alert('x')</script> & more"), "n0nce");
        assert!(
            html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more"),
            "{html}"
        );
        // The page's own script is the only one.
        assert_eq!(html.matches("<script").count(), 1, "{html}");
        assert!(!html.contains("alert('x')"));
        // Names, old names and URLs from the config are escaped as well, in text and attributes.
        for escaped in [
            "<b>a&lt;b&gt;</b>",
            "data-alias=\"a&lt;b&gt;\"",
            "old&quot;name",
            "data-backend=\"gpu&#39;1\"",
            "http://gpu1:8000/?&lt;x&gt;",
        ] {
            assert!(html.contains(escaped), "{escaped} in {html}");
        }
    }

    #[test]
    fn the_row_shows_state_load_and_the_window() {
        let html = render(&fleet("d"), "n");
        for shown in [
            "<span class=\"state down\">down</span>",
            "1/4 slots busy",
            "0.25 s",
            ">42<",
            ">4096<",
            "As of 2024-12-31 23:59:59 UTC · up 9 min 59 s",
            "config as loaded at start",
            "<script nonce=\"n\">",
            "prefill 3950 tok/s, half at 98k deep · decode 40.0 tok/s · learned from 12 answers",
            "waiting: batch 4.20 s",
            "prompt tokens from cache: 63 %",
        ] {
            assert!(html.contains(shown), "{shown} in {html}");
        }
    }

    #[test]
    fn every_state_has_its_class_and_words() {
        assert_eq!(state_cell("up"), ("up", "up"));
        assert_eq!(state_cell("breaker_open"), ("breaker", "breaker open"));
        assert_eq!(state_cell("loading"), ("loading", "loading"));
        assert_eq!(state_cell("down"), ("down", "down"));
        assert_eq!(state_cell("unknown").0, "unknown");
    }

    #[test]
    fn times_read_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_735_689_599), "2024-12-31 23:59:59 UTC");
    }
}
