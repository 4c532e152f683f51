#!/usr/bin/env bash
# Side-by-side proxy benchmark: direct vs nginx vs gov-agent in front of the same
# hello-world upstream (performance.md sections 3.4 and 5).
#
# Placement: vCPU0 = load generator; vCPU1 = upstream + proxy under test (a sidecar
# shares its service's core). Runs are interleaved (direct, nginx, gov-agent, direct,
# ...), and the summary quotes medians of per-run values and ratios.
#
#   bench/proxy.sh                 # RUNS=3, WRK_SECS=8, RATE_SECS=10, RATES="2000 8000"
#   RUNS=5 WRK_SECS=10 RATE_SECS=15 bench/proxy.sh
#   DECISION_LOG=1 ARMS="direct gov-agent" bench/proxy.sh   # + the agent with --decision-log
#
# Needs: nginx and wrk (`apt-get install -y nginx wrk`; add an `exit 101`
# /usr/sbin/policy-rc.d first so that nginx does not start on port 80), taskset,
# python3. The fixed-rate generator is agents/agent/benches/proxy_load.rs (open loop,
# latency measured from the scheduled send time, like `oha --latency-correction`).
# Results go to stdout and to $OUT (default target/bench-proxy/results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
WRK_SECS=${WRK_SECS:-8}
RATE_SECS=${RATE_SECS:-10}
RATES=${RATES:-"2000 8000"}
CONNS=${CONNS:-16}
WORK=${WORK:-target/bench-proxy}
OUT=${OUT:-$WORK/results.tsv}
UP=127.0.0.1:18080 NGINX=127.0.0.1:18081 AGENT=127.0.0.1:18082 ADMIN=127.0.0.1:18083
HYPER=127.0.0.1:18084 BEFORE=127.0.0.1:18085 BEFORE_ADMIN=127.0.0.1:18086
LOGGED=127.0.0.1:18087 LOGGED_ADMIN=127.0.0.1:18088
# The arms, interleaved in this order. `hyper` is a reference: hyper's server in front
# of hyper-util's pooled client with nothing else (performance.md section 3.2's
# "naive hyper proxy"), to show what hyper alone costs on this box.
ARMS=${ARMS:-"direct nginx hyper gov-agent"}
# BEFORE_BIN=path/to/an/older/gov-agent adds an arm `before`, interleaved with the
# others, for a before/after comparison of a change under the same load.
BEFORE_BIN=${BEFORE_BIN:-}
if [ -n "$BEFORE_BIN" ]; then ARMS="$ARMS before"; fi
# The before arm's config: the wire shape before issue 20 (policy-before.yaml,
# below) unless BEFORE_CONFIG=policy.yaml, for a BEFORE_BIN built after it.
BEFORE_CONFIG=${BEFORE_CONFIG:-policy-before.yaml}
# DECISION_LOG=1 adds an arm `gov-agent-log`: the same agent and policy with
# `--decision-log` at 100% sampling (the file in $WORK, rotated at 64 MiB).
DECISION_LOG=${DECISION_LOG:-}
if [ -n "$DECISION_LOG" ]; then ARMS="$ARMS gov-agent-log"; fi

for tool in nginx wrk taskset python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y nginx wrk)" >&2; exit 1; }
done
mkdir -p "$WORK"

# shellcheck source=bench/common.sh
source bench/common.sh

# The upstream: hyper hello world on vCPU1.
taskset -c 1 "$LOAD" upstream "$UP" & pids+=($!)

# nginx peer: one worker on vCPU1, upstream keepalive, no access log.
cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
worker_cpu_affinity 10;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server $UP; keepalive 64; }
  server {
    listen $NGINX;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
taskset -c 1 nginx -c "$PWD/$WORK/nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!

# gov-agent with a realistic policy that admits everything of this load: a bulkhead,
# with a per-call timeout, a per-consumer call and byte limit and a fuse, all matching
# every call.
cat > "$WORK/policy.yaml" <<'POLICY'
service: hello
version: bench-v1
consumer_header: x-gov-consumer
rules:
  - name: hello/all_calls
    on: { any: true }
    mode: MODE_ENFORCE
    bulkhead:
      max_concurrent: 1000
      max_wait_ms: 10
      timeout_ms: 5000
      reject_status: 408
      reject_grpc_status: GRPC_CODE_UNAVAILABLE
  - name: hello/per_consumer
    on: { any: true }
    mode: MODE_ENFORCE
    limit:
      key: LIMIT_KEY_CONSUMER
      calls: { amount: 1000000000, window_ms: 1000 }
      bytes: { amount: 1000000000000, window_ms: 60000 }
      reject_status: 429
      reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED
  - name: hello/errors
    on: { any: true }
    mode: MODE_ENFORCE
    fuse:
      trips:
        - { metric: TRIP_METRIC_ERROR_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 10000, min_calls: 100 }
      business: { status: [{ from: 500, to: 599 }] }
      system: { connect_failure: true, timeout: true, reset: true }
      recover: { manual: true }
      reject_status: 503
      reject_grpc_status: GRPC_CODE_UNAVAILABLE
POLICY
# The same policy in the wire shape before issue 20 (one list per kind), for a
# BEFORE_BIN built from a commit before it.
cat > "$WORK/policy-before.yaml" <<'POLICY'
service: hello
version: bench-v1
bulkheads:
  - rule: hello/all_calls
    on: { any: true }
    max_concurrent: 1000
    max_wait_ms: 10
    timeout_ms: 5000
limits:
  - rule: hello/per_consumer
    on: { any: true }
    key: LIMIT_KEY_CONSUMER
    calls: { amount: 1000000000, window_ms: 1000 }
    bytes: { amount: 1000000000000, window_ms: 60000 }
fuses:
  - rule: hello/errors
    on: { any: true }
    trips:
      - { metric: TRIP_METRIC_ERROR_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 10000, min_calls: 100 }
POLICY
taskset -c 1 "$LOAD" naive-proxy "$HYPER" "$UP" & pids+=($!)
HYPER_PID=$!

GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service hello --listen "$AGENT" --admin-listen "$ADMIN" \
  --upstream "$UP" --config "$WORK/policy.yaml" & pids+=($!)
AGENT_PID=$!
BEFORE_PID=""
if [ -n "$BEFORE_BIN" ]; then
  GOV_LOG=warn taskset -c 1 "$BEFORE_BIN" --service hello --listen "$BEFORE" --admin-listen "$BEFORE_ADMIN" \
    --upstream "$UP" --config "$WORK/$BEFORE_CONFIG" & pids+=($!)
  BEFORE_PID=$!
fi

LOGGED_PID=""
if [ -n "$DECISION_LOG" ]; then
  rm -f "$WORK"/decisions.jsonl*
  GOV_LOG=warn taskset -c 1 "$AGENT_BIN" --service hello --listen "$LOGGED" --admin-listen "$LOGGED_ADMIN" \
    --upstream "$UP" --config "$WORK/policy.yaml" --decision-log "$WORK/decisions.jsonl" & pids+=($!)
  LOGGED_PID=$!
fi

sleep 1
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -1)
curl -fsS "http://$AGENT/" >/dev/null && curl -fsS "http://$NGINX/" >/dev/null && curl -fsS "http://$UP/" >/dev/null \
  && curl -fsS "http://$HYPER/" >/dev/null

pid_of() { case $1 in direct) echo "";; nginx) echo "$NGINX_WORKER";; hyper) echo "$HYPER_PID";; gov-agent) echo "$AGENT_PID";; before) echo "$BEFORE_PID";; gov-agent-log) echo "$LOGGED_PID";; esac; }
url_of() { case $1 in direct) echo "http://$UP/";; nginx) echo "http://$NGINX/";; hyper) echo "http://$HYPER/";; gov-agent) echo "http://$AGENT/";; before) echo "http://$BEFORE/";; gov-agent-log) echo "http://$LOGGED/";; esac; }

echo -e "run\tarm\tmode\trps\tproxy_cpu_us_per_req\tp50_us\tp90_us\tp99_us\terrors" > "$OUT"
measure() { # arm mode -> one TSV line
  local arm=$1 mode=$2 url pid t0 t1 line rps n cpu p50="" p90="" p99="" errors=0
  url=$(url_of "$arm"); pid=$(pid_of "$arm")
  [ -n "$pid" ] && t0=$(ticks "$pid")
  if [ "$mode" = wrk ]; then
    line=$(taskset -c 0 wrk -t1 -c32 -d"${WRK_SECS}s" "$url")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$line")
    n=$(awk '/requests in/ {print $1}' <<<"$line")
    errors=$(awk '/Non-2xx|Socket errors/ {e+=$NF} END {print e+0}' <<<"$line")
  else
    line=$(taskset -c 0 "$LOAD" rate "$url" "$mode" "$RATE_SECS" "$CONNS")
    rps=$(sed -E 's/.*achieved_rps=([0-9.]+).*/\1/' <<<"$line")
    n=$(sed -E 's/.* ok=([0-9]+).*/\1/' <<<"$line")
    errors=$(sed -E 's/.*errors=([0-9]+).*/\1/' <<<"$line")
    p50=$(sed -E 's/.*p50_us=([0-9]+).*/\1/' <<<"$line")
    p90=$(sed -E 's/.*p90_us=([0-9]+).*/\1/' <<<"$line")
    p99=$(sed -E 's/.*p99_us=([0-9]+).*/\1/' <<<"$line")
  fi
  if [ -n "$pid" ]; then
    t1=$(ticks "$pid")
    cpu=$(python3 -c "print(round(($t1-$t0)/$HZ/$n*1e6, 2))")
  else
    cpu=""
  fi
  echo -e "$run\t$arm\t$mode\t$rps\t$cpu\t$p50\t$p90\t$p99\t$errors" | tee -a "$OUT"
}

echo "warm-up..." >&2
for arm in $ARMS; do taskset -c 0 wrk -t1 -c32 -d3s "$(url_of $arm)" >/dev/null; done

for run in $(seq 1 "$RUNS"); do
  for mode in wrk $RATES; do
    for arm in $ARMS; do
      measure "$arm" "$mode"
    done
  done
done

rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
if [ -n "$DECISION_LOG" ]; then
  curl -fsS "http://$LOGGED_ADMIN/metrics" | grep -E '^gov_agent_decision_log_[a-z_]+_total ' | tee -a "$OUT.log"
fi
echo -e "rss_kb\tnginx_worker\t$(rss "$NGINX_WORKER")\tgov-agent\t$(rss "$AGENT_PID")" | tee -a "$OUT.rss"

python3 - "$OUT" "$OUT.rss" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def val(run, arm, mode, key):
    for r in rows:
        if r["run"] == run and r["arm"] == arm and r["mode"] == mode and r[key] != "":
            return float(r[key])
    return None
runs = sorted({r["run"] for r in rows}); modes = list(dict.fromkeys(r["mode"] for r in rows))
med = lambda xs: st.median(xs) if xs else float("nan")
print("\nmedians over %d interleaved runs (ratios are medians of per-run ratios)" % len(runs))
for mode in modes:
    print(f"\n[{mode}]")
    for arm in ("direct", "nginx", "hyper", "gov-agent", "before", "gov-agent-log"):
        cols = {k: med([v for v in (val(r, arm, mode, k) for r in runs) if v is not None])
                for k in ("rps", "proxy_cpu_us_per_req", "p50_us", "p90_us", "p99_us", "errors")}
        print(f"  {arm:10} " + "  ".join(f"{k}={v:.1f}" for k, v in cols.items()))
    for arm, base in (("gov-agent", "nginx"), ("hyper", "nginx"), ("before", "nginx"), ("gov-agent", "before"), ("gov-agent-log", "gov-agent")):
        ratio = lambda k: med([val(r, arm, mode, k) / val(r, base, mode, k) for r in runs
                               if val(r, arm, mode, k) and val(r, base, mode, k)])
        print(f"  {arm}/{base}: throughput {ratio('rps'):.2f}x, cpu per request {ratio('proxy_cpu_us_per_req'):.2f}x")
    if mode != "wrk":
        added = lambda arm: med([val(r, arm, mode, "p50_us") - val(r, "direct", mode, "p50_us") for r in runs
                                 if val(r, arm, mode, "p50_us") is not None])
        p90 = lambda arm: med([val(r, arm, mode, "p90_us") / val(r, "nginx", mode, "p90_us") for r in runs
                               if val(r, arm, mode, "p90_us") and val(r, "nginx", mode, "p90_us")])
        print(f"  added p50 over direct: nginx {added('nginx'):.0f} us, gov-agent {added('gov-agent'):.0f} us;"
              f" p90 gov-agent/nginx {p90('gov-agent'):.2f}x")
print("\n" + open(sys.argv[2]).read().strip().splitlines()[-1])
PY
