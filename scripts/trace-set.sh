#!/usr/bin/env bash
# `auto`'s decision traces on a prompt set, cold, and what its bets saved or lost, read off them.
#
#   scripts/trace-set.sh OUT [PROMPTS.jsonl] [BIN]
#
# One `treespec generate --method auto --decision-trace` per prompt, as scripts/cold-bench.sh runs
# it (a fresh cache holding only this machine's cost curves; Qwen pair by default; greedy, N new
# tokens, 2 threads). Prompts: cold-bench.sh's held-out set (bench/results/cold-qwen-zen3-eos/
# held-out.jsonl by default). OUT/<id>.trace holds each trace, OUT/runs.jsonl each run's tokens/s,
# OUT/regret.md per prompt and category: the steps that drafted, by policy, and the time they
# saved (+) or lost (−) against the run's own median plain step (a drafted step emitting e tokens
# in t ms saved e·plain − t), as a share of the run's decode time; "lost" sums the steps that lost.
# Two builds compared: run it once per build (BIN) into two OUT folders.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: scripts/trace-set.sh OUT [PROMPTS.jsonl] [BIN]}"
prompts="${2:-bench/results/cold-qwen-zen3-eos/held-out.jsonl}"
bin="${3:-target/release/treespec}"
TARGET="${TARGET:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
DRAFT="${DRAFT-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
N="${N:-128}"
[[ -x "$bin" ]] || { echo "no $bin: cargo build --release -p treespec-cli" >&2; exit 1; }
mkdir -p "$out"
source scripts/lib/cold-cache.sh
cache="$out/cache"
curves_only_cache "$cache"
draft=()
[[ -n "$DRAFT" ]] && draft=(--draft "$DRAFT")
: >"$out/runs.jsonl"
while IFS= read -r line; do
    id="$(jq -r '.question_id // .id' <<<"$line")"
    category="$(jq -r '.category' <<<"$line")"
    text="$(jq -r '.turns[0]' <<<"$line")"
    name="${id//\//_}"
    cold_generate "$cache" "$bin" -m "$TARGET" -t 2 --method auto --chat -n "$N" --json \
        "${draft[@]}" --decision-trace "$out/$name.trace" -p "$text" |
        jq -c --arg id "$id" --arg c "$category" --arg f "$name" \
            '{id: $id, category: $c, trace: $f, tokens_per_s: .stats.tokens_per_s}' >>"$out/runs.jsonl"
    echo "[trace-set] $category $id" >&2
done <"$prompts"
rm -rf "$cache"

python3 - "$out" <<'EOF'
import collections, json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl") if l.strip()]
lines = ["| category | prompt | tok/s | steps | drafted steps | saved | lost |", "|---|---|---:|---:|---|---:|---:|"]
by_cat = collections.defaultdict(list)
for r in runs:
    steps = [json.loads(l) for l in open(f"{out}/{r['trace']}.trace") if l.strip()]
    if not steps:
        continue
    plain = [s["step_ms"] for s in steps if s["chosen"] == "plain"]
    per_token = statistics.median(plain) if plain else statistics.median(s["curve_ms"] for s in steps)
    total = sum(s["step_ms"] for s in steps)
    bets = [s for s in steps if s["chosen"] != "plain"]
    delta = [s["emitted"] * per_token - s["step_ms"] for s in bets]
    saved = 100 * sum(delta) / total
    lost = 100 * sum(d for d in delta if d < 0) / total
    policies = ", ".join(f"{p} {n}" for p, n in sorted(collections.Counter(s["chosen"] for s in bets).items()))
    by_cat[r["category"]].append((r["tokens_per_s"], saved, lost))
    lines.append(f"| {r['category']} | {r['id']} | {r['tokens_per_s']:.1f} | {len(steps)} | {policies or '—'} | {saved:+.1f}% | {lost:+.1f}% |")
lines += ["", "| category | prompts | mean tok/s | mean saved | mean lost |", "|---|---:|---:|---:|---:|"]
for c, v in sorted(by_cat.items()):
    lines.append(f"| {c} | {len(v)} | {statistics.mean(x[0] for x in v):.1f} | "
                 f"{statistics.mean(x[1] for x in v):+.1f}% | {statistics.mean(x[2] for x in v):+.1f}% |")
open(f"{out}/regret.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines[-len(by_cat) - 2:]))
EOF
