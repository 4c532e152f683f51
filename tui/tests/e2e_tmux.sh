#!/usr/bin/env bash
# End to end: the real `govc demo` in a real terminal (tmux, 120x36).
# Waits for the demo's `order/mdm` fuse to trip, selects it, checks that the
# confirmation defaults to No, releases it with `y`, sees the result and the
# fuse gone from the tripped list, then quits with `q` and checks that the
# process exited cleanly.
#
# Usage: tui/tests/e2e_tmux.sh path/to/govc
# Every wait is bounded; on failure the last screen is printed.
set -euo pipefail

GOVC=${1:?usage: e2e_tmux.sh path/to/govc}
command -v tmux >/dev/null || { echo "tmux is not installed" >&2; exit 2; }
S="gov-e2e-$$"
WORK=$(mktemp -d)
cleanup() {
  tmux kill-session -t "$S" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

screen() { tmux capture-pane -p -t "$S"; }

# wait_for SECONDS EXTENDED-REGEX DESCRIPTION
wait_for() {
  local deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    if screen | grep -Eq -- "$2"; then return 0; fi
    sleep 0.5
  done
  echo "FAIL: no $3 within $1 s; last screen:" >&2
  screen >&2
  exit 1
}

tmux new-session -d -s "$S" -x 120 -y 36 \
  "cd '$WORK' && '$GOVC' demo --duration 170s; echo EXITED rc=\$?; sleep 60"

wait_for 60 '● CONNECTED' 'connected TUI'
wait_for 100 'fuse +order/mdm +OPEN' 'tripped fuse order/mdm'
echo "ok: fuse order/mdm tripped"

# Focus the tripped list (Shift-Tab from the agents pane) and ask to release.
tmux send-keys -t "$S" BTab
sleep 0.5
tmux send-keys -t "$S" r
wait_for 10 'Release fuse order/mdm on all agents of order\? \[y/N\]' 'confirmation dialog'
# Enter takes the default answer: No.
tmux send-keys -t "$S" Enter
wait_for 10 'release of order/mdm cancelled' 'cancellation notice'
if ! screen | grep -Eq 'fuse +order/mdm +OPEN'; then
  echo "FAIL: Enter released the fuse" >&2; screen >&2; exit 1
fi
echo "ok: Enter cancelled"

tmux send-keys -t "$S" r
wait_for 10 '\[y/N\]' 'confirmation dialog'
tmux send-keys -t "$S" y
wait_for 15 'released fuse order/mdm: [0-9]+ agents? notified' 'release result'
echo "ok: released"
tmux send-keys -t "$S" Escape
wait_for 10 'Tripped fuses & engaged limits \(0\)|none: every fuse is closed' 'closed fuse'
echo "ok: fuse closed"

tmux send-keys -t "$S" q
wait_for 30 'EXITED rc=0' 'clean exit'
echo "ok: quit, terminal restored, exit 0"
