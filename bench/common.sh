# Shared by bench/proxy.sh and bench/overload.sh (sourced, not run): builds the
# release agent and the load tool, and tracks the processes a script starts.
#
# Sets AGENT_BIN and LOAD (agents/agent/benches/proxy_load.rs: the hello-world upstream,
# the fixed-rate generator and the reference proxies), `pids` with an EXIT trap
# that stops them, and `ticks PID` (utime+stime in clock ticks) with HZ.

# AGENT_BIN may name another build (e.g. of an older commit, for a before/after
# run) and LOAD a built load tool: then neither is built here.
if [ -z "${AGENT_BIN:-}" ]; then
  echo "building the agent (release)..." >&2
  cargo build --release -j2 -q -p gov-agent --bin gov-agent
  AGENT_BIN=target/release/gov-agent
fi
if [ -z "${LOAD:-}" ]; then
  echo "building the load tool (release)..." >&2
  LOAD=$(cargo bench -j2 -q -p gov-agent --bench proxy_load --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="proxy_load" and m.get("executable"):
        print(m["executable"])')
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# api_policy FILE VERSION: gov-agent's config for the peers' /api/ rules (a
# bulkhead of 256, no waiting, and a limit nobody reaches), as bench/peers.sh
# writes them for nginx and HAProxy too; used by profile.sh and h2load.sh.
api_policy() {
  cat > "$1" <<POLICY
service: hello
version: $2
consumer_header: x-gov-consumer
rules:
  - name: hello/bulk_api
    on: { path: { kind: PATH_KIND_PREFIX, value: "/api/" } }
    mode: MODE_ENFORCE
    bulkhead: { max_concurrent: 256, max_wait_ms: 0, timeout_ms: 30000, reject_status: 503, reject_grpc_status: GRPC_CODE_UNAVAILABLE }
  - name: hello/rate_api
    on: { path: { kind: PATH_KIND_PREFIX, value: "/api/" } }
    mode: MODE_ENFORCE
    limit: { key: LIMIT_KEY_ALL, calls: { amount: 1000000000, window_ms: 1000 }, reject_status: 429, reject_grpc_status: GRPC_CODE_RESOURCE_EXHAUSTED }
POLICY
}
