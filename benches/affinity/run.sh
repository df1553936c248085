#!/usr/bin/env bash
# Conversation affinity across Switchboard processes, measured on real llama-servers: two
# replicas (2 slots each, prompt cache on), 6 agent conversations of 8 turns with growing
# prompts (benches/affinity/driver.py), through one Switchboard and through two taking turns
# (requests alternating between them, as two pods behind a Service). The figure: the share of
# prompt tokens after each conversation's first turn that the backend took from its cache.
# Both replicas are restarted before every run (empty caches); each run of one mode is paired
# with a run of the other on the same conversations (the same seed).
#
#   REALWORLD=<dir with start.sh/stop.sh> benches/affinity/run.sh
#   RUNS=3 POLICIES="return stay" SWITCHBOARD_BIN=target/debug/switchboard \
#     REALWORLD=... RW=<its build dir> benches/affinity/run.sh
#   SPILL_WAIT_MS=0 ...   server.spill_wait_ms of every process (default: the config's default)
#
# Prints one JSON line per run and a summary per spill policy (server.after_spill), spill
# wait and mode.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${REALWORLD:?set REALWORLD to the directory holding start.sh and stop.sh}"
export RW=${RW:-$HOME/.cache/realworld}
RUNS=${RUNS:-3}
POLICIES=${POLICIES:-"return stay"}
SPILL_WAIT_MS=${SPILL_WAIT_MS:-}
# Per slot: CTX / 2 tokens, room for the 8th turn's prompt.
export CTX=${CTX:-16384} NP=2
DRIVER_ARGS=${DRIVER_ARGS:-}
# shellcheck source=../load/lib.sh
source "$HERE/../load/lib.sh"
BIN=${SWITCHBOARD_BIN:-$REPO_ROOT/target/debug/switchboard}
WORK=$(mktemp -d)
OUT=${OUT:-$WORK/results.jsonl}
LLAMA_PORTS=()

# Every Switchboard of a run and both replicas stopped.
stop_run() {
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}" "${NAMES[i]}"; done
    PIDS=()
    NAMES=()
    for port in "${LLAMA_PORTS[@]}"; do "$REALWORLD/stop.sh" "$port" >/dev/null 2>&1 || true; done
    LLAMA_PORTS=()
}
trap 'stop_run; cleanup' EXIT

# One run: fresh replicas, $1 Switchboard processes with spill policy $2, the driver with
# seed $3; its JSON line, with the processes' affinity counts, appended to $OUT.
run() {
    local procs=$1 policy=$2 seed=$3
    local l1 l2
    l1=$(free_port)
    l2=$(free_port)
    "$REALWORLD/start.sh" "$l1" >/dev/null 2>"$WORK/llama-$l1.log"
    LLAMA_PORTS+=("$l1")
    "$REALWORLD/start.sh" "$l2" >/dev/null 2>"$WORK/llama-$l2.log"
    LLAMA_PORTS+=("$l2")
    local args=() urls=()
    for i in $(seq 1 "$procs"); do
        local port
        port=$(free_port)
        cat >"$WORK/routes-$i.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
workers = 1
watch_config = false
after_spill = "$policy"
$([[ -n $SPILL_WAIT_MS ]] && echo "spill_wait_ms = $SPILL_WAIT_MS")
[backends.r1]
url = "http://127.0.0.1:$l1"
flavor = "llamacpp"
slots = 2
[backends.r2]
url = "http://127.0.0.1:$l2"
flavor = "llamacpp"
slots = 2
[aliases.m]
backends = ["r1", "r2"]
upstream_model = "tiny-qwen3"
EOF
        spawn "switchboard-$i" "$WORK/sb-$i.log" "$BIN" serve --config "$WORK/routes-$i.toml"
        wait_http "http://127.0.0.1:$port/health" "$SPAWNED" "switchboard-$i"
        args+=(--proxy "http://127.0.0.1:$port")
        urls+=("http://127.0.0.1:$port")
    done
    local line
    # shellcheck disable=SC2086
    line=$(python3 "$HERE/driver.py" "${args[@]}" --seed "$seed" $DRIVER_ARGS)
    local hit=0 moved=0 new=0
    for u in "${urls[@]}"; do
        local m
        m=$(curl -fsS "$u/metrics")
        hit=$((hit + $(sample "$m" hit)))
        moved=$((moved + $(sample "$m" moved)))
        new=$((new + $(sample "$m" new)))
    done
    stop_run
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(policy=sys.argv[2], spill_wait_ms=sys.argv[6] or "default", affinity=dict(hit=int(sys.argv[3]), moved=int(sys.argv[4]), new=int(sys.argv[5]))); print(json.dumps(d))' \
        "$line" "$policy" "$hit" "$moved" "$new" "$SPILL_WAIT_MS" | tee -a "$OUT"
}

# switchboard_affinity_total of result $2 in metrics text $1 (0 when absent).
sample() {
    printf '%s\n' "$1" | awk -v r="$2" '$1 ~ "^switchboard_affinity_total\\{" && $1 ~ "result=\"" r "\"" { v += $2 } END { printf "%d", v + 0 }'
}

for policy in $POLICIES; do
    for seed in $(seq 1 "$RUNS"); do
        run 1 "$policy" "$seed"
        run 2 "$policy" "$seed"
    done
done

python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    key = (r["policy"], str(r.get("spill_wait_ms", "default")), r["proxies"])
    groups.setdefault(key, []).append(r)
print("\npolicy  spill wait  processes  runs  cached share after turn 1 (pooled)  per run  moved")
for (policy, wait, procs), rs in sorted(groups.items()):
    cached = sum(r["cached_tokens_after_first"] for r in rs)
    prompt = sum(r["prompt_tokens_after_first"] for r in rs)
    per = ", ".join(f'{r["cached_share_pct"]:.1f}' for r in rs)
    moved = sum(r["affinity"]["moved"] for r in rs)
    print(f"{policy:7} {wait:>10} {procs:9}  {len(rs):4}  {100.0 * cached / prompt:30.1f} %  {per}  {moved}")
EOF
