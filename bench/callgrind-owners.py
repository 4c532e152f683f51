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
GOV = {"gov_agent", "gov_engine", "gov_proto"}


def costs(path):
    """Self instructions per function name, and inclusive instructions per
    call edge (caller, callee)."""
    names = {}
    self_cost = collections.Counter()
    edges = collections.Counter()
    function = callee = None
    call_cost_next = False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if not line:
            continue
        first = line[0]
        if first.isdigit() or first in "+-*":
            fields = line.split()
            if len(fields) < 2:
                continue
            # The cost line after `calls=` is the call's inclusive cost: the
            # callee's, not the caller's own.
            if call_cost_next:
                edges[(function, callee)] += int(fields[1])
                call_cost_next = False
            else:
                self_cost[function] += int(fields[1])
            continue
        key, _, value = line.partition("=")
        if key == "calls":
            call_cost_next = True
        elif key in ("fn", "cfn"):
            match = re.match(r"\((\d+)\)(?: (.*))?", value)
            name = value
            if match:
                if match.group(2) is not None:
                    names[match.group(1)] = match.group(2)
                name = names.get(match.group(1), "?")
            if key == "fn":
                function = name
            else:
                callee = name
    return self_cost, edges


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
    self_cost, edges = costs(path)
    by_owner = collections.Counter()
    for function, cost in self_cost.items():
        by_owner[owner(function)] += cost
    total = sum(by_owner.values())
    for name, cost in by_owner.most_common():
        if cost >= calls:  # at least one instruction a call
            print(f"{cost / calls:9.0f}  {name}")
    libraries = sum(by_owner[name] for name in HTTP2_LIBRARIES)
    print(f"{libraries / calls:9.0f}  the HTTP/2 libraries' functions ({', '.join(sorted(HTTP2_LIBRARIES))})")
    # What gov's own code asks of them beyond HTTP/2 (header look-ups in
    # `http`, `bytes`), and the copies they make (`memcpy` they call).
    asked = sum(
        cost
        for (caller, callee), cost in edges.items()
        if owner(caller) in GOV and owner(callee) in HTTP2_LIBRARIES - {"h2"}
    )
    copies = sum(
        cost
        for (caller, callee), cost in edges.items()
        if owner(caller) in HTTP2_LIBRARIES and owner(callee) == "memcpy"
    )
    print(f"{asked / calls:9.0f}  of them, what gov's code asks of http and bytes")
    print(f"{copies / calls:9.0f}  the copies the libraries make (memcpy they call)")
    own = libraries - asked + copies
    print(f"{own / calls:9.0f}  the HTTP/2 libraries' own work (their functions, less gov's asks, with their copies)")
    print(f"{total / calls:9.0f}  total")


if __name__ == "__main__":
    main()
