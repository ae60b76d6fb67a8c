#!/usr/bin/env bash
# The repository's rules, checked (issue #67): no import cycle between a crate's files, every
# script and results folder in its index, every path the docs name alive, every crate under the
# function-length lint (which clippy then applies: `scripts/test.sh`), no result over 512 KiB
# uncompressed unless excused. First the checks' own
# tests, which plant each violation in a scratch repository and expect it named, then the
# checks on this repository. Seconds; `scripts/test.sh` runs it before building anything.
#
#   scripts/rules/check.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
python3 -B -m unittest --quiet test_rules
status=0
for check in module_cycles indexes doc_paths function_length result_sizes; do
    python3 -B "$check.py" || status=1
done
exit "$status"
