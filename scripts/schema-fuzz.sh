#!/usr/bin/env bash
# Schema fuzzing of the server against its own /openapi.json with schemathesis (pinned): no 5xx,
# responses conform to the schema, every request answered within REQUEST_TIMEOUT seconds.
# Usage: scripts/schema-fuzz.sh [MODEL]   (MAX_EXAMPLES, REQUEST_TIMEOUT in the environment)
# Needs target/release/treespec (cargo build --release -p treespec-cli).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
MAX_EXAMPLES=${MAX_EXAMPLES:-60}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-30}
VERSION=4.32.5
VENV=bench-out/.venv-schemathesis
OUT=bench-out/schema-fuzz
mkdir -p "$OUT"
if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -q "$VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "schemathesis==$VERSION"
fi
target/release/treespec serve -m "$MODEL" -md "$MODEL" --method chain --port 0 -t 2 2> "$OUT/server.log" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
URL=
for _ in $(seq 600); do
    URL=$(grep -o 'listening on http://[^ ]*' "$OUT/server.log" | head -1 | sed 's/listening on //' || true)
    [ -n "$URL" ] && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$OUT/server.log"; exit 1; }
    sleep 0.1
done
[ -n "$URL" ] || { echo "server did not start"; cat "$OUT/server.log"; exit 1; }
echo "server at $URL"
# Generations are capped by the schema-fuzzed max_tokens only; keep the bound on examples small.
# From inside $OUT so that schemathesis's .schemathesis/ cache lands there.
ROOT=$PWD
cd "$OUT"
timeout 600 "$ROOT/$VENV/bin/schemathesis" run "$URL/openapi.json" \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
    --max-examples "$MAX_EXAMPLES" \
    --request-timeout "$REQUEST_TIMEOUT" \
    --workers 1 \
    --report junit --report-dir . \
    "${@:2}" 2>&1 | tee summary.txt
