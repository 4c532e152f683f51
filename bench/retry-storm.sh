#!/usr/bin/env bash
# Retry storm (issue 33): three tiers of services, each calling the next through
# its own gov-agent, the bottom tier failing FAIL of its calls with 503. Each
# caller's agent retries the calls to the next tier up to 3 attempts on 503:
#
#   client -> [edge agent] -> [t1 agent] t1 -> [t1 agent] -> [t2 agent] t2
#          -> [t2 agent] -> [t3 agent] t3 (fails FAIL of its calls)
#
# Two arms, the same policy but for the budget:
#   unbudgeted  `budget 100% min 100000 per 1s`: every retry paid, as three tiers
#               each retrying on its own would (1 + 2 + 4 ... up to 27 per call)
#   budgeted    `budget BUDGET min 1 per 1s`: retries at most BUDGET of the calls
# Per arm: CALLS client calls (CONC at a time); the calls t3 received per client
# call (the load the storm puts on the failing tier) and the clients' success rate.
#
#   bench/retry-storm.sh              # CALLS=2000 CONC=8 FAIL=0.5 BUDGET=10%
# Needs python3. Results: stdout and $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

CALLS=${CALLS:-2000}
CONC=${CONC:-8}
FAIL=${FAIL:-0.5}
BUDGET=${BUDGET:-10%}
WORK=${WORK:-target/bench-retry}
OUT=${OUT:-$WORK/retry-storm.tsv}
mkdir -p "$WORK"

if [ -z "${AGENT_BIN:-}" ] || [ -z "${GOVC_BIN:-}" ]; then
  echo "building the agent and govc (release)..." >&2
  cargo build --release -j2 -q -p gov-agent --bin gov-agent -p govc --bin govc
  AGENT_BIN=target/release/gov-agent GOVC_BIN=target/release/govc
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

policy() { # FILE BUDGET
  local retry
  retry() { # NAME TARGET
    cat <<RULE
  retry $1 on calls to $2 {
    attempts 3
    on status 503
    backoff 1ms max 4ms jitter
    budget $BUDGET_OF
  }
RULE
  }
  BUDGET_OF=$2
  {
    echo "service edge {"; retry to_t1 t1; echo "}"
    echo "service t1 {"; retry to_t2 t2; echo "}"
    echo "service t2 {"; retry to_t3 t3; echo "}"
    echo "service t3 {}"
  } > "$1"
}

wait_port() { # PORT
  for _ in $(seq 100); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 did not open" >&2; exit 1
}

# run ARM BUDGET: prints "ARM calls t3_calls ok"
run() {
  local arm=$1 file="$WORK/retry-$1.gov"
  policy "$file" "$2"
  for s in edge t1 t2 t3; do
    # The policy warns (gov::lint::retry-amplification): that is the point.
    "$GOVC_BIN" compile --service "$s" "$file" > "$WORK/retry-$arm-$s.yaml" 2>/dev/null
  done
  local started=("${pids[@]}")
  # Apps on 183x1 (t3), 183x2 (t2), 183x3 (t1); their agents' inbound on
  # 183x4.., outbound on 183x7..; x = 0 for one arm, 5 for the other.
  local b=$3
  python3 bench/retry_tier.py $((b + 1)) --fail "$FAIL" & pids+=($!)
  python3 bench/retry_tier.py $((b + 2)) --next 127.0.0.1:$((b + 8)) --next-service t3 & pids+=($!)
  python3 bench/retry_tier.py $((b + 3)) --next 127.0.0.1:$((b + 7)) --next-service t2 & pids+=($!)
  agent() { # SERVICE LISTEN UPSTREAM ADMIN [OUTBOUND INSTANCES]
    GOV_LOG=warn "$AGENT_BIN" --service "$1" --listen "127.0.0.1:$2" --upstream "127.0.0.1:$3" \
      --admin-listen "127.0.0.1:$4" --config "$WORK/retry-$arm-$1.yaml" \
      ${5:+--outbound-listen 127.0.0.1:$5 --instances "$6"} & pids+=($!)
  }
  agent t3 $((b + 4)) $((b + 1)) $((b + 40))
  agent t2 $((b + 5)) $((b + 2)) $((b + 41)) $((b + 8)) "t3=127.0.0.1:$((b + 4))"
  agent t1 $((b + 6)) $((b + 3)) $((b + 42)) $((b + 7)) "t2=127.0.0.1:$((b + 5))"
  agent edge $((b + 9)) $((b + 3)) $((b + 43)) $((b + 10)) "t1=127.0.0.1:$((b + 6))"
  for p in $((b + 1)) $((b + 2)) $((b + 3)) $((b + 4)) $((b + 5)) $((b + 6)) $((b + 8)) $((b + 7)) $((b + 10)); do
    wait_port "$p"
  done
  python3 - "$arm" "$CALLS" "$CONC" $((b + 10)) $((b + 1)) <<'PY'
import http.client, sys, threading
arm, calls, conc, port, bottom = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ok = [0]; lock = threading.Lock(); left = [calls]
def worker():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while True:
        with lock:
            if left[0] == 0: return
            left[0] -= 1
        try:
            conn.request("GET", "/work", headers={"gov-service": "t1"})
            r = conn.getresponse(); r.read()
            if r.status == 200:
                with lock: ok[0] += 1
        except (OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
threads = [threading.Thread(target=worker) for _ in range(conc)]
for t in threads: t.start()
for t in threads: t.join()
c = http.client.HTTPConnection("127.0.0.1", bottom, timeout=10)
c.request("GET", "/count"); t3 = int(c.getresponse().read())
print(f"{arm}\t{calls}\t{t3}\t{ok[0]}")
PY
  for p in "${pids[@]}"; do
    case " ${started[*]} " in *" $p "*) ;; *) kill "$p" 2>/dev/null || true ;; esac
  done
  pids=("${started[@]}")
  wait 2>/dev/null || true
}

{
  run unbudgeted "100% min 100000 per 1s" 18300
  run budgeted "$BUDGET min 1 per 1s" 18350
} | tee "$WORK/retry-storm.raw"

{
  printf 'arm\tclient_calls\tbottom_calls\tbottom_per_call\tsuccess\n'
  awk -F'\t' '{ printf "%s\t%d\t%d\t%.2f\t%.1f%%\n", $1, $2, $3, $3 / $2, 100 * $4 / $2 }' "$WORK/retry-storm.raw"
} | tee "$OUT"
