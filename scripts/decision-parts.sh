#!/usr/bin/env bash
# Issue 39: what the parts of gov-engine's matched decision that the crate
# stack does not do cost, measured by leaving each out of a build. The stack
# of agents/engine/benches/stack.rs is given its request routed, keeps no
# counts and does not time the call; gov's decision routes the request among
# the config's rules, counts it as admitted by each matched rule and records
# its latency in each rule's histogram. This script applies
# scripts/decision-parts.patch (which reads GOV_BENCH_WITHOUT when the engine
# is compiled) to a copy of HEAD in a temporary worktree and runs the bench
# once per part left out:
#
#   routing   each thread routes its first request and reuses that plan
#   admitted  no admitted count per rule
#   latency   no second clock read (the outcome counted at the decision's
#             time) and no latency histogram per rule
#
# The builds are for measurement only: they are wrong for any other use, which
# is why the switch lives in a patch and not in the engine.
#
# Usage: scripts/decision-parts.sh [--time]
#   instructions (callgrind) per call by default; --time runs the bench's whole
#   table per build and prints gov's matched CPU ns and the stack's of the same
#   run too (slower; an idle host).
# Needs valgrind and git. Shares the target directory ($CARGO_TARGET_DIR, else
# ./target) with the tree's own builds, so only gov-engine and the bench build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v valgrind >/dev/null 2>&1; then
  echo "decision-parts: valgrind is not installed (apt-get install valgrind)" >&2
  exit 2
fi
time_too=0
case "${1-}" in
  --time) time_too=1 ;;
  "") ;;
  *) echo "usage: scripts/decision-parts.sh [--time]" >&2; exit 2 ;;
esac

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
tree=$(mktemp -d)
cleanup() { git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"; }
trap cleanup EXIT
git worktree add --detach --quiet "$tree" HEAD
if ! git -C "$tree" apply "$root/scripts/decision-parts.patch"; then
  echo "decision-parts: scripts/decision-parts.patch no longer applies to HEAD;" \
    "redo its switches (routing, admitted, latency) on the code as it is" >&2
  exit 1
fi

echo "| left out | matched | recorded | stack | matched x stack | matched ns | stack ns |"
echo "|---|---|---|---|---|---|---|"
for without in "" routing admitted latency routing,admitted,latency; do
  out=$(cd "$tree" && GOV_BENCH_WITHOUT="$without" \
    cargo bench -q -j"${CARGO_BUILD_JOBS:-2}" -p gov-engine --bench stack -- --instructions)
  count() { awk -v s="$1" '$1 == "instructions" && $2 == s { print $3 }' <<<"$out"; }
  matched=$(count gov_matched)
  recorded=$(count gov_recorded)
  stack=$(count stack)
  if [ -z "$matched" ] || [ -z "$recorded" ] || [ -z "$stack" ]; then
    echo "decision-parts: no instruction counts from the bench (left out: ${without:-nothing})" >&2
    exit 1
  fi
  ns=-
  stack_ns=-
  if [ "$time_too" = 1 ]; then
    table=$(cd "$tree" && GOV_BENCH_WITHOUT="$without" \
      cargo bench -q -j"${CARGO_BUILD_JOBS:-2}" -p gov-engine --bench stack)
    ns_of() { awk -F'|' -v row="$1" 'index($0, row) { split($3, a, " "); print a[1] }' <<<"$table"; }
    ns=$(ns_of "| gov-engine, 3 rules matched (bulkhead, limit, fuse) |")
    stack_ns=$(ns_of "| stack: failsafe + governor + Semaphore |")
  fi
  ratio=$(awk -v m="$matched" -v s="$stack" 'BEGIN { printf "%.2f", m / s }')
  echo "| ${without:-nothing} | $matched | $recorded | $stack | $ratio | $ns | $stack_ns |"
done
