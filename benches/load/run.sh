#!/usr/bin/env bash
# Loopback load harness: Switchboard against nginx, a bare hyper proxy and no proxy at all.
#
# usage: benches/load/run.sh            (from any directory)
#
# Builds `cargo build --release` (Switchboard and the bare proxy, benches/load/bare), then
# starts, all on 127.0.0.1:
#   - two simulated backends with zero delays (`switchboard simulate`):
#       chat   llama.cpp flavour, non-streaming answers of CHAT_TOKENS tokens
#       stream vLLM flavour with --reasoning, streams of 200 token events; the wrk
#              script mixes bodies so a quarter of the requests think (their first
#              REASONING_TOKENS events carry vLLM's `reasoning` field, which
#              Switchboard renames to `reasoning_content`) and three quarters turn
#              thinking off (`chat_template_kwargs.enable_thinking: false`)
#   - nginx: one worker, keepalive upstream (64), HTTP/1.1 upstream, no buffering,
#     no access log; generated config, pid and logs in a temp dir; a foreground child
#   - bare: benches/load/bare, the least a hyper-based proxy does (hyper server, hyper-util
#     pooled client, `model` read from the body with serde_json, `bench` and `bench-stream`
#     sent to the two simulators, the answer's body passed through unchanged), SB_WORKERS
#     current-thread runtimes: the floor of the CPU budget
#   - switchboard serve, aliases `bench` and `bench-stream` on those backends, with
#     SB_WORKERS workers (default 1, as nginx's one worker: every proxy gets one core)
# and checks each path answers correctly. Then, for ROUNDS rounds, interleaved
# (direct → nginx → bare → switchboard for every setting, the order turned by one each
# round): wrk at each of CONNS connections and a sequential run (1 connection,
# 1 thread), for non-streaming chat and for streams. Each run records requests/s,
# p50/p99 latency (wrk --latency) and the CPU time of the proxy process per request,
# with its user-space part (utime+stime and utime from /proc/PID/stat, nginx master
# and worker summed, before and after the run, divided by the requests wrk
# completed). Then the time to the first SSE byte, on new connections and on
# kept-alive ones, the paths taking turns (first_byte.py, needs python3). Prints
# markdown tables of medians over the rounds, and the added p50 latency of each
# proxy over direct in sequential runs and to the first SSE byte, and Switchboard's CPU per
# request over bare's, paired by round, against the budget (docs/PERFORMANCE.md: at most
# 1.4 for whole answers, 1.8 for 200-event streams). Exits 1 if any
# wrk run saw a non-2xx answer or a socket error. Everything it started is stopped
# on exit.
#
# Environment (defaults):
#   DURATION=5s      length of each wrk run
#   ROUNDS=3         rounds of the whole interleaved sweep
#   CONNS="8 64"     concurrent connections of the throughput runs
#   KINDS="chat stream"  which kinds of request are measured (e.g. KINDS=chat: more rounds of
#                    the non-streaming path in the same time)
#   WRK_THREADS=1    wrk threads of the throughput runs (the machine has few cores)
#   CHAT_TOKENS=16   completion tokens of each non-streaming answer
#   REASONING_TOKENS=50  of the 200 tokens of a thinking stream, how many are reasoning
#   SKIP_BUILD=0     1: use the existing binaries (SWITCHBOARD_BIN and BARE_BIN, default
#                    target/release or $CARGO_TARGET_DIR/release)
#   DRY_RUN=0        1: no Switchboard; the backend is a second nginx serving fixed
#                    answers (tests the harness itself: direct and nginx paths only)
#   KEEP_TMP=0       1: keep the temp dir (configs, logs, raw wrk output)
#   SB_PORT=17700 NGINX_PORT=17780 NGINX_STREAM_PORT=17781 SIM_PORT=17801
#   SIM_STREAM_PORT=17802 BARE_PORT=17710                loopback ports used
#   SB_WORKERS=1     Switchboard's `server.workers` and bare's runtimes (nginx runs
#                    `worker_processes 1`)
#   BASELINE_BIN=    another Switchboard binary (an earlier build) measured side by side as
#                    the path `baseline`, on SB_PORT+1 with the same config: two builds
#                    compared in one run, against the same nginx
#   REPLICAS=1       2: Switchboard's aliases get two replicas each (`backends = [...]`), a
#                    second pair of simulators on SIM_PORT+100 and SIM_STREAM_PORT+100
#                    (nginx, bare and direct keep the first pair)
#   CLIENTS=0        N > 0: Switchboard gets N named clients, each with a key and limits
#                    far above the load (requests_per_minute, tokens_per_minute,
#                    tokens_per_day, max_concurrent), and every request carries one of
#                    their keys in turn (`Authorization: Bearer`; nginx and direct ignore
#                    it): the cost of identifying, limiting and charging each request.
#                    Not with BASELINE_BIN (an earlier build may not read [clients])
#   TRACE_RATIO=     set (e.g. 1 or 0.01): Switchboard gets a [tracing] section with that
#                    sample_ratio, exporting to an OTLP sink (otlp_sink.py, python3, its CPU
#                    not counted) on OTLP_PORT (default 17790): the cost of tracing.
#                    With BASELINE_BIN, the baseline runs without [tracing]: tracing on
#                    against off in one run (give it a build that reads the same config)
#   OTLP_SINK=ok     with TRACE_RATIO, the collector: ok (answers every export), hang (reads
#                    each export and never answers), down (nothing listens on OTLP_PORT).
#                    The report ends with the spans dropped and the proxy's peak RSS
#   FIRST_BYTE_SAMPLES=400  samples per path of the time to the first SSE byte (0: skip)
#   SHARED_STATE=0   1: Switchboard keeps its slots in a redis-server started here on REDIS_PORT
#                    (default 17791, no persistence; its CPU not counted): `server.shared_state`,
#                    the cost of a slot lease per request. With BASELINE_BIN, the baseline runs
#                    without it: the store against none in one run
#   LEDGER=          sqlite or postgres: Switchboard gets a [ledger] section, a SQLite file in the
#                    temp dir or a PostgreSQL server started here on PG_PORT (default 17792,
#                    Debian's postgresql; its CPU not counted, the ledger thread's is): the cost
#                    of a usage row per request. With BASELINE_BIN, the baseline runs without it:
#                    the ledger against none in one run. The report ends with the rows written
#                    and dropped
#   RUST_LOG=warn    log level of the proxy and simulators (per-request logs cost CPU)
# Needs: cargo, wrk, nginx, curl, awk.
set -euo pipefail

# shellcheck source=benches/load/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-8 64}
KINDS=${KINDS:-chat stream}
WRK_THREADS=${WRK_THREADS:-1}
CHAT_TOKENS=${CHAT_TOKENS:-16}
STREAM_TOKENS=200
REASONING_TOKENS=${REASONING_TOKENS:-50}
DRY_RUN=${DRY_RUN:-0}
SB_PORT=${SB_PORT:-17700}
NGINX_PORT=${NGINX_PORT:-17780}
NGINX_STREAM_PORT=${NGINX_STREAM_PORT:-17781}
SIM_PORT=${SIM_PORT:-17801}
SIM_STREAM_PORT=${SIM_STREAM_PORT:-17802}
BARE_PORT=${BARE_PORT:-17710}
SB_WORKERS=${SB_WORKERS:-1}
REPLICAS=${REPLICAS:-1}
CLIENTS=${CLIENTS:-0}
TRACE_RATIO=${TRACE_RATIO:-}
OTLP_PORT=${OTLP_PORT:-17790}
OTLP_SINK=${OTLP_SINK:-ok}
FIRST_BYTE_SAMPLES=${FIRST_BYTE_SAMPLES:-400}
SHARED_STATE=${SHARED_STATE:-0}
REDIS_PORT=${REDIS_PORT:-17791}
LEDGER=${LEDGER:-}
PG_PORT=${PG_PORT:-17792}
export RUST_LOG=${RUST_LOG:-warn}
API=/v1/chat/completions

for tool in wrk nginx curl awk; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, not $ROUNDS"
case $DURATION in
  *[0-9]s | *[0-9]) dur_s=${DURATION%s} ;;
  *[0-9]m) dur_s=$((${DURATION%m} * 60)) ;;
  *) die "DURATION must look like 5s or 1m, not $DURATION" ;;
esac
[[ $dur_s =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds or minutes"

WORK=$(mktemp -d -t switchboard-load.XXXXXX)
chmod 755 "$WORK" # nginx workers may run as another user
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- request bodies
BODIES=$WORK/bodies
mkdir -p "$BODIES"
cat >"$BODIES/chat.json" <<EOF
{"model":"bench","messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Name three primary colours."}],"max_tokens":$CHAT_TOKENS,"temperature":0}
EOF
cat >"$BODIES/stream-think.json" <<EOF
{"model":"bench-stream","stream":true,"messages":[{"role":"user","content":"Count to two hundred."}],"max_tokens":$STREAM_TOKENS}
EOF
cat >"$BODIES/stream-plain.json" <<EOF
{"model":"bench-stream","stream":true,"messages":[{"role":"user","content":"Count to two hundred."}],"max_tokens":$STREAM_TOKENS,"chat_template_kwargs":{"enable_thinking":false}}
EOF
CHAT_BODIES=("$BODIES/chat.json")
STREAM_BODIES=("$BODIES/stream-think.json" "$BODIES/stream-plain.json" "$BODIES/stream-plain.json" "$BODIES/stream-plain.json")

# ---------------------------------------------------------------- processes
if [[ $DRY_RUN == 1 ]]; then
  PATHS=(direct nginx)
  require_free_ports "$NGINX_PORT" "$NGINX_STREAM_PORT" "$SIM_PORT" "$SIM_STREAM_PORT"
else
  PATHS=(direct nginx bare switchboard)
  require_free_ports "$SB_PORT" "$NGINX_PORT" "$NGINX_STREAM_PORT" "$SIM_PORT" "$SIM_STREAM_PORT" \
    "$BARE_PORT"
  if [[ -n ${BASELINE_BIN:-} ]]; then
    PATHS=(direct nginx bare baseline switchboard)
    require_free_ports $((SB_PORT + 1))
  fi
fi

# A fixed-answer backend made of nginx `return`, for DRY_RUN.
start_static_backend() {
  local dir=$WORK/static i chunk
  mkdir -p "$dir/tmp"
  {
    printf 'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"bench-stream","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    chunk='{"id":"c","object":"chat.completion.chunk","created":0,"model":"bench-stream","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}'
    for ((i = 0; i < STREAM_TOKENS; i++)); do printf 'data: %s\n\n' "$chunk"; done
    printf 'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"bench-stream","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    printf 'data: [DONE]\n\n'
  } >"$dir/stream.txt"
  cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$SIM_PORT;
        default_type application/json;
        location / {
            return 200 '{"id":"c","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Red, yellow, blue."},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":$CHAT_TOKENS,"total_tokens":$((20 + CHAT_TOKENS))}}';
        }
    }
    server {
        listen 127.0.0.1:$SIM_STREAM_PORT;
        # the static module refuses POST; an error_page redirect turns it into a GET
        location / {
            error_page 405 =200 /stream.txt;
            return 405;
        }
        location = /stream.txt {
            root $dir;
            default_type text/event-stream;
        }
    }
}
EOF
  start_nginx "$dir" "static backend"
  wait_http "http://127.0.0.1:$SIM_PORT/" "$SPAWNED" "static backend"
}

if [[ $DRY_RUN == 1 ]]; then
  log "DRY_RUN=1: static nginx backend, no Switchboard"
  start_static_backend
else
  BIN=$(switchboard_bin)
  BARE=$(bare_bin)
  spawn "chat simulator" "$WORK/sim-chat.log" "$BIN" simulate --flavor llamacpp \
    --port "$SIM_PORT" --model bench --slots 4096 --completion-tokens "$CHAT_TOKENS"
  SIM_PID=$SPAWNED
  spawn "stream simulator" "$WORK/sim-stream.log" "$BIN" simulate --flavor vllm \
    --port "$SIM_STREAM_PORT" --model bench-stream --slots 4096 --completion-tokens "$STREAM_TOKENS" \
    --reasoning --reasoning-tokens "$REASONING_TOKENS"
  SIM_STREAM_PID=$SPAWNED
  wait_http "http://127.0.0.1:$SIM_PORT/health" "$SIM_PID" "chat simulator"
  wait_http "http://127.0.0.1:$SIM_STREAM_PORT/health" "$SIM_STREAM_PID" "stream simulator"
  if [[ $REPLICAS == 2 ]]; then
    require_free_ports $((SIM_PORT + 100)) $((SIM_STREAM_PORT + 100))
    spawn "chat simulator 2" "$WORK/sim-chat-2.log" "$BIN" simulate --flavor llamacpp \
      --port $((SIM_PORT + 100)) --model bench --slots 4096 --completion-tokens "$CHAT_TOKENS"
    wait_http "http://127.0.0.1:$((SIM_PORT + 100))/health" "$SPAWNED" "chat simulator 2"
    spawn "stream simulator 2" "$WORK/sim-stream-2.log" "$BIN" simulate --flavor vllm \
      --port $((SIM_STREAM_PORT + 100)) --model bench-stream --slots 4096 \
      --completion-tokens "$STREAM_TOKENS" --reasoning --reasoning-tokens "$REASONING_TOKENS"
    wait_http "http://127.0.0.1:$((SIM_STREAM_PORT + 100))/health" "$SPAWNED" "stream simulator 2"
  fi
fi

write_nginx_conf "$WORK/nginx" "$NGINX_PORT" "$SIM_PORT" "$NGINX_STREAM_PORT" "$SIM_STREAM_PORT"
chmod 755 "$WORK/nginx"
start_nginx "$WORK/nginx" nginx
NGINX_PID=$SPAWNED
wait_http "http://127.0.0.1:$NGINX_PORT/" "$NGINX_PID" nginx

if [[ $DRY_RUN != 1 ]]; then
  BARE_WORKERS=$SB_WORKERS spawn bare "$WORK/bare.log" "$BARE" "127.0.0.1:$BARE_PORT" \
    "bench=http://127.0.0.1:$SIM_PORT" "bench-stream=http://127.0.0.1:$SIM_STREAM_PORT"
  BARE_PID=$SPAWNED
  wait_http "http://127.0.0.1:$BARE_PORT/" "$BARE_PID" bare
fi

if [[ $DRY_RUN != 1 ]]; then
  cat >"$WORK/bench.toml" <<EOF
[server]
listen = "127.0.0.1:$SB_PORT"
workers = $SB_WORKERS
$([[ $SHARED_STATE == 1 ]] && printf 'shared_state = "redis://127.0.0.1:%s/0"\n' "$REDIS_PORT")

[backends.sim]
url = "http://127.0.0.1:$SIM_PORT"
flavor = "llamacpp"
slots = 4096

[backends.sim-stream]
url = "http://127.0.0.1:$SIM_STREAM_PORT"
flavor = "vllm"
slots = 4096

$([[ $REPLICAS == 2 ]] && printf '[backends.sim-2]\nurl = "http://127.0.0.1:%s"\nflavor = "llamacpp"\nslots = 4096\n\n[backends.sim-stream-2]\nurl = "http://127.0.0.1:%s"\nflavor = "vllm"\nslots = 4096\n' $((SIM_PORT + 100)) $((SIM_STREAM_PORT + 100)))

[aliases.bench]
$([[ $REPLICAS == 2 ]] && echo 'backends = ["sim", "sim-2"]' || echo 'backend = "sim"')
upstream_model = "bench"

[aliases.bench-stream]
$([[ $REPLICAS == 2 ]] && echo 'backends = ["sim-stream", "sim-stream-2"]' || echo 'backend = "sim-stream"')
upstream_model = "bench-stream"
$(for ((c = 1; c <= CLIENTS; c++)); do
    classes=(batch interactive normal)
    printf '\n[clients.bench-%s]\nkey_env = "SB_BENCH_KEY_%s"\npriority = "%s"\n' "$c" "$c" "${classes[c % 3]}"
    printf 'max_concurrent = 100000\nrequests_per_minute = 1000000000\ntokens_per_minute = 1000000000000\ntokens_per_day = 1000000000000000\n'
  done)
$([[ -n $TRACE_RATIO ]] && printf '\n[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nsample_ratio = %s\n' "$OTLP_PORT" "$TRACE_RATIO")
$(case $LEDGER in
    sqlite) printf '\n[ledger]\nurl = "sqlite://%s/usage.db"\n' "$WORK" ;;
    postgres) printf '\n[ledger]\nurl = "postgres://postgres@127.0.0.1:%s/bench"\n' "$PG_PORT" ;;
  esac)
EOF
  case $LEDGER in
    "" | sqlite) ;;
    postgres)
      pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
      [[ -x $pg_bin/initdb ]] || die "PostgreSQL not found (Debian package postgresql)"
      require_free_ports "$PG_PORT"
      as_pg=()
      mkdir -p "$WORK/pg"
      if [[ $(id -u) == 0 ]]; then
        # initdb refuses root: the server runs as postgres, in a dir it can reach.
        chmod o+x "$WORK"
        chown postgres "$WORK/pg"
        as_pg=(runuser -u postgres --)
      fi
      "${as_pg[@]}" "$pg_bin/initdb" -D "$WORK/pg" -A trust -U postgres >/dev/null
      spawn postgres "$WORK/postgres.log" "${as_pg[@]}" "$pg_bin/postgres" -D "$WORK/pg" \
        -p "$PG_PORT" -k "$WORK/pg" -c listen_addresses=127.0.0.1
      for _ in $(seq 100); do
        "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
        sleep 0.1
      done
      "$pg_bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres bench
      ;;
    *) die "LEDGER=$LEDGER: not sqlite or postgres" ;;
  esac
  if [[ -n $TRACE_RATIO ]]; then
    case $OTLP_SINK in
      ok | hang)
        spawn "otlp sink" "$WORK/otlp.log" python3 "$(dirname "${BASH_SOURCE[0]}")/otlp_sink.py" \
          "$OTLP_PORT" "$([[ $OTLP_SINK == hang ]] && echo hang)"
        wait_http "http://127.0.0.1:$OTLP_PORT/" "$SPAWNED" "otlp sink"
        ;;
      down) ;;
      *) die "OTLP_SINK=$OTLP_SINK: not ok, hang or down" ;;
    esac
  fi
  if [[ $SHARED_STATE == 1 ]]; then
    command -v redis-server >/dev/null || die "redis-server not found (Debian package redis-server)"
    require_free_ports "$REDIS_PORT"
    spawn "redis-server" "$WORK/redis.log" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 \
      --save "" --appendonly no --dir "$WORK"
    for _ in $(seq 100); do
      redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
      sleep 0.1
    done
  fi
  BEARER_KEYS=
  for ((c = 1; c <= CLIENTS; c++)); do
    export "SB_BENCH_KEY_$c=bench-key-$c"
    BEARER_KEYS+="${BEARER_KEYS:+,}bench-key-$c"
  done
  export BEARER_KEYS
  start_switchboard "$BIN" "$WORK/bench.toml"
  if [[ -n ${BASELINE_BIN:-} ]]; then
    # The baseline runs without the [tracing] and [ledger] sections (the last) and without
    # the store: tracing, the ledger, the store against none.
    sed "s/^listen = .*/listen = \"127.0.0.1:$((SB_PORT + 1))\"/; /^shared_state = /d; /^\[tracing\]/,\$d; /^\[ledger\]/,\$d" "$WORK/bench.toml" >"$WORK/baseline.toml"
    spawn baseline "$WORK/baseline.log" "$BASELINE_BIN" serve --config "$WORK/baseline.toml"
    BASE_PID=$SPAWNED
    wait_http "http://127.0.0.1:$((SB_PORT + 1))/health" "$BASE_PID" baseline
  fi
fi

# url_of PATH KIND
url_of() {
  case $1/$2 in
    direct/chat) echo "http://127.0.0.1:$SIM_PORT$API" ;;
    direct/stream) echo "http://127.0.0.1:$SIM_STREAM_PORT$API" ;;
    nginx/chat) echo "http://127.0.0.1:$NGINX_PORT$API" ;;
    nginx/stream) echo "http://127.0.0.1:$NGINX_STREAM_PORT$API" ;;
    bare/*) echo "http://127.0.0.1:$BARE_PORT$API" ;;
    switchboard/*) echo "http://127.0.0.1:$SB_PORT$API" ;;
    baseline/*) echo "http://127.0.0.1:$((SB_PORT + 1))$API" ;;
  esac
}

# proxy_pid PATH: the process whose CPU time is charged to the path (none for direct).
proxy_pid() {
  case $1 in
    nginx) echo "$NGINX_PID" ;;
    bare) echo "$BARE_PID" ;;
    switchboard) echo "$SB_PID" ;;
    baseline) echo "$BASE_PID" ;;
    *) echo "" ;;
  esac
}

# ---------------------------------------------------------------- correctness
post() {
  curl -sS --max-time 10 -H 'Content-Type: application/json' \
    ${BEARER_KEYS:+-H "Authorization: Bearer ${BEARER_KEYS%%,*}"} --data-binary "@$2" "$1"
}

verify_paths() {
  local path url out events
  for path in "${PATHS[@]}"; do
    url=$(url_of "$path" chat)
    out=$(post "$url" "$BODIES/chat.json") || die "$path: chat request failed"
    [[ $out == *'"choices"'* ]] || die "$path: chat answer has no choices: ${out:0:300}"

    url=$(url_of "$path" stream)
    out=$(post "$url" "$BODIES/stream-plain.json") || die "$path: stream request failed"
    events=$(grep -c '^data: ' <<<"$out" || true)
    [[ $out == *'data: [DONE]'* ]] || die "$path: stream did not end with [DONE]"
    ((events >= STREAM_TOKENS)) || die "$path: stream had $events events, expected at least $STREAM_TOKENS"
    log "$path: chat ok, stream ok ($events events)"

    [[ $DRY_RUN == 1 ]] && continue
    out=$(post "$url" "$BODIES/stream-think.json") || die "$path: thinking stream request failed"
    case $path in
      switchboard | baseline)
        [[ $out == *'"reasoning_content"'* ]] || die "$path: thinking stream carries no reasoning_content"
        [[ $out != *'"reasoning":'* ]] || die "$path: thinking stream still carries vLLM's reasoning field"
        ;;
      *)
        [[ $out == *'"reasoning"'* ]] || die "$path: thinking stream carries no reasoning field (simulator --reasoning)"
        ;;
    esac
  done
}
verify_paths

# ---------------------------------------------------------------- measurement
RESULTS=$WORK/results.tsv
: >"$RESULTS"

# to_us VALUE: wrk latency (e.g. 812.00us, 1.25ms, 2.00s) in microseconds.
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) f = 1; else if (v ~ /ms$/) f = 1000; else if (v ~ /m$/) f = 60e6; else if (v ~ /s$/) f = 1e6; else f = 1
    printf "%.1f", n * f
  }'
}

# measure ROUND KIND CONNS PATH: one wrk run; appends a line to RESULTS.
measure() {
  local round=$1 kind=$2 conns=$3 path=$4 threads=$WRK_THREADS url pid t0 t1 out
  local -a bodies
  ((conns < threads)) && threads=$conns
  url=$(url_of "$path" "$kind")
  pid=$(proxy_pid "$path")
  if [[ $kind == chat ]]; then bodies=("${CHAT_BODIES[@]}"); else bodies=("${STREAM_BODIES[@]}"); fi
  out=$WORK/wrk-r$round-$kind-c$conns-$path.txt
  [[ -n $pid ]] && t0=$(proc_ticks "$pid")
  timeout $((dur_s + 60)) wrk -t"$threads" -c"$conns" -d"$DURATION" --timeout 10s --latency \
    -s "$LOAD_DIR/post.lua" "$url" -- "${bodies[@]}" >"$out" 2>&1 ||
    die "wrk failed or overran for $kind c$conns $path: $(tail -3 "$out")"
  [[ -n $pid ]] && t1=$(proc_ticks "$pid")
  local requests rps p50 p99 non2xx sockerr cpu user
  requests=$(awk '/ requests in / { print $1 }' "$out")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
  p50=$(to_us "$(awk '$1 == "50%" { print $2 }' "$out")")
  p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$out")")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$out")
  sockerr=$(awk '/Socket errors:/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$out")
  [[ -n $requests && -n $rps ]] || die "cannot parse wrk output $out"
  if [[ -n $pid ]] && ((requests > 0)); then
    read -r cpu user < <(awk -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN {
      split(t0, a, " "); split(t1, b, " ")
      per = 1e6 / hz / n
      printf "%.2f %.2f\n", (b[1] + b[2] - a[1] - a[2]) * per, (b[1] - a[1]) * per
    }')
  else
    cpu=- user=-
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$kind" "$conns" "$path" \
    "$rps" "$p50" "$p99" "$requests" "${non2xx:-0}" "${sockerr:-0}" "$cpu" "$user" >>"$RESULTS"
  log "round $round $kind c$conns $path: $rps req/s, p50 ${p50} us, p99 ${p99} us, cpu ${cpu} us/req (user ${user}), errors ${non2xx:-0}+${sockerr:-0}"
}

log "measuring: ROUNDS=$ROUNDS DURATION=$DURATION CONNS=\"$CONNS\" paths: ${PATHS[*]}"
for ((round = 1; round <= ROUNDS; round++)); do
  # The order of the paths turns by one each round: a run's place in the sequence moves
  # its CPU figure (what ran just before it warms or cools the machine), so each path
  # takes each place equally often over as many rounds as there are paths.
  order=()
  for ((i = 0; i < ${#PATHS[@]}; i++)); do
    order+=("${PATHS[(i + round - 1) % ${#PATHS[@]}]}")
  done
  for kind in $KINDS; do
    for conns in $CONNS 1; do
      for path in "${order[@]}"; do
        measure "$round" "$kind" "$conns" "$path"
      done
    done
  done
done

# ---------------------------------------------------------------- first SSE byte
# New and kept-alive connections, one streaming request each, the paths taking turns
# (first_byte.py).
FIRST_BYTE=""
if [[ $FIRST_BYTE_SAMPLES != 0 ]] && command -v python3 >/dev/null; then
  log "time to first SSE byte: $FIRST_BYTE_SAMPLES samples per path"
  proxies=$NGINX_STREAM_PORT
  [[ $DRY_RUN == 1 ]] || proxies="$SB_PORT,$BARE_PORT,$NGINX_STREAM_PORT"
  FIRST_BYTE=$(timeout 600 python3 "$(dirname "${BASH_SOURCE[0]}")/first_byte.py" \
    "$SIM_STREAM_PORT" "$proxies" bench-stream "$FIRST_BYTE_SAMPLES") ||
    die "first_byte.py failed"
fi

# ---------------------------------------------------------------- report
report() {
  awk -F'\t' -v conns_list="$CONNS" -v rounds="$ROUNDS" -v paths="${PATHS[*]}" -v kinds="$KINDS" \
    -v chat_tokens="$CHAT_TOKENS" -v stream_tokens="$STREAM_TOKENS" -v dry="$([[ $DRY_RUN == 1 ]] && echo 1 || echo 0)" '
    function median(key,    n, i, j, t, a) {
      n = cnt[key]
      if (n == 0) return "-"
      for (i = 1; i <= n; i++) a[i] = val[key, i]
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(key, v) { if (v == "-") return; cnt[key]++; val[key, cnt[key]] = v + 0 }
    function us(v) { if (v == "-") return "-"; return (v >= 10000) ? sprintf("%.2f ms", v / 1000) : sprintf("%.0f µs", v) }
    function signed_us(v) { if (v == "-") return "-"; return (v < 0 ? "-" : "+") us(v < 0 ? -v : v) }
    function num(v, fmt) { return (v == "-") ? "-" : sprintf(fmt, v) }
    # The CPU budget: each proxy'"'"'s CPU per request over bare'"'"'s, paired within each round,
    # then the median; switchboard'"'"'s against the ratio allowed for the kind.
    function budget(    ki, ci, k, c, key, r, a, pi, p, allowed, v, line, n) {
      print "\n### CPU budget: CPU per request over bare'"'"'s, paired by round\n"
      line = "| kind | conns |"
      for (pi = 1; pi <= np; pi++) if (P[pi] != "direct" && P[pi] != "bare") line = line " " P[pi] " ÷ bare |"
      print line " budget | rounds |"
      line = "|---|---:|"
      for (pi = 1; pi <= np; pi++) if (P[pi] != "direct" && P[pi] != "bare") line = line "---:|"
      print line "---|---:|"
      for (ki = 1; ki <= nk; ki++) for (ci = 1; ci <= nc + 1; ci++) {
        k = K[ki]; c = (ci <= nc) ? C[ci] : 1; key = "bare" SUBSEP k SUBSEP c
        allowed = (k == "chat") ? 1.4 : 1.8
        line = "| " k " | " c " |"; n = 0; v = "-"
        for (pi = 1; pi <= np; pi++) {
          p = P[pi]
          if (p == "direct" || p == "bare") continue
          for (r = 1; r <= rounds; r++) {
            a = r SUBSEP k SUBSEP c
            if ((a SUBSEP p) in cpu && (a SUBSEP "bare") in cpu && cpu[a SUBSEP "bare"] > 0)
              add(key SUBSEP p, cpu[a SUBSEP p] / cpu[a SUBSEP "bare"])
          }
          line = line " " num(median(key SUBSEP p), "%.2f") " |"
          if (p == "switchboard") { v = median(key SUBSEP p); n = cnt[key SUBSEP p] }
        }
        line = line sprintf(" ≤ %.1f%s |", allowed, (v == "-") ? "" : (v <= allowed) ? ": within" : ": **over**")
        print line " " n " |"
      }
    }
    {
      r = $1; k = $2; c = $3; p = $4
      add(k SUBSEP c SUBSEP p SUBSEP "rps", $5)
      add(k SUBSEP c SUBSEP p SUBSEP "p50", $6)
      add(k SUBSEP c SUBSEP p SUBSEP "p99", $7)
      add(k SUBSEP c SUBSEP p SUBSEP "cpu", $11)
      add(k SUBSEP c SUBSEP p SUBSEP "user", $12)
      err[k SUBSEP c SUBSEP p] += $9 + $10
      p50[r SUBSEP k SUBSEP c SUBSEP p] = $6
      if ($11 != "-") cpu[r SUBSEP k SUBSEP c SUBSEP p] = $11
    }
    END {
      np = split(paths, P, " ")
      nc = split(conns_list, C, " ")
      nk = split(kinds, K, " ")
      for (ki = 1; ki <= nk; ki++) {
        k = K[ki]
        if (k == "chat") printf "\n### Non-streaming chat (%d-token answers)\n\n", chat_tokens
        else printf "\n### Streaming chat (%d token events%s)\n\n", stream_tokens, (dry == 1) ? ", fixed file" : ", a quarter with reasoning"
        print "| conns | path | req/s | p50 | p99 | proxy CPU µs/req | of it user space | errors |"
        print "|---:|---|---:|---:|---:|---:|---:|---:|"
        for (ci = 1; ci <= nc; ci++) for (pi = 1; pi <= np; pi++) {
          c = C[ci]; p = P[pi]; key = k SUBSEP c SUBSEP p
          printf "| %s | %s | %s | %s | %s | %s | %s | %d |\n", c, p, num(median(key SUBSEP "rps"), "%.0f"),
            us(median(key SUBSEP "p50")), us(median(key SUBSEP "p99")), num(median(key SUBSEP "cpu"), "%.1f"),
            num(median(key SUBSEP "user"), "%.1f"), err[key]
        }
      }
      print "\n### Sequential (1 connection, 1 wrk thread)\n"
      print "| kind | path | p50 | added p50 over direct | proxy CPU µs/req | of it user space | errors |"
      print "|---|---|---:|---:|---:|---:|---:|"
      for (ki = 1; ki <= nk; ki++) {
        k = K[ki]
        for (pi = 1; pi <= np; pi++) {
          p = P[pi]; key = k SUBSEP 1 SUBSEP p
          for (r = 1; r <= rounds; r++) {
            a = r SUBSEP k SUBSEP 1
            if ((a SUBSEP p) in p50 && (a SUBSEP "direct") in p50) add(key SUBSEP "added", p50[a SUBSEP p] - p50[a SUBSEP "direct"])
          }
          printf "| %s | %s | %s | %s | %s | %s | %d |\n", k, p, us(median(key SUBSEP "p50")),
            (p == "direct") ? "-" : signed_us(median(key SUBSEP "added")), num(median(key SUBSEP "cpu"), "%.1f"),
            num(median(key SUBSEP "user"), "%.1f"), err[key]
        }
      }
      printf "\nMedians over %d round(s). Errors: non-2xx answers plus socket errors, summed over rounds.\n", rounds
      if (paths ~ /bare/) budget()
      if (paths !~ /baseline/) exit
      # Paired within each round (the two builds ran minutes apart at most), then the median.
      print "\n### Switchboard against the baseline build, paired by round\n"
      print "| kind | conns | CPU/req switchboard ÷ baseline | ÷ nginx: switchboard | ÷ nginx: baseline | rounds |"
      print "|---|---:|---:|---:|---:|---:|"
      for (ki = 1; ki <= nk; ki++) for (ci = 1; ci <= nc + 1; ci++) {
        k = K[ki]; c = (ci <= nc) ? C[ci] : 1; key = "ratio" SUBSEP k SUBSEP c
        for (r = 1; r <= rounds; r++) {
          a = r SUBSEP k SUBSEP c
          if (!((a SUBSEP "switchboard") in cpu && (a SUBSEP "baseline") in cpu)) continue
          add(key SUBSEP "sb_base", cpu[a SUBSEP "switchboard"] / cpu[a SUBSEP "baseline"])
          if ((a SUBSEP "nginx") in cpu) {
            add(key SUBSEP "sb_nginx", cpu[a SUBSEP "switchboard"] / cpu[a SUBSEP "nginx"])
            add(key SUBSEP "base_nginx", cpu[a SUBSEP "baseline"] / cpu[a SUBSEP "nginx"])
          }
        }
        printf "| %s | %s | %s | %s | %s | %d |\n", k, c, num(median(key SUBSEP "sb_base"), "%.3f"),
          num(median(key SUBSEP "sb_nginx"), "%.3f"), num(median(key SUBSEP "base_nginx"), "%.3f"), cnt[key SUBSEP "sb_base"]
      }
    }
  ' "$RESULTS"
}

echo
echo "## Switchboard loopback load ($(date -u +%Y-%m-%dT%H:%MZ))"
echo
echo "$(nproc) CPUs, $(wrk -v 2>&1 | head -1 | awk '{ print "wrk " $2 }'), $(nginx -v 2>&1 | sed 's/.*: //'), commit $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown); DURATION=$DURATION, WRK_THREADS=$WRK_THREADS, SB_WORKERS=$SB_WORKERS, REPLICAS=$REPLICAS$([[ $DRY_RUN == 1 ]] && echo ', DRY_RUN (static nginx backend)')"
report
if [[ -n $FIRST_BYTE ]]; then
  printf '\n### Time to the first SSE byte (new connection per request)\n\n'
  printf '%s\n' "$FIRST_BYTE" | sed "s/:$SB_PORT/:$SB_PORT (switchboard)/; s/:$BARE_PORT/:$BARE_PORT (bare)/; s/:$NGINX_STREAM_PORT/:$NGINX_STREAM_PORT (nginx)/"
fi

if [[ -n $TRACE_RATIO ]]; then
  dropped=$(curl -sS --max-time 10 "http://127.0.0.1:$SB_PORT/metrics" |
    awk '/^switchboard_trace_spans_dropped_total/ { printf "%s%s %s", sep, $1, $2; sep = ", " }')
  printf '\n### Tracing (sample_ratio %s, collector %s)\n\n' "$TRACE_RATIO" "$OTLP_SINK"
  printf 'Spans dropped: %s. Switchboard peak RSS: %s.\n' "${dropped:-none}" \
    "$(awk '/^VmHWM/ { print $2 " " $3 }' "/proc/$SB_PID/status")"
fi

if [[ -n $LEDGER ]]; then
  rows=$(curl -sS --max-time 10 "http://127.0.0.1:$SB_PORT/metrics" |
    awk '/^switchboard_ledger_rows_(written|dropped)_total/ { printf "%s%s %s", sep, $1, $2; sep = ", " }')
  printf '\n### Ledger (%s)\n\n' "$LEDGER"
  printf 'Rows: %s. Switchboard peak RSS: %s.\n' "${rows:-none}" \
    "$(awk '/^VmHWM/ { print $2 " " $3 }' "/proc/$SB_PID/status")"
fi

total_errors=$(awk -F'\t' '{ s += $9 + $10 } END { print s + 0 }' "$RESULTS")
if ((total_errors > 0)); then
  log "FAIL: $total_errors non-2xx answers or socket errors (raw wrk output: KEEP_TMP=1)"
  exit 1
fi
