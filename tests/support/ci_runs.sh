#!/usr/bin/env bash
# Run CI's script N times, each in a fresh clone of this checkout's HEAD, as CI runs it: a new
# directory, CI=true, no standard input, the environment less what an interactive shell adds
# (PYTHONDONTWRITEBYTECODE, PYTHONUNBUFFERED, VIRTUAL_ENV). Prints each run's result and time,
# then a summary; exits 0 only when every run was green.
#
# Usage: tests/support/ci_runs.sh N [--busy K] [--keep]
#   --busy K   K CPU hogs beside each run (tests/support/busy.sh)
#   --keep     keep each clone and its log (default: the log is kept, the clone removed)
# Runs as root (CI's script boots containers). Clones go under /opt (not /tmp: the units'
# PrivateTmp=yes would hide them from the stand-in engines' user); logs under
# ${PDSVC_CI_RUNS_DIR:-/var/log/pdsvc-ci-runs}.
set -uo pipefail

usage() { echo "usage: $0 N [--busy K] [--keep]" >&2; exit 2; }
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then usage; fi
n="$1"; shift
busy=0; keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --busy)
            if [ $# -lt 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]]; then usage; fi
            busy="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        *) usage ;;
    esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# every run tests the commit HEAD is now, even if the checkout moves on meanwhile
sha="$(git -C "$here" rev-parse HEAD)"
rev="$(git -C "$here" rev-parse --short HEAD)"
logs="${PDSVC_CI_RUNS_DIR:-/var/log/pdsvc-ci-runs}"
mkdir -p "$logs"
green=0
for i in $(seq 1 "$n"); do
    stamp="$(date -u +%Y%m%dT%H%M%SZ)"
    dir="/opt/pdsvc-ci-run-$stamp-$i"
    log="$logs/$stamp-$i.log"
    git clone -q "$here" "$dir" && git -C "$dir" checkout -q "$sha"
    start=$(date +%s)
    cmd=(bash .ci/run)
    [ "$busy" -eq 0 ] || cmd=(bash tests/support/busy.sh "$busy" bash .ci/run)
    (cd "$dir" && env -u PYTHONDONTWRITEBYTECODE -u PYTHONUNBUFFERED -u VIRTUAL_ENV CI=true \
        "${cmd[@]}" </dev/null >"$log" 2>&1)
    rc=$?
    secs=$(( $(date +%s) - start ))
    result="$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$' "$log" | tail -1)"
    printf 'run %d of %d (%s, busy %d): exit %d, %dm%02ds: %s (log: %s)\n' "$i" "$n" "$rev" \
        "$busy" "$rc" $((secs / 60)) $((secs % 60)) "${result:-no pytest summary}" "$log"
    [ "$rc" -ne 0 ] || green=$((green + 1))
    [ "$keep" -eq 1 ] || rm -rf "$dir"
done
# .ci/run installs each clone into the machine's Python (pip install -e, as CI does): put this
# checkout back, so that `pdsvc` and the tests here import this tree again, not a removed clone
python3 -m pip install -q -e "$here" >/dev/null 2>&1 ||
    echo "ci_runs.sh: could not reinstall $here: run python3 -m pip install -e . there" >&2
echo "ci_runs.sh: $green of $n green ($rev, busy $busy)"
[ "$green" -eq "$n" ]
