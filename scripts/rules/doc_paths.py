#!/usr/bin/env python3
"""Every file a document names exists (issue #67): a reader who follows a path in the README, in
`docs/`, in `bench/README.md` or in `scripts/README.md` finds the file. Paths rot when code moves;
this check tells the one who moves it which docs still point at the old place.

A path is named however it is spelt:
- a link `[text](target)`: relative to the document (anchors dropped, web links skipped);
- a path from the repository root (`crates/…`, `scripts/…`, `docs/…`, `bench/…`, `.ci/…`), from
  `crates/` (`treespec-llama/src/…`) or a crate's short path (`server/src/…`): must exist there;
- any other word that ends in a source or document extension (`routes/chat.rs`,
  `batch_lm/forward.rs`, `validate.rs`, `tests/hardening.rs`, `regret.md`): relative to the
  document, or the tail of some file's path in the repository (a short name is the reader's cue
  to search for it, so it must find one). A bare data file name (`person.json`, `prompt.txt`) is
  an example in a command, not a reference, and is checked only when written with its folder.
Patterns (`*`, `<target>`, `{…}`, `$VAR`, `…`), placeholders in capitals (`OUT/…`, `CURVE.json`),
home and absolute paths, paths that leave the repository (`../shared/docs/…`: the project's
notes beside it, not in it), and what is fetched or generated rather than kept (`models/`,
`.cargo/`, `bench-out/`, `target/`) are skipped.

Usage: doc_paths.py [ROOT]. Prints each dead path as `document: path`; exits 1 if there is one.
"""

import re
import sys
from pathlib import Path

ROOTS = ("crates", "scripts", "docs", "bench", ".ci")
SOURCE_EXTENSIONS = ("rs", "sh", "py", "md", "toml", "html", "mjs", "js")
DATA_EXTENSIONS = ("json", "jsonl", "patch", "yaml", "yml", "txt", "csv", "svg", "png", "gz", "lock")
SKIPPED = ("models/", ".cargo/", "bench-out/", "target/", "~", "/")
PATH_CHARS = r"[A-Za-z0-9_./-]"
WORD = re.compile(r"(?<![A-Za-z0-9_./~-])(" + PATH_CHARS + r"+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
URL = re.compile(r"[a-z]+://\S+")
PATTERN_NEXT = ("*", "<", "{", "$", "…")
# The docs name over 800 paths: far fewer means the scan, not the docs, went wrong.
MIN_NAMED = 500


def documents(root):
    """The documents a newcomer opens."""
    docs = [root / "README.md", root / "bench/README.md", root / "scripts/README.md"]
    docs += sorted((root / "docs").glob("*.md"))
    return [d for d in docs if d.exists()]


def crate_dirs(root):
    """Short name (`server`) to folder of each crate under `crates/treespec-*`."""
    return {p.name.removeprefix("treespec-"): p for p in sorted((root / "crates").glob("treespec-*"))}


def repository_files(root):
    """Every file and folder's path relative to `root`, as text, leaving out build outputs."""
    found = []
    for top in ROOTS + ("README.md", "Cargo.toml", "Cargo.lock", "rustfmt.toml", "clippy.toml"):
        base = root / top
        if base.is_file():
            found.append(top)
        elif base.is_dir():
            found += [p.relative_to(root).as_posix() for p in base.rglob("*") if "target" not in p.parts]
    return found


def named_paths(text):
    """(path as written, is a link) for each path `text` names."""
    found = []
    for m in LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z]+:", target):
            found.append((target, True))
    text = URL.sub(" ", LINK.sub("] ", text))
    for m in WORD.finditer(text):
        word = m.group(1)
        if text[m.end() : m.end() + 1] in PATTERN_NEXT or text[m.start() - 1 : m.start()] in PATTERN_NEXT:
            continue
        word = word.rstrip(".-")
        bare = re.sub(r"^(\.\./)+", "", word)
        first, _, rest = bare.partition("/")
        if word.startswith(("-", ".")) and not word.startswith("../") or placeholder(bare):
            continue
        rooted = rest and (first in ROOTS or first.startswith("treespec-"))
        source = has_extension(word, SOURCE_EXTENSIONS)
        data_with_folder = rest and has_extension(word, DATA_EXTENSIONS)
        if rooted or source or data_with_folder or (rest and word.startswith("../")):
            found.append((word, False))
    return found


def has_extension(word, extensions):
    return re.search(r"[A-Za-z0-9_-]\.(" + "|".join(extensions) + r")$", word) is not None


def placeholder(path):
    """Whether a component of `path` stands for a name the reader picks (`OUT/`, `FILE.lock`)."""
    parts = path.split("/")
    stem = parts[-1].split(".")[0]
    return any(p.isupper() for p in parts[:-1]) or (stem.isupper() and not parts[-1].endswith(".md"))


def resolves(root, doc, named, is_link, crates, files):
    """Whether `named`, as written in `doc`, names a file or folder that exists."""
    if named.startswith(SKIPPED):
        return True
    if (doc.parent / named).exists() or outside(root, doc, named):
        return True
    if is_link:
        return False
    first, _, rest = named.partition("/")
    if first in crates and rest and (crates[first] / rest).exists():
        return True
    if first in ROOTS:
        return (root / named).exists()
    if first.startswith("treespec-") and rest:
        return (root / "crates" / named).exists()
    if first in crates and rest:
        return False
    tail = "/" + named.rstrip("/")
    return any(("/" + f).endswith(tail) for f in files)


def outside(root, doc, named):
    """Whether `named` points out of the repository: from the document, or (`../shared/…` in
    `docs/`, written from the root) into no folder the repository has."""
    root = root.resolve()
    target = (doc.parent / named).resolve()
    if not target.is_relative_to(root):
        return True
    top = target.relative_to(root).parts[:1]
    return bool(top) and not (root / top[0]).exists() and not (root / named).resolve().is_relative_to(root)


def scan(root):
    """(`document: path`, whether it resolves) for each path the documents under `root` name."""
    root = Path(root)
    crates, files = crate_dirs(root), repository_files(root)
    found = []
    for doc in documents(root):
        for named, is_link in named_paths(doc.read_text(encoding="utf-8")):
            found.append((f"{doc.relative_to(root)}: {named}", resolves(root, doc, named, is_link, crates, files)))
    return found


def report(root):
    """`document: path` for each dead path in the documents under `root`."""
    return sorted({named for named, alive in scan(root) if not alive})


def main():
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    found = scan(root)
    dead = sorted({named for named, alive in found if not alive})
    for d in dead:
        print(d)
    print(f"[rules] dead doc paths: {len(dead)} of {len(found)} named")
    if len(found) < MIN_NAMED:
        print(f"only {len(found)} paths found (at least {MIN_NAMED} expected): the scan is broken")
        return 1
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
