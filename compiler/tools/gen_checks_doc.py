#!/usr/bin/env python3
"""Regenerates docs/checks.md from the //! docs of compiler/src/check/*.rs and the
fixtures' golden diagnostics. Run from the repository root: python3 compiler/tools/gen_checks_doc.py"""
import re, glob, os
codes = re.findall(r'"(gov::[a-z:-]+)"', open('compiler/src/check.rs').read().split('pub const CODES')[1].split('];')[0])
files = {}
for f in glob.glob('compiler/src/check/*.rs'):
    doc = []
    for line in open(f):
        if line.startswith('//!'):
            doc.append(line[4:] if len(line) > 4 else '\n')
        else:
            break
    text = ''.join(doc)
    m = re.match(r'`(gov::[a-z:-]+)`', text)
    files[m.group(1)] = (os.path.basename(f), text)
out = ["# Checks and lints of `govc check`\n",
"""
`govc check` (and `govc compile`, and the control plane before it applies
anything) runs every check below and reports every finding at once, each with
a stable code, a message, a label on the exact text, and a help line.
The primary label is on the text to change, and the `file:line:col` header of
the report names it; labels that only give context (the `capacity` or
`latency` a lint compares with, the first of two definitions) are shown beside
it when they are near, or as a note after it.

- **Errors** (`gov::...`) stop `compile` and `apply`.
- **Lints** (`gov::lint::...`) are warnings: they are printed but never block,
  unless `govc check --deny-warnings` is used.

Syntax errors have the code `gov::syntax` (see [the language reference](language.md)).
Each check lives in its own file under `compiler/src/check/` and has an invalid
fixture with its golden diagnostic under `compiler/tests/fixtures/<name>.gov`.
This page is generated from those files' docs and the fixtures' golden diagnostics
by `python3 compiler/tools/gen_checks_doc.py`.

| Code | Severity | Source |
|---|---|---|
"""]
for c in codes:
    fn, _ = files[c]
    sev = 'warning' if '::lint::' in c else 'error'
    out.append(f"| [`{c}`](#{c.replace('::','').replace(':','')}) | {sev} | `compiler/src/check/{fn}` |\n")
for c in codes:
    fn, text = files[c]
    first, rest = text.split('\n', 1)
    out.append(f"\n## `{c}`\n\n")
    head = first[len(c)+2:].strip()
    head = head.removeprefix('(warning)').lstrip(': ').strip()
    head = head[0].upper() + head[1:]
    out.append(head + "\n" + rest)
    short = c.rsplit('::', 1)[1]
    snap = f'compiler/tests/snapshots/diagnostics__every_fixture_reports_its_code@{short}.gov.snap'
    if os.path.exists(snap):
        body = open(snap).read().split('---\n', 2)[2].rstrip()
        # The first diagnostic of the fixture is enough to show the shape.
        first = body.split('\n\ngov::')[0]
        out.append(f"\nReported as (from `compiler/tests/fixtures/{short}.gov`):\n\n```text\n{first}\n```\n")
open('docs/checks.md', 'w').write(''.join(out))
