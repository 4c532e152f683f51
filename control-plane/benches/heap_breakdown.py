#!/usr/bin/env python3
"""govd's heap per agent, by part, from a heaptrack run of the agents_sim bench.

Run govd under heaptrack through the bench (a wrapper the bench starts as
its govd), then turn the profile into stacks with their bytes at the peak
and group them:

    printf '#!/bin/sh\\nexec heaptrack -o /tmp/govd "$GOVD_BIN" "$@"\\n' > govd-heaptrack.sh
    chmod +x govd-heaptrack.sh
    GOVD_BIN=/path/to/govd GOV_BENCH_GOVD=$PWD/govd-heaptrack.sh \\
        target/release/deps/agents_sim-HASH 1000 5
    # the bench kills the wrapper; stop govd itself: kill -TERM <govd's pid>
    heaptrack_print -f /tmp/govd.PID.zst -F peak.txt --flamegraph-cost-type peak
    python3 control-plane/benches/heap_breakdown.py peak.txt 1000

Each stack goes to the first part whose frames it contains (the order below
matters: an h2 buffer is allocated inside tonic's connection task, for
example). "other" holds what matches none, govd's fixed heap included.
"""

import collections
import sys

# (part, frames that must all be in the stack)
PARTS = [
    ("h2 read buffer (tokio-util FramedRead, 8 KiB)", ["with_max_recv_frame_size", "new_read"]),
    ("h2 write buffer (16 KiB) and HPACK decoder buffer (4 KiB)", ["with_max_recv_frame_size"]),
    ("agent queues (tokio mpsc blocks)", ["channel_from_index"]),
    ("agent queues (tokio mpsc blocks)", ["channel_from_list"]),
    ("govd's agent record", ["hello_as"]),
    ("decoded agent messages (last stats)", ["merge_repeated"]),
    ("h2 streams (store, frame queues)", ["recv_headers"]),
    ("h2 streams (store, frame queues)", ["send_response"]),
    ("h2 streams (store, frame queues)", ["queue_frame"]),
    ("HPACK tables", ["load_hpack"]),
    ("HPACK tables", ["index_dynamic"]),
    ("tonic codec buffers", ["map_request_streaming"]),
    ("tonic codec buffers", ["map_response"]),
    ("task: connection (tonic, hyper)", ["spawn_inner", "serve_connection"]),
    ("task: h2 stream (hyper)", ["spawn_inner", "execute_h2stream"]),
    ("task: govd's stream reader", ["spawn_inner"]),
    ("store writes (transient)", ["append_agents"]),
    ("store writes (transient)", ["take_agent_changes"]),
    ("store writes (transient)", ["serialize"]),
]


def part(stack: str) -> str:
    for name, frames in PARTS:
        if all(f in stack for f in frames):
            return name
    return "other"


def main() -> None:
    path, agents = sys.argv[1], int(sys.argv[2])
    parts: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            parts[part(stack)] += int(n)
    for name, n in parts.most_common():
        print(f"{n / agents:9.0f} B per agent  {name}")
    print(f"{sum(parts.values()) / agents:9.0f} B per agent  total at the peak")


if __name__ == "__main__":
    main()
