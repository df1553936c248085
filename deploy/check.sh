#!/usr/bin/env bash
# Checks the Prometheus and Grafana assets of deploy/.
#
# usage: deploy/check.sh [SCRAPE_FILE]
#
#   SCRAPE_FILE  a live scrape of GET /metrics of the running binary (optional)
#
# Always: promtool check config, check rules, test rules; every rule and alert has
# a unit test; the dashboard is valid JSON and its PromQL parses. Then every
# switchboard_* name used by the rules and the dashboard must exist: in the scrape
# when one is given (its `# TYPE` lines count too, so a family that writes a TYPE
# line before any sample is found), else in the contract list deploy/metrics.txt. With a scrape, it is
# also linted with `promtool check metrics` (after rewriting OpenMetrics counter
# families `x` to `x_total`, as Prometheus names their series; see lint_text below).
# Needs: promtool, awk, sed, grep, sort. Runs from any directory.
set -euo pipefail

SCRAPE=${1:-}
if [[ -n $SCRAPE && $SCRAPE != /* ]]; then
  SCRAPE=$PWD/$SCRAPE # relative to the caller's directory, not the repository's
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PROM=deploy/prometheus
DASH=deploy/grafana/switchboard.json
CONTRACT=deploy/metrics.txt

fail() {
  echo "check.sh: FAIL: $*" >&2
  exit 1
}
step() { echo "== $*"; }

command -v promtool >/dev/null || fail "promtool not found (Debian package prometheus)"
if [[ -n $SCRAPE && ! -s $SCRAPE ]]; then
  fail "scrape file $SCRAPE is missing or empty"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step "promtool check config"
promtool check config "$PROM/prometheus.yml"

step "promtool check rules"
promtool check rules "$PROM"/rules/*.yml

step "promtool test rules"
promtool test rules "$PROM"/tests/*.yml

step "every recording rule and alert has a unit test"
untested=()
while read -r name; do
  grep -qE "^[[:space:]]*(- )?expr:[[:space:]]*$name[[:space:]]*\$" "$PROM"/tests/*.yml || untested+=("record $name")
done < <(sed -n 's/^[[:space:]]*- record:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$PROM"/rules/*.yml)
while read -r name; do
  grep -qE "alertname:[[:space:]]*$name[[:space:]]*\$" "$PROM"/tests/*.yml || untested+=("alert $name")
done < <(sed -n 's/^[[:space:]]*- alert:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$PROM"/rules/*.yml)
if ((${#untested[@]})); then
  fail "no test in $PROM/tests for: ${untested[*]}"
fi

# The dashboard's queries, one per line, JSON string escapes undone. Relies on the
# one-key-per-line layout that Grafana exports and json.dumps(indent=...) write.
sed -n 's/^[[:space:]]*"expr":[[:space:]]*"\(.*\)",\{0,1\}[[:space:]]*$/\1/p' "$DASH" |
  sed 's/\\"/"/g; s/\\\\/\\/g' >"$tmp/dash.exprs"

step "dashboard is valid JSON and its queries parse"
if command -v jq >/dev/null; then
  jq empty "$DASH" || fail "$DASH is not valid JSON"
elif command -v python3 >/dev/null; then
  python3 -m json.tool "$DASH" >/dev/null || fail "$DASH is not valid JSON"
else
  echo "   (no jq or python3: JSON syntax not checked)"
fi
[[ -s $tmp/dash.exprs ]] || fail "no \"expr\" lines found in $DASH"
grep -q 'label_values(switchboard_requests_total, alias)' "$DASH" ||
  fail "$DASH lost its \$alias variable query"
{
  echo "groups:"
  echo "  - name: dashboard"
  echo "    rules:"
  n=0
  while IFS= read -r expr; do
    n=$((n + 1))
    expr=${expr//\$__rate_interval/5m}
    expr=${expr//\$__range/1h}
    expr=${expr//\$__interval/1m}
    expr=${expr//\$alias/.*}
    echo "      - record: dashboard:query_$n"
    echo "        expr: |"
    echo "          $expr"
  done <"$tmp/dash.exprs"
} >"$tmp/dashboard-rules.yml"
promtool check rules "$tmp/dashboard-rules.yml" >/dev/null ||
  { promtool check rules "$tmp/dashboard-rules.yml" || true; fail "a query in $DASH does not parse"; }
echo "   $(wc -l <"$tmp/dash.exprs") queries parse"

# Series names the rules and dashboard query. Recording-rule names contain ':' and
# are skipped as whole tokens.
grep -ohE '[A-Za-z_:][A-Za-z0-9_:]*' "$PROM"/rules/*.yml "$DASH" |
  grep -E '^switchboard_[a-z0-9_]+$' | sort -u >"$tmp/used"
[[ -s $tmp/used ]] || fail "no switchboard_* names found in rules or dashboard"

if [[ -n $SCRAPE ]]; then
  step "promtool check metrics < $SCRAPE"
  # promtool reads the classic text format. In OpenMetrics a counter family `x`
  # has samples `x_total`; the classic parser would take those for an untyped
  # family without help, so HELP/TYPE are renamed to `x_total`. `# EOF`, `# UNIT`,
  # exemplars and `_created` samples have no classic form and are dropped; info
  # and stateset become gauges.
  awk '
    NR == FNR {
      if ($1 == "#" && $2 == "TYPE") type[$3] = $4
      next
    }
    function base(n) { sub(/\{.*/, "", n); return n }
    $1 == "#" && ($2 == "EOF" || $2 == "UNIT") { next }
    $1 == "#" && ($2 == "HELP" || $2 == "TYPE") {
      t = type[$3]
      if (t == "counter" && $3 !~ /_total$/) { $3 = $3 "_total" }
      else if (t == "info") { $3 = $3 "_info" }
      if ($2 == "TYPE" && (t == "info" || t == "stateset")) $4 = "gauge"
      if ($2 == "TYPE" && t == "unknown") $4 = "untyped"
      if ($2 == "TYPE" && t == "gaugehistogram") $4 = "histogram"
      print; next
    }
    /^#/ || /^[[:space:]]*$/ { print; next }
    {
      n = base($1)
      if (n ~ /_created$/) {
        f = n; sub(/_created$/, "", f)
        if (type[f] != "" && type[f] != "gauge") next
      }
      sub(/ # \{.*$/, "")
      print
    }
  ' "$SCRAPE" "$SCRAPE" >"$tmp/scrape.prom"
  promtool check metrics <"$tmp/scrape.prom" || fail "promtool check metrics found problems in $SCRAPE"

  # Exported series names: every sample name, plus the names each # TYPE line
  # implies, so that families with no samples yet count too.
  awk '
    function add(n) { print n }
    $1 == "#" && $2 == "TYPE" {
      n = $3; t = $4
      if (t == "counter") { add(n ~ /_total$/ ? n : n "_total") }
      else if (t == "histogram" || t == "gaugehistogram") { add(n "_bucket"); add(n "_sum"); add(n "_count") }
      else if (t == "summary") { add(n); add(n "_sum"); add(n "_count") }
      else if (t == "info") { add(n "_info") }
      else { add(n) }
      next
    }
    /^#/ || /^[[:space:]]*$/ { next }
    { n = $1; sub(/\{.*/, "", n); add(n) }
  ' "$SCRAPE" | sort -u >"$tmp/exported"
  # Family names as the contract spells them: counters with _total, others bare.
  awk '$1 == "#" && $2 == "TYPE" { print ($4 == "counter" && $3 !~ /_total$/) ? $3 "_total" : $3 }' \
    "$SCRAPE" | sort -u >"$tmp/families"
  source_name="the scrape $SCRAPE"
else
  # The contract names families as PromQL sees them (counters with _total,
  # histograms by base name); their types are not listed, so any histogram
  # suffix is accepted.
  grep -vE '^[[:space:]]*(#|$)' "$CONTRACT" |
    awk '{ print $1; print $1 "_bucket"; print $1 "_sum"; print $1 "_count" }' |
    sort -u >"$tmp/exported"
  source_name="the contract list $CONTRACT"
fi

step "switchboard_* names used by rules and dashboard exist in $source_name"
missing=$(comm -23 "$tmp/used" "$tmp/exported")
if [[ -n $missing ]]; then
  echo "check.sh: names used in $PROM/rules or $DASH but not in $source_name:" >&2
  sed 's/^/  MISSING: /' <<<"$missing" >&2
  if [[ -n $SCRAPE ]]; then
    echo "check.sh: note: prometheus-client writes no # TYPE line for a label family that" >&2
    echo "  has no series yet; the binary should create each alias's series at startup" >&2
    echo "  (counters at 0), or the scrape should follow traffic that touches them" >&2
  fi
  fail "$(wc -l <<<"$missing") metric name(s) missing"
fi
echo "   $(wc -l <"$tmp/used") names found"

if [[ -n $SCRAPE ]]; then
  # Families of the contract absent from the scrape: reported, not fatal here
  # (the binary's own tests assert the contract).
  absent=$(grep -vE '^[[:space:]]*(#|$)' "$CONTRACT" | sort -u | comm -23 - "$tmp/families" || true)
  if [[ -n $absent ]]; then
    echo "check.sh: warning: contract families not in the scrape:" >&2
    sed 's/^/  ABSENT: /' <<<"$absent" >&2
  fi
fi

echo "check.sh: all checks passed"
