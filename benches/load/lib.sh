# Shared helpers of the loopback load scripts (run.sh, rss.sh); sourced, not run.
# Every process started through `spawn` is stopped by `cleanup`, which the caller
# installs as its EXIT trap. Every wait is bounded.

LOAD_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LOAD_DIR/../.." && pwd)

PIDS=()
NAMES=()

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# spawn NAME LOGFILE CMD ARGS... : start CMD in the background, remember its pid in SPAWNED.
spawn() {
  local name=$1 logfile=$2
  shift 2
  "$@" >"$logfile" 2>&1 &
  SPAWNED=$!
  PIDS+=("$SPAWNED")
  NAMES+=("$name")
  log "started $name (pid $SPAWNED)"
}

# stop_pid PID NAME: SIGTERM, wait up to 5 s, then SIGKILL.
stop_pid() {
  local pid=$1 name=$2 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name (pid $pid) ignored SIGTERM; killing"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# stop_spawned: stop everything spawned, newest first.
stop_spawned() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    stop_pid "${PIDS[i]}" "${NAMES[i]}"
  done
  PIDS=()
  NAMES=()
}

# cleanup: stop everything spawned; remove WORK unless KEEP_TMP=1.
cleanup() {
  stop_spawned
  if [[ -n ${WORK:-} && -d $WORK ]]; then
    if [[ ${KEEP_TMP:-0} == 1 ]]; then
      log "kept $WORK"
    else
      rm -rf "$WORK"
    fi
  fi
}

# port_in_use PORT: true when something accepts connections on 127.0.0.1:PORT.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# free_port: a loopback port free now (the kernel's pick).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# require_free_ports PORT...
require_free_ports() {
  local p
  for p in "$@"; do
    if port_in_use "$p"; then
      die "port 127.0.0.1:$p is already in use (set the *_PORT variables to free ports)"
    fi
  done
}

# wait_http URL PID NAME: until URL answers any HTTP status (at most 15 s) while PID lives.
wait_http() {
  local url=$1 pid=$2 name=$3 i
  for ((i = 0; i < 150; i++)); do
    kill -0 "$pid" 2>/dev/null || die "$name exited during startup (see its log)"
    if curl -s -o /dev/null --max-time 1 "$url"; then
      return 0
    fi
    sleep 0.1
  done
  die "$name did not answer $url within 15 s"
}

# start_switchboard BIN CONFIG: `BIN serve --config CONFIG` as a tracked child, logging to
# $WORK/switchboard.log; waits for its /health on $SB_PORT and sets SB_PID.
start_switchboard() {
  spawn switchboard "$WORK/switchboard.log" "$1" serve --config "$2"
  SB_PID=$SPAWNED
  wait_http "http://127.0.0.1:$SB_PORT/health" "$SB_PID" switchboard
}

# proc_ticks PID...: "utime stime" (clock ticks) of the processes and their direct children.
proc_ticks() {
  local pid child all=() user=0 sys=0 stat rest
  local -a f
  for pid in "$@"; do
    all+=("$pid")
    for child in $(pgrep -P "$pid" 2>/dev/null || true); do
      all+=("$child")
    done
  done
  for pid in "${all[@]}"; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    rest=${stat##*) } # fields from 3 (state) on; comm may hold spaces
    read -r -a f <<<"$rest"
    user=$((user + f[11])) # utime (field 14)
    sys=$((sys + f[12]))   # stime (field 15)
  done
  echo "$user $sys"
}

# rss_kib PID: resident set size of the process in KiB.
rss_kib() {
  awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

# release_dir: where cargo puts release binaries (CARGO_TARGET_DIR, else target/).
release_dir() {
  echo "${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
}

# switchboard_bin: path of the release binary, built unless SKIP_BUILD=1.
switchboard_bin() {
  local bin=${SWITCHBOARD_BIN:-$(release_dir)/switchboard}
  if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "cargo build --release"
    (cd "$REPO_ROOT" && cargo build --release --quiet) >&2 || die "cargo build --release failed"
  fi
  [[ -x $bin ]] || die "no binary at $bin (build it or set SWITCHBOARD_BIN)"
  echo "$bin"
}

# bare_bin: path of the bare hyper proxy (benches/load/bare), built unless SKIP_BUILD=1.
bare_bin() {
  local bin=${BARE_BIN:-$(release_dir)/bare-proxy}
  if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    log "cargo build --release -p bare-proxy"
    (cd "$REPO_ROOT" && cargo build --release --quiet -p bare-proxy) >&2 ||
      die "cargo build --release -p bare-proxy failed"
  fi
  [[ -x $bin ]] || die "no binary at $bin (build it or set BARE_BIN)"
  echo "$bin"
}

# write_nginx_conf DIR LISTEN_PORT UPSTREAM_PORT [LISTEN_PORT UPSTREAM_PORT]...
# One worker, no access log, a keepalive upstream per pair, no response buffering;
# pid, logs and temp files under DIR.
write_nginx_conf() {
  local dir=$1
  shift
  mkdir -p "$dir/tmp"
  {
    cat <<EOF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    # keep client connections as long as wrk does (the default closes after 1000 requests)
    keepalive_requests 1000000;
EOF
    local n=0
    while (($# >= 2)); do
      n=$((n + 1))
      cat <<EOF
    upstream backend_$n {
        server 127.0.0.1:$2;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$1;
        location / {
            proxy_pass http://backend_$n;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
EOF
      shift 2
    done
    echo "}"
  } >"$dir/nginx.conf"
}

# start_nginx DIR NAME: run nginx in the foreground (our child) with prefix DIR; sets SPAWNED.
start_nginx() {
  local dir=$1 name=$2
  nginx -t -q -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" ||
    die "generated nginx config $dir/nginx.conf is invalid"
  spawn "$name" "$dir/stdout.log" nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -g 'daemon off;'
}
