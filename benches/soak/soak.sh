#!/usr/bin/env bash
# Soak of the release binary on loopback: streams, client disconnects, backend kills and
# restarts, and reloads for MINUTES minutes (default 10); prints requests lost, in flight at the
# end and RSS before and after (see soak.py). Bounded in time; stops everything it started.
#   benches/soak/soak.sh                 # 10 minutes
#   MINUTES=1 benches/soak/soak.sh       # a quick look
#   RESEND=1 benches/soak/soak.sh        # with server.resend_unanswered
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${SWITCHBOARD_BIN:-target/release/switchboard}
if [ -z "${SWITCHBOARD_BIN:-}" ]; then
  cargo build --release --bin switchboard
fi
exec timeout $(( ${MINUTES:-10} * 60 + 180 )) python3 benches/soak/soak.py --bin "$bin" --minutes "${MINUTES:-10}" --clients "${CLIENTS:-16}" ${RESEND:+--resend}
