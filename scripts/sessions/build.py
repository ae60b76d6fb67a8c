#!/usr/bin/env python3
"""Build the multi-turn session workloads of `bench/inputs/sessions/` from pinned public data.

    python3 scripts/sessions/build.py --out bench/inputs/sessions

Writes one JSON-lines file per workload (agent-whole, agent-search-replace, chat, tools, doc-qa);
the format is read by `crates/treespec-bench/src/sessions/workload.rs`. Every artifact is pinned
by sha256 below and checked before it is read; a mismatch stops the build. Downloaded packages are
only unpacked and read as text: nothing from them is imported, installed or run. Python sources
are parsed with the standard library's `ast` (never executed). The output is byte-identical from
run to run.

Sources:
  * agent workloads: modules (or excerpts of consecutive top-level definitions) from PyPI wheels
    and sdists of toolz, boltons, more-itertools and attrs;
  * chat: MT-Bench two-turn questions from spec-bench's question.jsonl (../shared/data);
  * tools: BFCL v4 multi-turn conversations and function docs from the bfcl-eval wheel;
  * doc-qa: attrs documentation (sdist) and one spec-bench summarization article.
"""

import argparse
import ast
import builtins
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
import tokenize
import typing
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------------
# Pins. url: where it is fetched from (PyPI's content-addressed file store); sha256: what it must be.

ARTIFACTS = {
    "toolz": {
        "file": "toolz-1.0.0-py3-none-any.whl",
        "url": "https://files.pythonhosted.org/packages/03/98/eb27cc78ad3af8e302c9d8ff4977f5026676e130d28dd7578132a457170c/toolz-1.0.0-py3-none-any.whl",
        "sha256": "292c8f1c4e7516bf9086f8850935c799a874039c8bcf959d47b600e4c44a6236",
        "label": "toolz 1.0.0 (wheel from PyPI)",
    },
    "boltons": {
        "file": "boltons-24.1.0-py3-none-any.whl",
        "url": "https://files.pythonhosted.org/packages/b8/96/e44606e60a0c005ac5f2a641960a93ca8f449ebdce7479f9bc4f10bead6d/boltons-24.1.0-py3-none-any.whl",
        "sha256": "a1776d47fdc387fb730fba1fe245f405ee184ee0be2fb447dd289773a84aed3b",
        "label": "boltons 24.1.0 (wheel from PyPI)",
    },
    "more-itertools": {
        "file": "more_itertools-10.5.0-py3-none-any.whl",
        "url": "https://files.pythonhosted.org/packages/48/7e/3a64597054a70f7c86eb0a7d4fc315b8c1ab932f64883a297bdffeb5f967/more_itertools-10.5.0-py3-none-any.whl",
        "sha256": "037b0d3203ce90cca8ab1defbbdac29d5f993fc20131f3664dc8d6acfa872aef",
        "label": "more-itertools 10.5.0 (wheel from PyPI)",
    },
    "attrs": {
        "file": "attrs-24.2.0.tar.gz",
        "url": "https://files.pythonhosted.org/packages/fc/0f/aafca9af9315aee06a89ffde799a10a582fe8de76c563ee80bbcdc08b3fb/attrs-24.2.0.tar.gz",
        "sha256": "5cfb1b9148b5b086569baec03f20d7b6bf3bcacc9a42bebf87ffaaca362f6346",
        "label": "attrs 24.2.0 (sdist from PyPI)",
    },
    "bfcl": {
        "file": "bfcl_eval-2026.3.23-py3-none-any.whl",
        "url": "https://files.pythonhosted.org/packages/ba/41/ed458527c770c50225b60bae3b0c3444b26804ee455fa2d8f187018d2cb2/bfcl_eval-2026.3.23-py3-none-any.whl",
        "sha256": "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
        "label": "bfcl-eval 2026.3.23 (wheel from PyPI)",
    },
}

# spec-bench's question.jsonl (MT-Bench rows and the summarization articles), read locally.
SPEC_BENCH = {
    "path": "../shared/data/spec-bench/question.jsonl",  # relative to the repository root
    "sha256": "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
    "label": "spec-bench question.jsonl",
}

MAX_TOKENS = {"agent-whole": 768, "agent-search-replace": 768, "chat": 192, "tools": 192, "doc-qa": 192}
WORKLOADS = ["agent-whole", "agent-search-replace", "chat", "tools", "doc-qa"]


def die(msg):
    sys.exit(f"build.py: error: {msg}")


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def fetch(key, cache):
    """The bytes of a pinned artifact: from the cache when it is there and matches, else downloaded."""
    art = ARTIFACTS[key]
    path = cache / art["file"]
    if path.exists():
        data = path.read_bytes()
        if sha256_bytes(data) == art["sha256"]:
            return data
        print(f"  {path}: cached copy does not match its pin, downloading again", file=sys.stderr)
    data = None
    for attempt in range(3):
        try:
            print(f"  downloading {art['url']}", file=sys.stderr)
            with urllib.request.urlopen(art["url"], timeout=120) as r:
                data = r.read()
            break
        except OSError as e:
            if attempt == 2:
                die(f"cannot download {art['url']}: {e}")
            time.sleep(2 + 3 * attempt)
    got = sha256_bytes(data)
    if got != art["sha256"]:
        die(f"{art['file']}: sha256 {got} does not match the pin {art['sha256']} ({art['url']})")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


class Archive:
    """Read-only text access to the members of a wheel (zip) or sdist (tar.gz)."""

    def __init__(self, data, name):
        self.name = name
        if name.endswith(".whl") or name.endswith(".zip"):
            self.zip = zipfile.ZipFile(io.BytesIO(data))
            self.tar = None
        else:
            self.zip = None
            self.tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")

    def text(self, member):
        if self.zip is not None:
            raw = self.zip.read(member)
        else:
            f = self.tar.extractfile(member)
            if f is None:
                die(f"{self.name}: {member} is not a file")
            raw = f.read()
        return raw.decode("utf-8")


# --------------------------------------------------------------------------------------------
# Agent workloads: a small Python file and change requests specific to it.

SYSTEM_WHOLE = """You are an expert software developer working on one Python file.
Each user message shows the file's path and its current contents in a fenced block, followed by a change request.

Make exactly the change that is requested and nothing more: leave every other line, comment, docstring and blank line as it is.

Answer with the complete updated file in a single fenced ```python block.
Write out the whole file, every line of it, including the parts you did not change; never shorten it with placeholders such as "# ... rest unchanged".
Do not add any explanation before or after the block."""

SYSTEM_SEARCH_REPLACE = """You are an expert software developer working on one Python file.
Each user message shows the file's path and its current contents in a fenced block, followed by a change request.

Make exactly the change that is requested and nothing more.
Describe each edit as a SEARCH/REPLACE block, written like this:

path/to/file.py
<<<<<<< SEARCH
lines copied exactly from the current file
=======
the lines that take their place
>>>>>>> REPLACE

Rules:
- The first line is the file's path, on its own.
- The SEARCH part must match the current file exactly, character for character, including indentation, comments and docstrings. Include enough lines to make it unique in the file, but not more than needed.
- Only the first place where the SEARCH part occurs is replaced.
- Use several short blocks for changes in different places rather than one huge block. To add new code, search for the lines next to where it goes and repeat them in the replacement with the new code added.
- Do not write out the whole file, and do not add explanations outside the blocks.

Example. For a file greet.py containing

def greet(name):
    return "Hello " + name

and the request "Add type hints to `greet`.", the answer is:

greet.py
<<<<<<< SEARCH
def greet(name):
=======
def greet(name: str) -> str:
>>>>>>> REPLACE"""

# Each file: where it comes from, and the requests. `refs` are identifiers the request names that
# must exist in the file at that point (checked against the file's tokens and `ast`); `adds` are
# the names a request introduces, which later requests may name.
AGENT_FILES = [
    {
        "name": "toolz-recipes",
        "artifact": "toolz",
        "member": "toolz/recipes.py",
        "path": "toolz/recipes.py",
        "turns": [
            {
                "user": "Add type hints to `countby` and `partitionby`: `key` and `func` are callables "
                "(for `countby`, `key` may also be anything `getter` accepts), `seq` is an iterable, "
                "`countby` returns a `dict` of counts and `partitionby` an iterator of tuples. "
                "Import what you need from `typing`.",
                "refs": ["countby", "partitionby", "key", "func", "getter", "seq"],
            },
            {
                "user": "In `countby`, raise `TypeError(\"countby() needs an iterable, got None\")` "
                "when `seq` is `None`, before anything else happens.",
                "refs": ["countby", "seq"],
            },
            {
                "user": "Rename `partitionby` to `partition_by` everywhere in the file, including "
                "`__all__` and the doctest examples in its docstring.",
                "refs": ["partitionby", "__all__"],
                "adds": ["partition_by"],
            },
            {
                "user": "Add a public function `countby_sorted(key, seq)` right after `countby` that "
                "returns the counts of `countby` as a list of `(key, count)` pairs, highest count "
                "first. Give it a short docstring with one doctest, and add it to `__all__`.",
                "refs": ["countby", "__all__"],
                "adds": ["countby_sorted"],
            },
        ],
    },
    {
        "name": "attrs-filters",
        "artifact": "attrs",
        "member": "attrs-24.2.0/src/attr/filters.py",
        "path": "attr/filters.py",
        "turns": [
            {
                "user": "Rename the helper `_split_what` to `_partition_what` everywhere.",
                "refs": ["_split_what"],
                "adds": ["_partition_what"],
            },
            {
                "user": "The inner functions `include_` and `exclude_` repeat the same membership "
                "test. Move it into a module-level helper `_matches(cls, names, attrs, attribute, "
                "value)` placed right after `_partition_what`, and call it from both.",
                "refs": ["include_", "exclude_", "_partition_what"],
                "adds": ["_matches"],
            },
            {
                "user": "Add type hints to every function, including the inner `include_` and "
                "`exclude_`; `include` and `exclude` return `Callable[[Attribute, Any], bool]`.",
                "refs": ["include_", "exclude_", "include", "exclude", "Attribute"],
            },
            {
                "user": "Make `include()` and `exclude()` raise a `TypeError` with a clear message "
                "when they are called without any argument.",
                "refs": ["include", "exclude"],
            },
        ],
    },
    {
        "name": "attrs-setters",
        "artifact": "attrs",
        "member": "attrs-24.2.0/src/attr/setters.py",
        "path": "attr/setters.py",
        "turns": [
            {
                "user": "Rename the parameters `_`, `__` and `___` of `frozen` to `instance`, "
                "`attrib` and `new_value`, like the other setters.",
                "refs": ["_", "__", "___", "frozen", "instance", "attrib", "new_value"],
            },
            {
                "user": "Simplify `validate`: fold the `_config._run_validators is False` check and "
                "the missing-validator check into a single `if` with one early `return new_value`.",
                "refs": ["validate", "_config", "_run_validators", "new_value"],
            },
            {
                "user": "Add type hints to `pipe`, `frozen`, `validate` and `convert`: use "
                "`typing.Any` for the instance and the values, and `Callable` for the setters "
                "that `pipe` takes and returns.",
                "refs": ["pipe", "frozen", "validate", "convert"],
            },
            {
                "user": "Add a new setter `strip(instance, attrib, new_value)` right after `convert` "
                "that returns `new_value.strip()` when `new_value` is a `str` and `new_value` "
                "unchanged otherwise. Give it a docstring in the same style as the others, ending "
                "with `.. versionadded:: 24.3.0`.",
                "refs": ["convert", "instance", "attrib", "new_value"],
                "adds": ["strip"],
            },
        ],
    },
    {
        "name": "boltons-deprutils",
        "artifact": "boltons",
        "member": "boltons/deprutils.py",
        "path": "boltons/deprutils.py",
        "turns": [
            {
                "user": "In `DeprecatableModule.__getattribute__`, rename the local variable `depros` "
                "to `deprecated_members`.",
                "refs": ["DeprecatableModule", "__getattribute__", "depros"],
                "adds": ["deprecated_members"],
            },
            {
                "user": "Resolve the `# todo: only warn once` comment: make `__getattribute__` warn "
                "only the first time each deprecated name is accessed, remembering the names already "
                "warned about in a set `_warned_members` kept next to `_deprecated_members`. Then "
                "delete the comment.",
                "refs": ["__getattribute__", "_deprecated_members"],
                "adds": ["_warned_members"],
            },
            {
                "user": "Add docstrings to `DeprecatableModule` and `deprecate_module_member`; the "
                "latter should explain its `mod_name`, `name` and `message` arguments.",
                "refs": ["DeprecatableModule", "deprecate_module_member", "mod_name", "name", "message"],
            },
            {
                "user": "Remove the bare `return` at the end of `deprecate_module_member`, and add "
                "type hints to `deprecate_module_member` and `DeprecatableModule.__init__`.",
                "refs": ["deprecate_module_member", "DeprecatableModule", "__init__"],
            },
        ],
    },
    {
        "name": "toolz-dicttoolz-merge",
        "artifact": "toolz",
        "member": "toolz/dicttoolz.py",
        "path": "toolz/dicttoolz.py",
        "excerpt": ["_get_factory", "merge", "merge_with"],
        "turns": [
            {
                "user": "`merge` and `merge_with` both start by unpacking a single argument that is "
                "not a `Mapping`. Move that into a helper `_unpack_dicts(dicts)` placed right after "
                "`_get_factory`, and use it in both functions.",
                "refs": ["merge", "merge_with", "Mapping", "_get_factory", "dicts"],
                "adds": ["_unpack_dicts"],
            },
            {
                "user": "In `merge_with`, replace the `collections.defaultdict(lambda: [].append)` "
                "trick with a plain `collections.defaultdict(list)` and `values[k].append(v)`, and "
                "adjust the last loop so it no longer needs `v.__self__`.",
                "refs": ["merge_with", "collections", "defaultdict", "values", "k", "v", "__self__"],
            },
            {
                "user": "Replace the for-loop at the end of `merge_with` that fills `result` with a "
                "single `result.update(...)` call over a generator expression.",
                "refs": ["merge_with", "result"],
            },
            {
                "user": "Use an f-string for the error message in `_get_factory`.",
                "refs": ["_get_factory"],
            },
            {
                "user": "Add type hints to `_get_factory`, `_unpack_dicts`, `merge` and `merge_with`.",
                "refs": ["_get_factory", "_unpack_dicts", "merge", "merge_with"],
            },
        ],
    },
    {
        "name": "more-itertools-take-tail",
        "artifact": "more-itertools",
        "member": "more_itertools/recipes.py",
        "path": "more_itertools/recipes.py",
        "excerpt": ["take", "tabulate", "tail"],
        "turns": [
            {
                "user": "Rename the `function` parameter of `tabulate` to `func`, so that it matches "
                "the docstring.",
                "refs": ["function", "tabulate"],
                "adds": ["func"],
            },
            {
                "user": "Make `take` raise `ValueError(\"n must be non-negative\")` when `n` is "
                "negative, and mention that in its docstring.",
                "refs": ["take", "n"],
            },
            {
                "user": "Handle `n <= 0` in `tail`: return early, before `iterable` is touched.",
                "refs": ["tail", "n", "iterable"],
            },
        ],
    },
]

AGENT_MIN_LINES, AGENT_MAX_LINES = 40, 90
STANDARD_NAMES = {"typing"}  # besides builtins and `typing`'s names, which a request may name freely


def excerpt(text, names, where):
    """Consecutive top-level definitions `names` of module `text`, preceded by the imports and
    module-level assignments they use (import lists cut down to the names used).

    Returns (excerpt text, first line, last line) of the definitions in the original."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    body = tree.body
    idx = {getattr(n, "name", None): i for i, n in enumerate(body)}
    for name in names:
        if name not in idx:
            die(f"{where}: no top-level definition {name}")
    first, last = idx[names[0]], idx[names[-1]]
    picked = body[first:last + 1]
    got = [n.name for n in picked if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    if got != names or len(picked) != len(names):
        die(f"{where}: {names} are not consecutive top-level definitions (found {got})")
    start = min([picked[0].lineno] + [d.lineno for d in getattr(picked[0], "decorator_list", [])])
    end = picked[-1].end_lineno
    defs = "".join(lines[start - 1:end])

    # Names the excerpt reads that it does not define itself.
    defined, used = set(names), set()
    for node in picked:
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                (used if isinstance(n.ctx, ast.Load) else defined).add(n.id)
            elif isinstance(n, ast.arg):
                defined.add(n.arg)
            elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                defined.add(n.name)
    needed = used - defined
    header = []
    for node in body[:first]:
        if isinstance(node, ast.Import):
            keep = [a for a in node.names if (a.asname or a.name.split(".")[0]) in needed]
            if keep:
                header.append("import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in keep) + "\n")
                needed -= {a.asname or a.name.split(".")[0] for a in keep}
        elif isinstance(node, ast.ImportFrom):
            keep = [a for a in node.names if (a.asname or a.name) in needed]
            if keep:
                mod = "." * node.level + (node.module or "")
                header.append(f"from {mod} import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in keep) + "\n")
                needed -= {a.asname or a.name for a in keep}
        elif isinstance(node, ast.Assign):
            targets = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if targets & needed:
                header.append("".join(lines[node.lineno - 1:node.end_lineno]))
                needed -= targets
    missing = sorted(n for n in needed if not hasattr(builtins, n))
    if missing:
        die(f"{where}: excerpt {names} uses {missing}, which it cannot import")
    return "".join(header) + "\n\n" + defs, start, end


def identifiers(text):
    """Every identifier token of a Python source, plus the names `ast` finds."""
    out = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME:
            out.add(tok.string)
    for n in ast.walk(ast.parse(text)):
        for attr in ("name", "id", "arg", "attr"):
            v = getattr(n, attr, None)
            if isinstance(v, str):
                out.add(v)
    return out


def agent_sessions(archives):
    whole, sr = [], []
    for spec in AGENT_FILES:
        art = ARTIFACTS[spec["artifact"]]
        where = f"{art['file']}:{spec['member']}"
        text = archives[spec["artifact"]].text(spec["member"])
        if "excerpt" in spec:
            text, start, end = excerpt(text, spec["excerpt"], where)
            source = (f"{art['label']}, {spec['member']}: excerpt, the consecutive top-level definitions "
                      f"{', '.join(spec['excerpt'])} (lines {start}-{end}) with the imports they use")
        else:
            source = f"{art['label']}, {spec['member']}: whole file"
        ast.parse(text)  # the file (or excerpt) must be valid Python
        n = len(text.splitlines())
        if not AGENT_MIN_LINES <= n <= AGENT_MAX_LINES:
            die(f"{where}: {n} lines, outside {AGENT_MIN_LINES}-{AGENT_MAX_LINES}")
        if not 3 <= len(spec["turns"]) <= 5:
            die(f"{spec['name']}: agent sessions have 3-5 turns")
        known = identifiers(text)
        functions = {x.name for x in ast.walk(ast.parse(text)) if isinstance(x, (ast.FunctionDef, ast.ClassDef))}
        for i, turn in enumerate(spec["turns"]):
            for ref in turn["refs"]:
                if ref not in known:
                    die(f"{spec['name']} turn {i + 1}: `{ref}` is not in the file")
            for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)(?:\(\))?`", turn["user"]):
                if name in STANDARD_NAMES or hasattr(builtins, name) or hasattr(typing, name):
                    continue
                if name not in known and name not in turn.get("adds", []) and name not in turn["refs"]:
                    die(f"{spec['name']} turn {i + 1}: `{name}` is neither in the file nor declared")
            known |= set(turn.get("adds", []))
        if not any(ref in functions for turn in spec["turns"] for ref in turn["refs"]):
            die(f"{spec['name']}: no request names a function of the file")
        for workload, system, out in (("agent-whole", SYSTEM_WHOLE, whole), ("agent-search-replace", SYSTEM_SEARCH_REPLACE, sr)):
            out.append({
                "id": f"{workload}/{spec['name']}",
                "workload": workload,
                "source": source,
                "sha256": art["sha256"],
                "system": system,
                "file": {"path": spec["path"], "text": text},
                "turns": [{"user": t["user"]} for t in spec["turns"]],
                "max_tokens": MAX_TOKENS[workload],
            })
    return whole, sr


# --------------------------------------------------------------------------------------------
# chat: MT-Bench's two-turn questions, the first two of each category in file order.

MT_BENCH_CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def chat_sessions(rows):
    out = []
    for cat in MT_BENCH_CATEGORIES:
        picked = [r for r in rows if r["category"] == cat][:2]
        if len(picked) != 2:
            die(f"question.jsonl: fewer than two {cat} rows")
        for r in picked:
            if len(r["turns"]) != 2:
                die(f"question.jsonl: MT-Bench question {r['question_id']} does not have 2 turns")
            out.append({
                "id": f"chat/mt-bench-{r['question_id']}",
                "workload": "chat",
                "source": f"{SPEC_BENCH['label']} (MT-Bench), question_id {r['question_id']}, category {cat}",
                "sha256": SPEC_BENCH["sha256"],
                "turns": [{"user": t} for t in r["turns"]],
                "max_tokens": MAX_TOKENS["chat"],
            })
    return out


# --------------------------------------------------------------------------------------------
# tools: BFCL v4 multi-turn conversations (base split), their first three turns.

BFCL_QUESTIONS = "bfcl_eval/data/BFCL_v4_multi_turn_base.json"
BFCL_ANSWERS = "bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_base.json"
BFCL_DOCS = "bfcl_eval/data/multi_turn_func_doc/"
BFCL_CONSTANTS = "bfcl_eval/constants/executable_backend_config.py"
TOOLS_SESSIONS, TOOLS_TURNS, TOOLS_CAP = 6, 3, 20

SYSTEM_TOOLS = """You are a helpful assistant that can act through the functions provided as tools.
When a request needs an action or information that a tool provides, call the tool with arguments taken from the conversation; call several tools in a row when a task needs them.
When the tool results are in, or no tool is needed, answer the user briefly."""

BFCL_TYPES = {"integer": "integer", "float": "number", "boolean": "boolean", "string": "string",
              "array": "array", "dict": "object", "tuple": "array", "any": None}


def json_lines(text, where):
    out = []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                die(f"{where}:{i + 1}: {e}")
    return out


def literal_assignment(source, name, where):
    """The literal value assigned to module-level `name` in Python `source` (parsed, not run)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    die(f"{where}: no assignment to {name}")


def enum_of(description):
    m = re.search(r"\[Enum\]:\s*(\[[^\]]*\])", description or "")
    if not m:
        return None
    try:
        values = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    return values if values and all(isinstance(v, str) for v in values) else None


def json_schema(p, where):
    """BFCL's parameter schema (python type names) as JSON Schema."""
    out = {}
    t = p.get("type")
    if t is not None:
        if t not in BFCL_TYPES:
            die(f"{where}: unknown BFCL type {t!r}")
        if BFCL_TYPES[t] is not None:
            out["type"] = BFCL_TYPES[t]
    if "description" in p:
        out["description"] = p["description"]
    enum = enum_of(p.get("description"))
    if "properties" in p:
        out["properties"] = {k: json_schema(v, f"{where}.{k}") for k, v in p["properties"].items()}
    if "items" in p:
        out["items"] = json_schema(p["items"], f"{where}[]")
        if enum and out["items"].get("type") == "string":
            out["items"]["enum"] = enum
    elif enum and out.get("type") == "string":
        out["enum"] = enum
    if "required" in p:
        out["required"] = list(p["required"])
    if "default" in p:
        out["default"] = p["default"]
    for k in p:
        if k not in ("type", "description", "properties", "items", "required", "default"):
            die(f"{where}: unexpected schema key {k!r}")
    return out


def openai_tool(doc, where):
    return {"type": "function", "function": {
        "name": doc["name"],
        "description": doc["description"],
        "parameters": json_schema(doc["parameters"], f"{where}:{doc['name']}"),
    }}


def parse_call(call, docs, where):
    """A ground-truth call string such as "mv(source='a', destination='b')": (name, arguments)."""
    try:
        node = ast.parse(call, mode="eval").body
    except SyntaxError as e:
        die(f"{where}: cannot parse ground truth {call!r}: {e}")
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        die(f"{where}: ground truth {call!r} is not a plain call")
    name = node.func.id
    if name not in docs:
        die(f"{where}: ground truth calls {name}, which no involved class declares")
    params = list(docs[name]["parameters"].get("properties", {}))
    args = {}
    for i, a in enumerate(node.args):
        if i >= len(params):
            die(f"{where}: {call!r} has more positional arguments than {name} has parameters")
        args[params[i]] = ast.literal_eval(a)
    for kw in node.keywords:
        args[kw.arg] = ast.literal_eval(kw.value)
    return name, args


def tools_sessions(bfcl):
    where = ARTIFACTS["bfcl"]["file"]
    mapping = literal_assignment(bfcl.text(BFCL_CONSTANTS), "MULTI_TURN_FUNC_DOC_FILE_MAPPING", f"{where}:{BFCL_CONSTANTS}")
    questions = json_lines(bfcl.text(BFCL_QUESTIONS), f"{where}:{BFCL_QUESTIONS}")
    answers = {r["id"]: r for r in json_lines(bfcl.text(BFCL_ANSWERS), f"{where}:{BFCL_ANSWERS}")}

    class_docs = {}

    def docs_of(cls):
        if cls not in class_docs:
            if cls not in mapping:
                die(f"{where}: no function doc file for class {cls}")
            member = BFCL_DOCS + mapping[cls]
            class_docs[cls] = json_lines(bfcl.text(member), f"{where}:{member}")
        return class_docs[cls]

    # Conversations with at least three turns and a ground-truth call in each of them. Chosen in
    # file order: first those that bring only classes not seen yet, then those that bring at least
    # one new class, then ones with a new combination of classes, until six.
    candidates = [q for q in questions
                  if len(q["question"]) >= TOOLS_TURNS and q["id"] in answers
                  and all(answers[q["id"]]["ground_truth"][i] for i in range(TOOLS_TURNS))]
    picked, covered, combos = [], set(), set()
    for rule in ("disjoint", "new-class", "new-combination"):
        for q in candidates:
            if len(picked) == TOOLS_SESSIONS:
                break
            classes = set(q["involved_classes"])
            combo = tuple(sorted(classes))
            if q in picked:
                continue
            ok = {"disjoint": not classes & covered,
                  "new-class": bool(classes - covered),
                  "new-combination": combo not in combos}[rule]
            if ok:
                picked.append(q)
                covered |= classes
                combos.add(combo)
    if len(picked) != TOOLS_SESSIONS:
        die(f"{where}: only {len(picked)} usable conversations")

    out = []
    for q in picked:
        qwhere = f"{where}:{BFCL_QUESTIONS}:{q['id']}"
        excluded = set(q.get("excluded_function") or [])
        docs = [d for cls in q["involved_classes"] for d in docs_of(cls) if d["name"] not in excluded]
        by_name = {}
        for d in docs:
            if d["name"] in by_name:
                die(f"{qwhere}: two involved classes declare {d['name']}")
            by_name[d["name"]] = d
        truth = answers[q["id"]]["ground_truth"][:TOOLS_TURNS]
        turns, used = [], []
        for i, (messages, calls) in enumerate(zip(q["question"][:TOOLS_TURNS], truth)):
            text = "\n".join(m["content"] for m in messages if m["role"] == "user").strip()
            if not text:
                die(f"{qwhere}: turn {i + 1} has no user text")
            results = {}
            for call in calls:
                name, args = parse_call(call, by_name, f"{qwhere} turn {i + 1}")
                if name not in used:
                    used.append(name)
                # One result per function and turn: the first ground-truth call's arguments.
                results.setdefault(name, json.dumps({"status": "ok", "function": name, "args": args}, ensure_ascii=False))
            turns.append({"user": text, "tool_results": dict(sorted(results.items()))})
        keep = set(used)
        for d in docs:
            if len(keep) >= TOOLS_CAP:
                break
            keep.add(d["name"])
        if len(used) > TOOLS_CAP:
            die(f"{qwhere}: the ground truth alone uses more than {TOOLS_CAP} functions")
        tools = [openai_tool(d, f"{where}:{BFCL_DOCS}") for d in docs if d["name"] in keep]
        out.append({
            "id": f"tools/{q['id']}",
            "workload": "tools",
            "source": (f"{ARTIFACTS['bfcl']['label']}, {BFCL_QUESTIONS} id {q['id']} (first {TOOLS_TURNS} of "
                       f"{len(q['question'])} turns; classes {', '.join(q['involved_classes'])}); tools from "
                       f"{BFCL_DOCS}; tool results synthesized from {BFCL_ANSWERS}"),
            "sha256": ARTIFACTS["bfcl"]["sha256"],
            "system": SYSTEM_TOOLS,
            "tools": tools,
            "turns": turns,
            "max_tokens": MAX_TOKENS["tools"],
        })
    return out


# --------------------------------------------------------------------------------------------
# doc-qa: a long document with three questions in the first turn, then one question a turn.
# Every question names an `anchor`: text the answer rests on, which must be in the document.

DOC_WORD_CAP = 2500

SYSTEM_DOC_QA = """You answer questions about a document that the user provides.
Base every answer on the document only; if it does not say, say so.
Be concise: a few sentences per question, and number your answers when several questions are asked at once."""

DOCS = [
    {
        "name": "attrs-why",
        "artifact": "attrs",
        "member": "attrs-24.2.0/docs/why.md",
        "questions": [
            ("In which Python version did Data Classes get support for `__slots__`, and what does "
             "the document say that support still lacks?", ["has only been added in Python 3.10", "bare calls to `super()`"]),
            ("For what kind of validation does the document call Pydantic the right tool, and which "
             "library does it suggest for structuring, unstructuring and validating data instead?",
             ["right tool for *Commands*", "*cattrs*"]),
            ("What goes wrong with the class's `__mro__` if you subclass a `namedtuple` the way the "
             "standard library documentation recommends?", ["*two* `Point`s"]),
            ("What rule of thumb does the section on dicts give for choosing a proper class over a dict?",
             ["fixed and known set of keys"]),
            ("In the section on hand-written classes, how many methods does the author say you end "
             "up writing again and again, and which comparison mistake is given as an example?",
             ["the same nine methods", "flip the `<`"]),
        ],
    },
    {
        "name": "attrs-init",
        "artifact": "attrs",
        "member": "attrs-24.2.0/docs/init.md",
        "questions": [
            ("What does the document recommend instead of an `__init__` that takes a database row, "
             "and what is that pattern sometimes called?", ["{obj}`classmethod`", "*named constructor*"]),
            ("Why does an attribute named `_1` lead to a `SyntaxError`, and which argument of "
             "`attrs.field` lets you choose the `__init__` argument name yourself?",
             ["`_1` got transformed into an invalid argument name `1`", "*alias* argument"]),
            ("What gotcha of decorator-based defaults does the warning in the Defaults section describe?",
             ["may not be fully initialized"]),
            ("Do converters run before or after validators, and what does that allow?",
             ["Converters are run *before* validators"]),
            ("Which two ways of turning validators off does the document show?",
             ["attrs.validators.set_disabled(True)", "attrs.validators.disabled()"]),
        ],
    },
    {
        "name": "attrs-contributing",
        "artifact": "attrs",
        "member": "attrs-24.2.0/.github/CONTRIBUTING.md",
        "questions": [
            ("What test coverage must a change reach for CI to pass, and what may the maintainers "
             "agree to add when something is hard to test?", ["coverage must be 100%", "# pragma: no cover"]),
            ("What line length does the project use, and which tools enforce its PEP 8 style?",
             ["line length of 79 characters", "[Ruff]", "[Black]"]),
            ("How should asserts be written in tests?", ["`expected == actual`"]),
            ("What should the news fragment for a non-breaking change proposed in pull request #42 "
             "be called?", ["changelog.d/42.change.md"]),
            ("What is the one simple rule about merging pull requests in the Governance section?",
             ["nobody is allowed to merge their own code"]),
        ],
    },
    {
        "name": "spec-bench-295",
        "question_id": 295,
        "questions": [
            ("Which company developed the TrackYourDose app, and which two institutions developed "
             "the mathematical model it uses?",
             ["Germany-based firm esooka", "Physikalisch-Technische Bundesanstalt (PTB)", "University Oulu"]),
            ("How many measurement points did PTB's scientists collect, at which altitudes, and in "
             "which years?", ["more than 2,500 points", "between 1997 and 2006"]),
            ("How much radiation does a ten-hour flight across the North Atlantic cause, and how does "
             "that compare with a dentist's X-ray?", ["between 50 µSv to 100 µSv", "exposes patients to 6 µSv"]),
            ("When were US pilots and cabin crew classified as radiation workers, and what is the "
             "maximum allowable yearly occupational dose?",
             ["in 1994 US pilots and cabin crew were classified as 'radiation workers'", "50,000"]),
            ("What did the University of California researchers find about pilots flying for an hour "
             "at 30,000ft?", ["20 minutes on a tanning bed"]),
        ],
    },
]


def markdown_sections_capped(text, cap, where):
    """The document cut after its last whole `## ` section that keeps it within `cap` words
    (headings inside fenced code do not count as sections)."""
    lines = text.splitlines(keepends=True)
    starts, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            starts.append(i)
    bounds = starts + [len(lines)]
    keep = 0
    for b in bounds:
        if len("".join(lines[:b]).split()) <= cap:
            keep = b
    if keep == 0:
        die(f"{where}: the first section alone exceeds {cap} words")
    return "".join(lines[:keep]).rstrip("\n") + "\n"


def doc_qa_sessions(archives, rows):
    out = []
    for spec in DOCS:
        if "question_id" in spec:
            (row,) = [r for r in rows if r["question_id"] == spec["question_id"]]
            if row["category"] != "summarization":
                die(f"question.jsonl: {spec['question_id']} is not a summarization row")
            doc = row["turns"][0]
            if not doc.startswith("Summarize: "):
                die(f"question.jsonl: {spec['question_id']} does not start with 'Summarize: '")
            doc = doc[len("Summarize: "):].strip() + "\n"
            source = (f"{SPEC_BENCH['label']} (summarization, CNN/DailyMail article), question_id "
                      f"{spec['question_id']}: the article without its 'Summarize: ' prefix")
            sha = SPEC_BENCH["sha256"]
            where = f"question.jsonl:{spec['question_id']}"
        else:
            art = ARTIFACTS[spec["artifact"]]
            where = f"{art['file']}:{spec['member']}"
            full = archives[spec["artifact"]].text(spec["member"])
            doc = markdown_sections_capped(full, DOC_WORD_CAP, where)
            cut = "whole file" if doc.strip() == full.strip() else f"its `## ` sections up to {DOC_WORD_CAP} words"
            source = f"{art['label']}, {spec['member']}: {cut}"
            sha = art["sha256"]
        words = len(doc.split())
        if words > DOC_WORD_CAP:
            die(f"{where}: {words} words, over {DOC_WORD_CAP}")
        qs = spec["questions"]
        if len(qs) != 5:
            die(f"{spec['name']}: doc-qa sessions ask 3 + 1 + 1 questions")
        for q, anchors in qs:
            for a in anchors:
                if a not in doc:
                    die(f"{spec['name']}: the anchor {a!r} of {q!r} is not in the document")
        first = ("Read the following document, then answer the three questions after it.\n\n"
                 "<document>\n" + doc + "</document>\n\n"
                 + "\n".join(f"{i + 1}. {q}" for i, (q, _) in enumerate(qs[:3])))
        out.append({
            "id": f"doc-qa/{spec['name']}",
            "workload": "doc-qa",
            "source": source,
            "sha256": sha,
            "system": SYSTEM_DOC_QA,
            "turns": [{"user": first}] + [{"user": q} for q, _ in qs[3:]],
            "max_tokens": MAX_TOKENS["doc-qa"],
        })
    return out


# --------------------------------------------------------------------------------------------

FIELDS = ["id", "workload", "source", "sha256", "system", "file", "tools", "turns", "max_tokens"]


def validate(sessions):
    seen = set()
    for s in sessions:
        if list(s) != [k for k in FIELDS if k in s]:
            die(f"{s.get('id')}: unexpected fields or order {list(s)}")
        for k in ("id", "workload", "source", "sha256", "turns", "max_tokens"):
            if k not in s:
                die(f"{s.get('id')}: missing {k}")
        if s["id"] in seen:
            die(f"{s['id']}: duplicate id")
        seen.add(s["id"])
        if s["workload"] not in WORKLOADS or not s["id"].startswith(s["workload"] + "/"):
            die(f"{s['id']}: bad workload {s['workload']}")
        if not re.fullmatch(r"[0-9a-f]{64}", s["sha256"]):
            die(f"{s['id']}: bad sha256")
        agent = s["workload"].startswith("agent-")
        if agent != ("file" in s) or (s["workload"] == "tools") != ("tools" in s):
            die(f"{s['id']}: `file` is for agent sessions and `tools` for tools sessions only")
        if not s["turns"] or any(not t.get("user") for t in s["turns"]):
            die(f"{s['id']}: empty turn")
        for t in s["turns"]:
            if set(t) - {"user", "tool_results"}:
                die(f"{s['id']}: unexpected turn fields {sorted(t)}")
            if "tool_results" in t and s["workload"] != "tools":
                die(f"{s['id']}: tool_results outside a tools session")
            for name in t.get("tool_results", {}):
                if name not in {x["function"]["name"] for x in s["tools"]}:
                    die(f"{s['id']}: a tool result for {name}, which is not among its tools")
        if s["max_tokens"] != MAX_TOKENS[s["workload"]]:
            die(f"{s['id']}: max_tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output folder (bench/inputs/sessions)")
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "treespec-sessions",
                    help="where downloaded artifacts are kept (checked against their pins on every use)")
    ap.add_argument("--spec-bench", type=Path, default=REPO / SPEC_BENCH["path"],
                    help="spec-bench's question.jsonl")
    args = ap.parse_args()

    raw = args.spec_bench.read_bytes() if args.spec_bench.exists() else die(f"{args.spec_bench} not found")
    got = sha256_bytes(raw)
    if got != SPEC_BENCH["sha256"]:
        die(f"{args.spec_bench}: sha256 {got} does not match the pin {SPEC_BENCH['sha256']}")
    rows = json_lines(raw.decode("utf-8"), str(args.spec_bench))

    archives = {k: Archive(fetch(k, args.cache), ARTIFACTS[k]["file"]) for k in ARTIFACTS}

    whole, sr = agent_sessions(archives)
    by_workload = {
        "agent-whole": whole,
        "agent-search-replace": sr,
        "chat": chat_sessions(rows),
        "tools": tools_sessions(archives["bfcl"]),
        "doc-qa": doc_qa_sessions(archives, rows),
    }
    validate([s for w in WORKLOADS for s in by_workload[w]])

    args.out.mkdir(parents=True, exist_ok=True)
    for w in WORKLOADS:
        text = "".join(json.dumps(s, ensure_ascii=False, separators=(",", ":")) + "\n" for s in by_workload[w])
        path = args.out / f"{w}.jsonl"
        path.write_bytes(text.encode("utf-8"))
        turns = sum(len(s["turns"]) for s in by_workload[w])
        print(f"{path}: {len(by_workload[w])} sessions, {turns} turns, {len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main()
