#!/usr/bin/env python3
"""One client, one request at a time: treespec serve against llama-server, streamed and whole (issue #64).

    scripts/stream-parity.py --server "treespec=treespec serve ... --port {port}" \
        --server "llama-server=llama-server ... --port {port}" [--server NAME=CMD ...] \
        [--prompts FILE.jsonl] [--pairs 6] [--max-tokens 256] [--modes stream,whole] [--out DIR]

Every server is up for the whole run (an idle server computes nothing). Every round sends one
prompt to each server in turn, the order reversed round by round, once per mode:
  stream  "stream": true; the client's decode rate is (tokens - 1) / (last content chunk - first)
  whole   "stream": false
and the servers' own decode rate (`timings.predicted_per_second`, which both report) for both.
Prompts: the first user turn of each session of bench/inputs/sessions/agent-whole.jsonl (its system
message, then the file in a fenced block and the change request), taken in turn; the answers
re-emit a whole file, so they run long. Greedy (temperature 0), `max_tokens` capped.

OUT/runs.jsonl has one line per request; OUT/summary.md the medians per server and mode, and
each server ÷ the last one named per mode (each round's ratio, then their median). Python
standard library.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import Server  # noqa: E402


def messages(session, turn=0):
    f = session["file"]
    user = f"{f['path']}\n```python\n{f['text']}```\n\n{session['turns'][turn]['user']}"
    return [{"role": "system", "content": session["system"]}, {"role": "user", "content": user}]


def request(server, msgs, max_tokens, stream):
    body = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
    sent = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    if not stream:
        answer = json.loads(resp.read())
        conn.close()
        return {
            "tokens": answer["usage"]["completion_tokens"],
            "text": answer["choices"][0]["message"]["content"],
            "server_tok_s": (answer.get("timings") or {}).get("predicted_per_second"),
            "latency_s": time.monotonic() - sent,
        }
    first = last = None
    text, tokens, timings = [], None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                now = time.monotonic()
                first = first if first is not None else now
                last = now
                text.append(piece)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("timings"):
            timings = chunk["timings"]
    conn.close()
    rate = (tokens - 1) / (last - first) if tokens and first is not None and last > first else None
    return {
        "tokens": tokens,
        "text": "".join(text),
        "client_tok_s": rate,
        "server_tok_s": (timings or {}).get("predicted_per_second"),
        "ttft_s": first - sent if first is not None else None,
    }


def summarize(runs, modes, names):
    ref = names[-1]
    lines = [f"| mode | figure | server | tok/s (median) | ÷ {ref} (median of rounds) | rounds |",
             "|---|---|---|---:|---:|---:|"]
    for mode in modes:
        for figure in ("client_tok_s", "server_tok_s"):
            rounds = {}
            for r in runs:
                if r["mode"] == mode and r.get(figure):
                    rounds.setdefault(r["pair"], {})[r["server"]] = r[figure]
            full = [p for p in rounds.values() if len(p) == len(names)]
            for name in names:
                if not full:
                    continue
                rate = statistics.median(p[name] for p in full)
                ratio = statistics.median(p[name] / p[ref] for p in full)
                lines.append(f"| {mode} | {figure} | {name} | {rate:.2f} | {ratio:.3f} | {len(full)} |")
    pairs = sorted({r["pair"] for r in runs})
    same = sum(1 for p in pairs if len({r["text"] for r in runs if r["pair"] == p and r["mode"] == modes[0]}) == 1)
    lines.append("")
    lines.append(f"The same answer from every server ({modes[0]}): {same} of {len(pairs)} rounds.")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, metavar="NAME=CMD",
                    help="a server to run: its name, then its command with {port}; the last is the reference")
    ap.add_argument("--prompts", default="bench/inputs/sessions/agent-whole.jsonl")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--modes", default="stream,whole")
    ap.add_argument("--out", default="bench-out/stream-parity")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"stream", "whole"}:
        sys.exit(f"--modes takes stream and whole, not {args.modes}")
    os.makedirs(args.out, exist_ok=True)
    with open(args.prompts) as f:
        sessions = [json.loads(line) for line in f if line.strip()]
    servers = {}
    for spec in args.server:
        name, sep, cmd = spec.partition("=")
        if not sep or not name or name in servers:
            sys.exit(f"--server takes NAME=CMD with a name used once, not {spec!r}")
        servers[name] = Server(cmd, os.path.join(args.out, f"{name}.log"), 600)
    runs = []
    try:
        for s in servers.values():
            s.start()
        names = list(servers)
        for pair in range(args.pairs):
            msgs = messages(sessions[pair % len(sessions)])
            order = names if pair % 2 == 0 else names[::-1]
            for mode in modes:
                for name in order:
                    r = request(servers[name], msgs, args.max_tokens, mode == "stream")
                    r.update(pair=pair, server=name, mode=mode, prompt=sessions[pair % len(sessions)]["id"])
                    runs.append(r)
                    print(f"[stream-parity] pair {pair} {mode} {name}: {r['tokens']} tokens, "
                          f"client {r.get('client_tok_s') or 0:.2f} server {r.get('server_tok_s') or 0:.2f} tok/s",
                          file=sys.stderr, flush=True)
    finally:
        for s in servers.values():
            s.stop()
    with open(os.path.join(args.out, "runs.jsonl"), "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    table = summarize(runs, modes, list(servers))
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
