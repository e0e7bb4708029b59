#!/bin/sh
# install.sh — install the systemd bundle that `pdsvc render` wrote (default: units/ beside
# this script; another with --bundle DIR). The installer is Python, shipped in every bundle
# (BUNDLE/install/, stdlib only): this finds the host's python3 (>= 3.9) and runs it as is.
# Usage, options, refusals and exit codes (0 done, 1 refused or failed, 2 usage): --help
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bundle=$here/units
prev=
for arg in "$@"; do
    if [ "$prev" = --bundle ]; then bundle=$arg; fi
    prev=$arg
done
installer=$bundle/install
# a bundle of an older pdsvc, or none at all: the checkout's installer says what is wrong
[ -f "$installer/__main__.py" ] || installer=$here/pdsvc/ship/install
if [ ! -f "$installer/__main__.py" ]; then
    echo "install.sh: error: $bundle/install/ not found: run \`pdsvc render\` first (or pass --bundle DIR)" >&2
    exit 1
fi
for py in "${PDSVC_PYTHON:-}" python3 /usr/bin/python3 python3.13 python3.12 python3.11 \
    python3.10 python3.9; do
    if [ -n "$py" ] && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
        PDSVC_INSTALL_SH=$0 PDSVC_DEFAULT_BUNDLE=$here/units exec "$py" "$installer" "$@"
    fi
done
echo "install.sh: error: no python3 >= 3.9 here (the installer is Python): install python3, or name one in PDSVC_PYTHON" >&2
exit 1
