#!/usr/bin/env bash
# Where the fixed-rate HTTP/2 gap to nginx is (issue 37): CPU per request and
# system calls per request (strace -c) of gov-agent (the peers' policy on /api/;
# `--upstream-protocol downstream` and `http1`) and nginx (h2c in, HTTP/1.1 out,
# as bench/peers.sh's nginx), each alone at RATE h2c calls/s over 4 connections.
# CPU is taken without strace (SECS), the calls with it (a second run, 4 s):
# strace slows what it traces, not what it counts.
#
#   RATE=2000 SECS=6 bench/h2-syscalls.sh
#
# Placement: the generator on vCPU0, the upstream and the proxy on vCPU1.
# Needs nginx and strace (apt-get install -y nginx strace).
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${RATE:-2000}
SECS=${SECS:-6}
WORK=${WORK:-target/bench-h2-syscalls}
UP=127.0.0.1:18280
for tool in nginx strace taskset python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y nginx strace)" >&2; exit 1; }
done
mkdir -p "$WORK"
# shellcheck source=bench/common.sh
source bench/common.sh
api_policy "$WORK/policy.yaml" bench-syscalls
cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log error;
events {}
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server $UP; keepalive 64; }
  server {
    listen 127.0.0.1:18291 http2;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX

taskset -c 1 "$LOAD" upstream "$UP" & pids+=($!)
taskset -c 1 nginx -c "$PWD/$WORK/nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!
declare -A PID PORT=([nginx]=18291 [gov-downstream]=18283 [gov-http1]=18285)
for proto in downstream http1; do
  port=${PORT[gov-$proto]}
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service hello --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$((port + 1))" --upstream "$UP" --upstream-protocol "$proto" \
    --config "$WORK/policy.yaml" & pids+=($!)
  PID[gov-$proto]=$!
done
sleep 1.5
PID[nginx]=$(pgrep -P "$NGINX_MASTER")

field() { sed -E "s/.*[ ^]$1=([0-9.]+).*/\1/" <<<" $2"; }
printf '%-16s %12s %14s %s\n' arm cpu_us/req syscalls/req "calls per request by name"
for arm in nginx gov-downstream gov-http1; do
  url="http://127.0.0.1:${PORT[$arm]}/api/x"
  taskset -c 0 "$LOAD" rate-h2 "$url" "$RATE" 2 4 >/dev/null
  t0=$(ticks "${PID[$arm]}")
  line=$(taskset -c 0 "$LOAD" rate-h2 "$url" "$RATE" "$SECS" 4)
  t1=$(ticks "${PID[$arm]}")
  cpu=$(python3 -c "print(round(($t1 - $t0) / $HZ / max($(field ok "$line"), 1) * 1e6, 1))")
  timeout 5 strace -c -f -p "${PID[$arm]}" -o "$WORK/strace-$arm.txt" 2>/dev/null & tracer=$!
  sleep 0.3
  line=$(taskset -c 0 "$LOAD" rate-h2 "$url" "$RATE" 4 4)
  wait "$tracer" || true
  ok=$(field ok "$line")
  per=$(awk -v n="$ok" '$NF == "total" {printf "%.1f", $4 / n}' "$WORK/strace-$arm.txt")
  names=$(awk -v n="$ok" 'NR > 2 && $1 !~ /^-/ && $NF != "total" && ($4 / n) >= 0.05 {printf "%s %.2f  ", $NF, $4 / n}' "$WORK/strace-$arm.txt")
  printf '%-16s %12s %14s %s\n' "$arm" "$cpu" "$per" "$names"
done
