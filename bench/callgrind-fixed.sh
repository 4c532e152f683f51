#!/usr/bin/env bash
# User-space instructions per h2c call at a fixed, low rate (every call its own
# wake-up, as `peers.sh`'s 2,000/s rows), gov-agent beside nginx and HAProxy, each
# alone under callgrind (load-independent: issue 37's fixed-rate rows swing
# 10-20% in CPU time between runs). The arms:
#   nginx      h2c in, HTTP/1.1 upstream with keepalive (peers.sh's set-up, one
#              process: `master_process off`); gRPC: `grpc_pass`
#   haproxy    h2c in, HTTP/1.1 upstream (`http-reuse always`, one thread);
#              gRPC: an h2 backend (`proto h2`), as peers.sh
#   gov-h1     gov-agent, the peers' /api/ policy, `--upstream-protocol http1`
#   gov-h2     the same with `--upstream-protocol downstream` (h2c upstream)
# Each: CONNS h2c connections at RPS calls/s each (`h2load --rps`), WARM calls to
# warm up, the counters zeroed, N calls counted, dumped. CLOSED=1 runs the
# closed loop instead (`h2load -c 4 -m 16`); GRPC=1 sends unary gRPC calls (a
# 5-byte message each, as peers.sh's); H1=1 sends HTTP/1.1 calls (`h2load --h1`;
# the gov arms only: the peers here listen for h2c).
#
#   bench/callgrind-fixed.sh                          # ARMS="nginx gov-h1 gov-h2" RPS=50 CONNS=4 N=4000
#   AGENT_BIN=path/to/gov-agent LOAD=path/to/proxy_load ARMS="gov-h1" bench/callgrind-fixed.sh
#   GRPC=1 CLOSED=1 N=20000 ARMS="haproxy gov-h2" bench/callgrind-fixed.sh
#
# Needs valgrind (callgrind_control), h2load (nghttp2-client), nginx, haproxy, curl.
# Also prints each arm's top functions by inclusive instructions with PROFILE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-4000}
WARM=${WARM:-400}
RPS=${RPS:-50}
CONNS=${CONNS:-4}
ARMS=${ARMS:-"nginx gov-h1 gov-h2"}
WORK=${WORK:-target/bench-callgrind-fixed}
for tool in valgrind callgrind_control h2load nginx haproxy curl; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
mkdir -p "$WORK"
# shellcheck source=bench/common.sh
source bench/common.sh
api_policy "$WORK/policy.yaml" bench-callgrind-fixed
UP=127.0.0.1:18880
PORT=18883
"$LOAD" upstream "$UP" & pids+=($!)

cat > "$WORK/nginx.conf" <<NGINX
daemon off;
master_process off;
worker_processes 1;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log error;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server $UP; keepalive 64; }
  upstream grpcapp { server $UP; keepalive 64; }
  server {
    listen 127.0.0.1:$PORT http2;
    location /api/hello.Greeter/ { grpc_pass grpc://grpcapp; }
    location /api/ { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX

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
printf '\0\0\0\0\5hello' > "$WORK/grpc-body"

start_arm() {
  case "$1" in
    nginx) echo nginx -e "$PWD/$WORK/nginx-error.log" -c "$PWD/$WORK/nginx.conf" ;;
    haproxy) echo haproxy -db -f "$PWD/$WORK/haproxy.cfg" ;;
    gov-h1 | gov-h2)
      local proto=http1
      [ "$1" = gov-h2 ] && proto=downstream
      echo "$AGENT_BIN" --service hello --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$((PORT + 1))" \
        --upstream "$UP" --upstream-protocol "$proto" --worker-threads 1 --config "$WORK/policy.yaml"
      ;;
    *) echo "unknown arm: $1" >&2; exit 1 ;;
  esac
}

h2() { # N
  local shape=(-c "$CONNS" -m 1 --rps "$RPS")
  [ -n "${CLOSED:-}" ] && shape=(-c 4 -m 16)
  [ -n "${H1:-}" ] && shape+=(--h1)
  if [ -n "${GRPC:-}" ]; then
    h2load -n "$1" "${shape[@]}" -d "$WORK/grpc-body" -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://127.0.0.1:$PORT/api/hello.Greeter/SayHello"
  else
    h2load -n "$1" "${shape[@]}" "http://127.0.0.1:$PORT/api/x"
  fi
}

for arm in $ARMS; do
  out="$WORK/cg.$arm.out"
  rm -f "$out" "$out".*
  # shellcheck disable=SC2046
  GOV_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" $(start_arm "$arm") 2>"$WORK/vg.$arm.log" &
  vg=$!
  for _ in $(seq 1 120); do
    curl -s --http2-prior-knowledge -o /dev/null "http://127.0.0.1:$PORT/api/x" && break
    sleep 0.5
  done
  h2 "$WARM" >/dev/null
  callgrind_control -z "$vg" >/dev/null
  done_line=$(h2 "$N" | grep -E '^requests:')
  callgrind_control -d "$vg" >/dev/null
  sleep 1
  kill "$vg"; wait "$vg" 2>/dev/null || true
  dump=$(ls "$out".* | head -1)
  total=$(awk '/^totals:/ {print $2}' "$dump")
  echo -e "$arm\t$total instructions\t$((total / N)) per call\t($done_line)"
  if [ -n "${PROFILE:-}" ]; then
    callgrind_annotate --inclusive=yes "$dump" 2>/dev/null | sed -n '1,60p' | cut -c1-200
  fi
done
