#!/usr/bin/env bash
# Records the prompt-token counts of Anthropic Messages and OpenAI Responses requests as a real
# llama-server and vLLM's conversion + preprocessing + HF transformers report them, into
# tests/fixtures/recorded_messages.json and tests/fixtures/recorded_responses.json.
#
#   REALWORLD=<dir with start.sh/stop.sh> RW=<its build dir> PYTHON=<python with transformers> \
#     scripts/record_api_counts.sh [PORT]
#
# The server runs with the defaults of start.sh (two slots of 4096 tokens).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT=${1:-18080}
: "${REALWORLD:?set REALWORLD to the directory holding start.sh and stop.sh}"
: "${RW:?set RW to the directory setup.sh built into}"
PYTHON=${PYTHON:-python3}
RW="$RW" "$REALWORLD/start.sh" "$PORT"
trap 'RW="$RW" "$REALWORLD/stop.sh" "$PORT"' EXIT
"$PYTHON" "$HERE/record_api_counts.py" --tokenizer-dir "$RW/qwen3-tok" --llama "http://127.0.0.1:$PORT"
