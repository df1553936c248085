#!/usr/bin/env bash
# The Batch API on idle slots: the GPU-time workload's person (a short streamed question every
# 2 s, interactive) and two agents (one compacting fresh 40k-token prompts, one in a growing
# conversation; each waiting THINK seconds between turns, as an agent running its tools does)
# on one simulated llama.cpp GPU with 2 slots (prefill 4,000 t/s slowing with depth, decode
# 40 t/s), through Switchboard with a SQLite ledger — once without a batch and once with a
# batch of LINES short chat lines created as the run starts. A fresh simulator and proxy per
# run. Prints one JSON line per run (benches/gpu/driver.py), then the ratios of the person's
# p95 time to first token and of each agent's answers, with over without, and the GPU's idle
# share in each. Builds nothing.
#
#   benches/batch/run.sh                    # DURATION=90 LINES=1000 THINK=3
#   DURATION=30 SWITCHBOARD_BIN=target/release/switchboard benches/batch/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DURATION=${DURATION:-90}
LINES=${LINES:-1000}
THINK=${THINK:-3}
BIN=${SWITCHBOARD_BIN:-target/release/switchboard}
# shellcheck source=benches/load/lib.sh
source "$HERE/../load/lib.sh"
WORK=$(mktemp -d)
trap cleanup EXIT

KEY_ARGS=()
for c in person compact1 conv1 batcher; do
    export "SB_BATCH_KEY_${c^^}=key-$c"
    KEY_ARGS+=(--key "$c=key-$c")
done

config() {
    cat <<TOML
[server]
listen = "127.0.0.1:$1"
queue_timeout_secs = 600
[backends.gpu]
url = "http://127.0.0.1:$2"
flavor = "llamacpp"
slots = 2
queue = 64
[aliases.m]
backend = "gpu"
upstream_model = "sim-model"
[clients.person]
key_env = "SB_BATCH_KEY_PERSON"
priority = "interactive"
[clients.compact1]
key_env = "SB_BATCH_KEY_COMPACT1"
priority = "batch"
[clients.conv1]
key_env = "SB_BATCH_KEY_CONV1"
priority = "batch"
[clients.batcher]
key_env = "SB_BATCH_KEY_BATCHER"
[ledger]
url = "sqlite://$3/usage.db"
[batches]
max_concurrent = 2
TOML
}

echo "GPU: 2 slots, prefill 4000 t/s, decode 40 t/s; $DURATION s per run; agents think $THINK s; batch of $LINES lines" >&2
results=()
for run in without with; do
    dir="$WORK/$run"
    mkdir -p "$dir"
    sim_port=$(free_port)
    spawn simulator "$dir/sim.log" "$BIN" simulate --port "$sim_port" --slots 2 \
        --slot-ctx 131072 --gpu-prefill-tps 4000 --gpu-decode-tps 40 \
        --gpu-prefill-half-depth 100000
    wait_http "http://127.0.0.1:$sim_port/health" "$SPAWNED" simulator
    port=$(free_port)
    config "$port" "$sim_port" "$dir" >"$dir/routes.toml"
    spawn switchboard "$dir/proxy.log" "$BIN" serve --config "$dir/routes.toml"
    wait_http "http://127.0.0.1:$port/health" "$SPAWNED" switchboard
    lines=0
    [[ $run == with ]] && lines=$LINES
    out=$(python3 "$HERE/../gpu/driver.py" --proxy "http://127.0.0.1:$port" \
        --sim "http://127.0.0.1:$sim_port" --mode "$run" --duration "$DURATION" \
        --agents compact1,conv1 --think "$THINK" --batch-lines "$lines" "${KEY_ARGS[@]}")
    echo "$out"
    results+=("$out")
    stop_spawned
done
python3 - "${results[@]}" <<'PY'
import json, sys
without, with_ = (json.loads(a) for a in sys.argv[1:3])
ratio = lambda k: with_[k] / without[k] if without[k] else None
print(json.dumps({
    "person_ttft_p95_ratio": round(ratio("person_ttft_p95_s"), 3),
    "person_ttft_p50_ratio": round(ratio("person_ttft_p50_s"), 3),
    "agent_answers_ratio": {n: round(with_["agent_requests"][n] / without["agent_requests"][n], 3)
                            for n in without["agent_requests"] if without["agent_requests"][n]},
    "gpu_idle_share_without": round(1 - without["gpu_busy_share"], 3),
    "gpu_idle_share_with": round(1 - with_["gpu_busy_share"], 3),
    "batch": with_.get("batch"),
}))
PY
