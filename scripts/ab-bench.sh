#!/usr/bin/env bash
# Two builds of treespec side by side, interleaved, on the same prompts: did a change (a refactor,
# a rework of the step) move serving throughput or single-request speed?
#
#   scripts/ab-bench.sh OLD_BIN NEW_BIN OUT
#
# Serving: for each repeat, OLD then NEW (then NEW then OLD on the next repeat, so drift hits both
# alike): scripts/serve-bench.py starts `treespec serve -m T -md D --method $METHOD -t 2
# --parallel $CLIENTS` and sends $REQUESTS streaming chat requests from $CLIENTS client threads
# (max_tokens $MAX_TOKENS, temperature 0, prompts from bench/inputs/prompts/code-edit.jsonl).
# Single requests: for each prompt of the same file (the first $PROMPTS), each repeat, OLD and NEW
# in alternating order run `treespec generate --json -n $MAX_TOKENS --chat --method $METHOD` and
# the decode rate (stats.tokens_per_s) is recorded. OUT/ab.md holds the medians and NEW ÷ OLD.
#
# Environment: TARGET (models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf), DRAFT (the 0.5B; empty:
# none), METHOD (auto), CLIENTS (4), REQUESTS (16), MAX_TOKENS (64), PROMPTS (4), REPEAT (2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
old="${1:?usage: scripts/ab-bench.sh OLD_BIN NEW_BIN OUT}"
new="${2:?usage: scripts/ab-bench.sh OLD_BIN NEW_BIN OUT}"
out="${3:?usage: scripts/ab-bench.sh OLD_BIN NEW_BIN OUT}"
TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
DRAFT="${DRAFT-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
METHOD="${METHOD:-auto}"
CLIENTS="${CLIENTS:-4}"
REQUESTS="${REQUESTS:-16}"
MAX_TOKENS="${MAX_TOKENS:-64}"
PROMPTS="${PROMPTS:-4}"
REPEAT="${REPEAT:-2}"
for b in "$old" "$new"; do [[ -x "$b" ]] || { echo "no executable $b" >&2; exit 1; }; done
[[ -f "$TARGET" ]] || { echo "no $TARGET: bash scripts/fetch-models.sh qwen" >&2; exit 1; }
mkdir -p "$out"
draft=()
[[ -n "$DRAFT" ]] && draft=(-md "$DRAFT")
prompts=bench/inputs/prompts/code-edit.jsonl
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >"$out/load.txt"

# Serving, interleaved.
for r in $(seq "$REPEAT"); do
    order=(old new)
    (( r % 2 == 0 )) && order=(new old)
    for which in "${order[@]}"; do
        bin="$old"; [[ "$which" == new ]] && bin="$new"
        python3 scripts/serve-bench.py --name "$which" --model-label "$(basename "$TARGET")" \
            --server-cmd "$bin serve -m $TARGET ${draft[*]} --method $METHOD -t 2 --parallel $CLIENTS -c $((CLIENTS * 2048)) --port {port}" \
            --prompts "$prompts" --clients "$CLIENTS" --requests "$REQUESTS" --max-tokens "$MAX_TOKENS" \
            --out "$out/serve.jsonl" --log "$out/serve-$which-$r.log" >/dev/null
    done
done

# Single requests, interleaved per prompt.
: >"$out/generate.jsonl"
for i in $(seq 0 $((PROMPTS - 1))); do
    text="$(python3 -c "import json,sys; l=open('$prompts').read().splitlines()[$i]; print(json.loads(l)['turns'][0])")"
    for r in $(seq "$REPEAT"); do
        order=(old new)
        (( (i + r) % 2 == 0 )) && order=(new old)
        for which in "${order[@]}"; do
            bin="$old"; [[ "$which" == new ]] && bin="$new"
            "$bin" generate -m "$TARGET" "${draft[@]}" -t 2 --method "$METHOD" --chat -n "$MAX_TOKENS" --json \
                -p "$text" 2>/dev/null |
                python3 -c "import json,sys; r=json.load(sys.stdin); print(json.dumps({'build':'$which','prompt':$i,'tok_s':r['stats']['tokens_per_s'],'tokens':r['token_ids']}))" \
                >>"$out/generate.jsonl"
        done
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"

python3 - "$out" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
serve = [json.loads(l) for l in open(f"{out}/serve.jsonl")]
gen = [json.loads(l) for l in open(f"{out}/generate.jsonl")]
med = lambda xs: statistics.median(xs) if xs else float("nan")
s = {b: med([r["throughput_tok_s"] for r in serve if r["name"] == b]) for b in ("old", "new")}
g = {b: med([r["tok_s"] for r in gen if r["build"] == b]) for b in ("old", "new")}
same = all(
    a["tokens"] == b["tokens"]
    for a in gen if a["build"] == "old"
    for b in gen if b["build"] == "new" and b["prompt"] == a["prompt"]
)
ratios = [
    med([r["tok_s"] for r in gen if r["build"] == "new" and r["prompt"] == p])
    / med([r["tok_s"] for r in gen if r["build"] == "old" and r["prompt"] == p])
    for p in sorted({r["prompt"] for r in gen})
]
lines = [
    "| measure | old | new | new ÷ old |",
    "|---|---:|---:|---:|",
    f"| serving throughput, tok/s (median of {sum(r['name']=='old' for r in serve)} runs each) | {s['old']:.1f} | {s['new']:.1f} | {s['new']/s['old']:.3f}× |",
    f"| single request decode, tok/s (median of {sum(r['build']=='old' for r in gen)} runs each) | {g['old']:.1f} | {g['new']:.1f} | {g['new']/g['old']:.3f}× |",
    f"| single request, per prompt: median of new ÷ old medians | | | {med(ratios):.3f}× |",
    "",
    f"Single-request outputs identical between the builds: {'yes' if same else 'NO'}.",
    "",
    open(f"{out}/load.txt").read().strip(),
]
open(f"{out}/ab.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
