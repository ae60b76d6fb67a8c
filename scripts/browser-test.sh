#!/usr/bin/env bash
# The chat page in a real browser: headless Chromium (Debian's package) driven by playwright-core
# (npm, pinned) against `treespec serve` on SmolLM2. Checks that the answer is coloured by how
# each token was produced and that tokens/s and tokens per forward are shown; saves a
# screenshot (docs/chat-page.png by default).
# Usage: scripts/browser-test.sh [SCREENSHOT]   (needs target/release/treespec and the model)
set -euo pipefail
cd "$(dirname "$0")/.."
SHOT=${1:-docs/chat-page.png}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=bench-out/browser
mkdir -p "$OUT"
if ! command -v chromium >/dev/null; then
    echo "[browser] installing Debian's chromium"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
fi
if [ ! -d "$OUT/node_modules/playwright-core" ]; then
    echo "[browser] installing playwright-core"
    (cd "$OUT" && npm init -y >/dev/null && npm install --silent playwright-core@1.64.1)
fi
cp scripts/browser/chat-page.mjs "$OUT/"
source scripts/lib/server.sh
start_server "$OUT/server.log" -m "$MODEL" --method suffix --port 0 -t 2 -c 4096
echo "[browser] server at $URL"
# The speed-up over plain needs this machine's cost curve: wait while the server measures it.
for _ in $(seq 600); do
    curl -sf "$URL/health" | grep -q '"cost_curve":"ready"' && break
    sleep 1
done
curl -sf "$URL/health"; echo
PROMPT="Add a docstring to this function and return the whole function:

$(cat scripts/demo/merge_intervals.py)"
node "$OUT/chat-page.mjs" "$URL/" "$SHOT" "$PROMPT" | tee "$OUT/result.json"
echo "[browser] PASS; screenshot in $SHOT"
