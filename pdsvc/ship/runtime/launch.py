"""``launch``: run the router's Python launcher in this process with the control-plane key
added to its arguments, so the key is never on a command line.

sglang-router 0.3.2 and smg take the key only as ``--control-plane-api-keys ID:NAME:ROLE:KEY``
(no environment variable, no file: ``router_args.py`` of both). Both launchers parse
``sys.argv`` in Python and hand the Rust core a config object, not the process's argv
(``launch_router.py``: ``parse_router_args(sys.argv[1:])``). So this sets ``sys.argv`` and runs
the launcher module as ``__main__`` with runpy (PEP 338): /proc/PID/cmdline, readable by every
local user, keeps the arguments this process was started with, which hold no key. The key comes
from a file: a systemd credential (LoadCredential=, systemd.exec(5)) or a 0640 file.

It also keeps SGLang out of sglang-router 0.3.2's process. ``launch_router.py`` imports
``mini_lb`` (its Python load balancer, run only with ``--mini-lb``), which tries
``from sglang.srt.tracing.trace import ...`` for OTLP tracing and sets
``trace_package_imported = False`` on ImportError. With sglang in the same venv, as
runtime.python's is, that import loads all of SGLang and torch into the router (seconds of
every router start, hundreds of MB it never uses; where triton is missing, torch loads before
the import fails). ``None`` in ``sys.modules`` makes an import fail at once, before any parent
package loads (importlib's ``_find_and_load``: "import of NAME halted; None in sys.modules"),
which mini_lb takes as tracing absent. Not with ``--mini-lb``: that balancer may trace.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from .endings import Exit
from .membership import read_key

#: The entry pdsvc's key takes in ``--control-plane-api-keys`` (id:name:role:key).
KEY_ENTRY = "pdsvc:pdsvc-membership:admin:{key}"
#: launcher module -> optional imports it tries and does without (the module docstring)
UNUSED_IMPORTS = {"sglang_router.launch_router": ("sglang.srt.tracing.trace",)}


def launch(key_spec: str, module: str, args: Sequence[str]) -> int:
    """Run ``python -m MODULE ARGS --control-plane-api-keys ENTRY`` in this process."""
    try:
        key = read_key(key_spec)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"launch: cannot read the control-plane key: {exc}\n")
        return Exit.USAGE
    sys.argv = [module, *args, "--control-plane-api-keys", KEY_ENTRY.format(key=key)]
    del key
    if "--mini-lb" not in args:
        for name in UNUSED_IMPORTS.get(module, ()):
            sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0
