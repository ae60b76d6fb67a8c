"""Cut a session file for a short run: every session to its first TURNS turns and answers of at
most MAX_TOKENS tokens (0 leaves that alone).

    python3 scripts/sessions/cut.py SRC DST TURNS MAX_TOKENS
"""
import json
import sys

src, dst, turns, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(dst, "w") as out:
    for line in open(src):
        s = json.loads(line)
        if turns:
            s["turns"] = s["turns"][:turns]
        if max_tokens:
            s["max_tokens"] = min(s.get("max_tokens", max_tokens), max_tokens)
        out.write(json.dumps(s) + "\n")
