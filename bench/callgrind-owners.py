#!/usr/bin/env python3
"""Instructions per call from a callgrind output file, grouped by the crate of
the function that ran them (issue 37's "what blocks the HTTP/2 CPU target").

Each instruction counts once, for the function it ran in: std code inlined
into an `h2` function counts as `h2`'s, not std's (grouping by source file, as
`callgrind_annotate` does, would put it under std). Functions are named by
their path, so `<h2::... as Trait>::f` and `h2::...::f` are both `h2`'s.

    bench/callgrind-owners.py target/bench-callgrind/cg.1.out.1 20000
    bench/callgrind-owners.py target/bench-callgrind-fixed/cg.gov-h2.out.1 2000

The second argument is the number of calls the file counted (the bench's N).
"""

import collections
import re
import sys

# Crates named by the first segment of a function's path; the HTTP/2 and HTTP
# libraries are summed as one line at the end.
CRATES = [
    "h2", "http_body_util", "http", "bytes", "slab", "tokio_util", "tokio",
    "hyper_util", "hyper", "gov_agent", "gov_engine", "gov_proto", "indexmap",
    "hashbrown", "tracing_core", "tracing", "core", "alloc", "std",
]
HTTP2_LIBRARIES = {"h2", "http", "bytes", "slab", "tokio_util", "indexmap"}


def self_costs(path):
    """Self instructions per function name."""
    names = {}
    costs = collections.Counter()
    function = None
    skip_call_cost = False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if not line:
            continue
        first = line[0]
        if first.isdigit() or first in "+-*":
            # A cost line; the one after `calls=` is the call's inclusive
            # cost, which belongs to the callee.
            if skip_call_cost:
                skip_call_cost = False
                continue
            fields = line.split()
            if len(fields) >= 2:
                costs[function] += int(fields[1])
            continue
        key, _, value = line.partition("=")
        if key == "calls":
            skip_call_cost = True
        elif key in ("fn", "cfn"):
            match = re.match(r"\((\d+)\)(?: (.*))?", value)
            name = value
            if match:
                if match.group(2) is not None:
                    names[match.group(1)] = match.group(2)
                name = names.get(match.group(1), "?")
            if key == "fn":
                function = name
    return costs


def owner(function):
    name = (function or "?").lstrip("<")
    for crate in CRATES:
        if name.startswith(crate + "::"):
            return crate
    if "memcpy" in name or "memmove" in name:
        return "memcpy"
    if "rjem" in name or "je_" in name or "malloc" in name or "free" in name:
        return "allocator"
    return "other"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, calls = sys.argv[1], int(sys.argv[2])
    by_owner = collections.Counter()
    for function, cost in self_costs(path).items():
        by_owner[owner(function)] += cost
    total = sum(by_owner.values())
    for name, cost in by_owner.most_common():
        print(f"{cost / calls:9.0f}  {name}")
    libraries = sum(by_owner[name] for name in HTTP2_LIBRARIES)
    print(f"{libraries / calls:9.0f}  the HTTP/2 libraries ({', '.join(sorted(HTTP2_LIBRARIES))})")
    print(f"{total / calls:9.0f}  total")


if __name__ == "__main__":
    main()
