#!/usr/bin/env bash
# Records the prompt-token counts of tests/fixtures/conversations.json as a real llama-server
# and vLLM's preprocessing + HF transformers report them, into tests/fixtures/recorded_counts.json.
#
#   REALWORLD=<dir with start.sh/stop.sh> RW=<its build dir> PYTHON=<python with transformers> \
#     scripts/record_counts.sh [PORT]
#
# The server runs with one slot of 262144 tokens (room for the 100k-token conversation).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT=${1:-18080}
: "${REALWORLD:?set REALWORLD to the directory holding start.sh and stop.sh}"
: "${RW:?set RW to the directory setup.sh built into}"
PYTHON=${PYTHON:-python3}
# The tiny GGUF says 40960 training tokens; llama-server caps the slot there unless overridden.
RW="$RW" CTX=262144 NP=1 "$REALWORLD/start.sh" "$PORT" --override-kv qwen3.context_length=int:262144
trap 'RW="$RW" "$REALWORLD/stop.sh" "$PORT"' EXIT
"$PYTHON" "$HERE/record_counts.py" --tokenizer-dir "$RW/qwen3-tok" --llama "http://127.0.0.1:$PORT"
