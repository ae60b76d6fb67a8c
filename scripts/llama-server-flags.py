#!/usr/bin/env python3
"""The command-line flags of a llama.cpp tool, read from the llama.cpp that llama-cpp-sys-2
vendors (its common/arg.cpp), one option a line: its spellings, then its value hint, tab-separated
(`-c --ctx-size<TAB>N`; a switch has an empty hint). What docs/SERVING.md's flag tables are
checked complete against (crates/treespec-cli/tests/llama_flags.rs).

    scripts/llama-server-flags.py                     # llama-server's flags
    scripts/llama-server-flags.py --example completion  # llama-completion's (also: cli)
    scripts/llama-server-flags.py --arg-cpp PATH      # another arg.cpp

An option counts for a tool when its `set_examples` names the tool or COMMON (no set_examples:
COMMON) and its `set_excludes` does not; preset-only options are not flags. Negated spellings
(`{"--x"}, {"--no-x"}`) are listed with the option.
"""

import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = {"server": "LLAMA_EXAMPLE_SERVER", "completion": "LLAMA_EXAMPLE_COMPLETION", "cli": "LLAMA_EXAMPLE_CLI"}
# Named example lists arg.cpp defines and passes to set_examples.
NAMED_LISTS = re.compile(r"static std::initializer_list<enum llama_example> (\w+) = \{([^}]*)\};")


def vendored_arg_cpp():
    """common/arg.cpp of the llama-cpp-sys-2 version Cargo.lock names, in cargo's registry."""
    lock = open(os.path.join(ROOT, "Cargo.lock")).read()
    version = re.search(r'name = "llama-cpp-sys-2"\nversion = "([^"]+)"', lock).group(1)
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    pattern = os.path.join(home, "registry/src/*", f"llama-cpp-sys-2-{version}/llama.cpp/common/arg.cpp")
    found = sorted(glob.glob(pattern))
    if not found:
        sys.exit(f"llama-server-flags.py: no {pattern} (build treespec once: cargo fetches it)")
    return found[0]


def literal_end(text, i):
    """Where the string or character literal opening at text[i] closes."""
    j = i + 1
    while j < len(text) and text[j] != text[i]:
        j += 2 if text[j] == "\\" else 1
    return j


def strip_comments(text):
    """The C++ text with its comments blanked, string and character literals kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = literal_end(text, i)
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i) + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def calls(text, opener):
    """The text inside each `opener(...)` call, its parentheses matched outside literals."""
    for m in re.finditer(re.escape(opener) + r"\(", text):
        depth, i = 1, m.end()
        while depth:
            c = text[i]
            if c in "\"'":
                i = literal_end(text, i)
            depth += {"(": 1, ")": -1}.get(c, 0)
            i += 1
        yield text[m.end() : i - 1]


def strings(text):
    return re.findall(r'"((?:[^"\\]|\\.)*)"', text)


def top_level(text):
    """`text` split at its commas outside brackets and literals."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = literal_end(text, i)
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    return parts + [text[start:].strip()]


def option(body, named):
    """(spellings, value hint, examples, excludes, preset only) of one add_opt's text:
    common_arg({spellings}, [{negated spellings},] [hint, [hint 2,]] help, handler)."""
    parts = top_level(next(calls(body, "common_arg")))
    spellings = strings(parts[0])
    if parts[1].startswith("{"):
        spellings += strings(parts.pop(1))
    hints = parts[1:-2]  # a hint may be an expression (--spec-type's list of names)
    hint = " ".join(strings(h)[0] if h.startswith('"') else h for h in hints)

    def examples(setter):
        found = set()
        for arg in calls(body, setter):
            arg = arg.strip()
            found |= set(re.findall(r"LLAMA_EXAMPLE_\w+", named.get(arg, arg)))
        return found

    ex = examples(".set_examples") or {"LLAMA_EXAMPLE_COMMON"}
    return spellings, hint, ex, examples(".set_excludes"), ".set_preset_only()" in body


def flags(path, example):
    text = strip_comments(open(path).read())
    named = {m.group(1): m.group(2) for m in NAMED_LISTS.finditer(text)}
    want, seen = EXAMPLES[example], set()
    for body in calls(text, "add_opt"):
        spellings, hint, ex, excludes, preset_only = option(body, named)
        if preset_only or want in excludes or not ex & {want, "LLAMA_EXAMPLE_COMMON"}:
            continue
        key = tuple(spellings)
        if key not in seen:  # -np is defined once per branch of an if
            seen.add(key)
            yield spellings, hint


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--example", choices=sorted(EXAMPLES), default="server")
    p.add_argument("--arg-cpp", help="default: the vendored llama.cpp's common/arg.cpp")
    a = p.parse_args()
    for spellings, hint in flags(a.arg_cpp or vendored_arg_cpp(), a.example):
        print(" ".join(spellings) + "\t" + hint)


if __name__ == "__main__":
    main()
