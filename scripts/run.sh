#!/usr/bin/env bash
# The main job (README): set the machine up, fetch the default model (SmolLM2-135M-Instruct),
# build treespec and generate the same answer with plain decoding and with speculative decoding,
# printing the acceptance statistics of each. Pass a prompt as the first argument to change it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/fetch-models.sh smollm2
cargo build --release -p treespec-cli

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
prompt=${1:-"Write a short poem about the sea."}
# SmolLM2 drafts for itself here (a demonstration of exactness, not of speed: a self-draft costs a
# full target step). `dyspec --budget 8` grows a fixed-size tree; `auto` measures this machine's
# cost curve once (cached) and drafts only where that pays.
for method in plain chain "dyspec --budget 8" auto; do
    echo
    echo "=== --method $method ==="
    # shellcheck disable=SC2086  # the method string carries its own knobs
    ./target/release/treespec generate -m "$model" --draft "$model" --chat --method $method -n 128 -p "$prompt"
done
