"""The routing table of a gateway run (scripts/gateway-bench.sh; issue #42), from its
sessions.json (or sessions.json.gz, as the runs kept in bench/results/ hold it): per workload
and server, the later turns' cached prompt share, the median time to first token, the
whole-session rate (the summary's median over sessions of tokens / request time), and the later
turns' tokens per target forward; then each gateway's share of later turns
that reached a replica that had seen the conversation (from OUT/replicas.txt).

    python3 scripts/sessions/gateway_table.py OUT
"""
import gzip
import json
import os
import re
import statistics
import sys
from collections import defaultdict

out = sys.argv[1]
path = f"{out}/sessions.json"
res = json.load(open(path) if os.path.exists(path) else gzip.open(f"{path}.gz", "rt"))
rows = {(r["workload"], r["server"]): r for r in res["summary"]}
servers = [s["name"] for s in res["config"]["servers"]]
workloads = sorted({w for w, _ in rows if w != "all"}) + ["all"]

later_tpf = defaultdict(lambda: [0, 0])
for r in res["records"]:
    f = r["reply"].get("target_forwards")
    if r["turn"] > 0 and f:
        for w in (r["workload"], "all"):
            later_tpf[(w, r["server"])][0] += r["reply"]["completion_tokens"]
            later_tpf[(w, r["server"])][1] += f


def pct(x):
    return "–" if x is None else f"{100 * x:.0f}%"


def num(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


print("| workload | server | later turns' prompt cached | TTFT ms | whole-session tok/s | ÷ first server | later turns' tokens/forward |")
print("|---|---|---:|---:|---:|---:|---:|")
for w in workloads:
    for s in servers:
        r = rows.get((w, s))
        if not r:
            continue
        t, f = later_tpf[(w, s)]
        print(f"| {w} | {s} | {pct(r.get('later_cached_share'))} | {num(r['ttft_ms'], 0)} | "
              f"{num(r['session_tokens_per_s'])} | {num(r['session_vs_baseline'], 2)}× | "
              f"{num(t / f if f else None, 2)} |")

try:
    text = open(f"{out}/replicas.txt").read()
except OSError:
    sys.exit(0)
print()
print("| gateway | turns per replica | turns that reached a replica that had seen the conversation |")
print("|---|---|---:|")
seen = defaultdict(lambda: defaultdict(float))
for line in text.splitlines():
    m = re.match(r"replicas-(\S+) replica (\d+):", line)
    if not m:
        continue
    for kind, v in re.findall(r'treespec_session_turns_total\{seen="(\w+)"\} (\S+)', line):
        seen[m.group(1)][(m.group(2), kind)] += float(v)
for g, counts in seen.items():
    per = {i: counts[(i, "known")] + counts[(i, "new")] for i in sorted({i for i, _ in counts})}
    known = sum(v for (_, k), v in counts.items() if k == "known")
    total = sum(per.values())
    split = " / ".join(f"{v:.0f}" for v in per.values())
    print(f"| {g} | {split} | {known:.0f} of {total:.0f} |")
