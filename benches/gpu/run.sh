#!/usr/bin/env bash
# The GPU-time workload (benches/gpu/driver.py): one person asking short streamed questions
# every 2 s (class interactive) and five batch agents in closed loops (two sending fresh 40k-token
# prompts, three in growing conversations) on one simulated llama.cpp GPU with 2 slots
# (prefill 4,000 t/s slowing with depth, decode 40 t/s), through Switchboard under each
# `server.schedule`. A fresh simulator (empty caches) and proxy per mode. Builds nothing.
#
#   benches/gpu/run.sh                       # DURATION=90, MODES="arrival requests work"
#   DURATION=30 MODES="arrival requests" SWITCHBOARD_BIN=target/release/switchboard benches/gpu/run.sh
#
# A proxy that does not know `server.schedule` yet (`switchboard check` refuses the key) runs
# with the key left out: "arrival" then puts every key in one client of one class (first come,
# first served), "requests" is today's behaviour (classes, then round robin over clients), and
# "work" is skipped. Prints one JSON line per mode.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DURATION=${DURATION:-90}
MODES=${MODES:-"arrival requests work"}
BIN=${SWITCHBOARD_BIN:-target/release/switchboard}
PREFILL_TPS=${PREFILL_TPS:-4000}
DECODE_TPS=${DECODE_TPS:-40}
HALF_DEPTH=${HALF_DEPTH:-100000}
SLOT_CTX=${SLOT_CTX:-131072}
DRIVER_ARGS=${DRIVER_ARGS:-}
# More [server] keys for every mode, e.g. SERVER_KEYS='slot_hold_ms = 500'; more keys of the
# backend (BACKEND_KEYS='cache_ram = false') and of each client (CLIENT_KEYS='cache_group =
# "fleet"': the clients share their cached prefixes, as one cache group).
SERVER_KEYS=${SERVER_KEYS:-}
BACKEND_KEYS=${BACKEND_KEYS:-}
CLIENT_KEYS=${CLIENT_KEYS:-}
# A directory to keep each mode's config and the proxy's and simulator's logs in.
LOGS=${LOGS:-}
# shellcheck source=benches/load/lib.sh
source "$HERE/../load/lib.sh"
WORK=$(mktemp -d)
keep_logs() { [[ -z $LOGS ]] || { mkdir -p "$LOGS" && cp "$WORK"/* "$LOGS"/; }; }
trap 'stop_spawned; keep_logs; cleanup' EXIT

CLIENTS="person compact1 compact2 conv1 conv2 conv3"
KEY_ARGS=()
ALL_KEYS=""
for c in $CLIENTS; do
    export "SB_GPU_KEY_${c^^}=key-$c"
    KEY_ARGS+=(--key "$c=key-$c")
    ALL_KEYS+="${ALL_KEYS:+,}key-$c"
done
export SB_GPU_ALL_KEYS=$ALL_KEYS

# The [clients] of a mode: one client and class for all, or one client each.
clients_toml() {
    if [[ $1 == one ]]; then
        printf '[clients.everyone]\nkey_env = "SB_GPU_ALL_KEYS"\n'
        return
    fi
    local c class
    for c in $CLIENTS; do
        class=batch
        [[ $c == person ]] && class=interactive
        printf '[clients.%s]\nkey_env = "SB_GPU_KEY_%s"\npriority = "%s"\n%s\n' "$c" "${c^^}" "$class" \
            "$CLIENT_KEYS"
    done
}

# $1: the port, $2: the schedule line (may be empty), $3: the clients' TOML, $4: sim port.
config() {
    cat <<TOML
[server]
listen = "127.0.0.1:$1"
queue_timeout_secs = 600
$2
$SERVER_KEYS
[backends.gpu]
url = "http://127.0.0.1:$4"
flavor = "llamacpp"
slots = 2
queue = 64
$BACKEND_KEYS
[aliases.m]
backend = "gpu"
upstream_model = "sim-model"
$3
TOML
}

# Whether this proxy knows server.schedule.
config "$(free_port)" 'schedule = "work"' "$(clients_toml each)" 1 >"$WORK/probe.toml"
if "$BIN" check --config "$WORK/probe.toml" >/dev/null 2>&1; then
    SCHEDULE_KEY=1
else
    SCHEDULE_KEY=0
    echo "note: this switchboard does not know server.schedule; modes emulated (see run.sh)" >&2
fi

echo "GPU: 2 slots, prefill $PREFILL_TPS t/s (half at depth $HALF_DEPTH), decode $DECODE_TPS t/s; $DURATION s per mode" >&2
for mode in $MODES; do
    line="" who=each
    if [[ $SCHEDULE_KEY == 1 ]]; then
        line="schedule = \"$mode\""
    else
        case $mode in
            arrival) who=one ;;
            requests) ;;
            *) echo "skipped $mode: the proxy does not have it" >&2; continue ;;
        esac
    fi
    sim_port=$(free_port)
    spawn simulator "$WORK/sim-$mode.log" "$BIN" simulate --port "$sim_port" --slots 2 \
        --slot-ctx "$SLOT_CTX" --gpu-prefill-tps "$PREFILL_TPS" --gpu-decode-tps "$DECODE_TPS" \
        --gpu-prefill-half-depth "$HALF_DEPTH"
    wait_http "http://127.0.0.1:$sim_port/health" "$SPAWNED" simulator
    port=$(free_port)
    config "$port" "$line" "$(clients_toml $who)" "$sim_port" >"$WORK/$mode.toml"
    spawn switchboard "$WORK/proxy-$mode.log" "$BIN" serve --config "$WORK/$mode.toml"
    wait_http "http://127.0.0.1:$port/health" "$SPAWNED" switchboard
    # shellcheck disable=SC2086
    python3 "$HERE/driver.py" --proxy "http://127.0.0.1:$port" --sim "http://127.0.0.1:$sim_port" \
        --mode "$mode" --duration "$DURATION" "${KEY_ARGS[@]}" $DRIVER_ARGS
    stop_spawned
done
