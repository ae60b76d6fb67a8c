#!/usr/bin/env bash
# The README's main benchmark, end to end, on the Qwen pair (greedy, 128 new tokens, 2 threads):
#   greedy   treespec plain, lookup, suffix, auto (with the 0.5B draft) on the main set
#            (scripts/bench-set.sh: Spec-Bench 6×5, HumanEval 10, 12 code edits), interleaved per
#            prompt
#   peers    llama.cpp's own tools on the same chat-formatted prompts (scripts/peer-bench.sh),
#            then one side-by-side table with the greedy stage's results (scripts/side-by-side.py)
#   table    only the side-by-side table, from the greedy and peers stages' files
#   t1       plain and auto at temperature 1 on the code categories
#   exact    plain, suffix and auto in --exact mode on SmolLM2-135M (all 52 prompts): greedy
#            outputs must equal plain's
#   exact-qwen  plain, suffix and auto in --exact mode on the Qwen pair (all 52 prompts): greedy
#            outputs must equal plain's on the real target too
#   levers   what each part of the suffix drafter contributes, on the code-edit and summarization
#            prompts
#
# Usage: scripts/bench-main.sh [STAGE …]   (default: greedy peers t1 exact levers)
# METHODS picks the greedy stage's methods (default plain,lookup,suffix,auto) and PEER_TOOLS the
# peers stage's llama.cpp tools (scripts/peer-bench.sh; default: all of them).
# Writes bench/results/main-*/ (results.json, summary.md, SVG charts, peers.jsonl, side-by-side.md).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
T=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
D=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
bin=./target/release/treespec
set_file=bench-out/sets/main.jsonl
stages=("$@")
((${#stages[@]})) || stages=(greedy peers t1 exact levers)

bash scripts/fetch-models.sh qwen
cargo build --release -p treespec-cli
bash scripts/bench-set.sh "$set_file"
echo "[bench-main] load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

for stage in "${stages[@]}"; do
    case "$stage" in
        greedy)
            "$bin" bench -m "$T" --draft "$D" -t 2 --prompts "$set_file" --methods "${METHODS:-plain,lookup,suffix,auto}" \
                -n 128 --temp 0 --log --out bench/results/main-greedy
            ;;
        peers)
            [[ -x "${TREESPEC_PEERS:-$HOME/.cache/treespec/peers}/build/bin/llama-completion" ]] ||
                bash scripts/peer-bench.sh build
            "$bin" bench -m "$T" --prompts "$set_file" --dump-prompts bench-out/prompts-formatted.jsonl
            bash scripts/peer-bench.sh run bench-out/prompts-formatted.jsonl bench/results/main-greedy/peers.jsonl \
                -m "$T" -md "$D" -n 128 -t 2
            python3 scripts/side-by-side.py bench/results/main-greedy/results.json bench/results/main-greedy/peers.jsonl \
                --out bench/results/main-greedy/side-by-side.md
            ;;
        table)
            python3 scripts/side-by-side.py bench/results/main-greedy/results.json bench/results/main-greedy/peers.jsonl \
                --out bench/results/main-greedy/side-by-side.md
            ;;
        t1)
            "$bin" bench -m "$T" --draft "$D" -t 2 --prompts "$set_file" --categories code_completion,code_edit \
                --methods plain,auto -n 128 --temp 1.0 --seed 1 --log --out bench/results/main-t1
            ;;
        exact)
            bash scripts/fetch-models.sh smollm2
            "$bin" bench -m models/SmolLM2-135M-Instruct.Q4_1.gguf -t 2 --exact --prompts "$set_file" \
                --methods plain,suffix,auto -n 128 --temp 0 --log --out bench/results/main-exact
            ;;
        exact-qwen)
            "$bin" bench -m "$T" --draft "$D" -t 2 --exact --prompts "$set_file" \
                --methods plain,suffix,auto -n 128 --temp 0 --log --out bench/results/main-exact-qwen
            ;;
        levers)
            # Code edits and summarization: where the free drafts matter.
            local_set=bench-out/sets/levers.jsonl
            grep -E '"category": "(code_edit|summarization)"' "$set_file" >"$local_set"
            run() { "$bin" bench -m "$T" -t 2 --prompts "$local_set" -n 128 --temp 0 --log --out "bench/results/levers-suffix/$1" "${@:2}"; }
            run defaults --methods plain,suffix
            run no-global --methods plain,suffix --no-global
            run mean-pricing --methods plain,suffix --suffix-pessimism 0
            run short-drafts --methods plain,suffix --suffix-depth 8
            run no-exploration --methods plain,suffix --suffix-explore 0
            ;;
        *) echo "unknown stage $stage (greedy, peers, table, t1, exact, levers)" >&2; exit 2 ;;
    esac
done
echo "[bench-main] load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
