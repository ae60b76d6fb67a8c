"""Each rule's check fails when its rule is broken: every test plants a violation in a scratch
repository and asserts the check names it (and names nothing else, so a check that reports
everything fails too). Run by `scripts/rules/check.sh`:

    python3 -m unittest discover -s scripts/rules
"""

import shutil
import subprocess
import tempfile
import textwrap
import unittest
from pathlib import Path

import doc_paths
import function_length
import indexes
import module_cycles
import result_sizes

REPO = Path(__file__).resolve().parents[2]


class Scratch(unittest.TestCase):
    """A scratch repository, deleted after the test."""

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name)

    def tearDown(self):
        self._dir.cleanup()

    def write(self, path, text=""):
        p = self.root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
        return p


class ModuleCycles(Scratch):
    def sources(self, files):
        """A crate `treespec-x` of these files (paths under its `src/`)."""
        for path, text in files.items():
            self.write(f"crates/treespec-x/src/{path}", text)

    def test_a_cycle_between_siblings_is_named_with_its_paths(self):
        self.sources(
            {
                "lib.rs": "mod a;\nmod b;\nmod c;\n",
                "a.rs": "use crate::b::B;\npub struct A;\n",
                "b.rs": "pub struct B;\nfn f() { crate::c::g(); }\n",
                "c.rs": "pub fn g() { let _ = super::a::A; }\n",
            }
        )
        [cycle] = module_cycles.report(self.root)
        self.assertIn("a.rs -> b.rs (crate::b::B)", cycle)
        self.assertIn("b.rs -> c.rs (crate::c::g)", cycle)
        self.assertIn("c.rs -> a.rs (super::a::A)", cycle)

    def test_a_cycle_through_a_folder_module_is_found(self):
        self.sources(
            {
                "lib.rs": "mod load;\nmod runtime;\n",
                "load.rs": "use crate::runtime::TILED;\npub struct Model;\n",
                "runtime/mod.rs": "mod kernels;\npub use kernels::TILED;\nuse crate::load::Model;\n",
                "runtime/kernels.rs": "pub const TILED: u8 = 0;\n",
            }
        )
        [cycle] = module_cycles.report(self.root)
        self.assertIn("load.rs -> runtime/mod.rs", cycle)

    def test_children_using_their_parent_comments_and_strings_are_no_cycle(self):
        self.write("crates/treespec-x/src/lib.rs", "mod p;\npub use p::Q;\nmod z;\n")
        self.write("crates/treespec-x/src/p/mod.rs", "mod q;\npub use q::Q;\nuse q::helper;\npub struct P;\n")
        self.write("crates/treespec-x/src/p/q.rs", "use super::P;\npub struct Q;\npub fn helper() {}\n")
        self.write(
            "crates/treespec-x/src/z.rs",
            """\
            //! Not an import: crate::p::Q.
            pub fn z() -> &'static str { "crate::p::Q" }
            #[cfg(test)]
            mod tests { use super::*; }
            """,
        )
        self.write("crates/treespec-x/src/p/q.rs", "use super::P;\nuse crate::z::z;\npub struct Q;\npub fn helper() {}\n")
        self.assertEqual(module_cycles.report(self.root), [])


class Indexes(Scratch):
    def test_a_script_missing_from_the_index_and_an_entry_naming_nothing_are_named(self):
        self.write(
            "scripts/README.md",
            """\
            | script | what it does |
            |---|---|
            | `listed.sh`, `gone.sh` | a script |
            | `demo/` | a folder |
            | `lib/one.sh` | a shared piece; `lib/two.sh` named here is no entry |
            """,
        )
        for f in ("listed.sh", "unlisted.py", "demo/a.py", "lib/one.sh", "lib/two.sh"):
            self.write(f"scripts/{f}")
        self.write("bench/README.md", "## results/\n")
        (self.root / "bench/results").mkdir()
        self.assertEqual(
            indexes.report(self.root),
            [
                "scripts/README.md does not list scripts/lib/two.sh",
                "scripts/README.md does not list scripts/unlisted.py",
                "scripts/README.md lists scripts/gone.sh, which does not exist",
            ],
        )

    def test_a_results_folder_missing_from_the_index_is_named(self):
        self.write("scripts/README.md", "")
        self.write(
            "bench/README.md",
            """\
            ## inputs/

            | `not-a-result` | |

            ## results/

            | folder | what |
            |---|---|
            | `kept`, `deleted` | a run |
            """,
        )
        self.write("bench/results/kept/README.md")
        self.write("bench/results/new-run/summary.md")
        self.assertEqual(
            indexes.report(self.root),
            [
                "bench/README.md does not list bench/results/new-run",
                "bench/README.md lists bench/results/deleted, which does not exist",
            ],
        )


class ResultSizes(Scratch):
    def big(self, path, size=result_sizes.LIMIT + 1):
        p = self.root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * size)

    def test_a_large_raw_result_and_every_bad_allowlist_entry_are_named(self):
        self.big("bench/results/run/trace.jsonl")
        self.big("bench/results/run/traces.tar.gz")
        self.big("bench/results/run/trace.jsonl.zst")
        self.big("bench/results/run/records.json")
        self.big("bench/results/run/excused.log")
        self.big("bench/results/run/at-limit.json", result_sizes.LIMIT)
        self.write("bench/results/run/small.json", "{}")
        self.write(
            "scripts/rules/large_results.txt",
            """\
            # a comment
            run/records.json   read whole by the report script
            run/excused.log
            run/gone.json      was here once
            run/small.json     small after all  # and a comment
            """,
        )
        self.assertEqual(
            result_sizes.report(self.root),
            [
                "scripts/rules/large_results.txt lists bench/results/run/excused.log without a reason",
                "bench/results/run/trace.jsonl is 512 KiB, over the 512 KiB limit: compress it (gzip -9), "
                "leave it out, or list it in scripts/rules/large_results.txt with its reason",
                "scripts/rules/large_results.txt lists bench/results/run/gone.json, which does not exist",
                "scripts/rules/large_results.txt lists bench/results/run/small.json, which needs no entry "
                "(small or compressed)",
            ],
        )


class DocPaths(Scratch):
    def test_every_spelling_of_a_dead_path_is_named(self):
        self.write("crates/treespec-server/src/http/chat.rs")
        self.write("crates/treespec-server/tests/hardening.rs")
        self.write("bench/results/serve/README.md")
        self.write("scripts/run.sh")
        self.write(
            "docs/GUIDE.md",
            """\
            Alive: `scripts/run.sh`, server/src/http/chat.rs, `treespec-server/src/http/chat.rs`,
            `http/chat.rs`, `chat.rs`, tests/hardening.rs, [serve](../bench/results/serve/README.md),
            [web](https://example.com/a.rs), `bench/*.md`, `OUT/regret.md`, `~/.cache/x.json`,
            `person.json`, `models/m.gguf`, ../shared/docs/ALGORITHMS.md.
            Dead: `scripts/gone.sh`, server/src/engine_thread.rs, `treespec-llama/src/batch_lm.rs`,
            `routes/chat.rs`, `llama_api.rs`, [gone](../bench/results/gone/README.md),
            bench/results/gone/data.json.
            """,
        )
        self.assertEqual(
            doc_paths.report(self.root),
            [
                "docs/GUIDE.md: ../bench/results/gone/README.md",
                "docs/GUIDE.md: bench/results/gone/data.json",
                "docs/GUIDE.md: llama_api.rs",
                "docs/GUIDE.md: routes/chat.rs",
                "docs/GUIDE.md: scripts/gone.sh",
                "docs/GUIDE.md: server/src/engine_thread.rs",
                "docs/GUIDE.md: treespec-llama/src/batch_lm.rs",
            ],
        )

    def test_the_readme_and_the_bench_index_are_read(self):
        self.write("README.md", "See `docs/MISSING.md`.\n")
        self.write("bench/README.md", "See [sessions](inputs/sessions/README.md).\n")
        self.assertEqual(
            doc_paths.report(self.root),
            ["README.md: docs/MISSING.md", "bench/README.md: inputs/sessions/README.md"],
        )


class FunctionLength(Scratch):
    def copy_rule(self):
        shutil.copy(REPO / "clippy.toml", self.root / "clippy.toml")
        lints = (REPO / "Cargo.toml").read_text(encoding="utf-8").split("[workspace.lints.clippy]")[1]
        lints = lints.split("\n[")[0]
        self.write("Cargo.toml", f'[workspace]\nmembers = ["crates/*"]\n\n[workspace.lints.clippy]{lints}\n')

    def crate(self, name, lints=True):
        table = "\n[lints]\nworkspace = true\n" if lints else ""
        self.write(f"crates/{name}/Cargo.toml", f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n{table}')

    def test_a_crate_that_does_not_take_the_workspace_lints_is_named(self):
        self.copy_rule()
        self.crate("inside")
        self.crate("outside", lints=False)
        self.assertEqual(
            function_length.report(self.root),
            ["crates/outside/Cargo.toml: no `[lints] workspace = true`: the crate escapes the rule"],
        )

    @unittest.skipUnless(shutil.which("cargo"), "needs cargo")
    def test_clippy_refuses_a_function_of_81_lines_and_takes_one_of_80(self):
        self.copy_rule()
        self.crate("long")
        # Clippy counts the lines of code between the braces.
        body = lambda n: "".join(f"    let x{i} = {i};\n" for i in range(n))
        self.write(
            "crates/long/src/lib.rs",
            "#![allow(unused_variables)]\n"
            f"pub fn eighty() {{\n    // comments and blank lines do not count\n\n{body(80)}}}\n\n"
            f"pub fn eighty_one() {{\n{body(81)}}}\n",
        )
        run = subprocess.run(
            ["cargo", "clippy", "--quiet", "--", "-D", "warnings"],
            cwd=self.root,
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "CARGO_TARGET_DIR": str(self.root / "target")},
        )
        self.assertNotEqual(run.returncode, 0, run.stderr)
        self.assertIn("this function has too many lines (81/80)", run.stderr)
        self.assertEqual(run.stderr.count("too many lines"), 1, run.stderr)


if __name__ == "__main__":
    unittest.main()
