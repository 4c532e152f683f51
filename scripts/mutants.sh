#!/usr/bin/env bash
# Mutation testing of the enforcement primitives and the HTTP/1 codec with a pinned
# cargo-mutants (installed into ./target/tools, not your ~/.cargo).
#
#   scripts/mutants.sh              # the default set (docs/testing.md has the scores)
#   scripts/mutants.sh --file agents/engine/src/fuse.rs   # one file
#
# Bounded for a shared 2-core machine: one mutant at a time (-j1), two build jobs,
# a per-mutant test timeout. Results land in ./mutants.out/ (outcomes.json,
# caught.txt, missed.txt, timeout.txt, unviable.txt).
set -euo pipefail

VERSION=27.1.0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS="$ROOT/target/tools"
BIN="$TOOLS/bin/cargo-mutants"

if ! "$BIN" mutants --version 2>/dev/null | grep -qF "$VERSION"; then
    cargo install --locked --root "$TOOLS" -j2 "cargo-mutants@$VERSION"
fi

cd "$ROOT"
if [ "$#" -eq 0 ]; then
    set -- \
        --package gov-engine --file agents/engine/src/bulkhead.rs \
        --file agents/engine/src/fuse.rs --file agents/engine/src/limit.rs
fi
# `cargo mutants` finds the binary on PATH as a cargo subcommand.
PATH="$TOOLS/bin:$PATH" exec cargo mutants --jobs 1 --timeout 120 --build-timeout 600 \
    --cargo-arg=-j2 "$@"
