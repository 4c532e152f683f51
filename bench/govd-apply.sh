#!/usr/bin/env bash
# govd applying large policies (issue 12): how long a release-build govd takes
# for one `Apply` (its own `elapsed_ms` log field: from the request to stored and
# pushed, or to refused), and the wall time of `govc apply --wait 0s` around it
# (which includes starting govc and printing its output), for 1,000 and 10,000 rules spread over
# services (20 per service: 10 bulkheads, 10 limits) and for 1,000 and 10,000
# limits on one match (refused: every limit after the first conflicts with it;
# the checks stay linear). Each valid policy is applied alternately in two
# versions, so every apply is a change that is compiled, planned, stored
# (fsynced) and committed.
#
#   cargo build --release -j2 -p gov-control-plane && cargo build -j2 -p govc
#   bench/govd-apply.sh              # RUNS=5
#
# govc (the client) can be a debug build: it reads the files and sends them;
# govd compiles them itself. Results go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
GOVD=${GOVD:-target/release/govd}
GOVC=${GOVC:-target/debug/govc}
WORK=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT

python3 - "$WORK" <<'EOF'
import sys
work = sys.argv[1]
def spread(n, bump):
    out = []
    for s in range(n // 20):
        out.append(f"service svc{s} {{")
        for m in range(10):
            out.append(f'  match m{m} = path prefix "/api/{m}"')
        for m in range(10):
            mc = 10 + m + (bump if s == 0 and m == 0 else 0)
            out.append(f"  bulkhead b{m} on m{m} {{\n    max_concurrent {mc}\n    max_wait 10ms\n  }}")
            out.append(f"  limit l{m} on m{m} {{\n    calls {100 + m} per 1s\n  }}")
        out.append("}")
    return "\n".join(out) + "\n"
def one_match(n):
    out = ["service one {", '  match all = path prefix "/"']
    for i in range(n):
        out.append(f"  limit l{i} on all {{\n    calls {100 + i} per 1s\n  }}")
    out.append("}")
    return "\n".join(out) + "\n"
for n in (1000, 10000):
    for bump in (0, 1):
        open(f"{work}/spread-{n}-{bump}.gov", "w").write(spread(n, bump))
    open(f"{work}/onematch-{n}.gov", "w").write(one_match(n))
EOF

echo "admin bench-token-0123456789 admin" > "$WORK/tokens"
"$GOVD" --listen 127.0.0.1:0 --state-dir "$WORK/state" --token-file "$WORK/tokens" \
  2> "$WORK/govd.log" &
PID=$!
for _ in $(seq 50); do
  grep -q "govd started" "$WORK/govd.log" && break
  sleep 0.1
done
ADDR=$(grep -o 'listen=[0-9.:]*' "$WORK/govd.log" | head -1 | cut -d= -f2)
export GOV_CONTROL_PLANE="http://$ADDR" GOV_TOKEN=bench-token-0123456789

ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in 1000 10000; do
  times=() govd=()
  for i in $(seq "$RUNS"); do
    f="$WORK/spread-$n-$((i % 2)).gov"
    t0=$(ms)
    "$GOVC" apply --wait 0s "$f" > /dev/null
    times+=($(( $(ms) - t0 )))
    govd+=($(grep -o 'elapsed_ms=[0-9]*' "$WORK/govd.log" | tail -1 | cut -d= -f2))
  done
  echo "apply, $n rules spread over $((n / 20)) services: govd median $(printf '%s\n' "${govd[@]}" | median) ms (${govd[*]}); govc wall median $(printf '%s\n' "${times[@]}" | median) ms"
  times=() govd=()
  for i in $(seq "$RUNS"); do
    t0=$(ms)
    "$GOVC" apply --wait 0s "$WORK/onematch-$n.gov" > /dev/null 2>&1 && exit 1
    times+=($(( $(ms) - t0 )))
    govd+=($(grep -o 'elapsed_ms=[0-9]*' "$WORK/govd.log" | tail -1 | cut -d= -f2))
  done
  echo "apply, $n limits on one match (refused): govd median $(printf '%s\n' "${govd[@]}" | median) ms (${govd[*]}); govc wall median $(printf '%s\n' "${times[@]}" | median) ms"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
ls -l "$WORK/state/state.json" | awk '{print "state.json: " $5 " bytes"}'
