//! A usage report as `switchboard usage` prints it: one line per group, as an aligned table,
//! CSV (RFC 4180) or JSON.

use serde_json::{json, Map, Value};

use super::store::{Dim, Total};

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

/// `totals` grouped by `by`, printed as `format`; a day or hour as its UTC start
/// (`2026-12-06`, `2026-12-06T14:00Z`).
pub fn render(totals: &[Total], by: &[Dim], format: Format) -> String {
    let header: Vec<&str> = by
        .iter()
        .map(|d| d.name())
        .chain(super::schema::SUMS)
        .chain(["gpu_s"])
        .collect();
    let lines: Vec<Vec<String>> = totals.iter().map(|t| cells(t, by)).collect();
    match format {
        Format::Csv => std::iter::once(header.iter().map(|h| csv(h)).collect::<Vec<_>>())
            .chain(lines.iter().map(|l| l.iter().map(|c| csv(c)).collect()))
            .map(|l| l.join(",") + "\r\n")
            .collect(),
        Format::Json => {
            let rows: Vec<Value> = totals
                .iter()
                .zip(&lines)
                .map(|(t, l)| {
                    let mut o = Map::new();
                    for (d, k) in by.iter().zip(l) {
                        o.insert(d.name().into(), json!(k));
                    }
                    o.insert("requests".into(), json!(t.requests));
                    o.insert("errors".into(), json!(t.errors));
                    o.insert("prompt_tokens".into(), json!(t.prompt_tokens));
                    o.insert("cached_tokens".into(), json!(t.cached_tokens));
                    o.insert("output_tokens".into(), json!(t.output_tokens));
                    o.insert("gpu_prefill_s".into(), json!(t.gpu_prefill_s));
                    o.insert("gpu_decode_s".into(), json!(t.gpu_decode_s));
                    o.insert("gpu_s".into(), json!(t.gpu_prefill_s + t.gpu_decode_s));
                    Value::Object(o)
                })
                .collect();
            Value::Array(rows).to_string() + "\n"
        }
        Format::Table => {
            let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
            for l in &lines {
                for (w, c) in widths.iter_mut().zip(l) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let keys = by.len();
            let line = |cells: &[String]| {
                let padded: Vec<String> = cells
                    .iter()
                    .zip(&widths)
                    .enumerate()
                    .map(|(i, (c, w))| match i < keys {
                        true => format!("{c:<w$}"),
                        false => format!("{c:>w$}"),
                    })
                    .collect();
                padded.join("  ").trim_end().to_string() + "\n"
            };
            let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
            std::iter::once(line(&head))
                .chain(lines.iter().map(|l| line(l)))
                .collect()
        }
    }
}

fn cells(t: &Total, by: &[Dim]) -> Vec<String> {
    let keys = by.iter().zip(&t.keys).map(|(d, k)| match d {
        Dim::Day => day(k, false),
        Dim::Hour => day(k, true),
        _ => k.clone(),
    });
    keys.chain([
        t.requests.to_string(),
        t.errors.to_string(),
        t.prompt_tokens.to_string(),
        t.cached_tokens.to_string(),
        t.output_tokens.to_string(),
        format!("{:.3}", t.gpu_prefill_s),
        format!("{:.3}", t.gpu_decode_s),
        format!("{:.3}", t.gpu_prefill_s + t.gpu_decode_s),
    ])
    .collect()
}

/// A bucket's start (milliseconds since the epoch, as text) as a UTC date, with its hour.
fn day(ms: &str, hour: bool) -> String {
    let Ok(ms) = ms.parse::<i64>() else {
        return ms.to_string();
    };
    let secs = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    let text = humantime::format_rfc3339_seconds(secs).to_string();
    match hour {
        true => format!("{}Z", &text[..16]),
        false => text[..10].to_string(),
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn csv(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals() -> Vec<Total> {
        vec![Total {
            keys: vec!["ann, the \"boss\"".into(), "1796515200000".into()],
            requests: 3,
            errors: 1,
            prompt_tokens: 30,
            cached_tokens: 10,
            output_tokens: 7,
            gpu_prefill_s: 0.5,
            gpu_decode_s: 0.25,
        }]
    }

    #[test]
    fn csv_quotes_what_needs_it_and_days_read_as_dates() {
        let text = render(&totals(), &[Dim::Client, Dim::Day], Format::Csv);
        assert_eq!(
            text,
            "client,day,requests,errors,prompt_tokens,cached_tokens,output_tokens,gpu_prefill_s,gpu_decode_s,gpu_s\r\n\
             \"ann, the \"\"boss\"\"\",2026-12-06,3,1,30,10,7,0.500,0.250,0.750\r\n"
        );
    }

    #[test]
    fn json_and_table_carry_the_same_figures() {
        let j: Value =
            serde_json::from_str(&render(&totals(), &[Dim::Client, Dim::Hour], Format::Json))
                .unwrap();
        assert_eq!(j[0]["hour"], "2026-12-06T00:00Z");
        assert_eq!(j[0]["gpu_s"], 0.75);
        let t = render(&totals(), &[Dim::Client, Dim::Hour], Format::Table);
        assert!(t.lines().nth(1).unwrap().ends_with("0.750"), "{t}");
    }
}
