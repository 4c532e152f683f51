#!/usr/bin/env bash
# Adaptive bulkhead under an upstream whose capacity changes mid-run (issue 32).
#
# Three arms, each a gov-agent in front of its own upstream
# (bench/adaptive_load.py upstream: a pool of workers, 100 ms per call, a FIFO
# queue in front) whose workers go 20 -> 6 -> 20 (PHASES, workers:seconds); an
# open-loop generator offers each the same schedule, RATE/s (default 600: 3x
# the 200 calls/s 20 workers serve; 10x the 60/s of 6), each call given up
# after TIMEOUT_MS:
#   none      no bulkhead
#   fixed     `max_concurrent 20`: the best fixed limit for the first phase
#   adaptive  `max_concurrent adaptive min MIN max 20`
# Both bulkheads fail fast (`max_wait 10ms`, rejected with 408). Before the
# phases, WARM seconds at WARM_RATE/s measure the unloaded latency.
# A run is the three arms one after the other in a rotating order, each with
# fresh processes (all three at once overload the Python generators of a
# loaded 2-core box). Per arm and phase: goodput (2xx/s), p50/p99 of the
# admitted calls (a timeout counts as TIMEOUT_MS), rejections/s; rejections
# per second around each phase change; adaptive's ratios to fixed per run and
# their medians. Each agent's limit (gov_agent_bulkhead_limit) is sampled
# every 0.5 s.
#
#   bench/adaptive.sh        # RUNS=3 PHASES=20:10,6:10,20:10 RATE=600 (about 5 minutes)
# Needs python3 and curl. Results: stdout, $WORK/adaptive-run*.tsv (one line per
# call), $WORK/adaptive-limit-run*-ARM.tsv, $OUT (the report).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
PHASES=${PHASES:-20:10,6:10,20:10}
RATE=${RATE:-600}
WARM=${WARM:-3}
WARM_RATE=${WARM_RATE:-20}
TIMEOUT_MS=${TIMEOUT_MS:-1000}
MIN=${MIN:-2}
MAX=${MAX:-20}
FIXED=${FIXED:-20}
WORK=${WORK:-target/bench-adaptive}
OUT=${OUT:-$WORK/adaptive.txt}
mkdir -p "$WORK"

if [ -z "${AGENT_BIN:-}" ]; then
  echo "building the agent (release)..." >&2
  cargo build --release -j2 -q -p gov-agent --bin gov-agent
  AGENT_BIN=target/release/gov-agent
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

policy() { # NAME BULKHEAD-YAML
  {
    printf 'service: bench\nversion: adaptive-%s\nconsumer_header: x-gov-consumer\n' "$1"
    if [ -z "$2" ]; then
      echo 'rules: []'
    else
      cat <<RULES
rules:
  - name: bench/work
    on: { any: true }
    mode: MODE_ENFORCE
    bulkhead: { $2, max_wait_ms: 10, timeout_ms: 5000, reject_status: 408, reject_grpc_status: GRPC_CODE_UNAVAILABLE }
RULES
    fi
  } > "$WORK/adaptive-$1.yaml"
}
policy none ""
policy fixed "max_concurrent: $FIXED"
policy adaptive "max_concurrent: $MAX, adaptive: { min: $MIN, max: $MAX }"

ARMS=(none fixed adaptive)
declare -A PORT=([none]=18611 [fixed]=18612 [adaptive]=18613)

wait_port() { # PORT
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 did not open" >&2; exit 1
}

# run_arm RUN ARM: the arm's upstream and agent, fresh, and its generator.
run_arm() {
  local run=$1 a=$2 up=$((PORT[$2] - 10)) started=("${pids[@]}")
  python3 bench/adaptive_load.py upstream "$up" --phases "$PHASES" & pids+=($!)
  GOV_LOG=warn "$AGENT_BIN" --service bench --listen "127.0.0.1:${PORT[$a]}" \
    --admin-listen "127.0.0.1:$((PORT[$a] + 10))" --upstream "127.0.0.1:$up" \
    --max-connections-per-client 4096 --config "$WORK/adaptive-$a.yaml" & pids+=($!)
  wait_port "$up"; wait_port "${PORT[$a]}"
  echo "run $run, $a: warm-up ${WARM}s at ${WARM_RATE}/s, then $PHASES at ${RATE}/s..." >&2
  rm -f "$WORK/adaptive-run$run-$a.tsv.start"
  python3 bench/adaptive_load.py load --phases "$PHASES" --rate "$RATE" \
    --warm "$WARM" --warm-rate "$WARM_RATE" --timeout-ms "$TIMEOUT_MS" \
    --arm "$a=${PORT[$a]}" --upstream "$up" --out "$WORK/adaptive-run$run-$a.tsv" &
  local load=$!
  while [ ! -s "$WORK/adaptive-run$run-$a.tsv.start" ] && kill -0 "$load" 2>/dev/null; do sleep 0.1; done
  local start
  start=$(cat "$WORK/adaptive-run$run-$a.tsv.start")
  # The bulkhead's limit, every 0.5 s: seconds since the start of the phases, the limit.
  (
    while true; do
      l=$(curl -fsS "http://127.0.0.1:$((PORT[$a] + 10))/metrics" 2>/dev/null \
        | awk '/^gov_agent_bulkhead_limit/ { print $2 }')
      echo "$(date +%s.%N) ${l:-}" | awk -v s="$start" '{ printf "%.1f\t%s\n", $1 - s, $2 }'
      sleep 0.5
    done
  ) > "$WORK/adaptive-limit-run$run-$a.tsv" & pids+=($!)
  wait "$load"
  for p in "${pids[@]}"; do
    case " ${started[*]} " in *" $p "*) ;; *) kill "$p" 2>/dev/null || true ;; esac
  done
  pids=("${started[@]}")
  wait 2>/dev/null || true
}

files=()
for run in $(seq 1 "$RUNS"); do
  # The arms one after the other (three at once overload a 2-core box's
  # Python generators), in a rotating order: none always follows the same one.
  for i in 0 1 2; do
    run_arm "$run" "${ARMS[$(((i + run) % 3))]}"
  done
  cat "$WORK/adaptive-run$run"-*.tsv > "$WORK/adaptive-run$run.tsv"
  files+=("$WORK/adaptive-run$run.tsv")
done

python3 bench/adaptive_load.py report "${files[@]}" --phases "$PHASES" --timeout-ms "$TIMEOUT_MS" | tee "$OUT"
echo "the limits over time: $WORK/adaptive-limit-run*-*.tsv" >&2
