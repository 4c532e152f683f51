#!/usr/bin/env bash
# Outbound balancing with one slow instance: three instances of `inventory` behind a
# caller's outbound listener, one of them 10x slower, at a fixed rate; p50/p99 with
# the agent's balancer (`--balance peak-ewma`) against round robin
# (`--balance round-robin`), side by side. Issue 11, docs/architecture.md targets.
#
# Placement: vCPU0 = load generator; vCPU1 = the instances and both agents. Runs are
# interleaved (round-robin, peak-ewma, round-robin, ...); the summary quotes medians
# of per-run values, with the share of calls each agent sent to the slow instance
# (from its /metrics), which host noise does not blur as it blurs the tail, and the
# median of the per-run ratios peak-ewma / round-robin (each pair of runs back to
# back, so a busy box weighs on both arms of a ratio alike). Each line records the
# 1-minute load average before the run.
#
#   bench/balance.sh                  # RUNS=3 SECS=10 RATE=2000 CONNS=64 FAST_MS=2 SLOW_MS=20
#   RUNS=5 SECS=15 bench/balance.sh
#
# Needs: taskset, python3. The upstreams and the open-loop generator are
# agents/agent/benches/proxy_load.rs (latency measured from the scheduled send
# time). Results go to stdout and to $OUT (default target/bench-balance/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
SECS=${SECS:-10}
RATE=${RATE:-2000}
CONNS=${CONNS:-64}
FAST_MS=${FAST_MS:-2}
SLOW_MS=${SLOW_MS:-20}
WORK=${WORK:-target/bench-balance}
OUT=${OUT:-$WORK/results.tsv}
I1=127.0.0.1:18191 I2=127.0.0.1:18192 I3=127.0.0.1:18193 LOCAL=127.0.0.1:18190
# Per arm: inbound, outbound, admin.
RR=(127.0.0.1:18201 127.0.0.1:18202 127.0.0.1:18203)
EWMA=(127.0.0.1:18211 127.0.0.1:18212 127.0.0.1:18213)

for tool in taskset python3 curl; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
mkdir -p "$WORK"

# shellcheck source=bench/common.sh
source bench/common.sh

taskset -c 1 "$LOAD" upstream "$LOCAL" & pids+=($!)
taskset -c 1 "$LOAD" upstream "$I1" "$FAST_MS" & pids+=($!)
taskset -c 1 "$LOAD" upstream "$I2" "$FAST_MS" & pids+=($!)
taskset -c 1 "$LOAD" upstream "$I3" "$SLOW_MS" & pids+=($!)

agent() { # balance inbound outbound admin
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service caller --upstream "$LOCAL" \
    --listen "$2" --outbound-listen "$3" --admin-listen "$4" \
    --instances "inventory=$I1,$I2,$I3" --balance "$1" & pids+=($!)
}
agent round-robin "${RR[@]}"
agent peak-ewma "${EWMA[@]}"
sleep 1
for out in "${RR[1]}" "${EWMA[1]}"; do
  curl -fsS -H 'host: inventory' "http://$out/" >/dev/null
done

url_of() { case $1 in round-robin) echo "http://${RR[1]}/";; peak-ewma) echo "http://${EWMA[1]}/";; esac; }
admin_of() { case $1 in round-robin) echo "${RR[2]}";; peak-ewma) echo "${EWMA[2]}";; esac; }
# Requests the agent sent to the slow instance, and to all, from its /metrics.
sent() { # admin -> "slow total"
  curl -fsS "http://$1/metrics" | awk -v slow="endpoint=\"$I3\"" '
    /^gov_agent_endpoint_requests_total/ { all += $2; if (index($0, slow)) s += $2 }
    END { print s + 0, all + 0 }'
}

echo -e "run\tarm\trps\tok\terrors\tp50_us\tp90_us\tp99_us\tp999_us\tslow_share\tload" > "$OUT"
measure() { # arm -> one TSV line
  local arm=$1 line before after share load
  load=$(cut -d' ' -f1 /proc/loadavg)
  before=$(sent "$(admin_of "$arm")")
  line=$(taskset -c 0 "$LOAD" rate "$(url_of "$arm")" "$RATE" "$SECS" "$CONNS" inventory)
  after=$(sent "$(admin_of "$arm")")
  share=$(python3 -c "b='$before'.split(); a='$after'.split(); print(round((int(a[0])-int(b[0]))/max(1,int(a[1])-int(b[1])), 4))")
  get() { sed -E "s/.*[ ^]$1=([0-9.]+).*/\1/" <<<" $line"; }
  echo -e "$run\t$arm\t$(get achieved_rps)\t$(get ok)\t$(get errors)\t$(get p50_us)\t$(get p90_us)\t$(get p99_us)\t$(get p999_us)\t$share\t$load" | tee -a "$OUT"
}

echo "warm-up..." >&2
for arm in round-robin peak-ewma; do
  taskset -c 0 "$LOAD" rate "$(url_of $arm)" "$RATE" 2 "$CONNS" inventory >/dev/null
done
for run in $(seq 1 "$RUNS"); do
  for arm in round-robin peak-ewma; do
    measure "$arm"
  done
done

python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("\nmedians over %d interleaved runs" % len({r["run"] for r in rows}))
med = {}
for arm in ("round-robin", "peak-ewma"):
    rs = [r for r in rows if r["arm"] == arm]
    med[arm] = {k: st.median(float(r[k]) for r in rs) for k in ("rps", "errors", "p50_us", "p90_us", "p99_us", "p999_us", "slow_share")}
    print(f"  {arm:12} " + "  ".join(f"{k}={v:.0f}" if k != "slow_share" else f"{k}={v:.3f}" for k, v in med[arm].items()))
by_run = {}
for r in rows:
    by_run.setdefault(r["run"], {})[r["arm"]] = r
pairs = [v for v in by_run.values() if "round-robin" in v and "peak-ewma" in v]
for k in ("p50_us", "p90_us", "p99_us", "p999_us"):
    ratios = [float(v["peak-ewma"][k]) / float(v["round-robin"][k]) for v in pairs]
    print(f"  {k} peak-ewma/round-robin: ratio of medians {med['peak-ewma'][k] / med['round-robin'][k]:.2f}x,"
          f" median of per-run ratios {st.median(ratios):.2f}x (per run: {' '.join(f'{x:.2f}' for x in ratios)})")
loads = [float(r["load"]) for r in rows]
print(f"  load average (1 min) before the runs: {min(loads):.1f}-{max(loads):.1f}")
PY
