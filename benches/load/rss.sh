#!/usr/bin/env bash
# Memory per open stream: Switchboard's RSS idle and with STREAMS slow streams open.
#
# usage: benches/load/rss.sh            (from any directory)
#
# Builds `cargo build --release`, starts on 127.0.0.1 a simulated vLLM backend that
# sends one token every TOKEN_DELAY_MS, and `switchboard serve` in front of it. A
# warm-up opens and closes WARMUP streams; then the proxy's RSS (VmRSS) is read idle,
# with STREAMS streams open at once (rss_client.py: one raw HTTP/1.1 connection each,
# counted open at its first event), and again after they are closed. Prints a
# markdown table with the growth in KiB per open stream. Everything it started is
# stopped on exit; every wait is bounded.
#
# Environment (defaults):
#   STREAMS=1000       concurrent streams
#   WARMUP=20          streams opened and closed before the idle reading
#   TOKEN_DELAY_MS=1000  simulator delay between tokens (streams stay open)
#   SKIP_BUILD=0       1: use the existing binary (SWITCHBOARD_BIN, default target/release)
#   KEEP_TMP=0         1: keep the temp dir (config, logs)
#   SB_PORT=17710 SIM_PORT=17811   loopback ports used
#   RUST_LOG=warn      log level of the proxy and simulator
# Needs: cargo, python3 (3.11, standard library), curl, awk.
set -euo pipefail

# shellcheck source=benches/load/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STREAMS=${STREAMS:-1000}
WARMUP=${WARMUP:-20}
TOKEN_DELAY_MS=${TOKEN_DELAY_MS:-1000}
SB_PORT=${SB_PORT:-17710}
SIM_PORT=${SIM_PORT:-17811}
export RUST_LOG=${RUST_LOG:-warn}
HOLD_MAX=300 # the client lets go by itself after this many seconds

for tool in python3 curl awk; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[[ $STREAMS =~ ^[1-9][0-9]*$ ]] || die "STREAMS must be a positive integer"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "WARMUP must be a whole number"

# The proxy holds two sockets per stream, the client one.
need_fds=$((STREAMS * 2 + 256))
if (($(ulimit -n) < need_fds)); then
  ulimit -n "$need_fds" 2>/dev/null || die "open-file limit $(ulimit -n) is below $need_fds and cannot be raised"
fi

WORK=$(mktemp -d -t switchboard-rss.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM
require_free_ports "$SB_PORT" "$SIM_PORT"

BIN=$(switchboard_bin)
# Enough tokens that no stream ends while held open.
tokens=$((HOLD_MAX * 1000 / TOKEN_DELAY_MS + 60))
spawn simulator "$WORK/sim.log" "$BIN" simulate --flavor vllm --port "$SIM_PORT" \
  --model slow --slots $((STREAMS + 16)) --completion-tokens "$tokens" --ttft-ms 0 \
  --token-delay-ms "$TOKEN_DELAY_MS"
SIM_PID=$SPAWNED
wait_http "http://127.0.0.1:$SIM_PORT/health" "$SIM_PID" simulator

cat >"$WORK/rss.toml" <<EOF
[server]
listen = "127.0.0.1:$SB_PORT"

[backends.sim]
url = "http://127.0.0.1:$SIM_PORT"
flavor = "vllm"
slots = $((STREAMS + 16))

[aliases.slow]
backend = "sim"
upstream_model = "slow"
EOF
start_switchboard "$BIN" "$WORK/rss.toml"

# hold N NAME: open N streams through the proxy, run READY_HOOK while all are open,
# then release them; bounded by the client's own timeouts and HOLD_MAX.
hold() {
  local n=$1 name=$2 out=$WORK/client-$2.out release=$WORK/release-$2 pid i line=""
  python3 "$LOAD_DIR/rss_client.py" --port "$SB_PORT" --model slow --streams "$n" \
    --release-file "$release" --max-hold "$HOLD_MAX" >"$out" 2>"$WORK/client-$name.err" &
  pid=$!
  PIDS+=("$pid")
  NAMES+=("client $name")
  for ((i = 0; i < 1200; i++)); do # 120 s to open every stream
    line=$(grep -m1 '^OPEN ' "$out" || true)
    [[ -n $line ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n $line ]] || die "client $name did not open its streams within 120 s: $(tail -3 "$WORK/client-$name.err")"
  read -r _ opened failed <<<"$line"
  if ((failed > 0)); then
    touch "$release"
    die "client $name: $failed of $n streams failed to open: $(tail -1 "$WORK/client-$name.err")"
  fi
  "$READY_HOOK"
  touch "$release"
  for ((i = 0; i < 300; i++)); do # 30 s to close
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  wait "$pid" || die "client $name exited with an error: $(tail -3 "$WORK/client-$name.err")"
  log "client $name: $opened streams opened and closed"
}

# settle_rss PID: RSS once it stops falling (at most 3 s), for readings after a burst.
settle_rss() {
  local prev cur i
  prev=$(rss_kib "$1")
  for ((i = 0; i < 30; i++)); do
    sleep 0.1
    cur=$(rss_kib "$1")
    ((cur >= prev)) && break
    prev=$cur
  done
  rss_kib "$1"
}

noop() { :; }
inflight() {
  curl -s --max-time 5 "http://127.0.0.1:$SB_PORT/metrics" |
    awk '/^switchboard_inflight_requests\{alias="slow"\}/ { print $2 }'
}
read_open_rss() {
  RSS_OPEN=$(rss_kib "$SB_PID")
  INFLIGHT=$(inflight)
}
# wait_drained: until the proxy has dropped every closed stream (at most 10 s).
wait_drained() {
  local i
  for ((i = 0; i < 100; i++)); do
    INFLIGHT_AFTER=$(inflight)
    [[ $INFLIGHT_AFTER == 0 ]] && return 0
    sleep 0.1
  done
  log "warning: $INFLIGHT_AFTER requests still in flight 10 s after the clients closed"
}

RSS_START=$(rss_kib "$SB_PID")
if ((WARMUP > 0)); then
  READY_HOOK=noop hold "$WARMUP" warmup
fi
RSS_IDLE=$(settle_rss "$SB_PID")
READY_HOOK=read_open_rss hold "$STREAMS" main
wait_drained
RSS_AFTER=$(settle_rss "$SB_PID")

echo
echo "## Switchboard RSS with $STREAMS open streams ($(date -u +%Y-%m-%dT%H:%MZ))"
echo
echo "$(nproc) CPUs, commit $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown); simulator token delay ${TOKEN_DELAY_MS} ms; in-flight gauge while open: ${INFLIGHT:-n/a}, after close: ${INFLIGHT_AFTER:-n/a}"
echo
echo "| state | RSS KiB |"
echo "|---|---:|"
echo "| started | $RSS_START |"
echo "| idle (after $WARMUP warm-up streams) | $RSS_IDLE |"
echo "| $STREAMS streams open | $RSS_OPEN |"
echo "| after they closed (allocator may keep freed pages) | $RSS_AFTER |"
echo
awk -v idle="$RSS_IDLE" -v open="$RSS_OPEN" -v n="$STREAMS" \
  'BEGIN { printf "Growth with streams open: %d KiB, %.1f KiB per stream.\n", open - idle, (open - idle) / n }'
