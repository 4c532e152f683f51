#!/usr/bin/env bash
# Mutation testing of the engine and the HTTP/1 codec with a pinned cargo-mutants
# (installed into ./target/tools, not your ~/.cargo). docs/testing.md has the scores
# and the verdict on every survivor.
#
#   scripts/mutants.sh                     # the engine files, then the codec
#   scripts/mutants.sh engine              # the engine files (tests: gov-engine's own)
#   scripts/mutants.sh codec               # the HTTP/1 codec (tests: gov-agent's lib tests)
#   scripts/mutants.sh agents/engine/src/state/fuse.rs   # some files, with their set's tests
#   scripts/mutants.sh engine --iterate    # more cargo-mutants arguments after the set
#
# Bounded for a shared 2-core machine: `nice`, one mutant at a time, two build jobs,
# a per-mutant test timeout, and only the mutated crate's own tests (no doctests, no
# examples, no end-to-end suites). Builds go to ./target/mutants (CARGO_TARGET_DIR
# overrides it), so a second run rebuilds only the workspace crates. Each set's
# results land in ./mutants.out/<set>/mutants.out/ (caught.txt, missed.txt,
# timeout.txt, unviable.txt, outcomes.json).
set -euo pipefail

VERSION=27.1.0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS="$ROOT/target/tools"
BIN="$TOOLS/bin/cargo-mutants"

ENGINE_FILES=(state/bulkhead state/fuse state/limit admission primitive decision engine)
CODEC=agents/agent/src/sidecar/h1/codec.rs

if ! "$BIN" mutants --version 2>/dev/null | grep -qF "$VERSION"; then
    nice -n 19 cargo install --locked --root "$TOOLS" -j2 "cargo-mutants@$VERSION"
fi

cd "$ROOT"
# One file changes per mutant: incremental builds reuse the rest of the crate.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-1}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/mutants}"
# `cargo mutants` finds the binary on PATH as a cargo subcommand.
export PATH="$TOOLS/bin:$PATH"

# run SET FILE... [-- CARGO-MUTANTS-ARGS...]
run() {
    local set=$1
    shift
    local args=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
        args+=(--file "$1")
        shift
    done
    [ "$#" -gt 0 ] && shift
    case $set in
        # --cargo-arg=--tests: the lib's unit tests and tests/*.rs, for the build
        # and the run alike (no examples, no doctests).
        engine) args+=(--package gov-engine --cargo-arg=--tests --timeout 60) ;;
        # The codec's tests are unit tests of the lib (h1/codec/tests.rs): the
        # sidecar's integration suites start agents and take minutes per mutant.
        codec) args+=(--package gov-agent --cargo-arg=--lib --timeout 120) ;;
    esac
    mkdir -p "mutants.out/$set"
    nice -n 19 cargo mutants --jobs 1 --jobserver-tasks 2 --build-timeout 1200 \
        --cargo-arg=-j2 --output "mutants.out/$set" "${args[@]}" "$@"
}

engine_files() {
    for f in "${ENGINE_FILES[@]}"; do echo "agents/engine/src/$f.rs"; done
}

status=0
case "${1:-all}" in
    all | -*)
        [ "${1:-}" = all ] && shift
        # shellcheck disable=SC2046
        run engine $(engine_files) -- "$@" || status=$?
        run codec "$CODEC" -- "$@" || status=$?
        ;;
    engine)
        shift
        # shellcheck disable=SC2046
        run engine $(engine_files) -- "$@" || status=$?
        ;;
    codec)
        shift
        run codec "$CODEC" -- "$@" || status=$?
        ;;
    agents/engine/src/*.rs | agents/agent/src/*.rs)
        set_=engine
        case $1 in agents/agent/*) set_=codec ;; esac
        files=()
        while [ "$#" -gt 0 ] && [[ $1 == *.rs ]]; do
            files+=("$1")
            shift
        done
        run "$set_" "${files[@]}" -- "$@" || status=$?
        ;;
    *)
        echo "usage: $0 [all|engine|codec|FILE] [cargo-mutants arguments...]" >&2
        exit 64
        ;;
esac
# cargo-mutants exits 2 when a mutant was missed, 3 on a timeout.
exit "$status"
