#!/usr/bin/env python3
# Writes a synthetic decision log for `govc replay` throughput (BENCHMARKS.md,
# "The decision log and govc replay"): python3 bench/decision-log-gen.py N RATE FILE
# A synthetic decision log: N calls at RATE per second to the policy of
# cli/tests/replay.rs (three consumers; a limited, a flaky and a slow path).
import json, random, sys
n = int(sys.argv[1]); rate = int(sys.argv[2]); random.seed(14)
t0 = 1_796_000_000_000_000
paths = [("/api/x", "order/per_consumer", 0.7), ("/flaky/ok", "order/flaky_fuse", 0.1),
         ("/flaky/err", "order/flaky_fuse", 0.05), ("/slow/x", "order/slow_calls", 0.15)]
out = open(sys.argv[3], "w")
t = t0 + 1000
for i in range(n):
    t += int(random.expovariate(rate) * 1e6)
    r = random.random(); acc = 0
    for path, rule, share in paths:
        acc += share
        if r <= acc: break
    lat = random.randint(200, 30_000) if path.startswith("/slow") else random.randint(100, 3000)
    status = 500 if path == "/flaky/err" else 200
    rec = {"v": 1, "t_us": t, "service": "order", "instance": "order-1", "direction": "inbound",
           "consumer": random.choice(["crm", "erp", "ops"]), "method": "GET", "path": path,
           "target": None, "upstream": None, "headers": [], "request_bytes": 0, "response_bytes": 3,
           "status": status, "outcome": "response", "latency_us": lat, "config": "805935c675670386",
           "rules": [{"rule": rule, "decision": "admitted"}], "shadow": []}
    if i == 0:
        rec["epochs"] = [{"rule": "order/per_consumer", "t_us": t0}, {"rule": "order/flaky_fuse", "t_us": t0}]
    out.write(json.dumps(rec, separators=(",", ":")) + "\n")
