#!/usr/bin/env bash
# Cluster limit accuracy (issues 15 and 38): N real gov-agents share one `scope cluster`
# limit through a real redis-server, all on loopback, offered RATE requests/s in
# total (open loop, split evenly over the agents, one generator per agent). The
# limit is LIMIT calls per WINDOW_MS window, counted by each ALGORITHM in turn
# (FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET with BURST, the compiler's default
# burst for the amount unless set); Redis is emptied before each row, so a
# sliding window has no window before and a bucket starts full. Each run starts
# just after a window begins and lasts SECS (< the window), so it sees exactly
# one window. What the algorithm allows in the run: LIMIT for the windows;
# BURST + LIMIT x (measured run time) / WINDOW_MS for the bucket. The figure is
# admitted / allowed, against the ideal 1.000 (more: overshoot; less: calls the
# limit lost), and offered / (RATE x SECS) says whether the generators kept up.
#
#   bench/cluster-accuracy.sh        # AGENTS="2 4 8" SYNCS="batch exact" RATE=5000
#                                    # ALGORITHMS="FIXED_WINDOW SLIDING_WINDOW TOKEN_BUCKET"
#                                    # LIMIT=10000 WINDOW_MS=10000 SECS=8 BATCH_MS=100 RUNS=3
# Needs redis-server, python3 and curl. AGENT_BIN may name another build (for a
# before/after run, e.g. of main). Results: stdout and $OUT. Each agent's log
# ($WORK/agent-*.log) is searched for the store's outage warning: the bound
# holds while Redis answers, so a run with an outage is flagged.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENTS=${AGENTS:-2 4 8}
SYNCS=${SYNCS:-batch exact}
ALGORITHMS=${ALGORITHMS:-FIXED_WINDOW SLIDING_WINDOW TOKEN_BUCKET}
RATE=${RATE:-5000}
LIMIT=${LIMIT:-10000}
WINDOW_MS=${WINDOW_MS:-10000}
SECS=${SECS:-8}
BATCH_MS=${BATCH_MS:-100}
RUNS=${RUNS:-3}
# The compiler's default burst: 5% of the amount, at least 10 (the amount if smaller).
BURST=${BURST:-$(python3 -c "print(min($LIMIT, max(10, -(-$LIMIT * 5 // 100))))")}
CONNS=${CONNS:-4}
WORK=${WORK:-target/bench-cluster}
OUT=${OUT:-$WORK/accuracy.tsv}
mkdir -p "$WORK"
if [ $((SECS * 1000 + 500)) -gt "$WINDOW_MS" ]; then
  echo "SECS=$SECS does not fit in one window of WINDOW_MS=$WINDOW_MS with 0.5 s to spare" >&2
  exit 64
fi

# shellcheck source=bench/common.sh
source bench/common.sh

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & pids+=($!)
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
UP=127.0.0.1:$(free_port)
"$LOAD" upstream "$UP" & pids+=($!)

policy() { # file sync algorithm
  local sync burst=0
  case $2 in
    exact) sync="sync: CLUSTER_SYNC_EXACT
      sync_timeout_ms: 100" ;;
    batch) sync="sync: CLUSTER_SYNC_BATCH
      sync_batch_ms: $BATCH_MS" ;;
  esac
  if [ "$3" = TOKEN_BUCKET ]; then burst=$BURST; fi
  cat > "$1" <<POLICY
service: hello
version: bench-accuracy-$2-$3
consumer_header: x-gov-consumer
rules:
  - name: hello/shared
    on: { any: true }
    mode: MODE_ENFORCE
    limit:
      key: LIMIT_KEY_ALL
      calls: { amount: $LIMIT, window_ms: $WINDOW_MS }
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
      scope: LIMIT_SCOPE_CLUSTER
      algorithm: LIMIT_ALGORITHM_$3
      burst: $burst
      $sync
POLICY
}

# Sleeps until 200 ms after the next window starts (windows follow Unix time).
next_window() {
  python3 -c "import time; w=$WINDOW_MS/1000; t=time.time(); time.sleep(w - t % w + 0.2)"
}

field() { sed -E "s/.*[ ]$1=([0-9.]+).*/\\1/" <<<"$2"; }

echo -e "run\talgorithm\tsync\tagents\toffered\toffered_share\tadmitted\trejected\terrors\toutages\tallowed\tadmitted_per_allowed" > "$OUT"
for run in $(seq 1 "$RUNS"); do
  for algorithm in $ALGORITHMS; do
  for sync in $SYNCS; do
    for n in $AGENTS; do
      policy "$WORK/accuracy-$sync.yaml" "$sync" "$algorithm"
      redis-cli -p "$REDIS_PORT" flushall >/dev/null
      agent_pids=() ports=()
      for i in $(seq 1 "$n"); do
        port=$(free_port)
        GOV_LOG=warn "$AGENT_BIN" --service hello --listen "127.0.0.1:$port" \
          --admin-listen "127.0.0.1:$(free_port)" --upstream "$UP" \
          --config "$WORK/accuracy-$sync.yaml" --redis "redis://127.0.0.1:$REDIS_PORT" \
          2> "$WORK/agent-$i.log" & agent_pids+=($!)
        ports+=("$port")
      done
      for port in "${ports[@]}"; do
        for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break; sleep 0.05; done
      done
      next_window
      # The readiness calls above were counted: start every row from empty.
      redis-cli -p "$REDIS_PORT" flushall >/dev/null
      t0=$(date +%s.%N)
      outs=()
      for i in $(seq 1 "$n"); do
        "$LOAD" rate "http://127.0.0.1:${ports[$((i - 1))]}/" $((RATE / n)) "$SECS" "$CONNS" \
          > "$WORK/load-$i.out" &
        outs+=($!)
      done
      wait "${outs[@]}"
      t1=$(date +%s.%N)
      ok=0 rej=0 err=0
      for i in $(seq 1 "$n"); do
        line=$(cat "$WORK/load-$i.out")
        ok=$((ok + $(field ok "$line"))); rej=$((rej + $(field rejected "$line"))); err=$((err + $(field errors "$line")))
      done
      outages=$(cat "$WORK"/agent-*.log | grep -c "cluster store (redis) unreachable" || true)
      kill "${agent_pids[@]}" 2>/dev/null || true
      wait "${agent_pids[@]}" 2>/dev/null || true
      rm -f "$WORK"/agent-*.log
      allowed=$(python3 -c "
if '$algorithm' == 'TOKEN_BUCKET': print(round($BURST + $LIMIT * ($t1 - $t0) * 1000 / $WINDOW_MS))
else: print($LIMIT)")
      offered=$((ok + rej + err))
      echo -e "$run\t$algorithm\t$sync\t$n\t$offered\t$(python3 -c "print(f'{$offered/($RATE*$SECS):.3f}')")\t$ok\t$rej\t$err\t$outages\t$allowed\t$(python3 -c "print(f'{$ok/$allowed:.4f}')")" | tee -a "$OUT"
    done
  done
  done
done

python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("\nmedian admitted / allowed (ideal 1.000), per-run values in brackets")
for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
    for sync in dict.fromkeys(r["sync"] for r in rows):
        for n in dict.fromkeys(r["agents"] for r in rows):
            sel = [r for r in rows if r["algorithm"] == algorithm and r["sync"] == sync and r["agents"] == n]
            if not sel:
                continue
            v = [float(r["admitted_per_allowed"]) for r in sel]
            out = sum(int(r["outages"]) for r in sel)
            offered = min(float(r["offered_share"]) for r in sel)
            print(f"{algorithm:14} {sync:5} {n:>2} agents: {st.median(v):.4f} [{', '.join(f'{x:.4f}' for x in v)}], "
                  f"allowed {sel[0]['allowed']}, offered >= {offered:.3f} of RATE x SECS, store outages {out}")
PY
