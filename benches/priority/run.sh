#!/usr/bin/env bash
# Who goes first on a one-slot backend: one request in the slot, N batch streams queued
# behind it, then one interactive request. Prints the interactive request's wait (its
# time to answer minus its own service time) with every caller alike (one key: first come,
# first served) and with the batch work and the interactive caller as separate clients of
# their classes. Loopback only, bounded: the built-in simulator, a few seconds a run.
#
#   benches/priority/run.sh            # N=8, 40 tokens at 40 ms each (a 1.6 s service time)
#   N=8 TOKENS=40 DELAY_MS=40 SWITCHBOARD_BIN=target/release/switchboard benches/priority/run.sh
set -euo pipefail

N=${N:-8}
TOKENS=${TOKENS:-40}
DELAY_MS=${DELAY_MS:-40}
BIN=${SWITCHBOARD_BIN:-target/debug/switchboard}
# shellcheck source=benches/load/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../load/lib.sh"
WORK=$(mktemp -d)
trap cleanup EXIT

SIM_PORT=$(free_port)
spawn simulator "$WORK/sim.log" "$BIN" simulate --port "$SIM_PORT" --slots 16 \
    --token-delay-ms "$DELAY_MS"
wait_http "http://127.0.0.1:$SIM_PORT/health" "$SPAWNED" simulator

export SB_BENCH_BATCH_KEYS=batch-key SB_BENCH_INTER_KEYS=inter-key SB_BENCH_ONE_KEYS=batch-key,inter-key

body() { printf '{"model":"a","max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"%s"}]}' "$TOKENS" "$1"; }

# One request's time to its last byte, in seconds.
timed() {
    curl -sS -o /dev/null -w '%{time_total}' -H "authorization: Bearer $2" \
        -H 'content-type: application/json' -d "$(body "$3")" "$1/v1/chat/completions"
}

# queued_requests of alias a, from the proxy's metrics.
queued() {
    curl -fsS "$1/metrics" | awk '/^switchboard_queued_requests\{alias="a"\}/ {print $2}'
}

run() { # $1: mode name, $2: the clients' TOML
    local port base
    port=$(free_port)
    base="http://127.0.0.1:$port"
    cat >"$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
queue_timeout_secs = 120
[backends.sim]
url = "http://127.0.0.1:$SIM_PORT"
flavor = "llamacpp"
slots = 1
queue = 64
[aliases.a]
backend = "sim"
upstream_model = "sim-model"
$2
TOML
    spawn switchboard "$WORK/$1.log" "$BIN" serve --config "$WORK/$1.toml"
    local proxy=$SPAWNED
    wait_http "$base/health" "$proxy" switchboard
    local service
    service=$(timed "$base" inter-key alone)
    local start
    start=$(date +%s.%N)
    timed "$base" batch-key running >/dev/null &
    local bg=($!)
    # The running request has the slot once the queue is empty and it was sent.
    sleep 0.1
    for i in $(seq 1 "$N"); do
        timed "$base" batch-key "batch$i" >/dev/null &
        bg+=($!)
    done
    for _ in $(seq 1 400); do
        [ "$(queued "$base")" = "$N" ] && break
        sleep 0.01
    done
    local sent remaining total
    sent=$(date +%s.%N)
    total=$(timed "$base" inter-key interactive)
    remaining=$(python3 -c "print(max(0.0, $service - ($sent - $start)))")
    for p in "${bg[@]}"; do wait "$p"; done
    kill "$proxy"
    wait "$proxy" 2>/dev/null || true
    python3 - "$1" "$service" "$total" "$remaining" <<'PY'
import sys
mode, service, total, remaining = sys.argv[1], *map(float, sys.argv[2:])
print(f"{mode:>9}: interactive waited {max(0.0, total - service):6.2f} s "
      f"(answer {total:.2f} s, service {service:.2f} s, in-slot request had {remaining:.2f} s left)")
PY
}

echo "one slot, $N batch streams queued, $TOKENS tokens at $DELAY_MS ms each"
run fifo '[clients.everyone]
key_env = "SB_BENCH_ONE_KEYS"'
run priority '[clients.agents]
key_env = "SB_BENCH_BATCH_KEYS"
priority = "batch"
[clients.person]
key_env = "SB_BENCH_INTER_KEYS"
priority = "interactive"'
