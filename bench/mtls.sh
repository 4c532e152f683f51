#!/usr/bin/env bash
# An agent-to-agent call over mutual TLS (issue 29) against nginx proxying to
# an mTLS upstream, in one run: CPU per request of the two proxies together
# (the caller's and the callee's) and the p50/p99 they add over calling the
# upstream directly, with wrk (HTTP/1.1 keep-alive from the client; the hop
# between the two proxies is pooled): one connection (the latency of a call,
# unloaded) and CONNS connections (throughput and CPU per request).
#
# Arms (each a pair: a caller-side proxy in front of a callee-side proxy,
# in front of the same hello-world upstream):
#   gov-mtls     gov-agent --outbound-mtls always (a `web` certificate) ->
#                gov-agent --inbound-mtls require (an `inv` certificate),
#                `consumer from peer`: the callee verifies the caller and
#                writes its service as the consumer
#   gov-plain    the same two agents without TLS (`consumer from header`)
#   nginx-mtls   nginx proxy_pass https:// with proxy_ssl_certificate,
#                proxy_ssl_verify on and session reuse -> nginx `ssl_verify_client on`
#   nginx-plain  the same two nginx without TLS
# The certificates (P-256, one CA) carry a SPIFFE URI SAN for gov and a DNS
# SAN for nginx's proxy_ssl_verify.
#
#   bench/mtls.sh                  # RUNS=5 SECS=8 CONNS=16
# Needs: nginx, wrk, openssl, taskset, python3. Results: stdout and $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
SECS=${SECS:-8}
CONNS=${CONNS:-16}
ROWS="c1 c$CONNS"
WORK=${WORK:-target/bench-mtls}
OUT=${OUT:-$WORK/results.tsv}
ARMS="gov-mtls gov-plain nginx-mtls nginx-plain"
UP=127.0.0.1:18280
# Caller-side port of each arm; the callee side listens at +1 (+2: admin).
declare -A PORT=([gov-mtls]=18281 [gov-plain]=18287 [nginx-mtls]=18293 [nginx-plain]=18295)

for tool in nginx wrk openssl taskset python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
mkdir -p "$WORK"
# wrk is the load; the upstream is an nginx of its own (a hello-world answer):
# no load tool to build.
LOAD=${LOAD:-none}
# shellcheck source=bench/common.sh
source bench/common.sh

# vCPU0: the load generator; vCPU1: the upstream and every proxy (a sidecar
# shares its service's core).
PROXY_CPUS=1 LOAD_CPUS=0
cat > "$WORK/upstream.conf" <<NGINX
worker_processes 1;
pid $PWD/$WORK/upstream.pid;
error_log $PWD/$WORK/upstream-error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen $UP; location / { return 200 "hello world\n"; } }
}
NGINX
taskset -c "$PROXY_CPUS" nginx -c "$PWD/$WORK/upstream.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)

# One CA; `web` and `inv` certificates for both gov (URI SAN) and nginx (DNS SAN).
pki=$WORK/pki
mkdir -p "$pki"
openssl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key" 2>/dev/null
openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=bench CA" -days 2 -out "$pki/ca.pem" 2>/dev/null
for svc in web inv; do
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$svc.ec" 2>/dev/null
  openssl pkcs8 -topk8 -nocrypt -in "$pki/$svc.ec" -out "$pki/$svc.key"
  openssl req -new -key "$pki/$svc.key" -subj "/CN=$svc" -out "$pki/$svc.csr" 2>/dev/null
  printf 'subjectAltName=URI:spiffe://bench.example/service/%s,DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$svc" "$svc" > "$pki/$svc.ext"
  openssl x509 -req -in "$pki/$svc.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$svc.ext" -out "$pki/$svc.pem" 2>/dev/null
done

# The callee's configs: consumer from peer (mTLS), from the header (plain).
cat > "$WORK/peer.yaml" <<YAML
service: inv
version: bench-mtls
consumer_header: x-gov-consumer
consumer_source: { peer: { on_invalid: ON_INVALID_REJECT } }
YAML
cat > "$WORK/plain.yaml" <<YAML
service: inv
version: bench-plain
consumer_header: x-gov-consumer
YAML

declare -A PID
start_pair_gov() { # arm tls(0|1)
  local port=${PORT[$1]} callee=$((PORT[$1] + 1)) tls=() caller_tls=()
  if [ "$2" = 1 ]; then
    tls=(--inbound-mtls require --tls-cert "$pki/inv.pem" --tls-key "$pki/inv.key" --peer-ca "$pki/ca.pem")
    caller_tls=(--outbound-mtls always --tls-cert "$pki/web.pem" --tls-key "$pki/web.key" --peer-ca "$pki/ca.pem")
  fi
  GOV_LOG=warn taskset -c "$PROXY_CPUS" "$AGENT_BIN" --service inv --listen "127.0.0.1:$callee" \
    --admin-listen "127.0.0.1:$((callee + 1))" --upstream "$UP" --worker-threads 1 \
    --config "$WORK/$([ "$2" = 1 ] && echo peer || echo plain).yaml" "${tls[@]}" & pids+=($!)
  PID[$1]=$!
  GOV_LOG=warn taskset -c "$PROXY_CPUS" "$AGENT_BIN" --service web --listen "127.0.0.1:$((callee + 2))" \
    --admin-listen "127.0.0.1:$((callee + 3))" --outbound-listen "127.0.0.1:$port" \
    --upstream "$UP" --worker-threads 1 --instances "inv=127.0.0.1:$callee" "${caller_tls[@]}" & pids+=($!)
  PID[$1]="${PID[$1]} $!"
}
start_pair_gov gov-mtls 1
start_pair_gov gov-plain 0

cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
pid $PWD/$WORK/nginx.pid;
error_log $PWD/$WORK/nginx-error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server $UP; keepalive 64; }
  upstream callee_tls { server 127.0.0.1:$((PORT[nginx-mtls] + 1)); keepalive 64; }
  upstream callee_plain { server 127.0.0.1:$((PORT[nginx-plain] + 1)); keepalive 64; }
  # Caller sides.
  server {
    listen 127.0.0.1:${PORT[nginx-mtls]};
    location / {
      proxy_pass https://callee_tls; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_ssl_certificate $PWD/$pki/web.pem; proxy_ssl_certificate_key $PWD/$pki/web.key;
      proxy_ssl_trusted_certificate $PWD/$pki/ca.pem; proxy_ssl_verify on; proxy_ssl_name inv;
      proxy_ssl_server_name on; proxy_ssl_session_reuse on;
    }
  }
  server {
    listen 127.0.0.1:${PORT[nginx-plain]};
    location / { proxy_pass http://callee_plain; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  # Callee sides.
  server {
    listen 127.0.0.1:$((PORT[nginx-mtls] + 1)) ssl;
    ssl_certificate $PWD/$pki/inv.pem; ssl_certificate_key $PWD/$pki/inv.key;
    ssl_client_certificate $PWD/$pki/ca.pem; ssl_verify_client on;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:$((PORT[nginx-plain] + 1));
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
taskset -c "$PROXY_CPUS" nginx -c "$PWD/$WORK/nginx.conf" -p "$PWD/$WORK" -g 'daemon off;' & pids+=($!)
NGINX_MASTER=$!
sleep 1.5
# nginx: one worker serves both sides of each nginx arm (one process does the
# work of the two proxies), so both nginx arms count the same worker; they
# are measured one at a time.
PID[nginx-mtls]=$(pgrep -P "$NGINX_MASTER" | tr '\n' ' ')
PID[nginx-plain]=${PID[nginx-mtls]}
for arm in $ARMS; do
  curl -fsS -H 'Host: inv' "http://127.0.0.1:${PORT[$arm]}/api/x" >/dev/null \
    || { echo "$arm does not answer" >&2; exit 1; }
done

arm_ticks() { local t=0 p; for p in ${PID[$1]}; do t=$((t + $(ticks "$p"))); done; echo "$t"; }
# wrk's figures: requests/s, requests, p50 and p99 in us, non-2xx and socket errors.
wrk_line() { # url conns
  taskset -c "$LOAD_CPUS" wrk -t1 -c"$2" -d"${SECS}s" --latency -H 'Host: inv' "$1" | python3 -c '
import re, sys
t = sys.stdin.read()
us = lambda v, u: float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[u]
pct = {p: us(v, u) for p, v, u in re.findall(r"^\s+(50|99)(?:\.000)?%\s+([\d.]+)(us|ms|s)$", t, re.M)}
rps = re.search(r"Requests/sec:\s+([\d.]+)", t).group(1)
n = re.search(r"(\d+) requests in", t).group(1)
errs = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", t)) + \
       sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", t))
print(rps, n, pct.get("50", "nan"), pct.get("99", "nan"), errs)'
}
echo -e "run\tarm\trow\trps\tcpu_us_per_req\tp50_us\tp99_us\terrors" > "$OUT"
measure() { # arm row
  local t0 t1 rps n p50 p99 errs
  t0=$(arm_ticks "$1")
  read -r rps n p50 p99 errs < <(wrk_line "http://127.0.0.1:${PORT[$1]}/api/x" "${2#c}")
  t1=$(arm_ticks "$1")
  echo -e "$run\t$1\t$2\t$rps\t$(python3 -c "print(round(($t1-$t0)/$HZ/max($n,1)*1e6, 2))")\t$p50\t$p99\t$errs" | tee -a "$OUT"
}
direct() { # row
  local rps n p50 p99 errs
  read -r rps n p50 p99 errs < <(wrk_line "http://$UP/api/x" "${1#c}")
  echo -e "$run\tdirect\t$1\t$rps\t\t$p50\t$p99\t$errs" | tee -a "$OUT"
}

arms=($ARMS)
for arm in $ARMS; do taskset -c "$LOAD_CPUS" wrk -t1 -c4 -d1s -H 'Host: inv' "http://127.0.0.1:${PORT[$arm]}/api/x" >/dev/null; done
for run in $(seq 1 "$RUNS"); do
  for row in $ROWS; do
    direct "$row"
    for i in "${!arms[@]}"; do measure "${arms[$(( (i + run) % ${#arms[@]} ))]}" "$row"; done
  done
done

python3 - "$OUT" "$ARMS" <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
arms = sys.argv[2].split()
runs = sorted({r["run"] for r in rows})
def val(run, arm, rate, key):
    for r in rows:
        if r["run"] == run and r["arm"] == arm and r["row"] == rate and r[key] != "":
            return float(r[key])
    return None
med = lambda xs: st.median(xs) if xs else float("nan")
print("\nmedians over %d interleaved runs; ratios are medians of per-run ratios" % len(runs))
for rate in dict.fromkeys(r["row"] for r in rows):
    print(f"\n[{rate}: wrk, {rate[1:]} connection(s)]")
    for arm in arms:
        cpu = [v for v in (val(r, arm, rate, "cpu_us_per_req") for r in runs) if v is not None]
        add = [val(r, arm, rate, k) - val(r, "direct", rate, k) for r in runs for k in ("p50_us",)
               if val(r, arm, rate, k) is not None and val(r, "direct", rate, k) is not None]
        add99 = [val(r, arm, rate, "p99_us") - val(r, "direct", rate, "p99_us") for r in runs
                 if val(r, arm, rate, "p99_us") is not None and val(r, "direct", rate, "p99_us") is not None]
        errs = sum(val(r, arm, rate, "errors") or 0 for r in runs)
        rps = [v for v in (val(r, arm, rate, "rps") for r in runs) if v is not None]
        line = f"  {arm:12} {med(rps):8.0f} req/s  cpu {med(cpu):7.2f} us/req  added p50 +{med(add):.0f} us  p99 +{med(add99):.0f} us  errors {errs:.0f}"
        peer = {"gov-mtls": "nginx-mtls", "gov-plain": "nginx-plain"}.get(arm)
        if peer:
            ratio = [val(r, arm, rate, "cpu_us_per_req") / val(r, peer, rate, "cpu_us_per_req") for r in runs
                     if val(r, arm, rate, "cpu_us_per_req") and val(r, peer, rate, "cpu_us_per_req")]
            line += f"  | cpu {med(ratio):.2f}x {peer}"
        if arm.endswith("-mtls"):
            plain = arm.replace("-mtls", "-plain")
            extra = [val(r, arm, rate, "cpu_us_per_req") - val(r, plain, rate, "cpu_us_per_req") for r in runs
                     if val(r, arm, rate, "cpu_us_per_req") and val(r, plain, rate, "cpu_us_per_req")]
            line += f"  | mTLS adds {med(extra):.2f} us/req"
        print(line)
PY
