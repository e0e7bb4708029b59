"""Each output read back the way its consumer reads it: supervisor's own config
reader, bash's `read` as install.sh splits install.list, Kubernetes' `$` rules. systemd's is
sdsyntax.py."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

#: Reads supervisord.conf paths from stdin, one a line, and answers each with what supervisor's
#: own reader makes of it, as one line of JSON (one interpreter for every example).
PARSE_SUPERVISORD = textwrap.dedent('''
    import json, shlex, sys
    import supervisor.options as so
    so.name_to_uid = lambda name: "uid:" + name  # the service user need not exist here
    so.existing_dirpath = lambda v: v  # nor the run and log directories
    for line in sys.stdin:
        opts = so.ServerOptions()
        opts.configfile = line.rstrip("\\n")
        opts.process_config(do_usage=False)
        out = {"programs": {}, "pidfile": opts.pidfile,
               "sockets": [s["file"] for s in opts.configroot.supervisord.server_configs]}
        for g in opts.process_group_configs:
            for pc in g.process_configs:
                out["programs"][pc.name] = {"argv": shlex.split(pc.command),
                                            "environment": pc.environment or {}, "uid": pc.uid}
        print(json.dumps(out), flush=True)
''')


def supervisord_reader(serve_venv: Path) -> Callable[[Path], dict] | None:
    """A function reading a supervisord.conf with supervisor's reader: in this process when
    `supervisor` is importable, else with the serve venv's python; None without either."""
    if importlib.util.find_spec("supervisor") is not None:
        return _read_here
    python = serve_venv / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.Popen([str(python), "-c", PARSE_SUPERVISORD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    atexit.register(proc.kill)

    def read(conf: Path) -> dict:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{conf}\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"supervisor's reader exited ({proc.poll()}) on {conf}"
        return json.loads(line)
    return read


def _read_here(conf: Path) -> dict:
    """PARSE_SUPERVISORD, in this process."""
    import shlex

    import supervisor.options as so

    saved = so.name_to_uid, so.existing_dirpath
    so.name_to_uid = lambda name: "uid:" + name  # the service user need not exist here
    so.existing_dirpath = lambda v: v  # nor the run and log directories
    try:
        opts = so.ServerOptions()
        opts.configfile = str(conf)
        opts.process_config(do_usage=False)
    finally:
        so.name_to_uid, so.existing_dirpath = saved
    out: dict = {"programs": {}, "pidfile": opts.pidfile,
                 "sockets": [s["file"] for s in opts.configroot.supervisord.server_configs]}
    for g in opts.process_group_configs:
        for pc in g.process_configs:
            out["programs"][pc.name] = {"argv": shlex.split(pc.command),
                                        "environment": pc.environment or {}, "uid": pc.uid}
    return out


#: install.sh's own loop (read_list): `IFS=$'\t' read -r kind a b c d`, each line's fields
#: printed NUL-separated, one record per line read.
_READ_LIST = r'''
while IFS=$'\t' read -r kind a b c d; do
    printf '%s\0' "$kind" "$a" "$b" "$c" "$d"; printf '\036'
done < "$1"
'''


def install_list_rows(path: Path) -> list[list[str]]:
    """install.list as install.sh splits it: the non-comment lines' fields (trailing empty
    fields dropped)."""
    out = subprocess.run(["bash", "-c", _READ_LIST, "read_list", str(path)],
                         capture_output=True, timeout=30, check=True,
                         env={**os.environ, "LC_ALL": "C.UTF-8"}).stdout.decode()
    rows = []
    for record in out.split("\036")[:-1]:
        fields = record.split("\0")[:-1]
        while fields and fields[-1] == "":
            fields.pop()
        if fields and not fields[0].startswith("#"):
            rows.append(fields)
    return rows


def k8s_unescape(value: str, references: frozenset[str] = frozenset()) -> str:
    """A container command word or env value as Kubernetes runs it: `$$` is `$`, and a
    `$(NAME)` would expand (only the given references may)."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and value not in references:
            raise SyntaxError(f"variable reference in {value!r}")
        else:
            out.append(value[i])
            i += 1
    return "".join(out)
