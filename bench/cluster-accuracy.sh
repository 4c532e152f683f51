#!/usr/bin/env bash
# Cluster limit accuracy (issue 15): N real gov-agents share one `scope cluster`
# limit through a real redis-server, all on loopback, offered RATE requests/s in
# total (open loop, split evenly over the agents, one generator per agent). The
# limit is LIMIT calls per WINDOW_MS window; each run starts just after a window
# begins and lasts SECS (< the window), so it sees exactly one window and offers
# RATE x SECS calls for LIMIT. The figure is admitted / LIMIT, against the
# ideal 1.000 (more: overshoot; less: calls the limit lost).
#
#   bench/cluster-accuracy.sh        # AGENTS="2 4 8" SYNCS="batch exact" RATE=5000
#                                    # LIMIT=10000 WINDOW_MS=10000 SECS=8 BATCH_MS=100 RUNS=3
# Needs redis-server, python3 and curl. AGENT_BIN may name another build (for a
# before/after run, e.g. of main). Results: stdout and $OUT. Each agent's log
# ($WORK/agent-*.log) is searched for the store's outage warning: the bound
# holds while Redis answers, so a run with an outage is flagged.
set -euo pipefail
cd "$(dirname "$0")/.."

AGENTS=${AGENTS:-2 4 8}
SYNCS=${SYNCS:-batch exact}
RATE=${RATE:-5000}
LIMIT=${LIMIT:-10000}
WINDOW_MS=${WINDOW_MS:-10000}
SECS=${SECS:-8}
BATCH_MS=${BATCH_MS:-100}
RUNS=${RUNS:-3}
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

policy() { # file sync
  local sync
  case $2 in
    exact) sync="sync: CLUSTER_SYNC_EXACT" ;;
    batch) sync="sync: CLUSTER_SYNC_BATCH
      sync_batch_ms: $BATCH_MS" ;;
  esac
  cat > "$1" <<POLICY
service: hello
version: bench-accuracy-$2
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
      $sync
POLICY
}

# Sleeps until 200 ms after the next window starts (windows follow Unix time).
next_window() {
  python3 -c "import time; w=$WINDOW_MS/1000; t=time.time(); time.sleep(w - t % w + 0.2)"
}

field() { sed -E "s/.*[ ]$1=([0-9.]+).*/\\1/" <<<"$2"; }

echo -e "run\tsync\tagents\toffered\tadmitted\trejected\terrors\toutages\tadmitted_per_limit" > "$OUT"
for run in $(seq 1 "$RUNS"); do
  for sync in $SYNCS; do
    for n in $AGENTS; do
      policy "$WORK/accuracy-$sync.yaml" "$sync"
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
      outs=()
      for i in $(seq 1 "$n"); do
        "$LOAD" rate "http://127.0.0.1:${ports[$((i - 1))]}/" $((RATE / n)) "$SECS" "$CONNS" \
          > "$WORK/load-$i.out" &
        outs+=($!)
      done
      wait "${outs[@]}"
      ok=0 rej=0 err=0
      for i in $(seq 1 "$n"); do
        line=$(cat "$WORK/load-$i.out")
        ok=$((ok + $(field ok "$line"))); rej=$((rej + $(field rejected "$line"))); err=$((err + $(field errors "$line")))
      done
      outages=$(cat "$WORK"/agent-*.log | grep -c "cluster store (redis) unreachable" || true)
      kill "${agent_pids[@]}" 2>/dev/null || true
      wait "${agent_pids[@]}" 2>/dev/null || true
      rm -f "$WORK"/agent-*.log
      echo -e "$run\t$sync\t$n\t$((ok + rej + err))\t$ok\t$rej\t$err\t$outages\t$(python3 -c "print(f'{$ok/$LIMIT:.4f}')")" | tee -a "$OUT"
    done
  done
done

python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("\nmedian admitted / limit (ideal 1.000), per-run values in brackets")
for sync in dict.fromkeys(r["sync"] for r in rows):
    for n in dict.fromkeys(r["agents"] for r in rows):
        v = [float(r["admitted_per_limit"]) for r in rows if r["sync"] == sync and r["agents"] == n]
        if v:
            out = sum(int(r["outages"]) for r in rows if r["sync"] == sync and r["agents"] == n)
            print(f"{sync:5} {n:>2} agents: {st.median(v):.4f} [{', '.join(f'{x:.4f}' for x in v)}], store outages {out}")
PY
