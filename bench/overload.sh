#!/usr/bin/env bash
# Overload and rejection cost of gov-agent (performance.md section 5, T6).
#
# Three agents in front of the same hello-world upstream, all on vCPU1 with the
# upstream; the open-loop generator (agents/sidecar/benches/proxy_load.rs) on vCPU0:
#   fwd  a limit nobody reaches: every call forwarded
#   rej  a limit of 1 call per hour: every call answered 429 by the engine
#   lim  a limit of LIMIT calls per 1 s window
# Per run (interleaved, RUNS times, SECS seconds each):
#   fwd at 3*LIMIT/s and rej at 3*LIMIT/s  -> CPU per forwarded vs rejected request
#   lim at LIMIT/2 /s (unloaded)            -> admitted p90 without overload
#   lim at 3*LIMIT/s (3x overload)          -> goodput (2xx/s) / LIMIT, admitted p90
#   nginx proxying, and nginx `return 429`, at 3*LIMIT/s -> the same ratio for the peer
#
#   bench/overload.sh                       # LIMIT=1000 RUNS=3 SECS=8
#   ALGORITHM=TOKEN_BUCKET BURST=50 bench/overload.sh   # `lim` counts by that algorithm
#   (FIXED_WINDOW, the wire's default; SLIDING_WINDOW; TOKEN_BUCKET with BURST calls;
#   the compiler's default for `calls 1000 per 1s` is TOKEN_BUCKET BURST=50)
# Needs what bench/proxy.sh needs (nginx, taskset, python3, curl). Results: stdout and $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT=${LIMIT:-1000}
ALGORITHM=${ALGORITHM:-FIXED_WINDOW}
BURST=${BURST:-0}
RUNS=${RUNS:-3}
SECS=${SECS:-8}
CONNS=${CONNS:-16}
WORK=${WORK:-target/bench-proxy}
OUT=${OUT:-$WORK/overload.tsv}
UP=127.0.0.1:18090
mkdir -p "$WORK"

# shellcheck source=bench/common.sh
source bench/common.sh

taskset -c 1 "$LOAD" upstream "$UP" & pids+=($!)

policy() { # name amount window_ms [algorithm burst]
  cat > "$WORK/overload-$1.yaml" <<POLICY
service: hello
version: bench-$1
consumer_header: x-gov-consumer
rules:
  - name: hello/calls
    on: { any: true }
    mode: MODE_ENFORCE
    limit:
      key: LIMIT_KEY_ALL
      calls: { amount: $2, window_ms: $3 }
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
      algorithm: LIMIT_ALGORITHM_${4:-FIXED_WINDOW}
      burst: ${5:-0}
POLICY
}
policy fwd 1000000000 1000
policy rej 1 3600000
policy lim "$LIMIT" 1000 "$ALGORITHM" "$BURST"

declare -A PORT=([fwd]=18091 [rej]=18093 [lim]=18095) PID
for a in fwd rej lim; do
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service hello --listen "127.0.0.1:${PORT[$a]}" \
    --admin-listen "127.0.0.1:$((PORT[$a] + 1))" --upstream "$UP" \
    --config "$WORK/overload-$a.yaml" & pids+=($!)
  PID[$a]=$!
done

# The peer: nginx proxying the same upstream, and answering 429 itself (one worker on
# vCPU1, as in bench/proxy.sh), to show what a rejection costs a C server here.
PORT[ngx-fwd]=18097; PORT[ngx-rej]=18098
cat > "$WORK/overload-nginx.conf" <<NGINX
worker_processes 1;
worker_cpu_affinity 10;
pid $PWD/$WORK/overload-nginx.pid;
error_log $PWD/$WORK/overload-nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server $UP; keepalive 64; }
  server { listen 127.0.0.1:${PORT[ngx-fwd]}; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  server { listen 127.0.0.1:${PORT[ngx-rej]}; location / { return 429 "rejected\n"; } }
}
NGINX
taskset -c 1 nginx -c "$PWD/$WORK/overload-nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!
sleep 1
PID[ngx-fwd]=$(pgrep -P "$NGINX_MASTER" | head -1); PID[ngx-rej]=${PID[ngx-fwd]}
curl -fsS "http://127.0.0.1:${PORT[fwd]}/" >/dev/null
curl -fsS "http://127.0.0.1:${PORT[ngx-fwd]}/" >/dev/null

field() { sed -E "s/.*[ ]$1=([0-9.]+).*/\\1/" <<<"$2"; }

echo -e "run\tagent\trate\tok\trejected\terrors\tgoodput_rps\tp50_us\tp90_us\tcpu_us_per_req" > "$OUT"
measure() { # agent rate
  local a=$1 rate=$2 t0 t1 line ok rej
  t0=$(ticks "${PID[$a]}")
  line=$(taskset -c 0 "$LOAD" rate "http://127.0.0.1:${PORT[$a]}/" "$rate" "$SECS" "$CONNS")
  t1=$(ticks "${PID[$a]}")
  ok=$(field ok "$line"); rej=$(field rejected "$line")
  echo -e "$run\t$a\t$rate\t$ok\t$rej\t$(field errors "$line")\t$(field achieved_rps "$line")\t$(field p50_us "$line")\t$(field p90_us "$line")\t$(python3 -c "print(round(($t1-$t0)/$HZ/max($ok+$rej,1)*1e6, 2))")" | tee -a "$OUT"
}

echo "warm-up..." >&2
for a in fwd rej lim ngx-fwd ngx-rej; do taskset -c 0 "$LOAD" rate "http://127.0.0.1:${PORT[$a]}/" "$LIMIT" 2 "$CONNS" >/dev/null; done

for run in $(seq 1 "$RUNS"); do
  measure fwd $((3 * LIMIT))
  measure rej $((3 * LIMIT))
  measure lim $((LIMIT / 2))
  measure lim $((3 * LIMIT))
  measure ngx-fwd $((3 * LIMIT))
  measure ngx-rej $((3 * LIMIT))
done

python3 - "$OUT" "$LIMIT" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t")); limit = float(sys.argv[2])
def get(agent, rate, key):
    return [float(r[key]) for r in rows if r["agent"] == agent and r["rate"] == str(rate)]
runs = sorted({r["run"] for r in rows})
over, under = int(3 * limit), int(limit // 2)
fwd, rej = get("fwd", over, "cpu_us_per_req"), get("rej", over, "cpu_us_per_req")
print(f"\nmedians over {len(runs)} interleaved runs")
print(f"CPU per request at {over}/s: forwarded {st.median(fwd):.1f} us, rejected {st.median(rej):.1f} us, "
      f"ratio {st.median([r / f for r, f in zip(rej, fwd)]):.2f}x (per-run {', '.join(f'{r / f:.2f}' for r, f in zip(rej, fwd))})")
nfwd, nrej = get("ngx-fwd", over, "cpu_us_per_req"), get("ngx-rej", over, "cpu_us_per_req")
if nfwd and nrej:
    print(f"nginx at {over}/s: proxied {st.median(nfwd):.1f} us, `return 429` {st.median(nrej):.1f} us, "
          f"ratio {st.median([r / f for r, f in zip(nrej, nfwd)]):.2f}x (per-run {', '.join(f'{r / f:.2f}' for r, f in zip(nrej, nfwd))}); "
          f"gov-agent's rejection / nginx's 429: {st.median([g / n for g, n in zip(rej, nrej)]):.2f}x")
good = get("lim", over, "goodput_rps")
print(f"goodput at 3x overload ({over}/s offered, limit {limit:.0f}/s): {st.median(good):.0f} 2xx/s = "
      f"{st.median(good) / limit:.3f} of the limit (per-run {', '.join(f'{g / limit:.3f}' for g in good)})")
p90u, p90o = get("lim", under, "p90_us"), get("lim", over, "p90_us")
print(f"admitted p90: unloaded ({under}/s) {st.median(p90u):.0f} us, 3x overload {st.median(p90o):.0f} us, "
      f"ratio {st.median([o / u for o, u in zip(p90o, p90u)]):.2f}x")
print(f"errors (transport): {sum(float(r['errors']) for r in rows):.0f}")
PY
