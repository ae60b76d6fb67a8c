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
for method in plain chain dyspec; do
    echo
    echo "=== --method $method ==="
    ./target/release/treespec generate -m "$model" --draft "$model" --chat --method "$method" -n 128 -p "$prompt"
done
