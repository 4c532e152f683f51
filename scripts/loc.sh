#!/usr/bin/env bash
# Non-test lines of every Rust file under agents/*/src and control-plane/src; fails
# when one has more than 700 (issue 20: split a file by responsibility before then).
# A `#[cfg(test)]` item (a `mod tests { ... }` block, a test-only fn) is not counted;
# neither are files that are tests by their place (`tests.rs`, `*/tests/*`).
# Usage: scripts/loc.sh [DIR...]   (default: agents/*/src control-plane/src;
# VERBOSE=1 prints every file's count)
set -euo pipefail
cd "$(dirname "$0")/.."

limit=700
if [ "$#" -gt 0 ]; then dirs=("$@"); else dirs=(agents/*/src control-plane/src); fi
status=0
while IFS= read -r file; do
  n=$(awk '
    # Skip from a #[cfg(test)] line through the end of the item it marks: to the
    # closing brace at the depth the item opened at, or the `;` of `mod tests;`.
    skip == 0 && /^[[:space:]]*#\[cfg\(test\)\]/ { skip = 1; depth = 0; opened = 0; next }
    skip == 1 {
      line = $0
      gsub(/"([^"\\]|\\.)*"/, "", line)   # braces inside strings do not count
      sub(/\/\/.*/, "", line)
      o = gsub(/\{/, "{", line); c = gsub(/\}/, "}", line)
      depth += o - c
      if (o > 0) opened = 1
      if ((opened && depth <= 0) || (!opened && line ~ /;[[:space:]]*$/)) skip = 0
      next
    }
    { count++ }
    END { print count + 0 }
  ' "$file")
  if [ "$n" -gt "$limit" ]; then
    echo "$file: $n lines of non-test code (limit $limit): split it by responsibility"
    status=1
  elif [ "${VERBOSE:-0}" = 1 ]; then
    echo "$n $file"
  fi
done < <(find "${dirs[@]}" -name '*.rs' ! -name tests.rs ! -path '*/tests/*' | sort)
exit "$status"
