#!/usr/bin/env bash
# Slow start under load (issue 31, docs/architecture.md problem 5): the share of a caller's calls
# a new instance gets, second by second, against the weight the caller gives it.
#
# govd; a caller `web` whose agent's outbound listener balances over the instances of
# `inv` that govd registers; two warm instances of `inv` whose latency has peaks
# (UP_MS, every PEAK_EVERY-th call PEAK_MS: a GC pause, a busy neighbour). Under an
# open-loop load of RATE req/s through the caller, a third instance (answering at
# once) starts after 3 s and ramps `from 10%` over RAMP_S seconds. Each second the
# caller's /metrics gives its requests per endpoint and the new one's weight; a line
# per second until the caller has it at full weight: the highest weight in the
# second, the new instance's share, the bound 1.25 x weight / 3. RUNS
# runs, each with a new instance (the last one is stopped first).
#
#   bench/warmup.sh                   # RUNS=2 RAMP_S=20 RATE=1000 CONNS=32 UP_MS=2 PEAK_MS=30 PEAK_EVERY=5
#   AGENT_BIN=/path/to/older/gov-agent bench/warmup.sh   # the same with another agent build
#   (GOVD_BIN, GOVC_BIN and LOAD likewise: prebuilt binaries are used as they are)
#
# Placement: vCPU0 = load generator; vCPU1 = govd, the agents and the upstreams
# (LOAD_CPUS, REST_CPUS: taskset lists). On a box other work keeps busy, one shared
# core delays every instance's answers alike, and those delays, not the upstreams',
# then make the latency estimates; LOAD_CPUS=0-1 REST_CPUS=0-1 lets them spread.
# Needs: taskset, python3, curl. Results go to stdout and $OUT
# (default target/bench-warmup/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-2}
RAMP_S=${RAMP_S:-20}
RATE=${RATE:-1000}
CONNS=${CONNS:-32}
UP_MS=${UP_MS:-2}
PEAK_MS=${PEAK_MS:-30}
PEAK_EVERY=${PEAK_EVERY:-5}
LOAD_CPUS=${LOAD_CPUS:-0}
REST_CPUS=${REST_CPUS:-1}
WORK=${WORK:-target/bench-warmup}
OUT=${OUT:-$WORK/results.tsv}
GOVD=127.0.0.1:18700 WEB_OUT=127.0.0.1:18701 WEB_IN=127.0.0.1:18702 WEB_ADMIN=127.0.0.1:18703
LOCAL=127.0.0.1:18704

for tool in taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
rm -rf "$WORK" && mkdir -p "$WORK/logs"

# shellcheck source=bench/common.sh
source bench/common.sh
# GOVD_BIN and GOVC_BIN may name other builds (then neither is built here).
if [ -z "${GOVD_BIN:-}" ] || [ -z "${GOVC_BIN:-}" ]; then
  cargo build --release -j2 -q -p gov-control-plane --bin govd -p govc --bin govc
  GOVD_BIN=target/release/govd GOVC_BIN=target/release/govc
fi

policy() { # warmup steps
  cat > "$WORK/policy.gov" <<GOV
service inv {
  capacity workers 100
  $1
}
service web {
  capacity workers 100
}
GOV
  "$GOVC_BIN" apply --auto-approve "$WORK/policy.gov" --control-plane "http://$GOVD" >/dev/null
}

GOV_LOG=warn taskset -c "$REST_CPUS" "$GOVD_BIN" --listen "$GOVD" --insecure --state-dir "$WORK/state" \
  2>"$WORK/logs/govd.log" & pids+=($!)
sleep 1
policy ""

taskset -c "$REST_CPUS" "$LOAD" upstream "$LOCAL" & pids+=($!)
GOV_LOG=warn taskset -c "$REST_CPUS" "$AGENT_BIN" --service web --instance web-1 --upstream "$LOCAL" \
  --listen "$WEB_IN" --outbound-listen "$WEB_OUT" --admin-listen "$WEB_ADMIN" \
  --control-plane "http://$GOVD" 2>"$WORK/logs/web.log" & pids+=($!)

# Instance N: upstream on 188NN, agent inbound 189NN, admin 190NN.
declare -A AGENT_PID
start_instance() { # n upstream-args...
  local n=$1 up=127.0.0.1:$((18800 + $1))
  shift
  taskset -c "$REST_CPUS" "$LOAD" upstream "$up" "$@" & pids+=($!)
  GOV_LOG=warn taskset -c "$REST_CPUS" "$AGENT_BIN" --service inv --instance "inv-$n" --upstream "$up" \
    --listen "127.0.0.1:$((18900 + n))" --admin-listen "127.0.0.1:$((19000 + n))" \
    --control-plane "http://$GOVD" 2>"$WORK/logs/inv-$n.log" & pids+=($!)
  AGENT_PID[$n]=$!
}
wait_ready() { # n
  for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$((19000 + $1))/ready" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "inv-$1 never became ready (see $WORK/logs/inv-$1.log)" >&2; exit 1
}

# The warm instances start without a warmup: full weight at once. Then the ramp.
for n in 1 2; do start_instance "$n" "$UP_MS" "$PEAK_MS" "$PEAK_EVERY"; done
for n in 1 2; do wait_ready "$n"; done
policy "warmup {
    register
    ramp ${RAMP_S}s from 10%
  }"
sleep 1
curl -fsS -H 'host: inv' "http://$WEB_OUT/" >/dev/null

# One sample of the caller's /metrics: time, then per endpoint of `inv` its requests
# and weight.
sample() {
  echo "t $(date +%s.%N)"
  curl -fsS "http://$WEB_ADMIN/metrics" | grep -E '^gov_agent_endpoint_(requests_total|weight_ratio)\{service="inv"'
}

echo -e "run\tsecond\tweight\tcalls\tto_new\tshare\tbound" > "$OUT"
echo "load $(cut -d' ' -f1-3 /proc/loadavg) before the runs" >&2
for run in $(seq 1 "$RUNS"); do
  n=$((run + 2))
  secs=$((RAMP_S + 6))
  taskset -c "$LOAD_CPUS" "$LOAD" rate "http://$WEB_OUT/" "$RATE" "$secs" "$CONNS" inv > "$WORK/load-$run.txt" & lp=$!
  sleep 3
  start_instance "$n"
  : > "$WORK/samples-$run.txt"
  for _ in $(seq 1 $((RAMP_S + 2))); do
    sample >> "$WORK/samples-$run.txt"
    sleep 1
  done
  wait "$lp"
  python3 - "$WORK/samples-$run.txt" "127.0.0.1:$((18900 + n))" "$run" >> "$OUT" <<'PY'
import re, sys
path, new, run = sys.argv[1], sys.argv[2], sys.argv[3]
samples, cur = [], None
for line in open(path):
    if line.startswith("t "):
        cur = {"t": float(line.split()[1]), "req": {}, "w": {}}
        samples.append(cur)
        continue
    m = re.match(r'gov_agent_endpoint_(requests_total|weight_ratio)\{service="inv",endpoint="([^"]+)"\} (\S+)', line)
    if m and cur is not None:
        cur["req" if m[1] == "requests_total" else "w"][m[2]] = float(m[3])
seen = [s for s in samples if new in s["w"]]
second = 0
for a, b in zip(seen, seen[1:]):
    if b["w"][new] >= 1:
        break
    calls = sum(b["req"].values()) - sum(a["req"].get(e, 0) for e in b["req"])
    to_new = b["req"][new] - a["req"][new]
    weight = max(a["w"][new], b["w"][new])
    share = to_new / calls if calls else 0
    print(f"{run}\t{second}\t{weight:.2f}\t{calls:.0f}\t{to_new:.0f}\t{share:.3f}\t{1.25 * weight / 3:.3f}")
    second += 1
PY
  tail -n +2 "$OUT" | awk -F'\t' -v r="$run" '$1 == r' >&2
  grep -o 'errors=[0-9]*' "$WORK/load-$run.txt" >&2 || true
  kill -TERM "${AGENT_PID[$n]}" 2>/dev/null || true
  sleep 2
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) after the runs" >&2

python3 - "$OUT" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
over = [r for r in rows if float(r["share"]) > float(r["bound"])]
ratio = [float(r["share"]) / (float(r["weight"]) / 3) for r in rows if float(r["weight"]) > 0]
print(f"\n{len(rows)} seconds of ramp over the runs: share / (weight / 3) "
      f"min {min(ratio):.2f}, max {max(ratio):.2f}; {len(over)} seconds over 1.25 x weight / 3")
PY
