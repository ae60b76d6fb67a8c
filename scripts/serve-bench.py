#!/usr/bin/env python3
"""Concurrent streaming load on one OpenAI-compatible server (issue #13): throughput, TTFT, latency.

    scripts/serve-bench.py --name NAME --server-cmd "CMD ... --port {port}" --prompts FILE.jsonl
        [--prompts MORE.jsonl] [--clients N] [--requests R] [--max-tokens 64] [--model-label L]
        [--out results.jsonl] [--log server.log] [--max-prompt-chars 2000] [--prompt-limit P]
    scripts/serve-bench.py --name NAME --url http://127.0.0.1:8080 --prompts ...   (server already up)
    scripts/serve-bench.py report OUT/results.jsonl --md OUT/serve-bench.md    (the table)

Python 3.11 standard library only (threads + http.client).

Server: `--server-cmd` is split like a shell would (no shell runs it) and started in its own
process group; `{port}` is replaced by a free port picked here. A command with no `{port}` may
ask for `--port 0`: the port is then read from treespec's stderr line
`treespec serve: listening on http://ADDR`. The server is ready when GET /health answers 200
(llama-server answers 503 while it loads). Its stdout and stderr go to `--log`. At the end the
whole process group gets SIGTERM, then SIGKILL after 15 s.

Load: one warm-up request first (not measured, a fixed prompt that is not in the set; `--warmup 0`
skips it), then N client threads
share one counter of R requests (default max(8N, 16)): each thread takes the next request, sends it,
reads the stream to its end and takes the next, until R are done, so the server sees N requests at
once for most of the run. Request i uses prompt i mod P (the first user turn of each JSONL line's
`turns`; prompts longer than --max-prompt-chars are left out, and --prompt-limit P keeps at most P
of each file, evenly spaced over it). Each request is
    POST /v1/chat/completions {"messages": [{"role": "user", "content": PROMPT}], "stream": true,
     "stream_options": {"include_usage": true}, "temperature": 0, "max_tokens": M}

Figures (one JSON line appended to --out, and printed):
  throughput_tok_s  completion tokens of all ok requests / (last request done - first request sent)
  ttft_p50/p99_s    request sent -> first chunk with non-empty delta content
  latency_p50/p99_s request sent -> stream done (`data: [DONE]`)
  ok / failed       ok = HTTP 200, a finish_reason and [DONE]; failures by kind in `errors`
Completion tokens come from the final usage chunk; without one, content deltas are counted
(`tokens_from` says which). Percentiles interpolate linearly between order statistics, so with few
requests p99 is close to the maximum.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import Server  # noqa: E402

# Not one of the measured prompts, so that no server can reuse its cached prefix in the run.
WARMUP_PROMPT = "Say hello."


def log(msg):
    print(f"[serve-bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Prompts


def load_prompts(paths, max_chars, limit):
    """First turns of every file's lines; with `limit`, at most that many per file, evenly spaced."""
    prompts = []
    for path in paths:
        mine = []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                row = json.loads(line)
                turns = row.get("turns") or []
                if not turns or not isinstance(turns[0], str):
                    continue
                if max_chars and len(turns[0]) > max_chars:
                    continue
                mine.append({"id": f"{os.path.basename(path)}:{row.get('question_id')}", "text": turns[0]})
        if limit and limit < len(mine):
            step = len(mine) / limit
            mine = [mine[int(i * step)] for i in range(limit)]
        prompts += mine
    if not prompts:
        sys.exit("serve-bench: no usable prompts")
    return prompts


# ---------------------------------------------------------------------------------------------
# Machine facts


def machine_facts():
    facts = {"nproc": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                facts["cpu"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        facts["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        pass
    try:
        facts["loadavg"] = [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        pass
    return facts


# ---------------------------------------------------------------------------------------------
# The server process


# ---------------------------------------------------------------------------------------------
# One streamed request


def stream_request(host, port, body, timeout):
    """Send one streaming chat request; returns a dict of timings, counts and error (if any)."""
    r = {"ok": False, "error": None, "status": None, "ttft_s": None, "latency_s": None, "tokens": None,
         "content_deltas": 0, "text_chars": 0}
    data = json.dumps(body).encode()
    t_send = time.monotonic()
    r["t_send"] = t_send
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=data,
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        r["status"] = resp.status
        if resp.status != 200:
            text = resp.read()[:300].decode(errors="replace")
            r["error"] = f"http {resp.status}: {text}"
            return r
        finish = None
        done = False
        usage = None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                r["error"] = f"bad chunk: {payload[:200]!r}"
                return r
            if "error" in chunk:
                r["error"] = f"error in stream: {json.dumps(chunk)[:300]}"
                return r
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices") or []:
                content = (ch.get("delta") or {}).get("content")
                if content:
                    if r["ttft_s"] is None:
                        r["ttft_s"] = time.monotonic() - t_send
                    r["content_deltas"] += 1
                    r["text_chars"] += len(content)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        t_done = time.monotonic()
        r["t_done"] = t_done
        r["latency_s"] = t_done - t_send
        r["finish_reason"] = finish
        if usage and isinstance(usage.get("completion_tokens"), int):
            r["tokens"], r["tokens_from"] = usage["completion_tokens"], "usage"
        else:
            r["tokens"], r["tokens_from"] = r["content_deltas"], "deltas"
        if not done:
            r["error"] = "stream ended without data: [DONE]"
        elif finish is None:
            r["error"] = "stream had no finish_reason"
        else:
            r["ok"] = True
        return r
    except (OSError, http.client.HTTPException) as e:
        r["error"] = f"{type(e).__name__}: {e}"
        return r
    finally:
        conn.close()


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def error_kind(e):
    if e.startswith("http "):
        return e.split(":", 1)[0]
    return e.split(":", 1)[0][:60]


def run_load(host, port, prompts, clients, total, max_tokens, timeout, model_field):
    lock = threading.Lock()
    counter = [0]
    results = []

    def body_for(i):
        b = {
            "messages": [{"role": "user", "content": prompts[i % len(prompts)]["text"]}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        if model_field:
            b["model"] = model_field
        return b

    def client():
        while True:
            with lock:
                i = counter[0]
                if i >= total:
                    return
                counter[0] += 1
            r = stream_request(host, port, body_for(i), timeout)
            r["index"] = i
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def summarize(results):
    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    s = {"requests": len(results), "ok": len(ok), "failed": len(failed)}
    errors = {}
    for r in failed:
        k = error_kind(r["error"] or "unknown")
        errors[k] = errors.get(k, 0) + 1
    s["errors"] = errors
    if failed:
        s["error_examples"] = sorted({r["error"] for r in failed})[:5]
    if results:
        first_send = min(r["t_send"] for r in results)
        last_done = max(r.get("t_done", r["t_send"]) for r in results)
        wall = last_done - first_send
    else:
        wall = 0.0
    tokens = sum(r["tokens"] or 0 for r in ok)
    s["completion_tokens"] = tokens
    s["wall_s"] = round(wall, 3)
    s["throughput_tok_s"] = round(tokens / wall, 3) if wall > 0 else None
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    lat = [r["latency_s"] for r in ok]
    for name, vals in (("ttft", ttft), ("latency", lat)):
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            p = percentile(vals, q)
            s[f"{name}_{label}_s"] = round(p, 4) if p is not None else None
    s["tokens_from"] = sorted({r.get("tokens_from") for r in ok if r.get("tokens_from")})
    s["mean_tokens_per_request"] = round(tokens / len(ok), 2) if ok else None
    s["finish_reasons"] = {}
    for r in ok:
        s["finish_reasons"][r["finish_reason"]] = s["finish_reasons"].get(r["finish_reason"], 0) + 1
    return s


# ---------------------------------------------------------------------------------------------
# The markdown table


def fmt(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def report(results_path, md_path):
    rows = [json.loads(l) for l in open(results_path) if l.strip()]
    # The last line of each (model, clients, server) wins (a re-run replaces an earlier one).
    last = {}
    for r in rows:
        last[(r.get("model", ""), r["clients"], r["name"])] = r
    rows = list(last.values())
    models = list(dict.fromkeys(r.get("model", "") for r in rows))
    servers = list(dict.fromkeys(r["name"] for r in rows))
    out = ["# Serving benchmark: concurrent streaming clients", ""]
    m = rows[0].get("machine", {}) if rows else {}
    loads = [r["machine"]["loadavg"][0] for r in rows if r.get("machine", {}).get("loadavg")]
    load = f"{min(loads):.2f}–{max(loads):.2f}" if loads else "?"
    out.append(f"Machine: {m.get('cpu', '?')}, {m.get('nproc', '?')} CPUs; 1-minute load average at the start "
               f"of each run {load} (column load1: at the start and at the end of each run, the end including "
               f"the run's own load; a start well above 0 means another process shared the CPUs).")
    if rows:
        r0 = rows[0]
        out.append(f"Each run: max_tokens {r0['max_tokens']}, temperature 0, streaming with usage; "
                   f"requests = max(8 × clients, 16) unless set, each with its own prompt where the set has "
                   f"enough; prompts from {', '.join(r0.get('prompt_files', []))}.")
    out.append("")
    out.append("Throughput = completion tokens of all ok requests / (last done − first sent). TTFT = sent → first "
               "non-empty content delta. Ratios: treespec-batch throughput ÷ the other server's, same model and "
               "clients (treespec-plain: the batch scheduler decoding plain; treespec-request: each request "
               "sizing its own drafts; treespec-draft-alone: each request running its own draft forwards).")
    out.append("")
    out.append("| model | clients | server | throughput tok/s | TTFT p50 / p99 s | latency p50 / p99 s | ok / failed "
               "| batch ÷ one | batch ÷ llama-server | batch ÷ plain | load1 start → end |")
    out.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in models:
        for n in sorted({r["clients"] for r in rows if r.get("model", "") == model}):
            here = {r["name"]: r for r in rows if r.get("model", "") == model and r["clients"] == n}
            b = (here.get("treespec-batch") or {}).get("throughput_tok_s")
            for name in servers:
                r = here.get(name)
                if not r:
                    continue
                tp = r.get("throughput_tok_s")
                ratios = ["", "", ""]
                if name == "treespec-batch":
                    for i, other in enumerate(("treespec-one", "llama-server", "treespec-plain")):
                        o = (here.get(other) or {}).get("throughput_tok_s")
                        ratios[i] = f"{b / o:.2f}×" if b and o else "–"
                load = f"{fmt((r.get('machine', {}).get('loadavg') or [None])[0])} → {fmt((r.get('loadavg_end') or [None])[0])}"
                out.append(
                    f"| {model} | {n} | {name} | {fmt(tp, 1)} | {fmt(r.get('ttft_p50_s'))} / {fmt(r.get('ttft_p99_s'))} "
                    f"| {fmt(r.get('latency_p50_s'))} / {fmt(r.get('latency_p99_s'))} | {r.get('ok', 0)} / {r.get('failed', 0)} "
                    f"| {ratios[0]} | {ratios[1]} | {ratios[2]} | {load} |")
    failures = [r for r in rows if r.get("failed")]
    if failures:
        out += ["", "Failures:", ""]
        for r in failures:
            out.append(f"- {r.get('model')} / {r['clients']} clients / {r['name']}: {r.get('errors')} "
                       f"e.g. {(r.get('error_examples') or [''])[0][:200]}")
    out += ["", "Server command lines:", ""]
    for r in rows:
        out.append(f"- {r.get('model')} / {r['clients']} / {r['name']}: `{r.get('server_cmd')}`")
    text = "\n".join(out) + "\n"
    if md_path:
        with open(md_path, "w") as f:
            f.write(text)
    print(text)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        rp = argparse.ArgumentParser(prog="serve-bench.py report")
        rp.add_argument("results")
        rp.add_argument("--md")
        ra = rp.parse_args(sys.argv[2:])
        report(ra.results, ra.md)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="server label in the results (treespec-batch, llama-server, ...)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--server-cmd", help="command line starting the server; {port} is replaced by a free port")
    g.add_argument("--url", help="an already running server (nothing is started or stopped)")
    ap.add_argument("--prompts", action="append", required=True, help="JSONL with `turns` (repeatable)")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=None, help="total requests (default max(8*clients, 16))")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-chars", type=int, default=2000, help="skip longer prompts (0 = keep all)")
    ap.add_argument("--prompt-limit", type=int, default=0, help="keep at most this many prompts of each file, evenly spaced (0 = all)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the run")
    ap.add_argument("--model-label", default="", help="model name recorded in the results")
    ap.add_argument("--model-field", default="", help="`model` sent in the request body (default: none)")
    ap.add_argument("--out", help="append the JSON result line here")
    ap.add_argument("--log", help="server stdout+stderr go here (default: a file beside --out, or none)")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=900, help="socket timeout per request")
    ap.add_argument("--keep-requests", action="store_true", help="put every request's figures in the result")
    a = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    total = a.requests if a.requests else max(8 * a.clients, 16)
    prompts = load_prompts(a.prompts, a.max_prompt_chars, a.prompt_limit)
    if total > len(prompts):
        # A repeated prompt is served partly from caches (a prefix cache holds its whole prompt,
        # treespec's suffix history its whole earlier answer): the figures would flatter them.
        print(f"serve-bench: {total} requests over {len(prompts)} prompts: some prompts repeat "
              f"(raise --prompt-limit)", file=sys.stderr)
    facts = machine_facts()
    log_path = a.log
    if not log_path and a.out:
        log_path = os.path.join(os.path.dirname(os.path.abspath(a.out)), f"server-{a.name}-{a.clients}.log")

    server = None
    result = {
        "name": a.name, "model": a.model_label, "clients": a.clients, "max_tokens": a.max_tokens,
        "planned_requests": total, "prompts_used": min(len(prompts), total),
        "prompt_files": a.prompts, "server_cmd": a.server_cmd, "url": a.url, "machine": facts,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        if a.server_cmd:
            server = Server(a.server_cmd, log_path, a.startup_timeout)
            log(f"{a.name}: starting {server.cmd}")
            server.start()
            host, port = server.host, server.port
            result["server_startup_s"] = round(server.startup_s, 2)
            log(f"{a.name}: ready on port {port} after {server.startup_s:.1f} s")
        else:
            u = urllib.parse.urlsplit(a.url)
            host, port = u.hostname, u.port or 80
        for i in range(a.warmup):
            w = stream_request(host, port, {
                "messages": [{"role": "user", "content": WARMUP_PROMPT}], "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0, "max_tokens": min(8, a.max_tokens),
            }, a.request_timeout)
            if not w["ok"]:
                log(f"{a.name}: warm-up request failed: {w['error']}")
        if server:
            result["server_rss_kib_before"] = server.rss_kib()
        log(f"{a.name}: {a.clients} clients, {total} requests, max_tokens {a.max_tokens}")
        results = run_load(host, port, prompts, a.clients, total, a.max_tokens, a.request_timeout, a.model_field)
        result.update(summarize(results))
        try:
            result["loadavg_end"] = [float(x) for x in open("/proc/loadavg").read().split()[:3]]
        except OSError:
            pass
        if server:
            result["server_rss_kib_after"] = server.rss_kib()
            if server.proc.poll() is not None:
                result["server_exited"] = server.proc.returncode
        if a.keep_requests:
            result["per_request"] = [
                {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k not in ("t_send", "t_done")}
                for r in sorted(results, key=lambda r: r["index"])
            ]
    except RuntimeError as e:
        log(f"{a.name}: {e}")
        result.update({"requests": 0, "ok": 0, "failed": total, "errors": {"server did not start": 1},
                       "error_examples": [str(e)], "throughput_tok_s": None})
    finally:
        if server:
            server.stop()
    line = json.dumps(result)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    print(line)
    log(f"{a.name}: {result.get('ok')} ok / {result.get('failed')} failed, "
        f"{result.get('throughput_tok_s')} tok/s, TTFT p50 {result.get('ttft_p50_s')} s, "
        f"latency p50 {result.get('latency_p50_s')} s")
    return 0 if result.get("failed") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
