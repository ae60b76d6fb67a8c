#!/usr/bin/env bash
# Real clients against `treespec serve` (issue #65): installs the clients (pinned) into
# bench-out/.venv-clients, starts the server on SmolLM2 (or MODEL) on a free port, and prints
# scripts/clients-check.py's pass/fail table. `--ci` runs the rows CI runs (openai, instructor).
#
# Usage: scripts/clients-check.sh [--ci] [MODEL.gguf] [-- extra `treespec serve` flags]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rows="openai,instructor,langchain,llm"
packages=("openai==2.8.1" "instructor==1.17.0" "langchain-openai==1.1.9" "llm==0.30")
if [[ "${1:-}" == "--ci" ]]; then
    rows="openai,instructor"
    packages=("${packages[@]:0:2}")
    shift
fi
model="${1:-$repo_root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
shift || true
[[ "${1:-}" == "--" ]] && shift
venv="$repo_root/bench-out/.venv-clients"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "${packages[@]}"
bin="$repo_root/target/release/treespec"
[[ -x "$bin" ]] || cargo build --release -p treespec-cli >&2
log="$(mktemp)"
"$bin" serve -m "$model" --method suffix --port 0 -t 2 "$@" 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$log"' EXIT
url=""
for _ in $(seq 1 240); do
    url="$(grep -o 'http://[0-9.:]*' "$log" | head -1 || true)"
    [[ -n "$url" ]] && break
    kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
done
[[ -n "$url" ]] || { echo "[clients] the server did not start" >&2; cat "$log" >&2; exit 1; }
echo "[clients] server at $url; rows: $rows" >&2
"$venv/bin/python" "$repo_root/scripts/clients-check.py" "$url" --rows "$rows"
