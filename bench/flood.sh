#!/usr/bin/env bash
# gov-agent's resident memory before, during and after floods (issue 27): at
# rest, then an h2c flood (bench/h2flood.py: many connections, streams with 150
# and 90 header fields, every other stream reset at once), then an HTTP/1 flood
# (wrk, 1,000 connections, 8 KiB of headers a request), then at rest again,
# sampled for SETTLE seconds. Prints one line per sample: seconds, phase, RSS.
#
#   AGENT_BIN=target/release/gov-agent bash bench/flood.sh
#
# The upstream is nginx on loopback (`return 200`), started here with its own
# config; the agent enforces the peers' policy on /api/ (bench/common.sh) with
# its default worker threads. Needs nginx, wrk, python3. Results: stdout and
# $OUT (target/bench-flood/rss.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

CONNS=${CONNS:-200}
STREAMS=${STREAMS:-300}
ROUNDS=${ROUNDS:-3}
SETTLE=${SETTLE:-60}
WORK=${WORK:-target/bench-flood}
OUT=${OUT:-$WORK/rss.tsv}
UP=127.0.0.1:18580
PORT=18583
for tool in nginx wrk python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
[ -n "${AGENT_BIN:-}" ] || { echo "set AGENT_BIN to a release gov-agent" >&2; exit 1; }
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

cat > "$WORK/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx-body;
  large_client_header_buffers 8 16k;
  server { listen $UP; keepalive_requests 100000; location / { return 200 "ok\n"; } }
}
NGINX
nginx -c "$WORK/nginx.conf" -p "$WORK" & pids+=($!)

cat > "$WORK/policy.yaml" <<POLICY
service: hello
version: bench-flood
consumer_header: x-gov-consumer
rules:
  - name: hello/bulk_api
    on: { path: { kind: PATH_KIND_PREFIX, value: "/api/" } }
    mode: MODE_ENFORCE
    bulkhead: { max_concurrent: 256, max_wait_ms: 0, timeout_ms: 30000, reject_status: 503, reject_grpc_status: GRPC_CODE_UNAVAILABLE }
POLICY
GOV_LOG=warn "$AGENT_BIN" --service hello --listen "127.0.0.1:$PORT" \
  --admin-listen "127.0.0.1:$((PORT + 1))" --upstream "$UP" --upstream-protocol downstream \
  --config "$WORK/policy.yaml" & pids+=($!)
AGENT=$!
sleep 2

T0=$(date +%s.%N)
rss() { awk '/^VmRSS/ {print $2}' "/proc/$AGENT/status"; }
sample() { # phase
  printf '%.1f\t%s\t%s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$1" "$(rss)" | tee -a "$OUT"
}
echo -e "secs\tphase\trss_kib" > "$OUT"
# Warm up with ordinary traffic, then rest.
wrk -t 2 -c 16 -d 3s "http://127.0.0.1:$PORT/api/x" >/dev/null
sleep 3
sample rest
PAD=$(head -c 8000 /dev/zero | tr '\0' 'p')
PEAK=0
watch_peak() { while sleep 0.5; do r=$(rss); echo "$r"; done; }
watch_peak > "$WORK/peak.txt" & WATCH=$!
pids+=($WATCH)
for round in $(seq 1 "$ROUNDS"); do
  python3 bench/h2flood.py 127.0.0.1 "$PORT" "$CONNS" "$STREAMS"
  sample "h2c flood $round"
done
wrk -t 2 -c 1000 -d 10s -H "x-pad: $PAD" "http://127.0.0.1:$PORT/api/x" | grep -E 'Requests/sec|responses' || true
sample "http/1 flood"
kill "$WATCH" 2>/dev/null || true
PEAK=$(sort -n "$WORK/peak.txt" | tail -1)
echo -e "peak\t$PEAK" | tee -a "$OUT"
for s in $(seq 10 10 "$SETTLE"); do
  sleep 10
  sample "after ${s}s"
done
