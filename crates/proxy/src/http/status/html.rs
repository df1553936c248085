//! The status page's document: the plain data of `view` laid out for `templates/page.html`
//! (the header's line here, each panel in its own module), rendered with every value escaped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::span::span;
use super::templates::RenderError;
use super::view::{Fleet, SharedView};
use crate::live::reload::ReloadOutcome;

/// How often the script fetches the page again and swaps in its `#status` part.
pub const REFRESH_SECS: u64 = 5;
/// With JavaScript off, the whole page reloads itself this often instead.
const NOSCRIPT_REFRESH_SECS: u64 = 30;

/// What `page.html` is rendered with.
#[derive(Serialize)]
struct Page<'a> {
    /// The Content-Security-Policy nonce of its style and script.
    nonce: &'a str,
    version: &'a str,
    refresh_secs: u64,
    noscript_secs: u64,
    /// When it was rendered, in Unix milliseconds.
    generated_ms: u64,
    as_of: String,
    up: String,
    reload: Option<Reload>,
    shared: Option<&'a SharedView>,
    ledger: Option<super::usage::LedgerShape<'a>>,
    aliases: Vec<super::aliases::AliasRow<'a>>,
    timelines: Vec<super::slots::TimelineShape<'a>>,
    clients: Vec<super::clients::ClientRow<'a>>,
    batches: Vec<super::batches::BatchLine<'a>>,
}

/// The last reload, as the header's line tells it.
#[derive(Serialize)]
struct Reload {
    applied: bool,
    at: String,
    ago: String,
    /// Of a refused one.
    errors: usize,
}

/// The whole document. `nonce` is the Content-Security-Policy nonce of its style and script.
pub(crate) fn render(fleet: &Fleet, nonce: &str) -> Result<String, RenderError> {
    let now = unix(fleet.now);
    let reload = fleet.reload.map(|r| {
        let at = unix(r.at);
        let (applied, errors) = match r.outcome {
            ReloadOutcome::Applied => (true, 0),
            ReloadOutcome::Refused { errors } => (false, errors),
        };
        Reload {
            applied,
            at: utc(at),
            ago: span(Duration::from_secs(now.saturating_sub(at))),
            errors,
        }
    });
    let page = Page {
        nonce,
        version: fleet.version,
        refresh_secs: REFRESH_SECS,
        noscript_secs: NOSCRIPT_REFRESH_SECS,
        generated_ms: fleet
            .now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        as_of: utc(now),
        up: span(Duration::from_secs(now.saturating_sub(fleet.started))),
        reload,
        shared: fleet.shared.as_ref(),
        ledger: fleet.ledger.as_ref().map(super::usage::shape),
        aliases: fleet.aliases.iter().map(super::aliases::row).collect(),
        timelines: fleet.timelines.iter().map(super::slots::shape).collect(),
        clients: fleet.clients.iter().map(super::clients::row).collect(),
        batches: fleet
            .batches
            .iter()
            .map(|b| super::batches::line(b, now))
            .collect(),
    };
    super::templates::render("page.html", page)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::http::status::view::{AliasView, BackendView, CostView};
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
        let html = render(&fleet("<script>alert('x')</script> & more"), "n0nce").unwrap();
        // minijinja's escaper writes `'` as `&#x27;` and `/` as `&#x2f;`.
        assert!(
            html.contains("&lt;script&gt;alert(&#x27;x&#x27;)&lt;&#x2f;script&gt; &amp; more"),
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
            "data-backend=\"gpu&#x27;1\"",
            "http:&#x2f;&#x2f;gpu1:8000&#x2f;?&lt;x&gt;",
        ] {
            assert!(html.contains(escaped), "{escaped} in {html}");
        }
    }

    #[test]
    fn the_row_shows_state_load_and_the_window() {
        let html = render(&fleet("d"), "n").unwrap();
        for shown in [
            "<span class=\"state down\">down</span>",
            "1/4 slots busy",
            "0.25 s",
            ">42<",
            ">4096<",
            "As of 2024-12-31 23:59:59 UTC · up 9 min 59 s · config as loaded at start",
            "<script nonce=\"n\">",
            "<style nonce=\"n\">",
            "(5000);</script>",
            "prefill 3950 tok/s, half at 98k deep · decode 40.0 tok/s · learned from 12 answers",
            "waiting: batch 4.20 s",
            "prompt tokens from cache: 63 %",
            "<td class=\"n bad\">1</td>",
            "<tr class=\"charts\" data-charts=\"a&lt;b&gt;\"><td colspan=\"10\"><span class=\"fig\">",
        ] {
            assert!(html.contains(shown), "{shown} in {html}");
        }
    }

    #[test]
    fn the_header_tells_the_last_reload_and_the_shared_state() {
        let mut f = fleet("d");
        f.reload = Some(crate::live::reload::LastReload {
            at: f.now - Duration::from_secs(65),
            outcome: ReloadOutcome::Refused { errors: 2 },
        });
        f.shared = Some(SharedView {
            store: "redis://cache:6379".into(),
            up: false,
        });
        let html = render(&f, "n").unwrap();
        assert!(
            html.contains(
                " · up 9 min 59 s · last reload: <span class=\"bad\">refused</span> at \
                 2024-12-31 23:58:54 UTC (1 min 5 s ago), 2 errors in the log; the config \
                 before it stays in force · shared state redis:&#x2f;&#x2f;cache:6379: \
                 <span class=\"bad\">unreachable</span>, slots and client limits counted by \
                 this process alone</p>"
            ),
            "{html}"
        );
        f.aliases.clear();
        let html = render(&f, "n").unwrap();
        assert!(html.contains("<p>No aliases are configured.</p>"), "{html}");
    }

    #[test]
    fn times_read_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_735_689_599), "2024-12-31 23:59:59 UTC");
    }
}
