#!/usr/bin/env bash
# Mutation check for the losslessness tests.
#
# Plants known verification / commit bugs, one at a time, in a scratch copy of the workspace and
# shows that the chi-square tests catch each of them:
#   * crates/treespec-core/tests/verifier_chi2.rs   (single-position verifier, 10^5 trials/config)
#   * crates/treespec-engine/tests/joint_chi2.rs    (whole generate loop, exact joint of L tokens;
#                                                    only its chi-square tests are run here)
# A mutant is CAUGHT when at least one of those test runs fails, MISSED when all pass. The script
# exits non-zero if the unmutated copy fails, if a mutant does not apply (its sed pattern no longer
# matches the source) or does not compile, or if any mutant is missed.
#
# Usage: scripts/mutation-check.sh [MUTANT...]      (default: all; `--list` lists them)
# Env:   MUTATION_WORK       scratch directory        (default /tmp/treespec-mutation)
#        CARGO_TARGET_DIR    build directory, reused across runs (default $MUTATION_WORK/target)
#        MUTATION_TIMEOUT    seconds per cargo invocation (default 1200)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${MUTATION_WORK:-/tmp/treespec-mutation}"
SRC="$WORK/src"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WORK/target}"
TIMEOUT="${MUTATION_TIMEOUT:-1200}"
LOGS="$WORK/logs"

VERIFY_RS=crates/treespec-core/src/verify.rs
DIST_RS=crates/treespec-core/src/dist.rs
GENERATE_RS=crates/treespec-engine/src/generate.rs
TOY_LM_RS=crates/treespec-engine/src/toy/lm.rs
SAMPLE_RS=crates/treespec-engine/src/drafters/sample.rs

# name | file | sed script | suites (core = verifier_chi2, joint = joint_chi2) | description
MUTANTS=(
  "a1-residual-keeps-p|$VERIFY_RS|s/Some(q) => p\.residual(q),/Some(_) => Some(p.clone()),/|core joint|after rejecting a sampled child, keep p unchanged instead of norm(max(p - q, 0))"
  "a2-residual-reversed|$VERIFY_RS|s/Some(q) => p\.residual(q),/Some(q) => q.residual(\&p),/|core joint|after rejecting a sampled child, use norm(max(q - p, 0))"
  "a3-residual-abs|$DIST_RS|s/(p - q)\.max(0\.0)/(p - q).abs()/|core joint|Dist::residual uses abs(p - q) instead of max(p - q, 0)"
  "b-wor-full-q|$VERIFY_RS|s/Some(qi) => qi,/Some(_) => check_q(q, \&p, c)?.clone(),/|core joint|without-replacement siblings verified against the full q instead of q_i (earlier siblings never removed)"
  "c1-commit-drops-last|$GENERATE_RS|s/target\.commit(&outcome\.path())?;/target.commit(\&outcome.path()[..outcome.accepted.len()])?;/|joint|the loop commits the accepted path minus its last node (KV cache one token short)"
  "c2-kv-gather-off-by-one|$TOY_LM_RS|s/self\.committed\.push(tok);/self.committed.push(self.pending[i.saturating_sub(1)].0);/|joint|ToyLm::commit gathers the KV slot before each kept node (off-by-one slot copy)"
  "d-accept-parent-prob|$VERIFY_RS|s/let qx = q\.prob(x) as f64;/let qx = tree.node(at).draft_prob as f64;/|core joint|accept test uses p(x)/q' with q' = the parent's draft probability instead of q_i(x)"
  "e-det-reject-keeps-x|$VERIFY_RS|s/None => p\.without(x),/None => Some(p.clone()),/|core joint|after rejecting a deterministic candidate, x is not removed from p"
  "f-top-token-as-sample|$SAMPLE_RS|s/let x = cur\.sample(rng);/let x = cur.argmax();/|joint|drafter proposes the top tokens of q_i but labels them as samples (llama.cpp tree-sampler bug)"
)

field() { cut -d'|' -f"$2" <<<"$1"; }

if [[ "${1:-}" == "--list" ]]; then
  for m in "${MUTANTS[@]}"; do printf '%-26s %s\n' "$(field "$m" 1)" "$(field "$m" 5)"; done
  exit 0
fi

WANT=("$@")
selected() {
  [[ ${#WANT[@]} -eq 0 ]] && return 0
  local w
  for w in "${WANT[@]}"; do [[ "$w" == "$1" ]] && return 0; done
  return 1
}

echo "== copying workspace $REPO -> $SRC (tracked + untracked, not ignored; no target/ or models/)"
rm -rf "$SRC" "$LOGS"
mkdir -p "$SRC" "$LOGS" "$CARGO_TARGET_DIR"
(
  cd "$REPO"
  git ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do
      case "$f" in target/* | models/*) continue ;; esac
      if [[ -f "$f" ]]; then printf '%s\0' "$f"; fi
    done |
    tar --null -T - -cf -
) | tar -xf - -C "$SRC"
mkdir -p "$SRC/.pristine"
echo "   CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

# run_suite NAME LOG: builds and runs one chi-square suite; prints PASS / FAIL / BUILD-ERROR.
run_suite() {
  local suite=$1 log=$2
  local pkg test filter=()
  case "$suite" in
    core) pkg=treespec-core test=verifier_chi2 ;;
    joint) pkg=treespec-engine test=joint_chi2 filter=(joint_distribution) ;;
  esac
  if ! (cd "$SRC" && timeout "$TIMEOUT" cargo test -p "$pkg" --release --test "$test" --no-run) >"$log" 2>&1; then
    echo BUILD-ERROR
    return
  fi
  if (cd "$SRC" && timeout "$TIMEOUT" cargo test -p "$pkg" --release --test "$test" -- "${filter[@]}") >>"$log" 2>&1; then
    echo PASS
  else
    echo FAIL
  fi
}

# The first lines explaining a failure, for the report.
why() {
  grep -E "failure\(s\)|does not follow|does not match|acceptance must|acceptance [0-9]|probability 0 but|panicked" "$1" |
    head -n 3 | cut -c1-220 | sed 's/^/      /' || true
}

status=0
echo "== baseline (unmutated)"
for suite in core joint; do
  r=$(run_suite "$suite" "$LOGS/baseline-$suite.log")
  echo "   $suite: $r"
  if [[ "$r" != PASS ]]; then
    echo "   baseline must pass; see $LOGS/baseline-$suite.log"
    why "$LOGS/baseline-$suite.log"
    tail -n 20 "$LOGS/baseline-$suite.log" | sed 's/^/      /'
    exit 2
  fi
done

summary=()
for m in "${MUTANTS[@]}"; do
  name=$(field "$m" 1) file=$(field "$m" 2) script=$(field "$m" 3) suites=$(field "$m" 4) desc=$(field "$m" 5)
  selected "$name" || continue
  echo "== mutant $name: $desc"
  echo "   $file: sed '$script'"
  cp "$SRC/$file" "$SRC/.pristine/current"
  sed -i "$script" "$SRC/$file"
  if cmp -s "$SRC/$file" "$SRC/.pristine/current"; then
    echo "   mutant not applied: the pattern no longer matches $file"
    summary+=("$(printf '%-26s NOT APPLIED' "$name")")
    status=1
    continue
  fi
  diff -u "$SRC/.pristine/current" "$SRC/$file" | grep -E '^[-+][^-+]' | sed 's/^/   /' || true
  caught=() verdicts=()
  for suite in $suites; do
    log="$LOGS/$name-$suite.log"
    r=$(run_suite "$suite" "$log")
    case "$r" in
      FAIL)
        verdicts+=("$suite FAILED")
        caught+=("$suite")
        echo "   $suite: FAILED (caught)"
        why "$log"
        ;;
      PASS)
        verdicts+=("$suite passed")
        echo "   $suite: passed (missed)"
        ;;
      *)
        verdicts+=("$suite build error")
        echo "   $suite: mutant does not compile; see $log"
        ;;
    esac
  done
  cp "$SRC/.pristine/current" "$SRC/$file"
  if [[ ${#caught[@]} -gt 0 ]]; then
    summary+=("$(printf '%-26s CAUGHT   (%s)' "$name" "$(IFS=,; echo "${verdicts[*]}")")")
  else
    summary+=("$(printf '%-26s MISSED   (%s)' "$name" "$(IFS=,; echo "${verdicts[*]}")")")
    status=1
  fi
done

echo
echo "== summary"
for s in "${summary[@]}"; do echo "   $s"; done
if [[ $status -eq 0 ]]; then
  echo "   every mutant was caught by a chi-square test"
else
  echo "   SOME MUTANTS WERE NOT CAUGHT OR NOT APPLIED"
fi
exit $status
