#!/usr/bin/env python3
"""The side-by-side harness on the same tokens (issue #68), with no llama.cpp build and no model.

    python3 scripts/same-prompt-test.py

1. scripts/peer-bench.sh run, on stand-ins for llama.cpp's tools that read `-f` as llama.cpp
   does (one trailing newline dropped, common/arg.cpp), count the prompt's tokens and answer
   differently when the prompt lost its last newline: every run must read as many tokens as
   treespec's count in the dumped prompts, and llama.cpp plain must answer as treespec does on the
   full prompt.
2. scripts/lib/cold_summary.py (cold-bench.sh, avx2-tier.sh) and scripts/side-by-side.py (the
   main table, the structured run) on canned runs of four prompts: the same, the same up to a near
   tie, a prompt read one token short, answers that differ early. The last two must be listed
   apart and left out of every ratio.
Fails (exit 1) on the first check that does not hold.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(repo, "scripts", "lib"))
import same_prompt  # noqa: E402

# The stand-in tools' tokenizer: words, and every other non-space character (newlines included).
TOKEN = re.compile(r"\w+|[^\w ]")
# What the stand-in model answers after the whole prompt, and after one that lost its last "\n"
# (it writes the newline itself, then goes on differently).
ANSWER = "The answer is 42."
SHORT_ANSWER = "\nAnswer: forty-two"

FAKE_TOOL = r'''#!/usr/bin/env python3
import re, sys
args = sys.argv[1:]
prompt = open(args[args.index("-f") + 1], encoding="utf-8", newline="").read()
if prompt.endswith("\n"):  # common/arg.cpp's -f
    prompt = prompt[:-1]
n = len(re.findall(r"\w+|[^\w ]", prompt))
answer = ANSWER if prompt.endswith("assistant\n") else SHORT_ANSWER
if "llama-completion" in sys.argv[0]:
    if "--no-display-prompt" not in args:
        sys.stdout.write(prompt)
    sys.stdout.write(answer + " [end of text]\n\n\n")
    sys.stderr.write(f"llama_perf_context_print: prompt eval time =      12.34 ms / {n:5d} tokens (    0.50 ms per token,  2000.00 tokens per second)\n")
    sys.stderr.write("llama_perf_context_print:        eval time =     100.00 ms /     9 runs   (   11.11 ms per token,    90.00 tokens per second)\n")
else:
    sys.stdout.write(answer + "\n\n")
    sys.stderr.write(f"encoded {n:4d} tokens in    0.012 seconds, speed: 2000.000 t/s\n")
    sys.stderr.write("decoded   10 tokens in    0.100 seconds, speed:  100.000 t/s\n")
'''

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def peer_bench(tmp):
    """Step 1: peer-bench.sh on the stand-in tools."""
    peers = os.path.join(tmp, "peers")
    bin_dir = os.path.join(peers, "build", "bin")
    os.makedirs(bin_dir)
    tool = FAKE_TOOL.replace("ANSWER if", f"{ANSWER!r} if").replace("else SHORT_ANSWER", f"else {SHORT_ANSWER!r}")
    for name in ("llama-completion", "llama-speculative-simple", "llama-lookup"):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(tool)
        os.chmod(path, 0o755)
    model = os.path.join(tmp, "model.gguf")
    open(model, "w").close()
    prompts = [
        ("q1", "qa", "<|im_start|>user\nWhat is six times seven?<|im_end|>\n<|im_start|>assistant\n"),
        ("q2", "coding", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSum 40 and 2.\r\n<|im_end|>\n<|im_start|>assistant\n"),
    ]
    formatted = os.path.join(tmp, "formatted.jsonl")
    with open(formatted, "w") as f:
        for i, c, text in prompts:
            # As `treespec bench --dump-prompts` writes them: the count is the tokens treespec reads.
            f.write(json.dumps({"id": i, "category": c, "text": text, "prompt_tokens": len(TOKEN.findall(text))}) + "\n")
    out = os.path.join(tmp, "peers.jsonl")
    env = dict(os.environ, TREESPEC_PEERS=peers)
    env.pop("PEER_TOOLS", None)
    env.pop("PEER_ISA", None)
    run = subprocess.run(["bash", os.path.join(repo, "scripts", "peer-bench.sh"), "run", formatted, out, "-m", model, "-n", "8"],
                         env=env, capture_output=True, text=True)
    check(run.returncode == 0, f"peer-bench.sh run exits 0 ({run.stderr.strip()[-300:]})")
    if run.returncode != 0:
        return
    lines = [json.loads(line) for line in open(out) if line.strip()]
    want = {i: len(TOKEN.findall(t)) for i, _, t in prompts}
    check(len(lines) == 3 * len(prompts), f"one line per prompt and tool ({len(lines)})")
    for line in lines:
        check(line["prompt_tokens"] == want[line["id"]],
              f"{line['id']} {line['tool']}: read {line['prompt_tokens']} prompt tokens, treespec's count is {want[line['id']]}")
        check(line["tokens_per_s"] is not None, f"{line['id']} {line['tool']}: speed parsed")
        if line["tool"] == "llama.cpp plain":
            check(line.get("text") == ANSWER, f"{line['id']} llama.cpp plain answers {line.get('text')!r} (treespec: {ANSWER!r})")
        else:
            check("text" not in line, f"{line['id']} {line['tool']}: no answer kept")


# Step 2: four prompts. tokens/s: both plains 10; the treespec method and the llama.cpp tool differ
# per prompt, so that leaving a prompt in moves every median.
CASES = {
    # id: (treespec answer, llama.cpp answer, llama.cpp prompt tokens, auto tok/s, ngram-mod tok/s)
    "p-same": ("def f(x):\n    return x + 1", "def f(x):\n    return x + 1", 50, 20.0, 15.0),
    "p-near": ("A" * 120 + " and so on", "A" * 120 + " or so", 50, 30.0, 12.0),
    "p-count": ("Hello there.", "Hello there.", 49, 100.0, 1.0),
    "p-text": ("Paris is the capital.", "\nThe capital is Paris.", 50, 90.0, 2.0),
}
KEPT = ["p-near", "p-same"]
LEFT_OUT = ["p-count", "p-text"]


def cold_summary(tmp):
    out = os.path.join(tmp, "cold")
    os.makedirs(out)
    rows = []
    for i, (ours, theirs, count, auto, ngram) in CASES.items():
        rows += [
            {"id": i, "category": "qa", "tool": "treespec plain", "tokens_per_s": 10.0, "wall_s": 1.0, "prompt_tokens": 50, "text": ours},
            {"id": i, "category": "qa", "tool": "treespec auto", "tokens_per_s": auto, "wall_s": 0.5},
            {"id": i, "category": "qa", "tool": "llama.cpp plain", "tokens_per_s": 10.0, "prompt_tokens": count, "text": theirs},
            {"id": i, "category": "qa", "tool": "llama.cpp ngram-mod", "tokens_per_s": ngram, "prompt_tokens": count},
        ]
    with open(os.path.join(out, "cold.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(out, "load.txt"), "w") as f:
        f.write("load average before: 0 0 0\n")
    run = subprocess.run([sys.executable, os.path.join(repo, "scripts", "lib", "cold_summary.py"), out], capture_output=True, text=True)
    check(run.returncode == 0, f"cold_summary.py exits 0 ({run.stderr.strip()[-300:]})")
    md = open(os.path.join(out, "cold.md")).read() if run.returncode == 0 else ""
    auto = statistics.median(CASES[i][3] / 10.0 for i in KEPT)
    ngram = statistics.median(CASES[i][4] / 10.0 for i in KEPT)
    check(f"| treespec auto | {auto:.2f}×" in md, f"cold: auto's ratio over the kept prompts only ({auto:.2f}×)")
    check(f"| llama.cpp ngram-mod | {ngram:.2f}×" in md, f"cold: ngram-mod's ratio over the kept prompts only ({ngram:.2f}×)")
    check(f"Median over {len(KEPT)} prompts" in md, f"cold: the medians are over {len(KEPT)} prompts")
    check(f"Same tokens: {len(KEPT)} of {len(CASES)} prompts" in md, "cold: the count of prompts compared")
    for i in LEFT_OUT:
        check(f"- left out: {i}:" in md, f"cold: {i} listed as left out")
    check("- near tie: p-near:" in md, "cold: p-near kept as a near tie")


def side_by_side(tmp):
    bench = os.path.join(tmp, "bench")
    os.makedirs(bench)
    runs, peers, answers = [], [], []
    for i, (ours, theirs, count, auto, ngram) in CASES.items():
        runs += [{"method": "plain", "prompt_id": i, "category": "qa", "tokens_per_s": 10.0},
                 {"method": "auto", "prompt_id": i, "category": "qa", "tokens_per_s": auto}]
        answers.append({"prompt_id": i, "category": "qa", "repeat": 0, "prompt_tokens": 50, "text": ours})
        peers += [{"id": i, "category": "qa", "tool": "llama.cpp plain", "tokens_per_s": 10.0, "prompt_tokens": count, "text": theirs},
                  {"id": i, "category": "qa", "tool": "llama.cpp ngram-mod", "tokens_per_s": ngram, "prompt_tokens": count}]
    json.dump({"runs": runs}, open(os.path.join(bench, "results.json"), "w"))
    with open(os.path.join(bench, "plain-answers.jsonl"), "w") as f:
        f.writelines(json.dumps(a) + "\n" for a in answers)
    with open(os.path.join(tmp, "side-peers.jsonl"), "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in peers)
    run = subprocess.run([sys.executable, os.path.join(repo, "scripts", "side-by-side.py"), os.path.join(bench, "results.json"),
                          os.path.join(tmp, "side-peers.jsonl")], capture_output=True, text=True)
    check(run.returncode == 0, f"side-by-side.py exits 0 ({run.stderr.strip()[-300:]})")
    table = run.stdout
    auto = statistics.median(CASES[i][3] for i in KEPT) / 10.0
    ngram = statistics.median(CASES[i][4] for i in KEPT) / 10.0
    check(f"| treespec `auto` | {auto:.2f}×" in table, f"side-by-side: auto's ratio over the kept prompts only ({auto:.2f}×)")
    check(f"| llama.cpp ngram-mod | {ngram:.2f}×" in table, f"side-by-side: ngram-mod's ratio over the kept prompts only ({ngram:.2f}×)")
    check(f"Same tokens: {len(KEPT)} of {len(CASES)} prompts" in table, "side-by-side: the count of prompts compared")
    for i in LEFT_OUT:
        check(f"- left out: {i}:" in table, f"side-by-side: {i} listed as left out")


def main():
    check(same_prompt.prompt_file_text("x\n") == "x\n\n", "a text ending in a newline gets the one `-f` drops")
    check(same_prompt.prompt_file_text("x") == "x", "any other text is written as it is")
    tmp = tempfile.mkdtemp(prefix="same-prompt-test-")
    try:
        peer_bench(tmp)
        cold_summary(tmp)
        side_by_side(tmp)
    finally:
        shutil.rmtree(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("same-prompt-test: all checks hold")


if __name__ == "__main__":
    main()
