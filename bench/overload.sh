#!/usr/bin/env bash
# Overload and rejection cost of gov-agent (performance.md section 5, T6), and
# goodput under overload per limit algorithm beside nginx and HAProxy (issue 38).
#
# Agents and peers in front of the same hello-world upstream, all on vCPU1 with the
# upstream; the open-loop generator (agents/agent/benches/proxy_load.rs) on vCPU0:
#   fwd          gov-agent, a limit nobody reaches: every call forwarded
#   rej          gov-agent, a limit of 1 call per hour: every call answered 429
#   lim-fixed    gov-agent, LIMIT calls per 1 s, fixed window
#   lim-sliding  the same, sliding window
#   lim-bucket   the same, token bucket of BURST (the compiler's default: 5% of
#                LIMIT, at least 10), what `calls LIMIT per 1s` compiles to
#   ngx-lim      nginx `limit_req` (leaky bucket) at LIMIT r/s, burst LIMIT/10 nodelay
#                (as bench/peers.sh)
#   hap-lim      HAProxy, a stick table's sliding 1 s rate (`sc_gpc0_rate`) >= LIMIT
#                denied with 429 (as bench/peers.sh)
#   ngx-fwd, ngx-rej   nginx proxying, and `return 429`
# Per round (RUNS rounds, SECS seconds each, the goodput arms in a rotating order):
#   fwd and rej at 3*LIMIT/s                -> CPU per forwarded vs rejected request
#   lim-bucket at LIMIT/2 /s (unloaded)     -> admitted p90 without overload
#   every lim arm at 3*LIMIT/s (3x overload) -> goodput (2xx/s) / LIMIT, admitted p90
#   ngx-fwd and ngx-rej at 3*LIMIT/s        -> the same CPU ratio for the peer
#
#   bench/overload.sh                       # LIMIT=1000 RUNS=5 SECS=6 (about 5 minutes)
# Needs what bench/proxy.sh needs (nginx, haproxy, taskset, python3, curl). Results:
# stdout and $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT=${LIMIT:-1000}
BURST=${BURST:-$(python3 -c "print(min($LIMIT, max(10, -(-$LIMIT * 5 // 100))))")}
RUNS=${RUNS:-5}
SECS=${SECS:-6}
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
policy lim-fixed "$LIMIT" 1000 FIXED_WINDOW 0
policy lim-sliding "$LIMIT" 1000 SLIDING_WINDOW 0
policy lim-bucket "$LIMIT" 1000 TOKEN_BUCKET "$BURST"

declare -A PORT=([fwd]=18091 [rej]=18093 [lim-fixed]=18095 [lim-sliding]=18099 [lim-bucket]=18101) PID
GOV_ARMS="fwd rej lim-fixed lim-sliding lim-bucket"
for a in $GOV_ARMS; do
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service hello --listen "127.0.0.1:${PORT[$a]}" \
    --admin-listen "127.0.0.1:$((PORT[$a] + 1))" --upstream "$UP" \
    --config "$WORK/overload-$a.yaml" & pids+=($!)
  PID[$a]=$!
done

# The peers: nginx proxying the same upstream, answering 429 itself, and limiting
# with `limit_req` (one worker on vCPU1, as in bench/proxy.sh); HAProxy limiting
# with its sliding rate (one thread on vCPU1), both configured as bench/peers.sh.
PORT[ngx-fwd]=18097; PORT[ngx-rej]=18098; PORT[ngx-lim]=18103; PORT[hap-lim]=18104
cat > "$WORK/overload-nginx.conf" <<NGINX
worker_processes 1;
worker_cpu_affinity 10;
pid $PWD/$WORK/overload-nginx.pid;
error_log $PWD/$WORK/overload-nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  map "" \$gov_all { default all; }
  limit_req_zone \$gov_all zone=lim:1m rate=${LIMIT}r/s;
  limit_req_status 429;
  upstream app { server $UP; keepalive 64; }
  server { listen 127.0.0.1:${PORT[ngx-fwd]}; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  server { listen 127.0.0.1:${PORT[ngx-rej]}; location / { return 429 "rejected\n"; } }
  server { listen 127.0.0.1:${PORT[ngx-lim]}; location / { limit_req zone=lim burst=$((LIMIT / 10)) nodelay;
           proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
NGINX
taskset -c 1 nginx -c "$PWD/$WORK/overload-nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!
cat > "$WORK/overload-haproxy.cfg" <<HAPROXY
global
  nbthread 1
  maxconn 8192
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:${PORT[hap-lim]}
  http-request track-sc0 int(1) table rates
  http-request deny deny_status 429 if { sc_gpc0_rate(0) ge $LIMIT }
  http-request sc-inc-gpc0(0)
  default_backend app
backend rates
  stick-table type integer size 16 expire 60s store gpc0,gpc0_rate(1s)
backend app
  http-reuse always
  server app $UP
HAPROXY
taskset -c 1 haproxy -db -f "$WORK/overload-haproxy.cfg" & pids+=($!)
PID[hap-lim]=$!
sleep 1
PID[ngx-fwd]=$(pgrep -P "$NGINX_MASTER" | head -1); PID[ngx-rej]=${PID[ngx-fwd]}; PID[ngx-lim]=${PID[ngx-fwd]}
curl -fsS "http://127.0.0.1:${PORT[fwd]}/" >/dev/null
curl -fsS "http://127.0.0.1:${PORT[ngx-fwd]}/" >/dev/null
curl -fsS "http://127.0.0.1:${PORT[hap-lim]}/" >/dev/null

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

LIM_ARMS=(lim-fixed lim-sliding lim-bucket ngx-lim hap-lim)
echo "warm-up..." >&2
for a in fwd rej ngx-fwd ngx-rej "${LIM_ARMS[@]}"; do taskset -c 0 "$LOAD" rate "http://127.0.0.1:${PORT[$a]}/" "$LIMIT" 2 "$CONNS" >/dev/null; done

for run in $(seq 1 "$RUNS"); do
  measure fwd $((3 * LIMIT))
  measure rej $((3 * LIMIT))
  measure lim-bucket $((LIMIT / 2))
  # The goodput arms in a rotating order: none always follows the same one.
  for i in $(seq 0 $((${#LIM_ARMS[@]} - 1))); do
    measure "${LIM_ARMS[$(((i + run) % ${#LIM_ARMS[@]}))]}" $((3 * LIMIT))
  done
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
print(f"goodput at 3x overload ({over}/s offered, limit {limit:.0f}/s), median 2xx/s / limit (per run), admitted p90:")
names = {"lim-fixed": "gov fixed window", "lim-sliding": "gov sliding window", "lim-bucket": "gov token bucket (default)",
         "ngx-lim": "nginx limit_req", "hap-lim": "HAProxy sliding rate"}
for arm, name in names.items():
    good, p90 = get(arm, over, "goodput_rps"), get(arm, over, "p90_us")
    if good:
        print(f"  {name:27} {st.median(good) / limit:.3f} ({', '.join(f'{g / limit:.3f}' for g in good)}), p90 {st.median(p90):.0f} us")
p90u, p90o = get("lim-bucket", under, "p90_us"), get("lim-bucket", over, "p90_us")
print(f"admitted p90 (token bucket): unloaded ({under}/s) {st.median(p90u):.0f} us, 3x overload {st.median(p90o):.0f} us, "
      f"ratio {st.median([o / u for o, u in zip(p90o, p90u)]):.2f}x")
print(f"errors (transport): {sum(float(r['errors']) for r in rows):.0f}")
PY
