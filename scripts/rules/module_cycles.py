#!/usr/bin/env python3
"""No import cycle between the files of a crate (issue #67): if `a.rs` uses `b.rs`, then nothing
`b.rs` uses, directly or not, uses `a.rs`. A cycle means neither file can be read, tested or moved
without the other; the rule keeps each crate a stack of layers.

A file uses another when its code names a path into it: `use crate::x::Y`, `super::Y`,
`self::x::Y` or `x::f()` for a child module `x`, in a `use` or inline. The path lands on the file
of the longest module it names, as written: `crate::runtime::TILED_ENV` is a use of
`runtime/mod.rs` even if that file only re-exports it, because the reader follows the path there.
A `pub use` is the file's interface, not a use, unless the file's own code also names what it
re-exports. Extern crates are not followed.

Usage: module_cycles.py [ROOT]  (ROOT: the repository, default this script's; every crate under
ROOT/crates/*/src). Prints each cycle with the paths that close it; exits 1 if there is one.
"""

import re
import sys
from pathlib import Path

from rule import run

from rust_source import IDENT, blank_comments_and_literals, expand_use_tree, module_files

USE = re.compile(r"(?<![\w:])(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE_PATH = re.compile(r"(?<![\w:$])((?:" + IDENT + r")(?:\s*::\s*" + IDENT + r")+)")
INLINE_MOD = re.compile(r"(?<![\w:])mod\s+(" + IDENT + r")\s*\{")


def crate_graph(src):
    """Edges between the files of the crate whose sources are in `src`: a dict from file to a
    dict from used file to the paths (as written) that use it."""
    files = module_files(src)
    graph = {}
    for module, path in files.items():
        code = blank_comments_and_literals(path.read_text(encoding="utf-8"))
        edges = {}
        for written, segments in named_paths(code, module, files):
            used = longest_module(segments, files)
            if used != module[: len(used)]:
                target = files[used]
                edges.setdefault(target, set()).add(written)
        graph[path] = edges
    return graph


def named_paths(code, module, files):
    """(path as written, absolute segments) for each crate-internal path `code` names."""
    inline_mods = inline_module_spans(code)
    found, use_spans = [], []
    for m in USE.finditer(code):
        use_spans.append((m.start(), m.end()))
        here = module + enclosing(inline_mods, m.start())
        for segments in expand_use_tree(m.group(2)):
            absolute = absolute_path(segments, here, files)
            if absolute is None:
                continue
            if m.group(1) and not reexport_used(code, segments, use_spans):
                continue
            found.append(("::".join(segments), absolute))
    for m in INLINE_PATH.finditer(code):
        if any(s <= m.start() < e for s, e in use_spans):
            continue
        segments = re.sub(r"\s+", "", m.group(1)).split("::")
        absolute = absolute_path(segments, module + enclosing(inline_mods, m.start()), files)
        if absolute is not None:
            found.append(("::".join(segments), absolute))
    return found


def reexport_used(code, segments, use_spans):
    """Whether the file's own code (outside `use` statements) names what a `pub use` re-exports."""
    name = segments[-1]
    if name == "*":
        return False
    for m in re.finditer(r"(?<![\w:])(?<!mod )" + re.escape(name) + r"(?!\w)", code):
        if not any(s <= m.start() < e for s, e in use_spans):
            return True
    return False


def inline_module_spans(code):
    """(start, end, name) of each inline `mod name { … }` block."""
    spans = []
    for m in INLINE_MOD.finditer(code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        spans.append((m.end(), i, m.group(1)))
    return spans


def enclosing(spans, at):
    """The inline modules around position `at`, outermost first."""
    return tuple(name for start, end, name in sorted(spans) if start <= at < end)


def absolute_path(segments, here, files):
    """`segments` as a path from the crate root, or None when it leaves the crate (an extern
    crate, a `std` path, a macro's `$crate`) or names no module of it."""
    first = segments[0]
    if first == "crate":
        return tuple(segments[1:])
    if first == "self":
        return here + tuple(segments[1:])
    if first == "super":
        up = here
        while segments and segments[0] == "super":
            up, segments = up[:-1], segments[1:]
        return up + tuple(segments)
    if here + (first,) in files:
        return here + tuple(segments)
    return None


def longest_module(segments, files):
    """The longest prefix of `segments` that is a file's module."""
    for n in range(len(segments), -1, -1):
        if tuple(segments[:n]) in files:
            return tuple(segments[:n])
    return ()


def cycles(graph):
    """The strongly connected parts of `graph` with more than one file (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def report(root):
    """One paragraph per cycle in any crate under `root`: its files and the uses between them."""
    root = Path(root)
    problems = []
    for src in sorted(root.glob("crates/*/src")):
        graph = crate_graph(src)
        for part in cycles(graph):
            lines = [f"import cycle in {src.parent.relative_to(root)}:"]
            for a in part:
                for b in part:
                    if b in graph[a]:
                        uses = ", ".join(sorted(graph[a][b]))
                        lines.append(f"  {a.relative_to(src)} -> {b.relative_to(src)} ({uses})")
            problems.append("\n".join(lines))
    return problems


if __name__ == "__main__":
    sys.exit(run(report, "module cycles"))
