#!/usr/bin/env bash
# Lossless scale-in and scale-out under load (issue 11, docs/architecture.md problems 5 and 6).
#
# govd; a caller `web` whose agent's outbound listener balances over the instances of
# `inv` that govd registers; three instances of `inv`, each a hello-world upstream
# behind its own gov-agent. An open-loop load of RATE req/s runs through the caller:
#   steady     SECS of load, nothing changes (the reference p99);
#   scale-in   SIGTERM one instance's agent a third of the way in: it deregisters,
#              `wait for gov` waits until the caller ACKed the set without it, it drains
#              and exits (time from SIGTERM to exit is measured);
#   scale-out  a new instance starts a third of the way in: no call before it is
#              ready, then its share ramps over 5s.
# Each run does all three, so the set is back to three instances at the end of a run.
#
#   bench/scale.sh                    # RUNS=3 SECS=12 RATE=2000 CONNS=64 UP_MS=1
#
# Placement: vCPU0 = load generator; vCPU1 = govd, the agents and the upstreams.
# Needs: taskset, python3, curl. Results go to stdout and $OUT
# (default target/bench-scale/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
SECS=${SECS:-12}
RATE=${RATE:-2000}
CONNS=${CONNS:-64}
UP_MS=${UP_MS:-1}
WORK=${WORK:-target/bench-scale}
OUT=${OUT:-$WORK/results.tsv}
GOVD=127.0.0.1:18300 WEB_OUT=127.0.0.1:18301 WEB_IN=127.0.0.1:18302 WEB_ADMIN=127.0.0.1:18303
LOCAL=127.0.0.1:18304

for tool in taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
rm -rf "$WORK" && mkdir -p "$WORK/logs"

# shellcheck source=bench/common.sh
source bench/common.sh
cargo build --release -j2 -q -p gov-control-plane --bin govd -p govc --bin govc
GOVD_BIN=target/release/govd GOVC_BIN=target/release/govc

cat > "$WORK/policy.gov" <<'GOV'
service inv {
  capacity workers 100
  warmup {
    register
    ramp 5s from 10%
  }
  shutdown {
    deregister
    wait for gov
    drain 5s
  }
}
service web {
  capacity workers 100
}
GOV

GOV_LOG=warn taskset -c 1 "$GOVD_BIN" --listen "$GOVD" --insecure --state-dir "$WORK/state" \
  2>"$WORK/logs/govd.log" & pids+=($!)
sleep 1
"$GOVC_BIN" apply --auto-approve "$WORK/policy.gov" --control-plane "http://$GOVD" >/dev/null

taskset -c 1 "$LOAD" upstream "$LOCAL" & pids+=($!)
GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service web --instance web-1 --upstream "$LOCAL" \
  --listen "$WEB_IN" --outbound-listen "$WEB_OUT" --admin-listen "$WEB_ADMIN" \
  --control-plane "http://$GOVD" 2>"$WORK/logs/web.log" & pids+=($!)

# Instance N: upstream on 184NN, agent inbound 185NN, admin 186NN.
declare -A AGENT_PID
start_instance() { # n
  local n=$1 up=127.0.0.1:$((18400 + $1))
  taskset -c 1 "$LOAD" upstream "$up" "$UP_MS" & pids+=($!)
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service inv --instance "inv-$n" --upstream "$up" \
    --listen "127.0.0.1:$((18500 + n))" --admin-listen "127.0.0.1:$((18600 + n))" \
    --control-plane "http://$GOVD" 2>"$WORK/logs/inv-$n.log" & pids+=($!)
  AGENT_PID[$n]=$!
}
ready() { curl -fsS "http://127.0.0.1:$((18600 + $1))/ready" >/dev/null 2>&1; }
wait_ready() { # n
  for _ in $(seq 1 200); do ready "$1" && return 0; sleep 0.05; done
  echo "inv-$1 never became ready (see $WORK/logs/inv-$1.log)" >&2; exit 1
}

for n in 1 2 3; do start_instance "$n"; done
for n in 1 2 3; do wait_ready "$n"; done
sleep 6 # past the 5s ramp
curl -fsS -H 'host: inv' "http://$WEB_OUT/" >/dev/null

load() { taskset -c 0 "$LOAD" rate "http://$WEB_OUT/" "$RATE" "$SECS" "$CONNS" inv; }
get() { sed -E "s/.*[ ^]$1=([0-9.]+).*/\1/" <<<" $2"; }
row() { # run phase line exit_ms
  echo -e "$1\t$2\t$(get achieved_rps "$3")\t$(get ok "$3")\t$(get errors "$3")\t$(get p50_us "$3")\t$(get p99_us "$3")\t$4" | tee -a "$OUT"
}

echo -e "run\tphase\trps\tok\terrors\tp50_us\tp99_us\texit_ms" > "$OUT"
echo "warm-up..." >&2
taskset -c 0 "$LOAD" rate "http://$WEB_OUT/" "$RATE" 3 "$CONNS" inv >/dev/null

oldest=1 next=4
for run in $(seq 1 "$RUNS"); do
  row "$run" steady "$(load)" ""

  # Scale-in: stop the oldest instance a third of the way into the load.
  load > "$WORK/in.txt" & lp=$!
  sleep "$(python3 -c "print($SECS / 3)")"
  victim=${AGENT_PID[$oldest]}
  t0=$(date +%s%N)
  kill -TERM "$victim"
  while kill -0 "$victim" 2>/dev/null; do sleep 0.01; done
  t1=$(date +%s%N)
  wait "$lp"
  row "$run" scale-in "$(cat "$WORK/in.txt")" "$(( (t1 - t0) / 1000000 ))"
  oldest=$((oldest + 1))

  # Scale-out: a new instance a third of the way into the load.
  load > "$WORK/out.txt" & lp=$!
  sleep "$(python3 -c "print($SECS / 3)")"
  start_instance "$next"
  wait "$lp"
  row "$run" scale-out "$(cat "$WORK/out.txt")" ""
  wait_ready "$next"
  next=$((next + 1))
  sleep 6 # the new instance's ramp
done

python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
runs = sorted({r["run"] for r in rows})
def val(run, phase, k):
    for r in rows:
        if r["run"] == run and r["phase"] == phase and r[k] != "":
            return float(r[k])
print("\nover %d runs (medians; errors summed)" % len(runs))
for phase in ("steady", "scale-in", "scale-out"):
    rs = [r for r in rows if r["phase"] == phase]
    errors = sum(int(r["errors"]) for r in rs)
    ok = sum(int(r["ok"]) for r in rs)
    p99 = st.median(float(r["p99_us"]) for r in rs)
    ratio = st.median(val(r, phase, "p99_us") / val(r, "steady", "p99_us") for r in runs)
    extra = ""
    if phase == "scale-in":
        extra = "  SIGTERM-to-exit ms=%s" % ",".join(r["exit_ms"] for r in rs)
    print(f"  {phase:9}  ok={ok} errors={errors}  p99_us={p99:.0f}  p99/steady={ratio:.2f}x{extra}")
PY
