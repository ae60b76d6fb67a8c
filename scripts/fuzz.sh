#!/usr/bin/env bash
# Longer runs of the fuzz harness that CI runs briefly (issue #15): the GGUF pre-check and
# llama.cpp's loader behind it, the request validator and both HTTP endpoints, and the command
# line. Same property tests as `cargo test`, with more cases:
#
#   bash scripts/fuzz.sh            # 2000 cases per property (real-model and CLI properties fewer)
#   FUZZ_CASES=20000 bash scripts/fuzz.sh
#
# Each property prints what happened to its cases (refused by the pre-check, by llama.cpp,
# loaded; HTTP statuses; CLI exit codes). A llama.cpp abort kills its test process: the file that
# did it is left at the `last-case.gguf` path printed at the start. Needs the SmolLM2 model
# (scripts/fetch-models.sh smollm2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cases=${FUZZ_CASES:-2000}
run() { # run CASES PACKAGE TEST [FILTER]
    echo "[fuzz] $2 $3 ${4:-} ($1 cases)"
    local out status=0
    out=$(TREESPEC_FUZZ_CASES=$1 cargo test --release -p "$2" --test "$3" -- --nocapture ${4:+"$4"} 2>&1) ||
        status=$?
    if [ "$status" -ne 0 ]; then
        printf '%s\n' "$out" | tail -60
        echo "[fuzz] FAILED: $2 $3 ${4:-}"
        exit 1
    fi
    printf '%s\n' "$out" | grep -E '^fuzz [a-z]+: (Stats|responses|exit)|test result' || true
}
run "$cases" treespec-server fuzz_requests
run "$cases" treespec-llama fuzz_gguf generated
run "$cases" treespec-llama fuzz_gguf random
# A case rewrites the 100 MB model file and decodes: about 0.2 s each.
run $((cases / 10 > 0 ? cases / 10 : 1)) treespec-llama fuzz_gguf the_real
# A case starts the binary (and often loads the model).
run $((cases / 5 > 0 ? cases / 5 : 1)) treespec-cli fuzz_cli
echo "[fuzz] all properties held"
