#!/usr/bin/env python3
"""How long a long prompt stalls the requests already decoding (issue #13: chunked prefill).

    python3 scripts/prefill-stall.py --server-cmd "target/release/treespec serve -m M.gguf -md D.gguf \
        --method chain -k 3 -t 2 -c 16384 --parallel 4 --port {port}" [--clients 3] [--tokens 900] \
        [--prompt-chars 50000]

Starts the server (its own process group; `{port}` replaced), streams --clients long greedy answers
of --tokens tokens, and 4 s later sends one prompt of --prompt-chars characters (about 11,000
SmolLM2 tokens for the default) for 4 tokens. Prints when the long prompt was answered and, per
client, the number of content chunks, the longest gap between two chunks (the stall) and the mean
gap. Standard library only.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream(port, content, n, gaps, key):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": n, "temperature": 0, "stream": True}
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    last, g = None, []
    for line in c.getresponse():
        if line.startswith(b"data: {") and b'"content"' in line:
            now = time.time()
            if last is not None:
                g.append(now - last)
            last = now
    gaps[key] = g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-cmd", required=True)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=900)
    ap.add_argument("--prompt-chars", type=int, default=50000)
    ap.add_argument("--story", default="Write a very long story about a robot number {}, with many chapters.",
                    help="the decoding clients' prompt ({} is the client's number); one the model answers at length")
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen(a.server_cmd.format(port=port), shell=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, preexec_fn=os.setsid)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.5)
        gaps = {}
        story = a.story
        clients = [threading.Thread(target=stream, args=(port, story.format(i), a.tokens, gaps, i))
                   for i in range(a.clients)]
        for t in clients:
            t.start()
        time.sleep(4)
        words = ("alpha beta gamma delta epsilon zeta eta theta " * (a.prompt_chars // 48 + 1))[: a.prompt_chars]
        t0 = time.time()
        stream(port, "Summarize: " + words, 4, gaps, "long")
        print(f"long prompt ({a.prompt_chars} chars) answered in {time.time() - t0:.1f} s")
        for t in clients:
            t.join()
        for i in range(a.clients):
            g = gaps.get(i) or [float("nan")]
            print(f"client {i}: {len(g) + 1} chunks, longest gap {max(g):.2f} s, mean gap {sum(g) / len(g):.2f} s")
        try:
            # treespec's batch scheduler: its steps and the time they spent in the forward.
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            m = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("treespec_batch_")
                 and len(l.split()) == 2}
            if m.get("treespec_batch_steps_total"):
                steps = m["treespec_batch_steps_total"]
                print(f"server: {steps:.0f} steps, {m.get('treespec_batch_step_seconds_total', 0):.1f} s in steps, "
                      f"{m.get('treespec_batch_forward_seconds_total', 0):.1f} s in forwards")
        except Exception:
            pass
    finally:
        os.killpg(server.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
