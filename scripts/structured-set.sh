#!/usr/bin/env bash
# The structured-output benchmark set (issue #14): 24 tool-call prompts from the Berkeley
# Function Calling Leaderboard data shipped in the `bfcl-eval` package (the wheel is downloaded
# with pip and unzipped; it is never installed or imported): the first 12 of `simple_python` (one
# function offered) and the first 12 of `multiple` (several offered, the model picks one). Each
# line carries the prompt (functions listed, answer asked for as {"name", "arguments"} JSON) and
# the JSON Schema of a valid call — the same shape as `treespec-grammar`'s tool-call grammar —
# which `treespec bench --structured` constrains the output to.
#
# Usage: scripts/structured-set.sh [OUT.jsonl]   (default: bench-out/sets/structured.jsonl)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo_root/bench-out/sets/structured.jsonl}"
version=2026.3.23
sha256=3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a
cache="$repo_root/bench-out/.cache"
mkdir -p "$cache" "$(dirname "$out")"
wheel="$cache/bfcl_eval-$version-py3-none-any.whl"
if [[ ! -f "$wheel" ]]; then
    pip download --no-deps --only-binary=:all: -d "$cache" "bfcl-eval==$version" >&2
fi
echo "$sha256  $wheel" | sha256sum --check --status || { echo "[structured-set] $wheel: sha256 mismatch" >&2; exit 1; }
unzip -o -q -d "$cache/bfcl" "$wheel" 'bfcl_eval/data/BFCL_v4_simple_python.json' 'bfcl_eval/data/BFCL_v4_multiple.json'

python3 - "$cache/bfcl/bfcl_eval/data" "$out" <<'EOF'
import json, sys
data, out = sys.argv[1:]
TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "bool": "boolean", "int": "integer"}

def schema(p):
    """BFCL's parameter types (Python names) as JSON Schema."""
    if isinstance(p, list):
        return [schema(x) for x in p]
    if not isinstance(p, dict):
        return p
    q = {}
    for k, v in p.items():
        if k == "type":
            if v == "any":
                continue
            q[k] = TYPES.get(v, v)
        elif k in ("properties",):
            q[k] = {name: schema(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf"):
            q[k] = schema(v)
        elif k in ("description", "default", "optional", "format"):
            continue
        else:
            q[k] = v
    if q.get("type") == "object":
        q["additionalProperties"] = False
    return q

def call(f):
    return {"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": schema(f["parameters"])},
            "required": ["name", "arguments"], "additionalProperties": False}

lines = []
for name, category in [("BFCL_v4_simple_python.json", "tool_call_simple"), ("BFCL_v4_multiple.json", "tool_call_multiple")]:
    for line in list(open(f"{data}/{name}"))[:12]:
        q = json.loads(line)
        fns = q["function"]
        listing = json.dumps([{"name": f["name"], "description": f["description"], "parameters": f["parameters"]} for f in fns])
        question = q["question"][0][-1]["content"]
        prompt = (f"You can call these functions:\n{listing}\n\nAnswer with exactly one call as JSON: "
                  f'{{"name": <function name>, "arguments": {{...}}}}.\n\nRequest: {question}')
        s = call(fns[0]) if len(fns) == 1 else {"anyOf": [call(f) for f in fns]}
        lines.append({"id": q["id"], "category": category, "prompt": prompt, "schema": s})
with open(out, "w") as f:
    for l in lines:
        f.write(json.dumps(l) + "\n")
print(f"[structured-set] wrote {len(lines)} prompts to {out}", file=sys.stderr)
EOF
