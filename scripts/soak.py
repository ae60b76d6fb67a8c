#!/usr/bin/env python3
"""Soak test of an OpenAI-compatible server (issue #13): many clients, disconnects, bad requests.

    scripts/soak.py --server-cmd "target/release/treespec serve -m M.gguf --method plain -t 2 -c 2048 --port {port}"
        [--clients 16] [--duration 600] [--max-tokens 32] [--out summary.json]
    scripts/soak.py --url http://127.0.0.1:8080 [--pid PID] ...

Python 3.11 standard library only. With --server-cmd the server is started here (its own process
group, `{port}` replaced by a free port, or `--port 0` read from treespec's "listening on" line;
output to --log) and stopped at the end; with --url it must already run (--pid lets its memory
be sampled).

Clients: --clients threads loop until --duration seconds have passed, each request drawn at random:
  ~5%  (--bad-frac) a bad request, one of: malformed JSON, a known field of the wrong type
       (messages a string, temperature a string, max_tokens a string, stream a number), max_tokens -1,
       max_tokens 0, empty messages, unknown role, a body over --oversize-bytes (default 2 MiB > the
       1 MiB default --max-body), wrong Content-Type, a prompt longer than the context
       (--long-prompt-chars). Each must get a 4xx with a JSON body {"error": {"message": ...}}; a
       503 with Retry-After counts as overload; anything else (5xx, a 2xx, no JSON, a hang, a
       closed connection) is an unexpected error.
  25%  (--disconnect-frac) a streaming request whose socket is closed after 1-3 content chunks.
   0%  (--impatient-frac) a streaming request whose client gives up when no response has come
       after --patience seconds (0.5-2 s by default: it was still queued) and closes its socket;
       a response that came in time is read as a normal stream. A server must drop a request
       whose client left the queue, so live requests are not refused for it (issue #40).
  the rest  a streaming chat request (`stream_options.include_usage`), read to the end. The stream
       must be well-formed: HTTP 200, text/event-stream, every `data:` a JSON chunk
       (object chat.completion.chunk, one id for the whole stream and never an id seen in another
       stream, choice indices unique within a chunk), at least one non-empty content delta, no
       content after the finish, exactly one finish_reason chunk, one usage chunk after it
       (choices empty, completion_tokens 1..max_tokens, total = prompt + completion), then exactly
       one `data: [DONE]`, nothing after it. No `error` object in the stream.
A 503 with Retry-After (queue full) on any request is counted as `overloaded_503`, then the client
waits Retry-After (at most 2 s). Every request's socket has a --request-timeout (default 120 s): a
request that times out is a hang (unexpected). A request still unresolved when its thread is
joined at the end is `lost`.

Monitor: GET /health every second (must answer 200 within 5 s, else a health failure) and the
server's VmRSS from /proc/PID/status, and the bytes of KV prefixes it keeps in host memory on purpose
(`treespec_prefix_cache_bytes` on /metrics, its --cache-ram store). RSS at warm-up = median of the
samples around --warmup-frac of the duration (default 20%); at the end = median of the last 5 s of
samples; growth = end / warm-up - 1, both less the prefix cache at that sample (`rss_growth`; the
whole RSS's growth is `rss_growth_raw`, the cache's own `prefix_cache_kib_*`).

At the end /metrics is scraped once the server is idle (generations in flight and queue depth 0, at
most 30 s of waiting) and compared with the client's counts, using treespec's metric names
(crates/treespec-server/src/metrics.rs):
  sum(treespec_generations_total) + sum(treespec_cancelled_total)
      == streams that got HTTP 200 (completed + disconnected on purpose + those that failed after 200)
  treespec_cancelled_total <= disconnected on purpose (a disconnect can race a finish)
  treespec_requests_total{endpoint="/v1/chat/completions",status=S} == the client's count of status S
Mismatches are reported (`metrics_mismatches`), and fail the run only with --strict-metrics.

Prints a JSON summary (also to --out) and exits 1 if there were unexpected errors, health failures,
lost requests, or RSS growth after warm-up above --max-rss-growth (default 0.10); 2 if the server
did not start.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_process import Server, http_get, rss_kib  # noqa: E402

CHAT = "/v1/chat/completions"

FALLBACK_PROMPTS = [
    "Write a Python function that reverses a string.",
    "Name three colours and one fact about each.",
    "Explain what a hash map is in two sentences.",
    "Translate 'good morning' into French, German and Spanish.",
    "Write a haiku about the sea.",
    "List the first ten prime numbers.",
]


def log(msg):
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Bookkeeping


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {k: 0 for k in (
            "started", "completed", "disconnected", "gave_up_queued", "bad_requests_sent", "bad_request_4xx",
            "overloaded_503",
            "unexpected", "health_checks", "health_failures")}
        self.status = {}          # HTTP status -> count, chat endpoint only
        self.bad_kinds = {}       # bad-request kind -> {status: count}
        self.unexpected = []      # descriptions (first 50 kept in full)
        self.unexpected_kinds = {}
        self.warnings = {}
        self.in_flight = {}       # request number -> description
        self.ids = set()
        self.duplicate_ids = 0
        self.latencies = []
        self.ttfts = []
        self.tokens = 0
        self.after_200 = 0        # requests answered 200 (reached the engine and started)
        self.failed_after_200 = 0
        self.next_no = 0

    def begin(self, what):
        with self.lock:
            self.counts["started"] += 1
            self.next_no += 1
            self.in_flight[self.next_no] = (what, time.monotonic())
            return self.next_no

    def end(self, no, outcome, detail=None, status=None, kind=None):
        with self.lock:
            what, _ = self.in_flight.pop(no, ("?", 0))
            self.counts[outcome] += 1
            if status is not None:
                self.status[status] = self.status.get(status, 0) + 1
            if outcome == "unexpected":
                key = f"{what}: {detail.split(':')[0] if detail else '?'}"
                self.unexpected_kinds[key] = self.unexpected_kinds.get(key, 0) + 1
                if len(self.unexpected) < 50:
                    self.unexpected.append(f"{what}: {detail}")
            if kind:
                d = self.bad_kinds.setdefault(kind, {})
                d[str(status)] = d.get(str(status), 0) + 1

    def warn(self, key):
        with self.lock:
            self.warnings[key] = self.warnings.get(key, 0) + 1

    def add(self, field, n=1):
        with self.lock:
            setattr(self, field, getattr(self, field) + n)

    def new_id(self, cid):
        with self.lock:
            if cid in self.ids:
                self.duplicate_ids += 1
                return False
            self.ids.add(cid)
            return True


# ---------------------------------------------------------------------------------------------
# Requests


class Unexpected(Exception):
    pass


def chat_body(prompt, max_tokens, stream=True):
    b = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens}
    if stream:
        b["stream"] = True
        b["stream_options"] = {"include_usage": True}
    return b


def bad_request(kind, a, prompt):
    """(body bytes, content type) of one bad request kind."""
    ct = "application/json"
    msg = [{"role": "user", "content": prompt}]
    if kind == "malformed_json":
        body = b'{"messages": [{"role": "user", "content": "hi"}'
    elif kind == "messages_string":
        body = json.dumps({"messages": "hello", "max_tokens": 8}).encode()
    elif kind == "temperature_string":
        body = json.dumps({"messages": msg, "temperature": "hot", "max_tokens": 8}).encode()
    elif kind == "max_tokens_string":
        body = json.dumps({"messages": msg, "max_tokens": "ten"}).encode()
    elif kind == "stream_number":
        body = json.dumps({"messages": msg, "max_tokens": 8, "stream": 3}).encode()
    elif kind == "max_tokens_negative":
        body = json.dumps({"messages": msg, "max_tokens": -1, "stream": True}).encode()
    elif kind == "max_tokens_zero":
        body = json.dumps({"messages": msg, "max_tokens": 0}).encode()
    elif kind == "empty_messages":
        body = json.dumps({"messages": [], "max_tokens": 8, "stream": True}).encode()
    elif kind == "unknown_role":
        body = json.dumps({"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 8}).encode()
    elif kind == "oversized_body":
        body = json.dumps({"messages": [{"role": "user", "content": "x" * a.oversize_bytes}], "max_tokens": 8}).encode()
    elif kind == "wrong_content_type":
        body = json.dumps({"messages": msg, "max_tokens": 8}).encode()
        ct = "text/plain"
    elif kind == "prompt_too_long":
        words = ("alpha beta gamma delta epsilon zeta eta theta " * (a.long_prompt_chars // 48 + 1))[: a.long_prompt_chars]
        body = json.dumps({"messages": [{"role": "user", "content": words}], "max_tokens": 8, "stream": True}).encode()
    else:
        raise ValueError(kind)
    return body, ct


BAD_KINDS = ["malformed_json", "messages_string", "temperature_string", "max_tokens_string", "stream_number",
             "max_tokens_negative", "max_tokens_zero", "empty_messages", "unknown_role", "oversized_body",
             "wrong_content_type", "prompt_too_long"]


def retry_after(resp):
    v = resp.getheader("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def do_bad(a, host, port, tally, rng, prompt):
    kind = rng.choice(BAD_KINDS)
    no = tally.begin(f"bad:{kind}")
    with tally.lock:
        tally.counts["bad_requests_sent"] += 1
    body, ct = bad_request(kind, a, prompt)
    conn = http.client.HTTPConnection(host, port, timeout=a.request_timeout)
    try:
        try:
            conn.request("POST", CHAT, body=body, headers={"Content-Type": ct})
        except (BrokenPipeError, ConnectionResetError):
            # The server may answer (413) and close before the whole body is sent: the answer
            # can still be read.
            pass
        resp = conn.getresponse()
        status = resp.status
        data = resp.read()
        if 400 <= status < 500:
            try:
                err = json.loads(data)["error"]
                assert isinstance(err.get("message"), str) and err["message"]
            except (ValueError, KeyError, TypeError, AssertionError):
                tally.end(no, "unexpected", f"{status} without an OpenAI JSON error body: {data[:200]!r}", status, kind)
                return
            tally.end(no, "bad_request_4xx", status=status, kind=kind)
        elif status == 503 and retry_after(resp) is not None:
            tally.end(no, "overloaded_503", status=status, kind=kind)
            time.sleep(min(retry_after(resp), 2.0))
        else:
            tally.end(no, "unexpected", f"HTTP {status} (want 4xx): {data[:200]!r}", status, kind)
    except socket.timeout:
        tally.end(no, "unexpected", f"hang: no answer within {a.request_timeout} s", None, kind)
    except (OSError, http.client.HTTPException) as e:
        tally.end(no, "unexpected", f"connection error: {type(e).__name__}: {e}", None, kind)
    finally:
        conn.close()


def do_stream(a, host, port, tally, rng, prompt, disconnect_after, patience=None):
    """One streamed chat request; disconnect_after = k closes the socket after k content chunks;
    patience = s gives up (closes the socket) when no response came within s seconds."""
    what = "disconnect" if disconnect_after else ("impatient" if patience else "stream")
    no = tally.begin(what)
    body = json.dumps(chat_body(prompt, a.max_tokens)).encode()
    conn = http.client.HTTPConnection(host, port, timeout=a.request_timeout)
    t0 = time.monotonic()
    status = None
    resp = None
    try:
        conn.request("POST", CHAT, body=body, headers={"Content-Type": "application/json"})
        sock = conn.sock
        if patience:
            sock.settimeout(patience)
            try:
                resp = conn.getresponse()
            except (socket.timeout, TimeoutError):
                # Still queued: the client leaves (its socket closes below).
                conn.close()
                tally.end(no, "gave_up_queued")
                return
            sock.settimeout(a.request_timeout)
        else:
            resp = conn.getresponse()
        status = resp.status
        if status == 503 and retry_after(resp) is not None:
            resp.read()
            tally.end(no, "overloaded_503", status=status)
            time.sleep(min(retry_after(resp), 2.0))
            return
        if status != 200:
            data = resp.read()
            tally.end(no, "unexpected", f"HTTP {status}: {data[:200]!r}", status)
            return
        tally.add("after_200")
        ctype = resp.getheader("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            raise Unexpected(f"content type {ctype!r}")
        stream_id = None
        finish_seen = 0
        usage_seen = 0
        done_seen = 0
        content_chunks = 0
        ttft = None
        usage = None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if not line or line.startswith(b":"):
                continue
            if not line.startswith(b"data:"):
                # `event:`, `id:`, `retry:` fields are legal SSE but treespec sends none.
                tally.warn(f"non-data SSE line {line[:20]!r}")
                continue
            payload = line[5:].strip()
            if done_seen:
                raise Unexpected(f"data after [DONE]: {payload[:100]!r}")
            if payload == b"[DONE]":
                done_seen += 1
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise Unexpected(f"chunk is not JSON: {payload[:150]!r}")
            if "error" in chunk:
                raise Unexpected(f"error in stream: {json.dumps(chunk)[:200]}")
            if chunk.get("object") != "chat.completion.chunk":
                raise Unexpected(f"object {chunk.get('object')!r}")
            cid = chunk.get("id")
            if stream_id is None:
                stream_id = cid
                if not tally.new_id(cid):
                    raise Unexpected(f"chunk id {cid!r} already used by another stream")
            elif cid != stream_id:
                raise Unexpected(f"chunk id changed within the stream: {stream_id!r} -> {cid!r}")
            choices = chunk.get("choices")
            if not isinstance(choices, list):
                raise Unexpected(f"choices is {choices!r}")
            if chunk.get("usage"):
                if usage_seen:
                    raise Unexpected("two usage chunks")
                if not finish_seen:
                    raise Unexpected("usage chunk before the finish_reason chunk")
                if choices:
                    raise Unexpected("usage chunk with choices")
                usage_seen += 1
                usage = chunk["usage"]
                continue
            indices = [c.get("index") for c in choices]
            if len(set(indices)) != len(indices) or any(i != 0 for i in indices):
                raise Unexpected(f"choice indices {indices}")
            for c in choices:
                delta = c.get("delta") or {}
                content = delta.get("content")
                if content:
                    if finish_seen:
                        raise Unexpected("content after the finish_reason chunk")
                    content_chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - t0
                if c.get("finish_reason") is not None:
                    finish_seen += 1
                    if finish_seen > 1:
                        raise Unexpected("two finish_reason chunks")
                    if c["finish_reason"] not in ("stop", "length"):
                        tally.warn(f"finish_reason {c['finish_reason']}")
            if disconnect_after and content_chunks >= disconnect_after and not finish_seen:
                # Close the socket mid-stream, without reading further.
                sock.shutdown(socket.SHUT_RDWR)
                resp.close()
                sock.close()
                tally.end(no, "disconnected", status=200)
                return
        # The stream ended (EOF).
        if not done_seen:
            raise Unexpected("stream ended without data: [DONE]")
        if not finish_seen:
            raise Unexpected("stream had no finish_reason chunk")
        if content_chunks == 0:
            raise Unexpected("stream had no content")
        if not usage_seen:
            raise Unexpected("no usage chunk although include_usage was asked")
        ct_, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
        if not (isinstance(ct_, int) and 1 <= ct_ <= a.max_tokens):
            raise Unexpected(f"usage.completion_tokens {ct_!r} not in 1..{a.max_tokens}")
        if not (isinstance(pt, int) and pt >= 1) or usage.get("total_tokens") != pt + ct_:
            raise Unexpected(f"usage {usage}")
        if content_chunks > ct_ + 1:
            tally.warn("more content chunks than completion tokens + 1")
        with tally.lock:
            tally.latencies.append(time.monotonic() - t0)
            if ttft is not None:
                tally.ttfts.append(ttft)
            tally.tokens += ct_
        tally.end(no, "completed", status=200)
    except Unexpected as e:
        if status == 200:
            tally.add("failed_after_200")
        tally.end(no, "unexpected", str(e), status)
    except socket.timeout:
        if status == 200:
            tally.add("failed_after_200")
        tally.end(no, "unexpected", f"hang: nothing for {a.request_timeout} s (HTTP {status})", status)
    except (OSError, http.client.HTTPException) as e:
        if status == 200:
            tally.add("failed_after_200")
        tally.end(no, "unexpected", f"connection error: {type(e).__name__}: {e} (HTTP {status})", status)
    finally:
        if resp is not None:
            resp.close()
        conn.close()


def client_loop(a, host, port, tally, deadline, prompts, seed):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        prompt = rng.choice(prompts)
        x = rng.random()
        if x < a.bad_frac:
            do_bad(a, host, port, tally, rng, prompt)
        elif x < a.bad_frac + a.disconnect_frac:
            do_stream(a, host, port, tally, rng, prompt, rng.randint(1, 3))
        elif x < a.bad_frac + a.disconnect_frac + a.impatient_frac:
            do_stream(a, host, port, tally, rng, prompt, 0, rng.uniform(*a.patience))
        else:
            do_stream(a, host, port, tally, rng, prompt, 0)


def monitor(a, host, port, pid, tally, stop, t_start, samples, health_log):
    while not stop.is_set():
        t = time.monotonic()
        ok = False
        try:
            status, _ = http_get(host, port, "/health", 5)
            ok = status == 200
            why = f"HTTP {status}"
        except (OSError, http.client.HTTPException) as e:
            why = f"{type(e).__name__}: {e}"
        with tally.lock:
            tally.counts["health_checks"] += 1
            if not ok:
                tally.counts["health_failures"] += 1
                if len(health_log) < 20:
                    health_log.append(f"t={t - t_start:.1f}s {why}")
        if pid:
            r = rss_kib(pid)
            if r is not None:
                samples.append((t - t_start, r, prefix_cache_kib(host, port)))
        stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))


def prefix_cache_kib(host, port):
    """KiB of KV prefixes the server keeps in host memory on purpose (its --cache-ram store, the
    gauge treespec_prefix_cache_bytes), 0 when /metrics does not say (a key is needed, or another
    server)."""
    try:
        status, body = http_get(host, port, "/metrics", 5)
    except (OSError, http.client.HTTPException):
        return 0
    if status != 200:
        return 0
    m = re.search(rb"^treespec_prefix_cache_bytes (\d+)$", body, re.M)
    return int(m.group(1)) // 1024 if m else 0


# ---------------------------------------------------------------------------------------------
# /metrics


def parse_prometheus(text):
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            lab = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
            out.append((name, lab, float(value)))
        except ValueError:
            continue
    return out


def check_metrics(host, port, tally, wait_s=30):
    """Compare the server's counters with the client's; returns (report, mismatches)."""
    deadline = time.monotonic() + wait_s
    samples = None
    while time.monotonic() < deadline:
        try:
            status, body = http_get(host, port, "/metrics", 10)
        except (OSError, http.client.HTTPException) as e:
            return {"skipped": f"/metrics: {e}"}, []
        if status != 200:
            return {"skipped": f"/metrics answered {status}"}, []
        samples = parse_prometheus(body.decode(errors="replace"))
        names = {n for n, _, _ in samples}
        if "treespec_generations_total" not in names and "treespec_requests_total" not in names:
            return {"skipped": "no treespec_* metrics (not a treespec server?)"}, []
        busy = sum(v for n, _, v in samples if n in ("treespec_generations_in_flight", "treespec_queue_depth"))
        if busy == 0:
            break
        time.sleep(0.5)
    total = lambda name: sum(v for n, _, v in samples if n == name)
    by_status = {}
    for n, lab, v in samples:
        if n == "treespec_requests_total" and lab.get("endpoint") == CHAT:
            by_status[int(lab.get("status", 0))] = by_status.get(int(lab.get("status", 0)), 0) + int(v)
    errors = {lab.get("kind"): int(v) for n, lab, v in samples if n == "treespec_errors_total"}
    cancelled = {lab.get("method"): int(v) for n, lab, v in samples if n == "treespec_cancelled_total"}
    gens = int(total("treespec_generations_total"))
    canc = int(total("treespec_cancelled_total"))
    with tally.lock:
        client_status = {k: v for k, v in tally.status.items() if k is not None}
        after_200 = tally.after_200
        disconnected = tally.counts["disconnected"]
        # A client that left the queue never saw the server's answer: a 200 that probed for it
        # (or, had it started just then, a stream whose first write failed).
        gave_up = tally.counts["gave_up_queued"]
    report = {
        "server_generations": gens, "server_cancelled": canc, "server_cancelled_by_method": cancelled,
        "server_errors": errors, "server_chat_requests_by_status": {str(k): v for k, v in sorted(by_status.items())},
        "client_chat_requests_by_status": {str(k): v for k, v in sorted(client_status.items())},
        "client_answered_200": after_200,
        "in_flight_at_scrape": total("treespec_generations_in_flight"), "queue_at_scrape": total("treespec_queue_depth"),
    }
    mism = []
    if gens + canc != after_200 + gave_up:
        mism.append(f"generations {gens} + cancelled {canc} = {gens + canc} != {after_200} requests answered 200"
                    f" + {gave_up} that left the queue")
    if canc > disconnected + gave_up:
        mism.append(f"cancelled {canc} > {disconnected} disconnects + {gave_up} that left the queue")
    client_status = dict(client_status)
    if gave_up:
        client_status[200] = client_status.get(200, 0) + gave_up
    for st in sorted(set(by_status) | set(client_status)):
        if by_status.get(st, 0) != client_status.get(st, 0):
            mism.append(f"status {st}: server counted {by_status.get(st, 0)}, client saw {client_status.get(st, 0)}")
    return report, mism


# ---------------------------------------------------------------------------------------------


def load_prompts(paths, max_chars):
    prompts = []
    for path in paths:
        for line in open(path):
            if line.strip():
                t = (json.loads(line).get("turns") or [None])[0]
                if isinstance(t, str) and len(t) <= max_chars:
                    prompts.append(t)
    return prompts or FALLBACK_PROMPTS


def median_window(samples, lo, hi, net=True):
    """Median RSS (KiB) of the samples between lo and hi seconds; with `net`, less the prefix
    cache the server keeps on purpose at each sample."""
    vals = [r - (c if net else 0) for t, r, c in samples if lo <= t <= hi]
    return statistics.median(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--url", help="a running server")
    g.add_argument("--server-cmd", help="start this server ({port} = a free port, or --port 0)")
    ap.add_argument("--pid", type=int, help="the running server's pid, for its memory (with --url)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", action="append", help="JSONL with `turns` (default: bench/inputs/prompts/code-edit.jsonl)")
    ap.add_argument("--max-prompt-chars", type=int, default=1500)
    ap.add_argument("--disconnect-frac", type=float, default=0.25)
    ap.add_argument("--bad-frac", type=float, default=0.05)
    ap.add_argument("--impatient-frac", type=float, default=0.0,
                    help="requests whose client leaves when no response came within --patience seconds")
    ap.add_argument("--max-overloaded", type=int, default=None,
                    help="fail when more requests than this get a 503 (0: the queue has room for every client)")
    ap.add_argument("--patience", type=float, nargs=2, default=(0.5, 2.0), metavar=("MIN", "MAX"))
    ap.add_argument("--oversize-bytes", type=int, default=2 * 1024 * 1024)
    ap.add_argument("--long-prompt-chars", type=int, default=60000, help="prompt_too_long: longer than the context")
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--warmup-frac", type=float, default=0.2)
    ap.add_argument("--max-rss-growth", type=float, default=0.10)
    ap.add_argument("--strict-metrics", action="store_true", help="a /metrics mismatch fails the run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", default="bench-out/soak-server.log", help="server output (with --server-cmd)")
    ap.add_argument("--out", help="write the JSON summary here too")
    a = ap.parse_args()

    default_prompts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "inputs", "prompts", "code-edit.jsonl")
    prompts = load_prompts(a.prompts or ([default_prompts] if os.path.exists(default_prompts) else []), a.max_prompt_chars)
    server = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.server_cmd:
        if a.log:
            os.makedirs(os.path.dirname(os.path.abspath(a.log)), exist_ok=True)
        server = Server(a.server_cmd, a.log, 300)
        log(f"starting {server.cmd}")
        try:
            server.start()
        except RuntimeError as e:
            log(str(e))
            server.stop()
            print(json.dumps({"error": str(e)}))
            return 2
        host, port, pid = server.host, server.port, server.proc.pid
    else:
        u = urllib.parse.urlsplit(a.url)
        host, port, pid = u.hostname, u.port or 80, a.pid
    log(f"server {host}:{port} pid {pid}; {a.clients} clients for {a.duration:.0f} s, max_tokens {a.max_tokens}")

    tally = Tally()
    stop = threading.Event()
    samples, health_log = [], []
    t_start = time.monotonic()
    deadline = t_start + a.duration
    summary = {}
    try:
        mon = threading.Thread(target=monitor, args=(a, host, port, pid, tally, stop, t_start, samples, health_log),
                               daemon=True)
        mon.start()
        threads = [threading.Thread(target=client_loop, args=(a, host, port, tally, deadline, prompts, a.seed * 1000 + i),
                                    daemon=True) for i in range(a.clients)]
        for t in threads:
            t.start()
        last_report = t_start
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(1)
            if time.monotonic() - last_report >= 30:
                last_report = time.monotonic()
                with tally.lock:
                    c = dict(tally.counts)
                log(f"t={last_report - t_start:.0f}s " + " ".join(f"{k}={v}" for k, v in c.items())
                    + (f" rss={samples[-1][1]} KiB" if samples else ""))
        # Let the last requests finish (each is bounded by the request timeout).
        join_by = time.monotonic() + a.request_timeout + 10
        for t in threads:
            t.join(timeout=max(0.0, join_by - time.monotonic()))
        t_end = time.monotonic()
        stop.set()
        mon.join(timeout=10)
        with tally.lock:
            lost = [f"{what} (running {t_end - t0:.0f} s)" for what, t0 in tally.in_flight.values()]
            counts = dict(tally.counts)
        metrics_report, mism = check_metrics(host, port, tally)
        dur = a.duration
        lo, hi = dur * a.warmup_frac - 5, dur * a.warmup_frac + 5
        last = samples[-1][0] - 5 if samples else 0
        # Growth is judged on RSS less the prefix cache the server was configured to keep
        # (--cache-ram fills up as conversations end; that is memory in use, not a leak), and
        # the cache's own growth is reported beside it.
        warm, end = median_window(samples, lo, hi), median_window(samples, last, float("inf"))
        growth = (end / warm - 1) if warm and end else None
        raw_warm, raw_end = median_window(samples, lo, hi, False), median_window(samples, last, float("inf"), False)
        cache = [(t, c, 0) for t, _, c in samples]
        cache_warm, cache_end = median_window(cache, lo, hi), median_window(cache, last, float("inf"))
        lat = sorted(tally.latencies)
        pick = lambda v, q: round(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))], 3) if v else None
        summary = {
            **counts,
            "lost": len(lost), "lost_requests": lost[:20],
            "unexpected_kinds": tally.unexpected_kinds, "unexpected_examples": tally.unexpected[:20],
            "health_failure_examples": health_log,
            "bad_request_statuses": tally.bad_kinds, "chat_status_counts": {str(k): v for k, v in tally.status.items()},
            "duplicate_stream_ids": tally.duplicate_ids, "warnings": tally.warnings,
            "completion_tokens": tally.tokens, "wall_s": round(t_end - t_start, 1),
            "tokens_per_s": round(tally.tokens / (t_end - t_start), 2) if t_end > t_start else None,
            "latency_p50_s": pick(lat, 0.5), "latency_p99_s": pick(lat, 0.99),
            "ttft_p50_s": pick(sorted(tally.ttfts), 0.5), "ttft_p99_s": pick(sorted(tally.ttfts), 0.99),
            "rss_kib_warmup": raw_warm, "rss_kib_end": raw_end, "rss_kib_max": max((r for _, r, _ in samples), default=None),
            "prefix_cache_kib_warmup": cache_warm, "prefix_cache_kib_end": cache_end,
            "rss_growth_raw": round(raw_end / raw_warm - 1, 4) if raw_warm and raw_end else None,
            "rss_growth": round(growth, 4) if growth is not None else None,
            "rss_samples": len(samples),
            "metrics": metrics_report, "metrics_mismatches": mism,
            "clients": a.clients, "duration_s": a.duration, "max_tokens": a.max_tokens,
            "server_cmd": server.cmd if server else None, "url": a.url,
            "loadavg_end": open("/proc/loadavg").read().split()[:3],
        }
    finally:
        stop.set()
        if server:
            code = server.stop()
            summary["server_exited_during_run"] = code
    failures = []
    if summary.get("unexpected"):
        failures.append(f"{summary['unexpected']} unexpected errors")
    if summary.get("health_failures"):
        failures.append(f"{summary['health_failures']} health failures")
    if summary.get("lost"):
        failures.append(f"{summary['lost']} lost requests")
    if summary.get("duplicate_stream_ids"):
        failures.append(f"{summary['duplicate_stream_ids']} duplicate stream ids")
    if summary.get("rss_growth") is not None and summary["rss_growth"] > a.max_rss_growth:
        failures.append(f"RSS grew {summary['rss_growth']:.1%} after warm-up (> {a.max_rss_growth:.0%})")
    if summary.get("server_exited_during_run") is not None:
        failures.append(f"the server exited during the run ({summary['server_exited_during_run']})")
    if a.strict_metrics and summary.get("metrics_mismatches"):
        failures.append("metrics mismatches")
    overloaded = summary.get("overloaded_503", 0)
    if a.max_overloaded is not None and overloaded > a.max_overloaded:
        failures.append(f"{overloaded} requests refused with 503 (at most {a.max_overloaded})")
    summary["verdict"] = "FAIL: " + "; ".join(failures) if failures else "PASS"
    text = json.dumps(summary, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    log(summary["verdict"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
