"""Reading Rust source well enough to find module paths: comments and literals blanked out, the
`use` trees expanded, and each file's place in its crate's module tree.

Not a Rust parser: enough for the rules in this folder, which only need `crate::`, `super::` and
`self::` paths and the inline `mod name { … }` blocks they sit in.
"""

import re
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(\\.[^']*|[^\\'])'")


def blank_comments_and_literals(text):
    """`text` with comments, string and char literals replaced by spaces (newlines kept), so a
    path inside a doc comment or a string is not read as code."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(_keep_newlines(text[i:j]))
            i = j
        elif c in "br" and (m := RAW_STRING.match(text, i)) and (i == 0 or not _ident_char(text[i - 1])):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(_keep_newlines(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(_keep_newlines(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := CHAR.match(text, i)):
            out.append(" " * (m.end() - i))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_char(c):
    return c.isalnum() or c == "_"


def _keep_newlines(s):
    return "".join("\n" if ch == "\n" else " " for ch in s)


def expand_use_tree(tree):
    """The paths a `use` tree names, each a list of segments: `a::{b, c::{d as e, self}}` gives
    `[a, b]`, `[a, c, d]`, `[a, c]`. A glob ends in `*`."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)
    return [p for p in _expand(tree, []) if p]


def _expand(tree, prefix):
    if not tree:
        return []
    brace = tree.find("{")
    if brace < 0:
        segments = [s for s in tree.split("::") if s]
        if segments and segments[-1] == "self":
            segments = segments[:-1]
        return [prefix + segments]
    head = [s for s in tree[:brace].split("::") if s]
    inner = tree[brace + 1 : tree.rfind("}")]
    found = []
    for part in _split_top_level(inner):
        found.extend(_expand(part, prefix + head))
    return found


def _split_top_level(inner):
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return [p for p in parts if p]


def module_files(src):
    """Each `.rs` file under a crate's `src/` with its module path (a tuple of names; the crate
    root `lib.rs`/`main.rs` is `()`, `a/mod.rs` and `a.rs` are `("a",)`). Binaries under
    `src/bin/` are left out: each is its own crate."""
    files = {}
    for path in sorted(Path(src).rglob("*.rs")):
        rel = path.relative_to(src)
        if rel.parts[0] == "bin":
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
            parts = parts[:-1]
        files[tuple(parts)] = path
    return files
