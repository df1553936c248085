#!/usr/bin/env bash
# What `kill -9` under load costs the usage ledger: rows lost against answers the client saw.
#
# usage: benches/load/ledger_kill.sh [BIN]     (from any directory)
#
# Starts a zero-delay simulator (llama.cpp, CHAT_TOKENS-token chats) and `BIN serve` in front
# of it with a SQLite ledger (batch_interval_ms BATCH_MS), drives wrk at CONNS connections,
# kills the proxy with SIGKILL after KILL_AFTER seconds, and counts the ledger's rows
# against the answers wrk completed. A row is written after its answer ends, in batches:
# the rows lost should be about what came in during the last batch interval (answers/s ×
# BATCH_MS), never more than answered. Prints one markdown table row per ROUNDS.
#
# Environment (defaults):
#   CONNS=8  KILL_AFTER=3  BATCH_MS=1000  ROUNDS=3  CHAT_TOKENS=16
#   SKIP_BUILD=0  KEEP_TMP=0  SB_PORT=17730  SIM_PORT=17831
# Needs: wrk, curl, python3 (its sqlite3 module).
set -euo pipefail

# shellcheck source=benches/load/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CONNS=${CONNS:-8}
KILL_AFTER=${KILL_AFTER:-3}
BATCH_MS=${BATCH_MS:-1000}
ROUNDS=${ROUNDS:-3}
CHAT_TOKENS=${CHAT_TOKENS:-16}
SB_PORT=${SB_PORT:-17730}
SIM_PORT=${SIM_PORT:-17831}
export RUST_LOG=${RUST_LOG:-warn}

for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

WORK=$(mktemp -d -t switchboard-kill.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM

BIN=${1:-$(switchboard_bin)}
[[ -x $BIN ]] || die "no binary at $BIN"

cat >"$WORK/chat.json" <<EOF
{"model":"bench","messages":[{"role":"user","content":"Name three primary colours."}],"max_tokens":$CHAT_TOKENS}
EOF
cat >"$WORK/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$WORK/chat.json"); wrk.body = f:read("*a"); f:close()
EOF

require_free_ports "$SB_PORT" "$SIM_PORT"
spawn simulator "$WORK/sim.log" "$BIN" simulate --flavor llamacpp --port "$SIM_PORT" \
  --model bench --slots 4096
wait_http "http://127.0.0.1:$SIM_PORT/health" "$SPAWNED" simulator

printf '| round | answered | ledger rows | lost | answers/s | lost ÷ (answers/s × batch interval) |\n'
printf '|---:|---:|---:|---:|---:|---:|\n'
for ((r = 1; r <= ROUNDS; r++)); do
  db="$WORK/usage-$r.db"
  cat >"$WORK/proxy-$r.toml" <<EOF
[server]
listen = "127.0.0.1:$SB_PORT"
workers = 1

[backends.sim]
url = "http://127.0.0.1:$SIM_PORT"
flavor = "llamacpp"
slots = 4096

[aliases.bench]
backend = "sim"
upstream_model = "bench"

[ledger]
url = "sqlite://$db"
batch_interval_ms = $BATCH_MS
EOF
  "$BIN" serve --config "$WORK/proxy-$r.toml" >"$WORK/proxy-$r.log" 2>&1 &
  proxy=$!
  wait_http "http://127.0.0.1:$SB_PORT/health" "$proxy" switchboard
  wrk -t1 -c"$CONNS" -d"$((KILL_AFTER + 2))s" -s "$WORK/post.lua" \
    "http://127.0.0.1:$SB_PORT/v1/chat/completions" >"$WORK/wrk-$r.txt" 2>&1 &
  load=$!
  sleep "$KILL_AFTER"
  kill -9 "$proxy"
  wait "$proxy" 2>/dev/null || true
  wait "$load" || true
  answered=$(awk '/requests in/ { print $1 }' "$WORK/wrk-$r.txt")
  rows=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from requests').fetchone()[0])" "$db")
  python3 - "$answered" "$rows" "$KILL_AFTER" "$BATCH_MS" "$r" <<'EOF'
import sys
answered, rows, secs, batch_ms, r = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]),
                                     float(sys.argv[4]), sys.argv[5])
rate = answered / secs
lost = answered - rows
print(f"| {r} | {answered} | {rows} | {lost} | {rate:.0f} | {lost / (rate * batch_ms / 1000):.2f} |")
EOF
done
