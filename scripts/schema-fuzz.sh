#!/usr/bin/env bash
# Schema fuzzing of the server against its own /openapi.json with schemathesis (pinned): no 5xx,
# responses conform to the schema, every request answered within REQUEST_TIMEOUT seconds. Then
# hostile grammars (issue #29): recursive and cyclic `$ref`s, long ref chains, deep and huge
# schemas, in response_format and in tools, streamed or not: no 5xx, no 200 that ends in an
# error event, each answered within REQUEST_TIMEOUT seconds.
# Usage: scripts/schema-fuzz.sh [MODEL]   (MAX_EXAMPLES, REQUEST_TIMEOUT in the environment)
# Needs target/release/treespec (cargo build --release -p treespec-cli).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
MAX_EXAMPLES=${MAX_EXAMPLES:-60}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-30}
VERSION=4.32.5
VENV=bench-out/.venv-schemathesis
OUT=bench-out/schema-fuzz
mkdir -p "$OUT"
if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -q "$VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "schemathesis==$VERSION"
fi
source scripts/lib/server.sh
start_server "$OUT/server.log" -m "$MODEL" -md "$MODEL" --method chain --port 0 -t 2
echo "server at $URL"
# Generations are capped by the schema-fuzzed max_tokens only; keep the bound on examples small.
# From inside $OUT so that schemathesis's .schemathesis/ cache lands there.
python3 - "$URL" "$REQUEST_TIMEOUT" "$MAX_EXAMPLES" <<'PY' | tee "$OUT/hostile.txt"
import json, random, sys, time, urllib.error, urllib.request
url, timeout, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(29)
def ref():
    return rng.choice(["#", "#/$defs/d0", "#/$defs/d1", "#/properties/a", "#/items", "#/$defs/missing"])
def schema(depth=0):
    k = rng.randrange(7 if depth < 4 else 2)
    if k == 0: return {"type": rng.choice(["integer", "string", "boolean"])}
    if k == 1: return {"$ref": ref()}
    if k == 2: return {"type": "object", "properties": {"a": schema(depth + 1)}, **({"required": ["a"]} if rng.random() < .5 else {})}
    if k == 3: return {"type": "array", "items": schema(depth + 1), "minItems": rng.randrange(2)}
    if k == 4: return {"anyOf": [schema(depth + 1) for _ in range(rng.randrange(1, 4))]}
    if k == 5: return {"allOf": [schema(depth + 1)]}
    return {"oneOf": [schema(depth + 1), {"$ref": ref()}]}
def hostile():
    k = rng.randrange(4)
    if k == 0:
        m = rng.randrange(1, 3000)
        d = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i+1}"}} for i in range(m)}
        d[f"d{m}"] = {"type": "integer"}
        return {"$ref": "#/$defs/d0", "$defs": d}
    if k == 1:
        s = {"$ref": "#"}
        for _ in range(rng.randrange(1, 100)): s = {"items": s}
        return s
    if k == 2:
        return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(rng.randrange(1, 6000))}}
    s = schema()
    if isinstance(s, dict): s["$defs"] = {f"d{i}": schema(1) for i in range(rng.randrange(3))}
    return s
bad = 0
for i in range(n):
    s, stream = hostile(), rng.random() < .5
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": stream}
    if rng.random() < .5:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": s}}]
        body["tool_choice"] = rng.choice(["required", "auto", {"type": "function", "function": {"name": "f"}}])
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    except Exception as e:
        status, text = 0, repr(e)
    late_error = status == 200 and stream and '"error"' in text
    if status == 0 or status >= 500 or late_error or "NoExtensionBias" in text:
        bad += 1
        print(f"FAIL {status} in {time.time()-t:.1f}s: {json.dumps(body)[:300]} -> {text[:300]}")
print(f"hostile grammars: {n} requests, {bad} failures")
sys.exit(1 if bad else 0)
PY
ROOT=$PWD
cd "$OUT"
timeout 600 "$ROOT/$VENV/bin/schemathesis" run "$URL/openapi.json" \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
    --max-examples "$MAX_EXAMPLES" \
    --request-timeout "$REQUEST_TIMEOUT" \
    --workers 1 \
    --report junit --report-dir . \
    "${@:2}" 2>&1 | tee summary.txt
