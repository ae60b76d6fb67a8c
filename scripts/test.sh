#!/usr/bin/env bash
# The test command (README and CI): set the machine up, fetch the small test model, then check
# formatting and lints and run every test in release mode (the statistical tests run 10^5+
# trials and the llama.cpp tests want optimised code).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/fetch-models.sh smollm2

echo "[test] cargo fmt --check"
cargo fmt --all -- --check
echo "[test] cargo clippy -D warnings"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "[test] cargo test"
cargo test --workspace --release
