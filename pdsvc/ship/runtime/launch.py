"""``launch``: run the router's Python launcher in this process with the control-plane key
added to its arguments, so the key is never on a command line.

sglang-router 0.3.2 and smg take the key only as ``--control-plane-api-keys ID:NAME:ROLE:KEY``
(no environment variable, no file: ``router_args.py`` of both). Both launchers parse
``sys.argv`` in Python and hand the Rust core a config object, not the process's argv
(``launch_router.py``: ``parse_router_args(sys.argv[1:])``). So this sets ``sys.argv`` and runs
the launcher module as ``__main__`` with runpy (PEP 338): /proc/PID/cmdline, readable by every
local user, keeps the arguments this process was started with, which hold no key. The key comes
from a file: a systemd credential (LoadCredential=, systemd.exec(5)) or a 0640 file.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from .endings import Exit
from .membership import read_key

#: The entry pdsvc's key takes in ``--control-plane-api-keys`` (id:name:role:key).
KEY_ENTRY = "pdsvc:pdsvc-membership:admin:{key}"


def launch(key_spec: str, module: str, args: Sequence[str]) -> int:
    """Run ``python -m MODULE ARGS --control-plane-api-keys ENTRY`` in this process."""
    try:
        key = read_key(key_spec)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"launch: cannot read the control-plane key: {exc}\n")
        return Exit.USAGE
    sys.argv = [module, *args, "--control-plane-api-keys", KEY_ENTRY.format(key=key)]
    del key
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0
