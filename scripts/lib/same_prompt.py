#!/usr/bin/env python3
"""Side by side on the same tokens (issue #68): what every comparison with llama.cpp's own tools
shares.

llama.cpp's tools read a prompt file (`-f`) and drop ONE trailing newline from it
(common/arg.cpp: `if (params.prompt.back() == '\\n') params.prompt.pop_back();`), and every
chat-formatted prompt ends in "<|im_start|>assistant\\n": fed the text as it is, llama.cpp reads
a prompt one token shorter than treespec's and greedy answers can differ from the first token.
So:

  * `prompt_file_text` is what to write for llama.cpp: the text, plus the newline `-f` drops when
    it ends in one (the one place that writes a prompt file for llama.cpp's tools:
    `write-prompt` below, used by scripts/peer-bench.sh);
  * `parse_run` reads what a tool printed: its decode speed, the prompt's token count and (stdout)
    the answer;
  * `verdict` says whether treespec's and llama.cpp's plain runs of a prompt are comparable: the
    same number of prompt tokens, and the same greedy answer up to a near tie (the rule below);
    a prompt that is not is reported apart and left out of every ratio (`split`).

The near-tie rule: the two plain answers, with llama.cpp's " [end of text]" marker and trailing
whitespace dropped, are the same when equal; when they differ only after a common prefix of at
least NEAR_TIE_CHARS characters (about 25 tokens of prose or code), both decoders read the same
prompt and an argmax flipped at a near tie (their kernels round differently, docs/BENCHMARKS.md):
kept, and counted as a near tie. A difference earlier than that (or an empty answer) is not
trusted to be one: left out.

Command line (used by the shell scripts):
  same_prompt.py write-prompt OUT.txt < TEXT          the prompt file for llama.cpp's `-f`
  same_prompt.py parse-run STDOUT.txt LOG.txt         one JSON object: tokens_per_s, prompt_tokens, text
"""
import json
import re
import sys

# Common characters two differing greedy answers must share to count as a near tie.
NEAR_TIE_CHARS = 100
# What llama-completion prints after an end-of-generation token.
END_OF_TEXT = " [end of text]"


def prompt_file_text(text):
    """The prompt file's text for llama.cpp's `-f`, which drops one trailing newline."""
    return text + "\n" if text.endswith("\n") else text


def write_prompt_file(text, path):
    """Write the prompt file byte for byte (no newline translation)."""
    with open(path, "wb") as f:
        f.write(prompt_file_text(text).encode("utf-8", "surrogateescape"))


def parse_speed(log):
    """Decode tokens/s from a tool's log (the tools print it in two formats), or None."""
    m = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", log)
    if not m:
        m = re.search(r"(?<!prompt )eval time =.*?/\s*\d+ (?:runs|tokens).*?([\d.]+) tokens per second", log)
    return float(m.group(1)) if m else None


def parse_prompt_tokens(log):
    """The prompt's token count a tool printed, or None.

    llama-speculative-simple and llama-lookup print `encoded N tokens in S seconds` (the whole
    prompt; their target's `prompt eval` holds one token fewer, the last one being decoded with the
    first draft). llama-completion prints only llama_perf_context_print's `prompt eval time = … /
    N tokens`, the whole prompt read in one batch."""
    m = re.search(r"encoded\s+(\d+) tokens in", log)
    if not m:
        m = re.search(r"prompt eval time =.*?/\s*(\d+) tokens", log)
    return int(m.group(1)) if m else None


def answer_text(stdout):
    """The answer llama-completion printed (`--no-display-prompt`), without its end marker."""
    text = stdout.rstrip()
    if text.endswith(END_OF_TEXT):
        text = text[: -len(END_OF_TEXT)]
    return text.rstrip()


def parse_run(stdout, log):
    """One tool run: its log (stderr) first, stdout where the log lacks a line."""
    speed = parse_speed(log)
    count = parse_prompt_tokens(log)
    return {
        "tokens_per_s": speed if speed is not None else parse_speed(stdout),
        "prompt_tokens": count if count is not None else parse_prompt_tokens(stdout),
        "text": answer_text(stdout),
    }


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def verdict(ours, theirs):
    """Whether treespec plain's run of a prompt and llama.cpp plain's are on the same tokens.

    Each is a dict with `prompt_tokens` and `text`. Returns (kept, why): kept is False when the
    prompt must be left out of the ratios; why is "same", "near tie at character N" or the
    reason it was left out."""
    a, b = ours.get("prompt_tokens"), theirs.get("prompt_tokens")
    if a is None or b is None:
        return False, f"prompt tokens not recorded (treespec {a}, llama.cpp {b})"
    if a != b:
        return False, f"prompt tokens differ: treespec {a}, llama.cpp {b}"
    x, y = ours.get("text"), theirs.get("text")
    if x is None or y is None:
        return False, "plain answer not recorded"
    x, y = x.rstrip(), y.rstrip()
    if x == y:
        return True, "same"
    n = common_prefix(x, y)
    if n >= NEAR_TIE_CHARS:
        return True, f"near tie at character {n}"
    return False, f"plain answers differ at character {n}"


def split(pairs):
    """{prompt id: (ours, theirs)} → (kept ids, {left-out id: why}, {near-tie id: why})."""
    kept, left_out, near = [], {}, {}
    for i, (ours, theirs) in sorted(pairs.items()):
        ok, why = verdict(ours, theirs)
        if not ok:
            left_out[i] = why
            continue
        kept.append(i)
        if why != "same":
            near[i] = why
    return kept, left_out, near


def report(left_out, near, total):
    """Markdown lines: how many prompts were compared, and each one left out and why."""
    lines = [f"Same tokens: {total - len(left_out)} of {total} prompts compared with llama.cpp "
             f"({len(left_out)} left out of every ratio, {len(near)} near ties kept; scripts/lib/same_prompt.py)."]
    lines += [f"- left out: {i}: {why}" for i, why in sorted(left_out.items())]
    lines += [f"- near tie: {i}: {why}" for i, why in sorted(near.items())]
    return lines


def main(argv):
    if len(argv) == 2 and argv[0] == "write-prompt":
        write_prompt_file(sys.stdin.buffer.read().decode("utf-8", "surrogateescape"), argv[1])
    elif len(argv) == 3 and argv[0] == "parse-run":
        stdout = open(argv[1], encoding="utf-8", errors="replace").read()
        log = open(argv[2], encoding="utf-8", errors="replace").read()
        print(json.dumps(parse_run(stdout, log)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
