#!/usr/bin/env bash
# A replica killed and restarted in the middle of a run (issue #42; docs/SERVING.md "Many
# machines"): SMG over 2 replicas that keep their suffix histories in files (saved every
# SAVE_EVERY seconds), the session runner playing conversations through SMG with their session
# keys; once the victim replica is answering a request, it is killed (SIGKILL: no drain, no final
# save), left down DOWN_FOR seconds, and started again with the same arguments.
#
#   scripts/replica-restart.sh OUT [SESSION FILES...]   (default: chat, tools, agent-whole)
#
# What it shows, in OUT/restart.md: whether any request failed (the gateway retries a refused
# connection on the other replica; a stream cut by the kill is sent again by the client, as
# OpenAI's SDKs and agents do: counted), how many turns the survivor took over from conversations
# it had never seen, that the victim loaded its saved history when it came back, and that
# conversations reached it again. Environment: TARGET (the Qwen 1.5B), METHOD (auto), POLICY
# (consistent_hashing), CONCURRENCY (4), PER_WORKLOAD (2), CTX (per session, 8192), VICTIM (2),
# KILL_AFTER (seconds before the victim may be killed, 30: past a history save), DOWN_FOR (15),
# SAVE_EVERY (10), BASE_PORT (8400); TURNS and MAX_TOKENS cut the sessions as in gateway-bench.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: scripts/replica-restart.sh OUT [SESSION FILES...]}"
shift
source scripts/lib/sessions.sh
POLICY="${POLICY:-consistent_hashing}"
VICTIM="${VICTIM:-2}"
port="${BASE_PORT:-8400}"
log() { printf '[replica-restart] %s\n' "$*" >&2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
dir="$out/replicas"
export REPLICAS_DIR="$dir"
runner=""
cleanup() {
    [[ -z "$runner" ]] || kill "$runner" 2>/dev/null || true
    bash scripts/replicas.sh stop 2>/dev/null || true
}
trap cleanup EXIT

rm -rf "$dir"
bash scripts/replicas.sh start -n 2 --policy "$POLICY" --port "$port" -- \
    -m "$TARGET" -t 1 --method "$METHOD" --parallel "$C" -c $((CTX * C / 2)) \
    --suffix-history "$dir/history-{i}.bin" --history-save-every "${SAVE_EVERY:-10}"
session_files "$out" "$@"
victim_url="http://127.0.0.1:$((port + VICTIM))"
target/release/treespec bench --sessions "$files_arg" --server "smg:$METHOD=http://127.0.0.1:$port" --concurrency "$C" \
    --per-category "${PER_WORKLOAD:-2}" --log --out "$out" 2>&1 | tee "$out/runner.log" >&2 &
runner=$!
sleep "${KILL_AFTER:-30}"
# Kill it while it is answering, so that a request is cut in the middle.
log "waiting for replica $VICTIM to be answering a request"
for _ in $(seq 600); do
    running="$(curl -fsS "$victim_url/v1/loads" 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["loads"][0]["num_running_reqs"])' 2>/dev/null || echo 0)"
    [[ "$running" -gt 0 ]] && break
    kill -0 "$runner" 2>/dev/null || break
    sleep 0.2
done
killed_at="$(date -u +%FT%TZ)"
log "killing replica $VICTIM ($running request(s) in flight) at $killed_at"
bash scripts/replicas.sh kill "$VICTIM"
sleep "${DOWN_FOR:-15}"
bash scripts/replicas.sh revive "$VICTIM"
wait "$runner" || true
runner=""

# The report: the runner's errors and retries, where turns went, what the victim loaded.
python3 - "$out" "$dir" "$VICTIM" "$port" "$killed_at" "${DOWN_FOR:-15}" <<'EOF' | tee "$out/restart.md"
import json, re, sys, urllib.request
out, d, victim, port, killed_at, down = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
res = json.load(open(f"{out}/sessions.json"))
records, errors = res["records"], res["errors"]
retried = [r for r in records if r["reply"].get("retries", 0) > 0]
def turns(i):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port + i}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    got = {}
    for m in re.finditer(r'^treespec_session_turns_total\{[^}]*seen="(\w+)"[^}]*\} (\S+)', text, re.M):
        got[m.group(1)] = got.get(m.group(1), 0) + float(m.group(2))
    return got
log = open(f"{d}/replica-{victim}.log").read()
after = log.split("[replicas] revived", 1)[1] if "[replicas] revived" in log else ""
loaded = re.findall(r"loaded the suffix history (\S+) \((\d+) tokens in (\d+) documents\)", after)
saved_before = re.findall(r"saved the suffix history \((\d+) tokens", log.split("[replicas] revived", 1)[0])
print(f"# A replica killed and restarted\n")
print(f"{len(res['sessions'])} sessions through SMG ({res['config']['concurrency']} at a time) over 2 replicas; "
      f"replica {victim} killed (SIGKILL) at {killed_at} while answering, down {down} s, then started again.\n")
print(f"- requests answered: {len(records)}; sessions failed: {len(errors)}")
for e in errors:
    print(f"  - {e}")
print(f"- requests the client sent again (a stream cut by the kill, a 5xx): {len(retried)}")
for i in (1, 2):
    t = turns(i)
    who = "victim, since its restart" if i == victim else "survivor"
    print(f"- replica {i} ({who}): turns of conversations it knew {t.get('known', 0):.0f}, "
          f"new to it (first turns, and those taken over) {t.get('new', 0):.0f}")
print(f"- victim's periodic saves before the kill: {len(saved_before)}"
      + (f" (the last {saved_before[-1]} tokens)" if saved_before else ""))
if loaded:
    for path, tokens, docs in loaded:
        print(f"- victim at its restart: loaded {path.rsplit('/', 1)[-1]}, {tokens} tokens in {docs} documents")
else:
    print("- victim at its restart: loaded no saved history")
ok = not errors and bool(loaded)
print(f"\n{'PASS' if ok else 'FAIL'}: no failed request, and the saved history came back.")
sys.exit(0 if ok else 1)
EOF
