#!/usr/bin/env bash
# The main job (README): set the machine up, fetch the models, build treespec, then
#   1. edit a piece of code with Qwen2.5-Coder-1.5B (the project's default target), with plain
#      decoding and with `--method auto` (suffix drafts from the prompt, priced on this machine's
#      measured cost curve), and print both speeds side by side;
#   2. show exactness on the small SmolLM2-135M: in `--exact` mode every method's greedy output
#      is plain decoding's, token for token.
# Pass a prompt file as the first argument to edit something else.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Every stage says what it does and how long it took; the whole run's time is estimated up front
# from what is already done (a second run skips the build, the fetch and the cost curve).
started=$SECONDS
stage_n=0
stage() {
    stage_n=$((stage_n + 1))
    printf '\n[run] %d/6 %s  (%d:%02d elapsed)\n' "$stage_n" "$*" $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60))
}
estimate=3 # the runs themselves, minutes on 2 cores
[[ -x target/release/treespec ]] || estimate=$((estimate + 12))
[[ -f models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ]] || estimate=$((estimate + 2))
cache_dir="${TREESPEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/treespec}"
compgen -G "$cache_dir/costs/qwen2.5-coder-1.5b*" >/dev/null || estimate=$((estimate + 4))
echo "[run] about $estimate minutes on a 2-core machine (build ~12, model fetch ~2, cost curve ~4 once; then cached)"

stage "setting the machine up (cmake, clang; CPU flags for llama.cpp)"
bash scripts/setup.sh
stage "fetching the models (SmolLM2-135M for exactness, Qwen2.5-Coder-1.5B for speed)"
bash scripts/fetch-models.sh smollm2
bash scripts/fetch-models.sh qwen
stage "building treespec (release; llama.cpp is compiled the first time)"
cargo build --release -p treespec-cli

target=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
small=models/SmolLM2-135M-Instruct.Q4_1.gguf
bin=./target/release/treespec
prompt_file=${1:-}
if [[ -z "$prompt_file" ]]; then
    prompt_file="$(mktemp)"
    trap 'rm -f "$prompt_file"' EXIT
    # The function (scripts/demo/, also the browser test's) in a code-edit request.
    {
        printf 'Add type hints to this Python function. Return the complete function.\n\n```python\n'
        cat scripts/demo/merge_intervals.py
        printf '```\n'
    } >"$prompt_file"
fi

# One generation as JSON: "<tokens/s> <mean accepted> <token ids>" (MODEL first).
run() {
    local model="$1"
    shift
    "$bin" generate -m "$model" --chat -n 200 -f "$prompt_file" --json "$@" 2>/dev/null |
        python3 -c 'import json,sys; o=json.load(sys.stdin); s=o["stats"]
print("%.1f %.2f %s" % (s["tokens_per_s"], s["mean_accepted"], ",".join(map(str, o["token_ids"]))))'
}

stage "warming up: the first auto run measures this machine's cost curve (once, cached in $cache_dir)"
# Its progress goes to the terminal; the generation itself is thrown away.
"$bin" generate -m "$target" --chat -n 200 -f "$prompt_file" --method auto >/dev/null
stage "editing code: plain decoding vs --method auto, 3 alternating runs of 200 tokens each"
plain=() auto=()
for i in 1 2 3; do
    echo "[run]   round $i/3"
    plain+=("$(run "$target" --method plain | cut -d' ' -f1)")
    read -r tps acc _ < <(run "$target" --method auto)
    auto+=("$tps")
done
median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
p="$(median "${plain[@]}")" a="$(median "${auto[@]}")"
printf '%-8s %10s\n' method "tokens/s"
printf '%-8s %10s\n' plain "$p" auto "$a"
python3 -c "print(f'speed-up: {float(\"$a\") / float(\"$p\"):.2f}x (auto verified {float(\"$acc\"):.2f} tokens per target forward)')"
echo
"$bin" generate -m "$target" --chat -n 200 -f "$prompt_file" --method auto

stage "exactness (--exact, SmolLM2-135M drafting for itself): greedy tokens equal plain decoding's"
reference="$(run "$small" --exact --method plain | cut -d' ' -f3)"
for method in suffix auto chain "dyspec --budget 8"; do
    # shellcheck disable=SC2086  # the method string carries its own knobs
    read -r tps acc ids < <(run "$small" --exact --draft "$small" --method $method)
    verdict=$([[ "$ids" == "$reference" ]] && echo "identical to plain" || echo "DIFFERS from plain")
    printf '%-18s %6s tok/s  %5s tokens/forward  %s\n' "$method" "$tps" "$acc" "$verdict"
done
printf "\n[run] done in %d:%02d\n" $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60))
