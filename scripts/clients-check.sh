#!/usr/bin/env bash
# Real clients against `treespec serve` (issue #65): installs the clients (pinned) into
# bench-out/.venv-clients, starts the server on SmolLM2 (or MODEL) on a free port, and prints
# scripts/clients-check.py's pass/fail table. `--ci` runs the rows CI runs (openai, instructor).
# `--aider` runs aider's rows instead (one edit in each of its whole, diff and udiff formats),
# with aider-chat installed into its own environment (bench-out/.venv-aider: its pins clash with
# the other clients') and the Qwen 1.5B target by default (SmolLM2 cannot follow the formats).
#
# Usage: scripts/clients-check.sh [--ci | --aider] [MODEL.gguf] [-- extra `treespec serve` flags]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rows="openai,instructor,langchain,llm"
packages=("openai==2.8.1" "instructor==1.17.0" "langchain-openai==1.1.9" "llm==0.30")
default_model="$repo_root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
venv="$repo_root/bench-out/.venv-clients"
if [[ "${1:-}" == "--ci" ]]; then
    rows="openai,instructor"
    packages=("${packages[@]:0:2}")
    shift
elif [[ "${1:-}" == "--aider" ]]; then
    rows="aider-whole,aider-diff,aider-udiff"
    packages=("aider-chat==0.86.2")
    venv="$repo_root/bench-out/.venv-aider"
    default_model="$repo_root/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    export AIDER="$venv/bin/aider"
    shift
fi
model="${1:-$default_model}"
shift || true
[[ "${1:-}" == "--" ]] && shift
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
echo "[clients] installing ${packages[*]} into $venv (a minute the first time)" >&2
"$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"
model="$(realpath "$model")"
cd "$repo_root"
[[ -x target/release/treespec ]] || cargo build --release -p treespec-cli >&2
source scripts/lib/server.sh
log=bench-out/clients-server.log
start_server "$log" -m "$model" --method suffix --port 0 -t 2 "$@"
echo "[clients] server at $URL; rows: $rows" >&2
"$venv/bin/python" scripts/clients-check.py "$URL" --rows "$rows"
