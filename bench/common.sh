# Shared by bench/proxy.sh and bench/overload.sh (sourced, not run): builds the
# release agent and the load tool, and tracks the processes a script starts.
#
# Sets AGENT_BIN and LOAD (agents/sidecar/benches/proxy_load.rs: the hello-world upstream,
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
