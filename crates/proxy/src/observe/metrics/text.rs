//! The Prometheus text format (0.0.4) made from OpenMetrics text, for scrapers that do not ask
//! for OpenMetrics.

/// OpenMetrics → Prometheus text 0.0.4: counters are named with `_total` in HELP/TYPE,
/// `# UNIT` and `# EOF` lines are dropped.
pub(super) fn to_prometheus_text(om: &str) -> String {
    let mut counters: Vec<&str> = Vec::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.push(name);
            }
        }
    }
    let mut out = String::with_capacity(om.len() + counters.len() * 16);
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let meta = line
            .strip_prefix("# TYPE ")
            .map(|r| ("# TYPE ", r))
            .or_else(|| line.strip_prefix("# HELP ").map(|r| ("# HELP ", r)));
        if let Some((prefix, rest)) = meta {
            let name = rest.split(' ').next().unwrap_or_default();
            if counters.contains(&name) {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total");
                out.push_str(&rest[name.len()..]);
                out.push('\n');
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
