#!/usr/bin/env bash
# The test command (README and CI): check the repository's rules (seconds, before any build),
# set the machine up, fetch the small test model, then check formatting and lints and run every
# test in release mode (the statistical tests run 10^5+ trials and the llama.cpp tests want
# optimised code).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "[test] rules: import cycles, indexes, doc paths, function length, result sizes (scripts/rules/)"
bash scripts/rules/check.sh
bash scripts/setup.sh
bash scripts/fetch-models.sh smollm2

echo "[test] the side-by-side harness feeds llama.cpp's tools the tokens treespec reads (stand-in tools, no build)"
python3 scripts/same-prompt-test.py
echo "[test] cargo fmt --check"
cargo fmt --all -- --check
echo "[test] cargo clippy -D warnings"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "[test] cargo test"
cargo test --workspace --release
echo "[test] short soak: 8 streaming clients for 20 s on SmolLM2 (25% disconnect, 5% bad requests; prefixes kept in 16 MiB of host memory, so RSS must level off)"
cargo build --release -p treespec-cli --bin treespec
python3 scripts/soak.py --server-cmd "target/release/treespec serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf --method suffix -t 2 -c 4096 --parallel 8 --cache-ram 16 --port {port}" \
    --clients 8 --duration 20 --max-tokens 16 --strict-metrics --max-rss-growth 0.25
echo "[test] short soak with a shared draft model: 8 streaming clients for 15 s, chain drafts batched across requests"
python3 scripts/soak.py --server-cmd "target/release/treespec serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf -md models/SmolLM2-135M-Instruct.Q4_1.gguf --method chain -k 3 -t 2 -c 4096 --parallel 8 --cache-ram 16 --port {port}" \
    --clients 8 --duration 15 --max-tokens 16 --strict-metrics --max-rss-growth 0.25
echo "[test] real clients, unmodified, against the server: the openai and instructor rows of scripts/clients-check.sh"
bash scripts/clients-check.sh --ci
