#!/usr/bin/env python3
"""Did every server of a session run read the same prompt? (issue #68)

    python3 scripts/session-prompts.py RUN/requests.jsonl [...]

`treespec bench --sessions` sends every server the same request, each rendered by the server's
own chat template, and each server reports the prompt's token count (`usage.prompt_tokens`,
kept in `requests.jsonl`). A session's first request (turn 0, step 0) carries nothing any server
wrote, so every server must read it as the same number of tokens; a difference means the two
templates rendered the same request differently, and the servers' answers (and their speed-ups)
are to different prompts. Later requests carry each server's own earlier answers and may differ.

Prints, per session, the first request's prompt tokens on each server and whether they agree;
exits 1 when one does not.
"""

import json
import sys
from collections import defaultdict


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: session-prompts.py RUN/requests.jsonl [...]")
    disagree = 0
    for path in sys.argv[1:]:
        first = defaultdict(dict)
        for line in open(path):
            r = json.loads(line)
            if r.get("turn") == 0 and r.get("step", 0) == 0:
                key = (r["session"], r.get("repeat", 0))
                first[key][r["server"]] = r["reply"].get("prompt_tokens")
        servers = sorted({s for counts in first.values() for s in counts})
        print(f"{path}\n")
        print("| session | " + " | ".join(servers) + " | same |")
        print("|---|" + "---:|" * len(servers) + "---|")
        for (session, repeat), counts in sorted(first.items()):
            seen = {c for c in counts.values() if c is not None}
            same = len(seen) == 1
            disagree += not same
            cells = " | ".join(str(counts.get(s, "–")) for s in servers)
            label = session if repeat == 0 else f"{session} (repeat {repeat})"
            print(f"| {label} | {cells} | {'yes' if same else '**no**'} |")
        print()
    sys.exit(1 if disagree else 0)


if __name__ == "__main__":
    main()
