#!/usr/bin/env bash
# User-space instructions per proxied request, under valgrind's callgrind.
#
# usage: benches/load/instructions.sh [BIN...]     (from any directory)
#
# CPU time on a shared VM moves by a quarter between runs; the instructions the proxy
# executes per request barely move, so this is the figure to compare two builds by. For
# each binary (default: the release build, built unless SKIP_BUILD=1) it starts a
# zero-delay simulator as the backend (that binary's own: llama.cpp answering 16-token
# chats, or with KIND=stream vLLM streaming 200 token events, a quarter of the streams with
# 50 events of reasoning to rename, as in run.sh), `BIN serve` under
# callgrind in front of it, warms up with wrk for WARMUP, zeroes the counters, drives
# DURATION of wrk at CONNS connections, dumps the counters, and prints the instructions
# (Ir) of the proxy process divided by the requests wrk completed. Kernel work (system
# calls) is not counted. Callgrind's output stays in the temp dir with KEEP_TMP=1, for
# `callgrind_annotate --inclusive=yes FILE`.
#
# Environment (defaults):
#   KIND=chat (or stream)  DURATION=10s  WARMUP=3s  CONNS=8  CHAT_TOKENS=16
#   SKIP_BUILD=0  KEEP_TMP=0  SB_PORT=17720 SIM_PORT=17821
# Needs: valgrind (callgrind_control, callgrind_annotate), wrk, curl, awk.
set -euo pipefail

# shellcheck source=benches/load/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KIND=${KIND:-chat}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
CONNS=${CONNS:-8}
CHAT_TOKENS=${CHAT_TOKENS:-16}
SB_PORT=${SB_PORT:-17720}
SIM_PORT=${SIM_PORT:-17821}
export RUST_LOG=${RUST_LOG:-warn}

for tool in valgrind callgrind_control callgrind_annotate wrk curl awk; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

WORK=$(mktemp -d -t switchboard-instr.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM

if (($# == 0)); then
  set -- "$(switchboard_bin)"
fi

cat >"$WORK/proxy.toml" <<EOF
[server]
listen = "127.0.0.1:$SB_PORT"
workers = 1

[backends.sim]
url = "http://127.0.0.1:$SIM_PORT"
flavor = "$([[ $KIND == stream ]] && echo vllm || echo llamacpp)"
slots = 4096

[aliases.bench]
backend = "sim"
upstream_model = "bench"
EOF
case $KIND in
  chat)
    SIM_ARGS=(--flavor llamacpp --completion-tokens "$CHAT_TOKENS")
    printf '%s' '{"model":"bench","messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Name three primary colours."}],"max_tokens":16,"temperature":0}' >"$WORK/chat.json"
    BODIES=("$WORK/chat.json")
    ;;
  stream)
    SIM_ARGS=(--flavor vllm --completion-tokens 200 --reasoning --reasoning-tokens 50)
    printf '%s' '{"model":"bench","stream":true,"messages":[{"role":"user","content":"Count to two hundred."}],"max_tokens":200}' >"$WORK/think.json"
    printf '%s' '{"model":"bench","stream":true,"messages":[{"role":"user","content":"Count to two hundred."}],"max_tokens":200,"chat_template_kwargs":{"enable_thinking":false}}' >"$WORK/plain.json"
    BODIES=("$WORK/think.json" "$WORK/plain.json" "$WORK/plain.json" "$WORK/plain.json")
    ;;
  *) die "KIND must be chat or stream, not $KIND" ;;
esac
URL=http://127.0.0.1:$SB_PORT/v1/chat/completions

echo "| binary | requests | instructions | instructions/request |"
echo "|---|---:|---:|---:|"
n=0
for bin in "$@"; do
  n=$((n + 1))
  [[ -x $bin ]] || die "no binary at $bin"
  require_free_ports "$SB_PORT" "$SIM_PORT"
  spawn simulator "$WORK/sim-$n.log" "$bin" simulate "${SIM_ARGS[@]}" --port "$SIM_PORT" \
    --model bench --slots 4096
  sim=$SPAWNED
  wait_http "http://127.0.0.1:$SIM_PORT/health" "$sim" simulator
  out=$WORK/callgrind-$n.out
  spawn "switchboard (callgrind)" "$WORK/switchboard-$n.log" valgrind --tool=callgrind \
    --callgrind-out-file="$out" "$bin" serve --config "$WORK/proxy.toml"
  sb=$SPAWNED
  # Under callgrind the proxy starts some 50 times slower.
  for ((i = 0; i < 600; i++)); do
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$SB_PORT/health" && break
    kill -0 "$sb" 2>/dev/null || die "switchboard exited under callgrind (see $WORK/switchboard-$n.log)"
    sleep 0.1
  done
  status=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' --data-binary "@${BODIES[0]}" "$URL")
  [[ $status == 200 ]] || die "$bin: a request through the proxy answered $status"
  wrk -t1 -c"$CONNS" -d"$WARMUP" -s "$LOAD_DIR/post.lua" "$URL" -- "${BODIES[@]}" >/dev/null
  callgrind_control -z "$sb" >/dev/null 2>&1
  wrk -t1 -c"$CONNS" -d"$DURATION" -s "$LOAD_DIR/post.lua" "$URL" -- "${BODIES[@]}" >"$WORK/wrk-$n.txt"
  callgrind_control -d "$sb" >/dev/null 2>&1
  stop_pid "$sb" switchboard
  stop_pid "$sim" simulator
  requests=$(awk '/requests in/ { print $1 }' "$WORK/wrk-$n.txt")
  if grep -q "Non-2xx\|Socket errors" "$WORK/wrk-$n.txt"; then
    die "$bin: wrk saw errors: $(grep 'Non-2xx\|Socket errors' "$WORK/wrk-$n.txt")"
  fi
  # The dump after zeroing is part 1; the final one at exit holds only the shutdown.
  ir=$(callgrind_annotate "$out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  [[ -n $ir && -n $requests && $requests -gt 0 ]] || die "$bin: no counts (see $WORK)"
  printf '| %s | %d | %d | %d |\n' "$bin" "$requests" "$ir" $((ir / requests))
done
