#!/usr/bin/env bash
# Closed-loop HTTP/2 (h2c) and unary-gRPC-shaped load through gov-agent with h2load,
# for a steadier before/after of the agent's hyper path than a fixed-rate row
# (issue 20: hyper's path moved onto the engine's Govern). Arms: `gov` (AGENT_BIN)
# and, with BEFORE_BIN, `gov-before`, both enforcing the peers' policy on /api/
# (bench/profile.sh's: a bulkhead of 256 and a limit nobody reaches), interleaved
# per run, arm order rotating. Per arm and row: requests/s and the agent's CPU per
# request (utime+stime over the run); the summary gives medians of per-run ratios.
#
#   BEFORE_BIN=path/to/older/gov-agent RUNS=5 N=100000 bench/h2load.sh
#   WORKERS=2 BEFORE_BIN=... bench/h2load.sh     # both agents with --worker-threads 2
#
# Placement: h2load on vCPU0; the upstream and the agent on vCPU1 (WORKERS=2: the
# agent on both vCPUs, as bench/peers.sh places two workers). Needs h2load
# (nghttp2-client). Results: stdout and $OUT (target/bench-h2load/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
N=${N:-100000}
CONNS=${CONNS:-4}
STREAMS=${STREAMS:-16}
BEFORE_BIN=${BEFORE_BIN:-}
WORKERS=${WORKERS:-1}
AGENT_CPUS=1
[ "$WORKERS" -gt 1 ] && AGENT_CPUS=0,1
WORK=${WORK:-target/bench-h2load}
OUT=${OUT:-$WORK/results.tsv}
UP=127.0.0.1:18380
command -v h2load >/dev/null || { echo "missing: h2load (apt-get install -y nghttp2-client)" >&2; exit 1; }
mkdir -p "$WORK"
# shellcheck source=bench/common.sh
source bench/common.sh

api_policy "$WORK/policy.yaml" bench-h2load
# A unary gRPC request body: one uncompressed 5-byte-prefixed message.
printf '\0\0\0\0\5hello' > "$WORK/grpc-body"

taskset -c 1 "$LOAD" upstream "$UP" & pids+=($!)
declare -A PORT=([gov]=18383 [gov-before]=18385) PID
start() { # arm binary
  GOV_LOG=warn taskset -c "$AGENT_CPUS" "$2" --service hello --listen "127.0.0.1:${PORT[$1]}" \
    --admin-listen "127.0.0.1:$((PORT[$1] + 1))" --upstream "$UP" --upstream-protocol downstream \
    --worker-threads "$WORKERS" --config "$WORK/policy.yaml" & pids+=($!)
  PID[$1]=$!
}
start gov "$AGENT_BIN"
ARMS=(gov)
if [ -n "$BEFORE_BIN" ]; then start gov-before "$BEFORE_BIN"; ARMS+=(gov-before); fi
sleep 1

echo -e "run\tarm\trow\trps\tcpu_us_per_req\tfailed" > "$OUT"
measure() { # arm row
  local port=${PORT[$1]} t0 t1 line rps ok failed args
  case $2 in
    h2) args=("http://127.0.0.1:$port/api/x") ;;
    grpc) args=(-d "$WORK/grpc-body" -H 'content-type: application/grpc' -H 'te: trailers'
                "http://127.0.0.1:$port/api/hello.Greeter/SayHello") ;;
  esac
  t0=$(ticks "${PID[$1]}")
  line=$(taskset -c 0 h2load -n "$N" -c "$CONNS" -m "$STREAMS" "${args[@]}" 2>&1)
  t1=$(ticks "${PID[$1]}")
  rps=$(awk '/^finished in/ {print $4}' <<<"$line")
  ok=$(awk '/^requests:/ {print $8}' <<<"$line")
  failed=$(awk '/^requests:/ {print $10}' <<<"$line")
  echo -e "$run\t$1\t$2\t$rps\t$(python3 -c "print(round(($t1-$t0)/$HZ/max($ok,1)*1e6, 2))")\t$failed" | tee -a "$OUT"
}
# Warm-up (run 0, left out of the summary).
run=0
for arm in "${ARMS[@]}"; do N=20000 measure "$arm" h2 >/dev/null; done
for run in $(seq 1 "$RUNS"); do
  for row in h2 grpc; do
    for i in "${!ARMS[@]}"; do
      measure "${ARMS[$(( (i + run) % ${#ARMS[@]} ))]}" "$row"
    done
  done
done

python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def val(run, arm, row, key):
    for r in rows:
        if r["run"] == run and r["arm"] == arm and r["row"] == row:
            return float(r[key])
runs = sorted({r["run"] for r in rows} - {"0"})
for row in ("h2", "grpc"):
    for arm in ("gov", "gov-before"):
        xs = [val(r, arm, row, "cpu_us_per_req") for r in runs if val(r, arm, row, "cpu_us_per_req")]
        ys = [val(r, arm, row, "rps") for r in runs if val(r, arm, row, "rps")]
        if xs:
            print(f"[{row}] {arm:10} cpu/req median {st.median(xs):.2f} us ({min(xs):.2f}-{max(xs):.2f})  rps median {st.median(ys):.0f}")
    ratios = [val(r, "gov", row, "cpu_us_per_req") / val(r, "gov-before", row, "cpu_us_per_req")
              for r in runs if val(r, "gov-before", row, "cpu_us_per_req")]
    if ratios:
        print(f"[{row}] gov / gov-before cpu: median {st.median(ratios):.3f}x  per run " + " ".join(f"{x:.3f}" for x in ratios))
PY
