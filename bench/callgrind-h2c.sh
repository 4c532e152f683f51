#!/usr/bin/env bash
# User-space instructions per h2c call of gov-agent builds, counted by callgrind:
# load-independent, so a before/after on a busy box means something where CPU
# time does not (BENCHMARKS.md, issue 27). Per binary: the agent (one worker
# thread, bench/h2load.sh's policy) under valgrind in front of the load tool's
# upstream, 2,000 h2c calls to warm up, the counters zeroed, then
# `h2load -n N -c 4 -m 16` on /api/x, dumped; prints instructions per call.
#
#   LOAD=path/to/proxy_load bash bench/callgrind-h2c.sh path/to/gov-agent [path/to/other/gov-agent ...]
#   GRPC=1 ...   the same with unary gRPC calls (a 5-byte message each, as peers.sh's)
#
# Needs valgrind (callgrind_control), h2load, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
WORK=${WORK:-target/bench-callgrind}
[ -n "${LOAD:-}" ] || { echo "set LOAD to a built proxy_load (bench/common.sh builds one)" >&2; exit 1; }
for tool in valgrind callgrind_control h2load curl; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
mkdir -p "$WORK"
# shellcheck source=bench/common.sh
AGENT_BIN=${1:?name at least one gov-agent binary} source bench/common.sh
api_policy "$WORK/policy.yaml" bench-callgrind
printf '\0\0\0\0\5hello' > "$WORK/grpc-body"
load() { # N: h2load's closed loop, h2c or unary gRPC
  if [ -n "${GRPC:-}" ]; then
    h2load -n "$1" -c 4 -m 16 -d "$WORK/grpc-body" -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://127.0.0.1:$PORT/api/hello.Greeter/SayHello"
  else
    h2load -n "$1" -c 4 -m 16 "http://127.0.0.1:$PORT/api/x"
  fi
}
UP=127.0.0.1:18780
PORT=18783
"$LOAD" upstream "$UP" & pids+=($!)
i=0
for bin in "$@"; do
  i=$((i + 1))
  out="$WORK/cg.$i.out"
  rm -f "$out" "$out".*
  GOV_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --service hello \
    --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$((PORT + 1))" --upstream "$UP" \
    --upstream-protocol downstream --worker-threads 1 --config "$WORK/policy.yaml" 2>"$WORK/vg.$i.log" &
  vg=$!
  for _ in $(seq 1 120); do
    curl -s --http2-prior-knowledge -o /dev/null "http://127.0.0.1:$PORT/api/x" && break
    sleep 0.5
  done
  load 2000 >/dev/null
  callgrind_control -z "$vg" >/dev/null
  load "$N" | grep -E '^requests:'
  callgrind_control -d "$vg" >/dev/null
  sleep 1
  kill "$vg"; wait "$vg" 2>/dev/null || true
  total=$(awk '/^totals:/ {print $2}' "$out.1")
  echo -e "$bin\t$total instructions\t$((total / N)) per call"
done
