"""Ask the installed launchers' own parsers about the units' command lines, under runtime.python.

Run by the SGLang venv's interpreter, not by pdsvc, as ``PY -I parser.py pdsvc-doctor-parse``
with ``[{"kind": "sglang"|"router", "argv": [...], "env": {...}}, ...]`` on stdin. For each
item it does what ``python -m sglang.launch_server`` / ``-m sglang_router.launch_router`` do
before starting anything (load_plugins + prepare_server_args; parse_router_args, its
validation and the Rust config) and prints one line,
``pdsvc-doctor-result [{"ok", "error", "parser", "abbreviated"}, ...]``.
Standard library only (besides the packages it asks), Python >= 3.9.
"""

import argparse
import contextlib
import copy
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
from unittest import mock

RESULT_PREFIX = "pdsvc-doctor-result "

# Before 3.11, -I still puts this file's directory first on sys.path: keep its neighbours
# from shadowing what sglang imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


class TritonStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An importable ``triton`` whose every attribute is a MagicMock."""

    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = "0.0.0+pdsvc-stub"

        def getattr_(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return mock.MagicMock(name=module.__name__ + "." + attr)

        module.__getattr__ = getattr_


def stub_triton():
    """sglang imports triton at module level for nothing its parser needs; stub it only when
    it is missing (it is installed on a GPU host)."""
    try:
        import triton  # noqa: F401
        return
    except Exception:  # noqa: BLE001 - a broken triton is as good as none here
        pass
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, TritonStub())


def parse_sglang(argv):
    from sglang.srt.server_args import prepare_server_args

    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins is not None:
        load_plugins()
    prepare_server_args(argv)


def parse_router(argv):
    import sglang_router.launch_router as launch_router

    sys.argv[0] = "sglang_router.launch_router"
    args = launch_router.parse_router_args(argv)
    validate = getattr(args, "_validate_router_args", None)
    if validate is not None:
        validate()
    try:
        from sglang_router.router import Router
    except ImportError:
        Router = None
    if Router is not None and hasattr(Router, "from_args"):
        Router.from_args(copy.deepcopy(args))


def abbreviated(parsers, argv):
    """Options accepted only as argparse prefix abbreviations (allow_abbrev is on in both)."""
    if not parsers:
        return []
    known = parsers[-1]._option_string_actions
    found = []
    for word in argv:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            matches = sorted(o for o in known if o.startswith(name))
            if matches:
                found.append([name, matches[0]])
    return found


def last_error(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    return (errors or lines or [""])[-1]


def record_parsers():
    """Every ArgumentParser that parses, in order: the last one is the launcher's."""
    parsers = []
    real_parse_args = argparse.ArgumentParser.parse_args

    def parse_args(self, *args, **kwargs):
        parsers.append(self)
        return real_parse_args(self, *args, **kwargs)

    argparse.ArgumentParser.parse_args = parse_args
    return parsers


def ask(item, parsers):
    os.environ.update(item.get("env") or {})
    captured = io.StringIO()
    result = {"ok": False, "error": None, "parser": True, "abbreviated": []}
    del parsers[:]
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            (parse_sglang if item["kind"] == "sglang" else parse_router)(list(item["argv"]))
        result["ok"] = True
        result["abbreviated"] = abbreviated(parsers, item["argv"])
    except SystemExit as exc:
        result["error"] = last_error(captured.getvalue()) or f"parser exited ({exc.code})"
    except BaseException as exc:  # noqa: BLE001 - whatever the import or parser raises
        result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        result["parser"] = False
    return result


def main():
    parsers = record_parsers()
    items = json.load(sys.stdin)
    stub_triton()
    results = [ask(item, parsers) for item in items]
    sys.stdout.write(RESULT_PREFIX + json.dumps(results) + "\n")
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: sglang's import may leave non-daemon threads


if __name__ == "__main__":
    main()
