#!/usr/bin/env bash
# Run a command with N CPU hogs beside it: the suite on a busy machine, as CI's machine may be
# (docs/testing.md, "A busy machine"). A timing assumption (a bound measured under load, two
# durations taken at different moments) shows itself here before it reaches CI.
#
# Usage: tests/support/busy.sh N CMD [ARG...]
#        tests/support/busy.sh 2 python3 -m pytest -q -n 6 --dist loadgroup
#
# Each hog is `python3 -c 'while 1: pass'` at the normal priority, bounded by timeout(1)
# (PDSVC_BUSY_MAX_SECS, 3 hours) in case this script is killed before it can end them; they end
# with the command, whose exit status is this script's.
set -uo pipefail

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 N CMD [ARG...]   (N CPU hogs beside CMD)" >&2
    exit 2
fi
n="$1"
shift
max="${PDSVC_BUSY_MAX_SECS:-10800}"
hogs=()
for _ in $(seq 1 "$n"); do
    timeout "$max" python3 -c 'while 1: pass' &
    hogs+=("$!")
done
stop() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null; wait "${hogs[@]}" 2>/dev/null; }
trap stop EXIT
trap 'exit 130' INT TERM
echo "busy.sh: $n CPU hog(s) running beside: $*" >&2
"$@"
