#!/usr/bin/env bash
# Where gov-agent's CPU goes under one row of bench/peers.sh (issue 16): the agent
# enforcing the peers' policy on /api/ (a bulkhead of 256 and a limit nobody reaches),
# sampled by `perf record` while the row's load runs, then `perf report` by symbol
# (self time) and by the agent's own threads.
#
#   bench/profile.sh                      # ROW=grpc RATE=2000 SECS=10
#   ROW=h2 bench/profile.sh               # h2c, 4 connections
#   ROW=http1 RATE=8000 bench/profile.sh  # HTTP/1.1, 16 connections
#   ARM=nginx ROW=grpc bench/profile.sh   # the same load through nginx (grpc_pass / proxy_pass)
#   ARM=haproxy ROW=grpc bench/profile.sh # or HAProxy (proto h2 to the upstream for gRPC)
#
# Placement as in peers.sh with WORKERS=1: the generator on vCPU0, the upstream and
# the proxy on vCPU1. Needs perf (linux-perf), nginx or haproxy for those arms, and
# kernel.perf_event_paranoid <= 1 or root. Output: target/bench-profile/<arm>-<row>.txt
set -euo pipefail
cd "$(dirname "$0")/.."

ROW=${ROW:-grpc}
RATE=${RATE:-2000}
SECS=${SECS:-10}
ARM=${ARM:-gov}
WORK=${WORK:-target/bench-profile}
UP=127.0.0.1:18280
PORT=18283
command -v perf >/dev/null || { echo "missing: perf (apt-get install -y linux-perf)" >&2; exit 1; }
mkdir -p "$WORK"
# shellcheck source=bench/common.sh
source bench/common.sh

taskset -c 1 "$LOAD" upstream "$UP" & pids+=($!)
case $ARM in
  gov)
    api_policy "$WORK/policy.yaml" bench-profile
    GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service hello --listen "127.0.0.1:$PORT" \
      --admin-listen "127.0.0.1:$((PORT + 1))" --upstream "$UP" --upstream-protocol downstream \
      --worker-threads 1 --config "$WORK/policy.yaml" & pids+=($!)
    sleep 1
    TARGET=$!
    ;;
  nginx)
    cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server $UP; keepalive 64; }
  upstream grpcapp { server $UP; keepalive 64; }
  server {
    listen 127.0.0.1:$PORT http2;
    location /api/hello.Greeter/ { grpc_pass grpc://grpcapp; }
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
    taskset -c 1 nginx -c "$PWD/$WORK/nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
    sleep 1
    TARGET=$(pgrep -P $! | head -1)
    ;;
  haproxy)
    cat > "$WORK/haproxy.cfg" <<HAPROXY
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
  bind 127.0.0.1:$PORT proto h2
  use_backend grpc if { path_beg /api/hello.Greeter/ }
  default_backend app
backend app
  http-reuse always
  server app $UP maxconn 256
backend grpc
  http-reuse always
  server app $UP maxconn 256 proto h2
HAPROXY
    taskset -c 1 haproxy -db -f "$WORK/haproxy.cfg" & pids+=($!)
    sleep 1
    TARGET=$!
    ;;
  *) echo "ARM is gov, nginx or haproxy" >&2; exit 64 ;;
esac

case $ROW in
  grpc) load=(rate-h2 "http://127.0.0.1:$PORT/api/hello.Greeter/SayHello" "$RATE" "$SECS" 4 grpc) ;;
  h2) load=(rate-h2 "http://127.0.0.1:$PORT/api/x" "$RATE" "$SECS" 4) ;;
  http1) load=(rate "http://127.0.0.1:$PORT/api/x" "$RATE" "$SECS" 16) ;;
  *) echo "ROW is grpc, h2 or http1" >&2; exit 64 ;;
esac
# The peers' h2 listeners take no HTTP/1.1: profile http1 on gov only.
[ "$ARM" != gov ] && [ "$ROW" = http1 ] && { echo "ARM=$ARM profiles h2 and grpc" >&2; exit 64; }

OUTF="$WORK/$ARM-$ROW.txt"
t0=$(ticks "$TARGET")
taskset -c 0 "$LOAD" "${load[@]}" > "$WORK/load.txt" &
loadpid=$!
sleep 1
perf record -q -g -F 4999 -p "$TARGET" -o "$WORK/perf.data" -- sleep $((SECS - 2)) 2>/dev/null
wait "$loadpid"
t1=$(ticks "$TARGET")
# `head` closes the reports early: no pipefail from here on.
set +o pipefail
{
  echo "# $ARM $ROW at $RATE/s for ${SECS}s: $(cat "$WORK/load.txt")"
  echo "# CPU of the proxy: $(python3 -c "print(round(($t1-$t0)/$HZ, 2))") s; uptime: $(uptime)"
  echo "# by thread"
  perf report -i "$WORK/perf.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -8
  echo "# by shared object"
  perf report -i "$WORK/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -8
  echo "# by crate (self; [k] the kernel, libc its functions; user space per request in us)"
  perf report -i "$WORK/perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null \
    | python3 -c '
import re, sys, collections
cpu_us = float(sys.argv[1])
by = collections.Counter()
for line in sys.stdin:
    m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
    if kind == "k":
        key = "[kernel]"
    elif dso.startswith("libc"):
        key = "libc (malloc, free, memmove...)"
    else:
        sym = re.sub(r"^(<|\(|&|\*const |\*mut |dyn )+", "", sym)
        key = re.split(r"::|<| ", sym)[0] or sym
    by[key] += pct
for key, pct in by.most_common(14):
    print(f"{pct:6.2f}%  {pct / 100 * cpu_us:6.2f} us  {key}")
' "$(python3 -c "print(($t1-$t0)/$HZ/max($(sed -E 's/.*ok=([0-9]+).*/\1/' "$WORK/load.txt"),1)*1e6)")"
  echo "# by symbol (self)"
  perf report -i "$WORK/perf.data" --no-children --sort sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
} | tee "$OUTF"
