#!/usr/bin/env python3
"""Functions longer than 120 lines outside tests (issue 30).

Reads every `.rs` file under the given `src` directories (not `tests.rs`, not a
`tests/` or `benches/` folder), drops `#[cfg(test)]` items, and prints every
`fn` whose body, from its `fn` line to its closing brace, has more than 120
lines. Exits 1 when there is one. Strings, char literals and comments do not
count as braces. Usage: scripts/fnlen.py [--allow FILE:FN]... DIR...
(LIMIT=N to change 120). `--allow FILE:FN` lets that one function pass while
it is being split (printed as allowed); an allowed function that is no longer
over the limit fails the check, so that the allowance goes with it.
"""
import os
import re
import sys

LIMIT = int(os.environ.get("LIMIT", "120"))
FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def clean(line):
    """A line without its strings, char literals and comment."""
    line = re.sub(r'r#*"[^"]*"#*', '""', line)
    line = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)
    line = re.sub(r"'(?:[^'\\]|\\.)'", "' '", line)
    return re.sub(r"//.*", "", line)


def item_end(lines, i):
    """The index of the line that closes the item starting at line i."""
    depth, opened = 0, False
    for j in range(i, len(lines)):
        s = lines[j]
        depth += s.count("{") - s.count("}")
        if "{" in s:
            opened = True
        if opened and depth <= 0:
            return j
        if not opened and s.rstrip().endswith(";"):
            return j
    return len(lines) - 1


def long_fns(path):
    raw = open(path).read().split("\n")
    lines = [clean(l) for l in raw]
    out, i = [], 0
    while i < len(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", lines[i]):
            i = item_end(lines, i + 1) + 1
            continue
        m = FN.match(lines[i])
        if m:
            end = item_end(lines, i)
            if end - i + 1 > LIMIT:
                out.append((path, i + 1, m.group(1), end - i + 1))
        i += 1
    return out


def main(args):
    allowed, dirs = set(), []
    while args:
        arg = args.pop(0)
        if arg == "--allow" and args:
            path, _, name = args.pop(0).rpartition(":")
            allowed.add((os.path.normpath(path), name))
        else:
            dirs.append(arg)
    found = []
    for root in dirs:
        for dirpath, dirnames, names in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in ("tests", "benches")]
            for n in sorted(names):
                if n.endswith(".rs") and n != "tests.rs":
                    found += long_fns(os.path.join(dirpath, n))
    status, used = 0, set()
    for path, line, name, n in sorted(found, key=lambda f: -f[3]):
        key = (os.path.normpath(path), name)
        if key in allowed:
            used.add(key)
            print(f"{path}:{line}: fn {name} is {n} lines (limit {LIMIT}): allowed (--allow)")
            continue
        print(f"{path}:{line}: fn {name} is {n} lines (limit {LIMIT}): split it by step")
        status = 1
    for path, name in sorted(allowed - used):
        print(f"{path}: fn {name} is allowed but not over {LIMIT} lines: remove its --allow")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
