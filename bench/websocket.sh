#!/usr/bin/env bash
# WebSocket messages through gov-agent against nginx (issue 37): both proxy the
# same echo upstream (bench/ws_echo.py, stdlib Python: a 101, then bytes echoed),
# gov-agent with a rule on the upgrade path (a limit nobody reaches), nginx with
# `proxy_pass` and the upgrade headers. The client keeps CONNS WebSockets open,
# each sending a SIZE-byte frame and waiting for its echo (closed loop), for SECS.
# Rows per arm, interleaved per run (arm order rotates), medians of per-run
# values and of per-run ratios to nginx: messages/s and the proxy's CPU per
# message (utime+stime of its processes / messages).
#
# Placement as bench/peers.sh: vCPU0 = load generator; vCPU1 = upstream + proxy.
# The Python client and upstream bound the rate (the same for both arms): the CPU
# per message is the proxy's own cost.
#
#   bench/websocket.sh                  # RUNS=5 SECS=8 CONNS=16 SIZE=32
# Needs: nginx, taskset, python3. AGENT_BIN: a built gov-agent (default: builds
# the release one). Results: stdout and $OUT (target/bench-websocket/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
SECS=${SECS:-8}
CONNS=${CONNS:-16}
SIZE=${SIZE:-32}
WORK=${WORK:-target/bench-websocket}
OUT=${OUT:-$WORK/results.tsv}
LOAD_CPUS=${LOAD_CPUS:-0}
PROXY_CPUS=${PROXY_CPUS:-1}
UP=18280
declare -A PORT=([nginx]=18281 [gov]=18283)

for tool in nginx taskset python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
if [ -z "${AGENT_BIN:-}" ]; then
  echo "building the agent (release)..." >&2
  cargo build --release -j2 -q -p gov-agent --bin gov-agent
  AGENT_BIN=target/release/gov-agent
fi
mkdir -p "$WORK/logs"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

taskset -c "$PROXY_CPUS" python3 bench/ws_echo.py upstream "$UP" & pids+=($!)

cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:${PORT[nginx]};
    location / {
      proxy_pass http://127.0.0.1:$UP;
      proxy_http_version 1.1;
      proxy_set_header Upgrade \$http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_read_timeout 1h;
    }
  }
}
NGINX
taskset -c "$PROXY_CPUS" nginx -c "$PWD/$WORK/nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!

cat > "$WORK/gov.yaml" <<POLICY
service: bench
version: ws-v1
consumer_header: x-gov-consumer
rules:
  - name: bench/ws
    on: { path: { kind: PATH_KIND_PREFIX, value: "/ws" } }
    mode: MODE_ENFORCE
    limit: { key: LIMIT_KEY_ALL, calls: { amount: 1000000000, window_ms: 1000 }, reject_status: 429, reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED }
POLICY
GOV_LOG=warn taskset -c "$PROXY_CPUS" "$AGENT_BIN" --service bench --listen "127.0.0.1:${PORT[gov]}" \
  --admin-listen 127.0.0.1:18289 --upstream "127.0.0.1:$UP" --config "$WORK/gov.yaml" \
  >"$WORK/logs/gov.log" 2>&1 & pids+=($!)
declare -A PID=([gov]=$!)
sleep 1.5
PID[nginx]=$(pgrep -P "$NGINX_MASTER" | tr '\n' ' ')
arm_ticks() { local t=0 p; for p in ${PID[$1]}; do t=$((t + $(ticks "$p"))); done; echo "$t"; }

ARMS=(nginx gov)
echo -e "run\tarm\tmessages\tsecs\tmsgs_per_s\tcpu_us_per_msg" >"$OUT"
# Warm-up: one short run each.
for arm in "${ARMS[@]}"; do
  taskset -c "$LOAD_CPUS" python3 bench/ws_echo.py load "127.0.0.1:${PORT[$arm]}" /ws "$CONNS" 2 "$SIZE" >/dev/null
done
for run in $(seq 1 "$RUNS"); do
  order=("${ARMS[@]}")
  if [ $((run % 2)) -eq 0 ]; then order=(gov nginx); fi
  for arm in "${order[@]}"; do
    t0=$(arm_ticks "$arm")
    line=$(taskset -c "$LOAD_CPUS" python3 bench/ws_echo.py load "127.0.0.1:${PORT[$arm]}" /ws "$CONNS" "$SECS" "$SIZE")
    t1=$(arm_ticks "$arm")
    msgs=$(sed -E 's/.*messages=([0-9]+).*/\1/' <<<"$line")
    secs=$(sed -E 's/.*secs=([0-9.]+).*/\1/' <<<"$line")
    python3 - "$run" "$arm" "$msgs" "$secs" "$t0" "$t1" "$HZ" >>"$OUT" <<'PY'
import sys
run, arm, msgs, secs, t0, t1, hz = sys.argv[1:]
msgs, secs = int(msgs), float(secs)
cpu_us = (int(t1) - int(t0)) / int(hz) * 1e6
print(f"{run}\t{arm}\t{msgs}\t{secs:.3f}\t{msgs / secs:.0f}\t{cpu_us / max(msgs, 1):.2f}")
PY
    tail -n1 "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import csv, statistics as st, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
runs = sorted({r["run"] for r in rows})
val = lambda run, arm, k: next(float(r[k]) for r in rows if r["run"] == run and r["arm"] == arm)
print("\nmedians over %d interleaved runs; x = median of per-run ratios to nginx" % len(runs))
for arm in ("nginx", "gov"):
    mps = st.median(val(r, arm, "msgs_per_s") for r in runs)
    cpu = st.median(val(r, arm, "cpu_us_per_msg") for r in runs)
    line = f"{arm:6s} {mps:9.0f} msgs/s  {cpu:6.2f} us CPU/msg"
    if arm != "nginx":
        rm = st.median(val(r, arm, "msgs_per_s") / val(r, "nginx", "msgs_per_s") for r in runs)
        rc = st.median(val(r, arm, "cpu_us_per_msg") / val(r, "nginx", "cpu_us_per_msg") for r in runs)
        line += f"  | vs nginx: msgs/s {rm:.2f}x  cpu/msg {rc:.2f}x"
    print(line)
PY
