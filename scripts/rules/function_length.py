#!/usr/bin/env python3
"""No production function over 80 lines (issue #67), as clippy counts them (`too_many_lines`:
lines of code, blank and comment lines left out). Clippy does the counting; this checks that
every crate is under the rule, since a crate without `[lints] workspace = true` silently escapes
it: the workspace turns the lint on (`[workspace.lints.clippy]` in Cargo.toml), `clippy.toml`
sets the threshold, and each crate's manifest takes the workspace's lints.

Usage: function_length.py [ROOT]. Prints what is missing; exits 1 if anything is.
"""

import sys
import tomllib
from pathlib import Path

from rule import run

THRESHOLD = 80


def report(root):
    root = Path(root)
    problems = []
    workspace = tomllib.loads((root / "Cargo.toml").read_text(encoding="utf-8"))
    lint = workspace.get("workspace", {}).get("lints", {}).get("clippy", {}).get("too_many_lines")
    level = lint.get("level") if isinstance(lint, dict) else lint
    if level not in ("warn", "deny", "forbid"):
        problems.append("Cargo.toml: [workspace.lints.clippy] does not turn on too_many_lines")
    clippy = root / "clippy.toml"
    threshold = tomllib.loads(clippy.read_text(encoding="utf-8")).get("too-many-lines-threshold") if clippy.exists() else None
    if threshold != THRESHOLD:
        problems.append(f"clippy.toml: too-many-lines-threshold is {threshold}, not {THRESHOLD}")
    for manifest in sorted(root.glob("crates/*/Cargo.toml")):
        crate = tomllib.loads(manifest.read_text(encoding="utf-8"))
        if crate.get("lints", {}).get("workspace") is not True:
            problems.append(f"{manifest.relative_to(root)}: no `[lints] workspace = true`: the crate escapes the rule")
    return problems


if __name__ == "__main__":
    sys.exit(run(report, "crates outside the function-length rule"))
