#!/usr/bin/env python3
"""The copy oracle (scripts/copy-bound.py) on a session run's answers: how fast could ANY free
draft copied from the text itself have made each answer, given everything the session had said
before it (system prompt, earlier turns and answers, the agent's file, tool results)?

Reads the baseline server's requests from a `treespec bench --sessions` run (sessions.json keeps
their messages), rebuilds each prompt with a running `treespec serve` of the same model
(`/apply-template`, then `/tokenize`; tool declarations are left out of the prompt, so the bound
is slightly low for tools sessions), tokenizes each answer the same way, and prints the oracle's
speed-up over plain decoding per workload, first turns and later turns apart, priced on the
target's cost curve.

`--plain-tokens FILE` also writes the tokenized prompts and answers as a `plain-tokens.jsonl`
(category = workload/turns), which `suffix_replay` replays through the real suffix drafter on any
cost curve (what `scripts/gpu-check.sh replay` does with a GPU's).

Usage: scripts/session-copy-bound.py SESSIONS_JSON --url http://127.0.0.1:8080 --curve COST_JSON
       [--match 1 3] [--max-rows 64] [--plain-tokens FILE]
"""

import argparse
import importlib.util
import json
import statistics
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path


def copy_bound():
    sys.dont_write_bytecode = True  # no __pycache__ in the repository
    spec = importlib.util.spec_from_file_location("copy_bound", Path(__file__).with_name("copy-bound.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def text_of(message):
    """Tool-call messages: their calls as text, so the template has something to render."""
    if message.get("tool_calls"):
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
        return {"role": "assistant", "content": (message.get("content") or "") + json.dumps(calls)}
    if message.get("role") == "tool":
        return {"role": "user", "content": message.get("content", "")}
    return {"role": message["role"], "content": message.get("content") or ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sessions", help="sessions.json from treespec bench --sessions")
    ap.add_argument("--url", required=True, help="a running treespec serve of the same target")
    ap.add_argument("--curve", required=True, help="the target's cost-cache JSON (~/.cache/treespec/costs/…)")
    ap.add_argument("--match", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--plain-tokens", help="also write the tokenized answers (plain-tokens.jsonl) here")
    args = ap.parse_args()
    cb = copy_bound()
    cost = cb.load_curve(args.curve)
    try:
        run = json.load(open(args.sessions))
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"session-copy-bound: cannot read {args.sessions}: {e}")
    records = [r for r in run["records"] if r.get("messages")]
    if not records:
        sys.exit("session-copy-bound: no request kept its messages (only the baseline server's do)")
    url = args.url.rstrip("/")
    by = defaultdict(lambda: defaultdict(list))
    plain_tokens = open(args.plain_tokens, "w") if args.plain_tokens else None
    for i, r in enumerate(records):
        messages = [text_of(m) for m in r["messages"]]
        prompt_text = post(f"{url}/apply-template", {"messages": messages})["prompt"]
        prompt = post(f"{url}/tokenize", {"content": prompt_text})["tokens"]
        answer = r["reply"]["text"]
        for c in r["reply"].get("tool_calls") or []:
            answer += json.dumps({"name": c["name"], "arguments": c["arguments"]})
        output = post(f"{url}/tokenize", {"content": answer, "parse_special": False})["tokens"]
        if len(output) < 2:
            continue
        turn = "turn 1" if r["turn"] == 0 else "later"
        if plain_tokens:
            line = {"prompt_id": f"{r['session']}/{r['turn']}/{i}", "category": f"{r['workload']}/{turn}",
                    "repeat": 0, "prompt": prompt, "output": output}
            plain_tokens.write(json.dumps(line) + "\n")
        for m in args.match:
            s = cb.oracle_speedup(prompt, output, cost, m, args.max_rows)
            for key in [(r["workload"], turn), (r["workload"], "all"), ("all", turn)]:
                by[key][m].append(s)
    print(f"Copy oracle on {len(records)} answers of {run['config']['baseline']} ({args.sessions}); "
          f"speed-up over plain decoding on {args.curve}, median [min–max]\n")
    print("| workload | turns | answers | " + " | ".join(f"oracle, match ≥ {m}" for m in args.match) + " |")
    print("|---|---|---:|" + "---:|" * len(args.match))
    for key in sorted(by, key=lambda k: (k[0] == "all", k)):
        cells = [f"{statistics.median(v):.2f}× [{min(v):.2f}–{max(v):.2f}]" for v in (by[key][m] for m in args.match)]
        print(f"| {key[0]} | {key[1]} | {len(by[key][args.match[0]])} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
