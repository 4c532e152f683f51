#!/usr/bin/env python3
"""Import cycles between the modules (files) of a crate.

Reads every `crate::`, `super::` and `self::` path in a crate's `src/` (in `use`
trees and in expressions), resolves it to the file that defines the item (a
`pub use` re-export is followed to where the item lives), and prints every group
of files that import each other in a circle. Exits 1 when there is one.
Test modules (`#[cfg(test)]` blocks, `tests.rs`) are not counted: a test may
use anything. Usage: scripts/cycles.py [CRATE_DIR...] (default: agents/engine
agents/agent control-plane); EDGES=1 also prints every module's imports.
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)(::\{)?")
CHILD = re.compile(r"(?<![:\w])(\w+)((?:::\w+)+)")


def strip_tests(text):
    """Drops `#[cfg(test)]` items (brace-matched) and comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = j + len("#[cfg(test)]")
        brace = text.find("{", k)
        semi = text.find(";", k)
        if semi >= 0 and (brace < 0 or semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = tree.strip()
    m = re.match(r"^([\w:]*?)(::)?\{(.*)\}$", tree, re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree)]
    prefix, body = m.group(1), m.group(3)
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        for e in expand_use(p):
            out.append(prefix + "::" + e if prefix else e)
    return out


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel == ["lib"]:
        return ()
    return tuple(rel)


def main(crates):
    found = False
    for crate in crates:
        src = os.path.join(crate, "src")
        files = {}
        for root, _, names in os.walk(src):
            if os.path.relpath(root, src).split(os.sep)[0] == "bin":
                continue
            for n in names:
                if n.endswith(".rs") and n != "tests.rs":
                    p = os.path.join(root, n)
                    files[module_of(src, p)] = strip_tests(open(p).read())
        # Re-exports: module -> {name: absolute path}.
        reexports = {m: {} for m in files}
        uses = {m: [] for m in files}
        for m, text in files.items():
            for stmt in re.findall(r"\buse\s+([^;]+);", text):
                for full in expand_use(stmt):
                    uses[m].append(full)
            for stmt in re.findall(r"\bpub(?:\([\w\s:]+\))?\s+use\s+([^;]+);", text):
                for full in expand_use(stmt):
                    name = full.split("::")[-1]
                    if full.split("::")[0] not in ("crate", "super", "self"):
                        full = "self::" + full
                    reexports[m][name] = full

        def absolute(m, path):
            segs = path.split("::")
            if segs[0] == "crate":
                base, segs = (), segs[1:]
            elif segs[0] in ("super", "self"):
                base = m
                while segs and segs[0] in ("super", "self"):
                    if segs[0] == "super":
                        base = base[:-1]
                    segs = segs[1:]
            else:
                return None
            return base, segs

        def resolve(m, path, seen=0):
            a = absolute(m, path)
            if a is None or seen > 8:
                return None
            cur, segs = a
            for i, s in enumerate(segs):
                if cur + (s,) in files:
                    cur = cur + (s,)
                    continue
                target = reexports.get(cur, {}).get(s)
                if target and absolute(cur, target):
                    rest = "::".join(segs[i + 1:])
                    r = resolve(cur, target + ("::" + rest if rest else ""), seen + 1)
                    return r if r is not None else cur
                break
            return cur

        edges = {m: set() for m in files}
        for m, text in files.items():
            paths = set(uses[m])
            for g in PATH.finditer(text):
                # `crate::a::{b, c}` imports b and c (the use tree above),
                # not `a` itself.
                if not g.group(3):
                    paths.add(g.group(1) + g.group(2))
            # A path that starts at a child module (`use listener::Side`).
            for g in CHILD.finditer(text):
                if m + (g.group(1),) in files:
                    paths.add("self::" + g.group(1) + g.group(2))
            for p in paths:
                if p.split("::")[0] not in ("crate", "super", "self"):
                    if m + (p.split("::")[0],) not in files:
                        continue
                    p = "self::" + p
                t = resolve(m, p)
                if t is not None and t != m and t in files:
                    # A module's own `pub use` of a child is not a dependency.
                    edges[m].add(t)
        # Tarjan's strongly connected components.
        index, low, stack, on, sccs = {}, {}, [], set(), []
        sys.setrecursionlimit(10000)

        def visit(v):
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)

        for v in sorted(files):
            if v not in index:
                visit(v)
        name = lambda m: "::".join(m) or "lib"
        for comp in sccs:
            found = True
            members = sorted(comp)
            print(f"{crate}: cycle among {', '.join(name(m) for m in members)}")
            for m in members:
                for t in sorted(edges[m] & set(comp)):
                    print(f"    {name(m)} -> {name(t)}")
        if os.environ.get("EDGES"):
            for m in sorted(files):
                print(f"  {name(m)} -> {sorted(name(t) for t in edges[m])}")
        if not sccs:
            print(f"{crate}: no import cycle ({len(files)} modules)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["agents/engine", "agents/agent", "control-plane"]))
