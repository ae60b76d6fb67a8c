#!/usr/bin/env bash
# The Python `openai` client against `treespec serve` (issues #13, #14): a chat completion whole
# and streamed, a `json_schema` response, and a forced tool call, each checked. The client is
# installed into bench-out/.venv-openai (pinned); the server runs SmolLM2 (or MODEL) on a free port.
#
# Usage: scripts/openai-roundtrip.sh [MODEL.gguf] [-- extra `treespec serve` flags]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="${1:-$repo_root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
shift || true
[[ "${1:-}" == "--" ]] && shift
venv="$repo_root/bench-out/.venv-openai"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "openai==2.8.1"
bin="$repo_root/target/release/treespec"
[[ -x "$bin" ]] || cargo build --release -p treespec-cli >&2
log="$(mktemp)"
"$bin" serve -m "$model" -md "$model" --method chain --port 0 -t 2 "$@" 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 120); do
    url="$(grep -o 'http://[0-9.:]*' "$log" | head -1 || true)"
    [[ -n "$url" ]] && break
    kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
done
[[ -n "$url" ]] || { echo "[openai] the server did not start" >&2; cat "$log" >&2; exit 1; }
echo "[openai] server at $url" >&2
"$venv/bin/python" - "$url/v1" <<'EOF'
import json, sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="unused")
msgs = [{"role": "user", "content": "Name three colours."}]
whole = client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0)
text = whole.choices[0].message.content
assert text, whole
streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model="x", messages=msgs, max_tokens=24, temperature=0, stream=True) if c.choices)
assert streamed == text, (streamed, text)
print(f"[openai] chat, whole and streamed alike: {text!r}")

schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
r = client.chat.completions.create(model="x", temperature=0, max_tokens=64,
    messages=[{"role": "user", "content": "Invent a person as JSON."}],
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
person = json.loads(r.choices[0].message.content)
assert isinstance(person["name"], str) and isinstance(person["age"], int) and len(person) == 2, person
print(f"[openai] json_schema: {person}")

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
r = client.chat.completions.create(model="x", temperature=0, max_tokens=64, tools=tools, tool_choice="required",
    messages=[{"role": "user", "content": "What is the weather in Paris?"}])
call = r.choices[0].message.tool_calls[0]
args = json.loads(call.function.arguments)
assert call.function.name == "get_weather" and isinstance(args["city"], str), call
assert r.choices[0].finish_reason == "tool_calls", r
print(f"[openai] tool call: {call.function.name}({args})")

# The round trip: the call and the tool's result go back; the tools stay offered (auto).
history = [{"role": "user", "content": "What is the weather in Paris?"},
           r.choices[0].message.model_dump(exclude_none=True),
           {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."}]
final = client.chat.completions.create(model="x", temperature=0, max_tokens=32, tools=tools, messages=history)
answer = final.choices[0].message
assert answer.content or answer.tool_calls, final
print(f"[openai] after the tool's result: {answer.content or answer.tool_calls}")

lp = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0,
    logprobs=True, top_logprobs=2)
entries = lp.choices[0].logprobs.content
assert len(entries) == lp.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in entries), lp
assert "".join(e.token for e in entries) == lp.choices[0].message.content, lp
print(f"[openai] logprobs: {[(e.token, round(e.logprob, 3)) for e in entries]}")
EOF
echo "[openai] round trip OK" >&2
