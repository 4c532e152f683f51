#!/usr/bin/env bash
# gov-agent against the proxies people would pick instead, each enforcing the same
# policy (issue 16): nginx (`limit_conn` + `limit_req`) and HAProxy (`maxconn` per
# server + a stick-table rate limit), with gov-agent enforcing it and gov-agent with
# no policy, in front of the same upstream.
#
# The policy, in each peer's own terms:
#   /api/    a bulkhead of 256 concurrent calls (no waiting) and a limit of
#            API_LIMIT calls/s (default: never reached, so the rows measure what
#            enforcing costs when it admits);
#   /hot/    the same bulkhead and a limit of LIMIT calls/s (default 1,000): the
#            overload row sends 3x LIMIT here;
#   /other/  a limit of 10 calls/s (a rule on another path, never called).
# Before measuring, each arm's share of rejections over 10 s at 3x LIMIT on /hot/ is checked
# to be the same (2/3 within REJECT_TOLERANCE): a peer configured to reject less
# would look cheaper for the wrong reason.
#
# Placement: vCPU0 = load generator; vCPU1 = upstream + proxy under test (a sidecar
# shares its service's core). WORKERS=2 runs every proxy with two workers (nginx
# worker_processes, HAProxy nbthread, gov-agent --worker-threads) on both vCPUs,
# with the generator on both too. Rows, interleaved per run (arm order rotates),
# summarised as medians of per-run values and of per-run ratios to nginx:
#   http1 wrk   closed-loop throughput (wrk -c32) and CPU per request
#   http1 R     open loop at R calls/s (RATES): CPU per request, added p50/p99 over direct
#   overload    3x LIMIT on /hot/: reject share, goodput/LIMIT, CPU per request
#   h2 R        h2c (prior knowledge) at R calls/s, 4 connections
#   grpc R      unary gRPC over h2c at R calls/s (nginx: grpc_pass; HAProxy: proto h2)
#   h2-closed, grpc-closed   the same closed loop (h2load -c 4 -m 16, H2_N calls;
#               only when h2load is installed: nghttp2-client)
#
#   bench/peers.sh                      # RUNS=3 SECS=8 RATES="2000 8000" LIMIT=1000
#   WORKERS=2 RUNS=3 bench/peers.sh
# Needs: nginx, haproxy, wrk (`apt-get install -y nginx haproxy wrk`; add an
# `exit 101` /usr/sbin/policy-rc.d first so that they do not start as services),
# taskset, curl, python3. Results: stdout and $OUT (target/bench-peers/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
SECS=${SECS:-8}
RATES=${RATES:-"2000 8000"}
H2_RATE=${H2_RATE:-2000}
H2_N=${H2_N:-100000}
LIMIT=${LIMIT:-1000}
API_LIMIT=${API_LIMIT:-1000000}
WORKERS=${WORKERS:-1}
CONNS=${CONNS:-16}
REJECT_TOLERANCE=${REJECT_TOLERANCE:-0.05}
WORK=${WORK:-target/bench-peers}
OUT=${OUT:-$WORK/results-w$WORKERS.tsv}
ARMS=${ARMS:-"nginx haproxy gov gov-bare"}
# BEFORE_BIN=path/to/an/older/gov-agent adds an arm `gov-before`: that build with
# the same policy, interleaved with the others (a before/after run of a change).
BEFORE_BIN=${BEFORE_BIN:-}
if [ -n "$BEFORE_BIN" ]; then ARMS="$ARMS gov-before"; fi
UP=127.0.0.1:18180
declare -A PORT=([nginx]=18181 [haproxy]=18182 [gov]=18183 [gov-bare]=18185 [gov-before]=18187)
# h2c listeners of the peers (gov-agent serves both protocols on one port).
declare -A H2PORT=([nginx]=18191 [haproxy]=18192 [gov]=18183 [gov-bare]=18185 [gov-before]=18187)
declare -A GRPCPORT=([nginx]=18193 [haproxy]=18194 [gov]=18183 [gov-bare]=18185 [gov-before]=18187)

for tool in nginx haproxy wrk taskset curl python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y nginx haproxy wrk)" >&2; exit 1; }
done
mkdir -p "$WORK"
# A unary gRPC request body for h2load: one uncompressed 5-byte-prefixed message.
printf '\0\0\0\0\5hello' > "$WORK/grpc-body"
# shellcheck source=bench/common.sh
source bench/common.sh

if [ "$WORKERS" = 1 ]; then PROXY_CPUS=1 LOAD_CPUS=0; else PROXY_CPUS=0,1 LOAD_CPUS=0,1; fi
taskset -c "$PROXY_CPUS" "$LOAD" upstream "$UP" & pids+=($!)

# nginx: limit_conn is its bulkhead (concurrent requests per key, rejected at once),
# limit_req its rate limit (a leaky bucket; `burst` lets a window's worth through at
# at once; a tenth of the rate, so a short run measures the steady rate). One key for every call ($gov_all), as LIMIT_KEY_ALL.
cat > "$WORK/nginx.conf" <<NGINX
worker_processes $WORKERS;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  map "" \$gov_all { default all; }
  limit_conn_zone \$gov_all zone=bulk:1m;
  limit_req_zone \$gov_all zone=api:1m rate=${API_LIMIT}r/s;
  limit_req_zone \$gov_all zone=hot:1m rate=${LIMIT}r/s;
  limit_req_zone \$gov_all zone=other:1m rate=10r/s;
  limit_conn_status 503;
  limit_req_status 429;
  upstream app { server $UP; keepalive 64; }
  upstream grpcapp { server $UP; keepalive 64; }
  server {
    listen 127.0.0.1:${PORT[nginx]};
    listen 127.0.0.1:${H2PORT[nginx]} http2;
    location /api/ { limit_conn bulk 256; limit_req zone=api burst=$((API_LIMIT / 10)) nodelay;
                     proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
    location /hot/ { limit_conn bulk 256; limit_req zone=hot burst=$((LIMIT / 10)) nodelay;
                     proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
    location /other/ { limit_req zone=other burst=10 nodelay;
                       proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:${GRPCPORT[nginx]} http2;
    location /api/ { limit_conn bulk 256; limit_req zone=api burst=$((API_LIMIT / 10)) nodelay; grpc_pass grpc://grpcapp; }
  }
}
NGINX

# HAProxy: `maxconn` on the server is its bulkhead (a call beyond it queues; `timeout
# queue 1ms` rejects it almost at once, with 503); a stick table counts admitted calls
# per path (gpc0, incremented after the deny rules, so a rejected call does not count)
# and denies with 429 above the rate. `sc_gpc0_rate` is a sliding 1 s rate.
cat > "$WORK/haproxy.cfg" <<HAPROXY
global
  nbthread $WORKERS
  maxconn 8192
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  timeout queue 1ms
  option http-keep-alive
frontend fe
  bind 127.0.0.1:${PORT[haproxy]}
  bind 127.0.0.1:${H2PORT[haproxy]} proto h2
  bind 127.0.0.1:${GRPCPORT[haproxy]} proto h2
  acl api path_beg /api/
  acl hot path_beg /hot/
  acl other path_beg /other/
  http-request track-sc0 int(1) table rates if api
  http-request track-sc0 int(2) table rates if hot
  http-request track-sc0 int(3) table rates if other
  http-request deny deny_status 429 if api { sc_gpc0_rate(0) ge $API_LIMIT }
  http-request deny deny_status 429 if hot { sc_gpc0_rate(0) ge $LIMIT }
  http-request deny deny_status 429 if other { sc_gpc0_rate(0) ge 10 }
  http-request sc-inc-gpc0(0) if api || hot || other
  use_backend grpc if { dst_port ${GRPCPORT[haproxy]} }
  default_backend app
backend rates
  stick-table type integer size 16 expire 60s store gpc0,gpc0_rate(1s)
backend app
  http-reuse always
  server app $UP maxconn 256
backend grpc
  http-reuse always
  server app $UP maxconn 256 proto h2
HAPROXY

# gov-agent: the same rules in the compiled config's shape.
rule_pair() { # prefix limit
  cat <<RULES
  - name: hello/bulk_${1}
    on: { path: { kind: PATH_KIND_PREFIX, value: "/${1}/" } }
    mode: MODE_ENFORCE
    bulkhead: { max_concurrent: 256, max_wait_ms: 0, timeout_ms: 30000, reject_status: 503, reject_grpc_status: GRPC_CODE_UNAVAILABLE }
  - name: hello/rate_${1}
    on: { path: { kind: PATH_KIND_PREFIX, value: "/${1}/" } }
    mode: MODE_ENFORCE
    limit:
      key: LIMIT_KEY_ALL
      calls: { amount: $2, window_ms: 1000 }
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
RULES
}
{
  printf 'service: hello\nversion: bench-peers\nconsumer_header: x-gov-consumer\nrules:\n'
  rule_pair api "$API_LIMIT"
  rule_pair hot "$LIMIT"
  cat <<RULES
  - name: hello/rate_other
    on: { path: { kind: PATH_KIND_PREFIX, value: "/other/" } }
    mode: MODE_ENFORCE
    limit:
      key: LIMIT_KEY_ALL
      calls: { amount: 10, window_ms: 1000 }
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
RULES
} > "$WORK/policy.yaml"
printf 'service: hello\nversion: bench-bare\nconsumer_header: x-gov-consumer\nrules: []\n' > "$WORK/bare.yaml"

declare -A PID
start_gov() { # arm config [binary]
  GOV_LOG=warn taskset -c "$PROXY_CPUS" "${3:-$AGENT_BIN}" --service hello --listen "127.0.0.1:${PORT[$1]}" \
    --admin-listen "127.0.0.1:$((PORT[$1] + 1))" --upstream "$UP" --upstream-protocol downstream \
    --worker-threads "$WORKERS" --config "$2" & pids+=($!)
  PID[$1]=$!
}
start_gov gov "$WORK/policy.yaml"
start_gov gov-bare "$WORK/bare.yaml"
if [ -n "$BEFORE_BIN" ]; then start_gov gov-before "$WORK/policy.yaml" "$BEFORE_BIN"; fi
taskset -c "$PROXY_CPUS" nginx -c "$PWD/$WORK/nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!
taskset -c "$PROXY_CPUS" haproxy -db -f "$WORK/haproxy.cfg" & pids+=($!)
PID[haproxy]=$!
sleep 1
PID[nginx]=$(pgrep -P "$NGINX_MASTER" | tr '\n' ' ')
for arm in $ARMS; do curl -fsS "http://127.0.0.1:${PORT[$arm]}/api/x" >/dev/null; done

# CPU ticks of an arm's processes (nginx: all its workers).
arm_ticks() { local t=0 p; for p in ${PID[$1]}; do t=$((t + $(ticks "$p"))); done; echo "$t"; }
field() { sed -E "s/.*[ ^]$1=([0-9.]+).*/\1/" <<<" $2"; }

echo -e "run\tarm\trow\trps\tcpu_us_per_req\tp50_us\tp99_us\trejected_share\terrors" > "$OUT"
measure() { # arm row -> one TSV line
  local arm=$1 row=$2 t0 t1 line n rps p50="" p99="" share="" errors=0 port=${PORT[$1]} sent
  t0=$(arm_ticks "$arm")
  case $row in
    wrk)
      line=$(taskset -c "$LOAD_CPUS" wrk -t1 -c32 -d"${SECS}s" "http://127.0.0.1:$port/api/x")
      rps=$(awk '/Requests\/sec/ {print $2}' <<<"$line")
      n=$(awk '/requests in/ {print $1}' <<<"$line")
      errors=$(awk '/Non-2xx|Socket errors/ {e+=$NF} END {print e+0}' <<<"$line")
      ;;
    h2-closed|grpc-closed)
      if [ "$row" = h2-closed ]; then
        line=$(taskset -c "$LOAD_CPUS" h2load -n "$H2_N" -c 4 -m 16 "http://127.0.0.1:${H2PORT[$arm]}/api/x" 2>&1)
      else
        line=$(taskset -c "$LOAD_CPUS" h2load -n "$H2_N" -c 4 -m 16 -d "$WORK/grpc-body" \
          -H 'content-type: application/grpc' -H 'te: trailers' \
          "http://127.0.0.1:${GRPCPORT[$arm]}/api/hello.Greeter/SayHello" 2>&1)
      fi
      rps=$(awk '/^finished in/ {print $4}' <<<"$line")
      n=$(awk '/^requests:/ {print $8}' <<<"$line")
      errors=$(awk '/^requests:/ {print $10 + $12}' <<<"$line")
      ;;
    *)
      case $row in
        http1-*) line=$(taskset -c "$LOAD_CPUS" "$LOAD" rate "http://127.0.0.1:$port/api/x" "${row#http1-}" "$SECS" "$CONNS") ;;
        overload) line=$(taskset -c "$LOAD_CPUS" "$LOAD" rate "http://127.0.0.1:$port/hot/x" $((3 * LIMIT)) "$SECS" "$CONNS") ;;
        h2-*) line=$(taskset -c "$LOAD_CPUS" "$LOAD" rate-h2 "http://127.0.0.1:${H2PORT[$arm]}/api/x" "${row#h2-}" "$SECS" 4) ;;
        grpc-*) line=$(taskset -c "$LOAD_CPUS" "$LOAD" rate-h2 "http://127.0.0.1:${GRPCPORT[$arm]}/api/hello.Greeter/SayHello" "${row#grpc-}" "$SECS" 4 grpc) ;;
      esac
      rps=$(field achieved_rps "$line"); p50=$(field p50_us "$line"); p99=$(field p99_us "$line")
      errors=$(field errors "$line"); sent=$(field sent "$line")
      n=$(( $(field ok "$line") + $(field rejected "$line") ))
      share=$(python3 -c "print(round($(field rejected "$line") / max($sent, 1), 4))")
      ;;
  esac
  t1=$(arm_ticks "$arm")
  cpu=$(python3 -c "print(round(($t1-$t0)/$HZ/max($n,1)*1e6, 2))")
  echo -e "$run\t$arm\t$row\t$rps\t$cpu\t$p50\t$p99\t$share\t$errors" | tee -a "$OUT"
}

# Direct (no proxy) latency, for the added-latency columns.
direct() { # row
  local line
  line=$(taskset -c "$LOAD_CPUS" "$LOAD" rate "http://$UP/api/x" "${1#http1-}" "$SECS" "$CONNS")
  echo -e "$run\tdirect\t$1\t$(field achieved_rps "$line")\t\t$(field p50_us "$line")\t$(field p99_us "$line")\t0\t$(field errors "$line")" | tee -a "$OUT"
}

echo "warm-up and the same-share check at 3x LIMIT on /hot/..." >&2
run=0
for arm in $ARMS; do taskset -c "$LOAD_CPUS" wrk -t1 -c32 -d2s "http://127.0.0.1:${PORT[$arm]}/api/x" >/dev/null; done
for arm in nginx haproxy gov; do
  case " $ARMS " in *" $arm "*) ;; *) continue ;; esac
  line=$(taskset -c "$LOAD_CPUS" "$LOAD" rate "http://127.0.0.1:${PORT[$arm]}/hot/x" $((3 * LIMIT)) 10 "$CONNS")
  share=$(python3 -c "print($(field rejected "$line") / max($(field sent "$line"), 1))")
  echo "  $arm rejects $share of 3x LIMIT" >&2
  python3 -c "import sys; sys.exit(abs($share - 2/3) > $REJECT_TOLERANCE)" || {
    echo "$arm does not reject 2/3 of a 3x overload (within $REJECT_TOLERANCE): its policy is not the same" >&2; exit 1; }
done

# ROWS="h2-2000 grpc-2000 h2-closed grpc-closed" runs only those rows.
if [ -z "${ROWS:-}" ]; then
  ROWS="wrk"
  for r in $RATES; do ROWS="$ROWS http1-$r"; done
  ROWS="$ROWS overload h2-$H2_RATE grpc-$H2_RATE"
  # Closed loop over HTTP/2 (h2load, 4 connections x 16 streams, H2_N calls).
  command -v h2load >/dev/null && ROWS="$ROWS h2-closed grpc-closed"
fi
arms=($ARMS)
for run in $(seq 1 "$RUNS"); do
  for row in $ROWS; do
    case $row in http1-*) direct "$row" ;; esac
    # Rotate the arm order every run, so no arm always follows the same one.
    for i in "${!arms[@]}"; do
      arm=${arms[$(( (i + run) % ${#arms[@]} ))]}
      # gov-bare has no limit to overload, and its h2 path is gov's without rules.
      case $row in overload|h2-*|grpc-*) [ "$arm" = gov-bare ] && continue ;; esac
      measure "$arm" "$row"
    done
  done
done

rss() { local t=0 p; for p in ${PID[$1]}; do t=$((t + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done; echo "$t"; }
echo -e "rss_kb\t$(for a in $ARMS; do printf '%s=%s ' "$a" "$(rss "$a")"; done)" | tee "$OUT.rss"

python3 - "$OUT" "$ARMS" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
arms = sys.argv[2].split()
def val(run, arm, row, key):
    for r in rows:
        if r["run"] == run and r["arm"] == arm and r["row"] == row and r[key] != "":
            return float(r[key])
    return None
runs = sorted({r["run"] for r in rows}); table = list(dict.fromkeys(r["row"] for r in rows))
med = lambda xs: st.median(xs) if xs else float("nan")
print("\nmedians over %d interleaved runs; x = median of per-run ratios to nginx" % len(runs))
for row in table:
    print(f"\n[{row}]")
    for arm in ["direct"] + arms:
        cols = {k: [v for v in (val(r, arm, row, k) for r in runs) if v is not None]
                for k in ("rps", "cpu_us_per_req", "p50_us", "p99_us", "rejected_share", "errors")}
        if not cols["rps"]:
            continue
        line = "  ".join(f"{k}={med(v):.4g}" for k, v in cols.items() if v)
        if arm not in ("direct", "nginx"):
            ratio = lambda k: med([val(r, arm, row, k) / val(r, "nginx", row, k) for r in runs
                                   if val(r, arm, row, k) and val(r, "nginx", row, k)])
            line += f"  | vs nginx: rps {ratio('rps'):.2f}x cpu {ratio('cpu_us_per_req'):.2f}x"
            if row not in ("wrk", "h2-closed", "grpc-closed"):
                line += f" p99 {ratio('p99_us'):.2f}x"
        if row.startswith("http1-") and arm != "direct":
            add = lambda k: med([val(r, arm, row, k) - val(r, "direct", row, k) for r in runs
                                 if val(r, arm, row, k) is not None and val(r, "direct", row, k) is not None])
            line += f"  added p50 +{add('p50_us'):.0f} us p99 +{add('p99_us'):.0f} us"
        print(f"  {arm:9} {line}")
    if "gov-before" in arms:
        per = lambda k: med([val(r, "gov", row, k) / val(r, "gov-before", row, k) for r in runs
                             if val(r, "gov", row, k) and val(r, "gov-before", row, k)])
        print(f"  gov / gov-before: cpu {per('cpu_us_per_req'):.3f}x rps {per('rps'):.3f}x")
PY
