#!/usr/bin/env bash
# Issue 39: the instructions of gov-engine's decision, counted by callgrind
# (deterministic, unlike time on a shared machine), against a committed budget.
# Fails when a matched (3 rules: bulkhead, limit, fuse; finished, or recorded at
# the response head and dropped later as the proxy does) or an unmatched decision
# of agents/engine/benches/stack.rs costs more than its budget; prints the crate
# stack of the same run beside them. Needs valgrind (Debian package valgrind).
#
# Usage: scripts/decision-budget.sh
# The budgets are the instructions measured when they were last lowered, plus
# about 5% (a compiler upgrade moves counts by a few percent). Lower them when
# the decision gets cheaper; raise one only with the cost in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

matched_budget=592
recorded_budget=631
unmatched_budget=95

if ! command -v valgrind >/dev/null 2>&1; then
  echo "decision-budget: valgrind is not installed (apt-get install valgrind)" >&2
  exit 2
fi
out=$(cargo bench -j"${CARGO_BUILD_JOBS:-2}" -p gov-engine --bench stack -- --instructions)
echo "$out"
count() { awk -v s="$1" '$1 == "instructions" && $2 == s { print $3 }' <<<"$out"; }
matched=$(count gov_matched)
recorded=$(count gov_recorded)
unmatched=$(count gov_unmatched)
stack=$(count stack)
if [ -z "$matched" ] || [ -z "$recorded" ] || [ -z "$unmatched" ]; then
  echo "decision-budget: no instruction counts from the bench" >&2
  exit 1
fi
status=0
check() {
  if [ "$2" -gt "$3" ]; then
    echo "decision-budget: $1 decision costs $2 instructions, over its budget of $3" >&2
    status=1
  else
    echo "decision-budget: $1 decision $2 instructions (budget $3; the crate stack: $stack)"
  fi
}
check matched "$matched" "$matched_budget"
check "recorded (the proxy's path)" "$recorded" "$recorded_budget"
check unmatched "$unmatched" "$unmatched_budget"
exit $status
