#!/usr/bin/env bash
# Fair share in one pool (issue 32): one greedy consumer at 10x the rate of two
# polite ones on one bulkhead, with and without `share by consumer`.
#
# One upstream answering after DELAY_MS (100 ms), two gov-agents in front of it,
# all on vCPU1; the open-loop generators (agents/agent/benches/proxy_load.rs,
# one per consumer, `LOAD_CONSUMER` naming it in x-gov-consumer) on vCPU0:
#   plain   a bulkhead of POOL (10) permits, max_wait WAIT_MS (50 ms)
#   share   the same with `share by consumer { crm 1  web 1  default 1 }`
# The pool carries POOL / DELAY_MS = 100 calls/s. Per round (RUNS rounds, SECS
# seconds each, the two arms in an order that alternates between rounds):
#   unloaded  crm and web at RATE/s each (20/s), alone            -> their p99
#   loaded    the same, beside `batch` at 10 x RATE/s (200/s)      -> their
#             success rate (2xx / sent) and p99; the greedy one's goodput
#
#   bench/fairness.sh                  # RUNS=3 SECS=10 (about 3 minutes)
# Needs taskset, python3, curl. Results: stdout and $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${RATE:-20}
POOL=${POOL:-10}
WAIT_MS=${WAIT_MS:-50}
DELAY_MS=${DELAY_MS:-100}
RUNS=${RUNS:-3}
SECS=${SECS:-10}
WORK=${WORK:-target/bench-proxy}
OUT=${OUT:-$WORK/fairness.tsv}
UP=127.0.0.1:18190
mkdir -p "$WORK"

# shellcheck source=bench/common.sh
source bench/common.sh

taskset -c 1 "$LOAD" upstream "$UP" "$DELAY_MS" & pids+=($!)

policy() { # name [share yaml]
  cat > "$WORK/fairness-$1.yaml" <<POLICY
service: ledger
version: bench-$1
consumer_header: x-gov-consumer
rules:
  - name: ledger/exports
    on: { any: true }
    mode: MODE_ENFORCE
    bulkhead:
      max_concurrent: $POOL
      max_wait_ms: $WAIT_MS
      reject_status: 503
      reject_grpc_status: GRPC_CODE_UNAVAILABLE
$2
POLICY
}
policy plain ""
policy share "      share: { default_weight: 1, weights: [ { consumer: crm, weight: 1 }, { consumer: web, weight: 1 } ] }"

declare -A PORT=([plain]=18191 [share]=18193)
for a in plain share; do
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service ledger --listen "127.0.0.1:${PORT[$a]}" \
    --admin-listen "127.0.0.1:$((PORT[$a] + 1))" --upstream "$UP" \
    --config "$WORK/fairness-$a.yaml" & pids+=($!)
done
sleep 1
for a in plain share; do curl -fsS "http://127.0.0.1:${PORT[$a]}/" >/dev/null; done

field() { sed -E "s/.*[ ]$1=([0-9.]+).*/\\1/" <<<"$2"; }

echo -e "run\tagent\tload\tconsumer\trate\tsent\tok\trejected\terrors\tp50_us\tp99_us" > "$OUT"
gen() { # agent consumer rate conns -> one line of proxy_load
  LOAD_CONSUMER=$2 taskset -c 0 "$LOAD" rate "http://127.0.0.1:${PORT[$1]}/exports" "$3" "$SECS" "$4"
}
row() { # agent load consumer rate line
  echo -e "$run\t$1\t$2\t$3\t$4\t$(field sent "$5")\t$(field ok "$5")\t$(field rejected "$5")\t$(field errors "$5")\t$(field p50_us "$5")\t$(field p99_us "$5")" | tee -a "$OUT"
}
measure() { # agent load
  local a=$1 load=$2 tmp greedy=""
  tmp=$(mktemp -d)
  if [ "$load" = loaded ]; then
    gen "$a" batch $((10 * RATE)) 96 > "$tmp/batch" & greedy=$!
  fi
  gen "$a" crm "$RATE" 8 > "$tmp/crm" & local c=$!
  gen "$a" web "$RATE" 8 > "$tmp/web" & local w=$!
  wait "$c" "$w" ${greedy:+"$greedy"}
  for who in crm web; do row "$a" "$load" "$who" "$RATE" "$(cat "$tmp/$who")"; done
  if [ -n "$greedy" ]; then row "$a" "$load" batch $((10 * RATE)) "$(cat "$tmp/batch")"; fi
  rm -r "$tmp"
}

echo "warm-up..." >&2
for a in plain share; do gen "$a" crm "$RATE" 8 >/dev/null; done

for run in $(seq 1 "$RUNS"); do
  if [ $((run % 2)) -eq 1 ]; then order="plain share"; else order="share plain"; fi
  for a in $order; do
    measure "$a" unloaded
    measure "$a" loaded
  done
done

python3 - "$OUT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def get(agent, load, who, key):
    return [float(r[key]) for r in rows if (r["agent"], r["load"], r["consumer"]) == (agent, load, who)]
runs = sorted({r["run"] for r in rows})
print(f"\nmedians over {len(runs)} interleaved runs (crm and web: the polite consumers)")
for a in ("plain", "share"):
    for who in ("crm", "web"):
        sent, ok = get(a, "loaded", who, "sent"), get(a, "loaded", who, "ok")
        rate = [o / s for o, s in zip(ok, sent)]
        p99u, p99l = get(a, "unloaded", who, "p99_us"), get(a, "loaded", who, "p99_us")
        ratio = [l / u for l, u in zip(p99l, p99u)]
        print(f"  {a:6} {who}: success {st.median(rate) * 100:.1f}% ({', '.join(f'{r * 100:.1f}' for r in rate)}), "
              f"p99 unloaded {st.median(p99u) / 1000:.0f} ms, loaded {st.median(p99l) / 1000:.0f} ms, "
              f"ratio {st.median(ratio):.2f}x ({', '.join(f'{r:.2f}' for r in ratio)})")
    sent, ok = get(a, "loaded", "batch", "sent"), get(a, "loaded", "batch", "ok")
    print(f"  {a:6} batch (greedy): admitted {st.median(ok):.0f} of {st.median(sent):.0f} sent "
          f"({st.median([o / s for o, s in zip(ok, sent)]) * 100:.1f}%)")
print(f"errors (transport): {sum(float(r['errors']) for r in rows):.0f}")
PY
