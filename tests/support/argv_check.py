"""Check command lines with SGLang's, sglang-router's and smg's OWN argument parsers, without a GPU.

Run it with the serve venv's python (built by ``tests/support/make_serve_venv.sh``)::

    .venv-serve/bin/python tests/support/argv_check.py sglang -- --model-path /srv/m --tp 4
    .venv-serve/bin/python tests/support/argv_check.py router -- --pd-disaggregation ...
    .venv-serve/bin/python tests/support/argv_check.py batch FILE.json     # FILE or "-" (stdin)

Single mode prints one result as JSON on stdout and exits 0 when the launcher would accept the
command line; otherwise it prints the parser's message on stderr (``PROG: error: ...``, without
argparse's usage text: SGLang's is 700 lines) and exits with the launcher's code: 2 for an
argparse error, 1 for an exception raised while the launcher turns the parsed namespace into its
args record (e.g. sglang-router's ``Invalid bootstrap port``).

Batch mode reads ``[{"kind": "sglang"|"router"|"smg", "argv": [...]}, ...]`` and prints the list of
results (same order), exiting 0 whenever it could produce them, so a test suite pays the import
cost (about 3 s) once. A result is::

    {"kind", "argv", "ok", "exit_code",
     "error": "PROG: error: MESSAGE" (argparse) or "ExcType: message", else null,
     "usage": argparse's usage text for an argparse error, else null,
     "namespace": every attribute of the parsed argparse namespace (JSON-safe),
     "record": every field of the launcher's args record (ServerArgs / RouterArgs),
     "abbreviated": [{"given": "--tp", "option": "--tp-size"}, ...] options accepted only as
                    argparse prefix abbreviations (see ``abbreviations``)}

How each launcher is reproduced, without starting anything:

* sglang 0.5.23: ``python -m sglang.launch_server`` runs ``load_plugins()`` then
  ``prepare_server_args(argv)`` (``argparse.ArgumentParser(prog="sglang serve")`` +
  ``ServerArgs.add_cli_args`` + ``parse_args`` + ``ServerArgs.from_cli_args``); this script calls
  the very same two functions from ``sglang.launch_server``'s namespace. It stops before
  ``run_server`` / ``resolve_once()`` (which read a model config and need transformers).
* sglang-router 0.3.2: ``python -m sglang_router.launch_router`` runs
  ``parse_router_args(argv)`` (``RouterArgs.add_cli_args(parser, use_router_prefix=False)`` +
  ``parse_args`` + ``RouterArgs.from_cli_args``) then, in ``launch_router``,
  ``_validate_router_args()`` and ``Router.from_args()``, which builds the Rust router's config
  object; only ``router.start()`` binds ports. This script does all but ``start()``.
* sglang.bench_serving (kind ``bench``): ``cli_main()`` with ``run_benchmark`` replaced.
* smg 1.13.0 (kind ``smg``): ``python -m smg.launch_router`` has the same shape
  (smg/launch_router.py: ``parse_router_args`` then, in ``launch_router``, IGW on when a
  discovery provider is selected, ``_validate_router_args()``, ``Router.from_args()``); this
  script does all but ``start()`` too.

SGLang imports ``triton`` at module level (``sglang/srt/utils/common.py``) for nothing the parser
needs; a stub module is put on ``sys.meta_path`` first so the 1 GB package need not be installed.

The module also holds the client side (stdlib only, importable from any python): ``run_checks``
runs a batch through the venv's python and returns the results.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import enum
import importlib.abc
import importlib.machinery
import json
import math
import os
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

KINDS = ("sglang", "router", "smg", "bench")
EX_USAGE = 64  # a misuse of this script itself, as opposed to a rejected command line


# --------------------------------------------------------------------------------------------
# Client side (stdlib only): used by the test suite, from whatever python runs pytest.
# --------------------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    """The interpreter of a serve venv (``VENV/bin/python``)."""
    return venv / "bin" / "python"


def run_checks(
    python: Path | str,
    items: Sequence[tuple[str, Sequence[str]]],
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Check each ``(kind, argv)`` with the launcher's own parser, in one subprocess.

    ``python`` is the serve venv's interpreter. Returns one result dict per item, in order.
    Raises RuntimeError when the checker itself fails (not when a command line is rejected).
    """
    batch = [{"kind": kind, "argv": list(argv)} for kind, argv in items]
    proc = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "batch", "-"],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"argv_check batch failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    return results


def resolve_options(
    python: Path | str, kind: str, argv: Sequence[str], words: Sequence[str],
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Ask the ``kind`` launcher's own parser, after it accepted ``argv``, what each option
    word in ``words`` (``--por``) means to it: ``{"dests": {option string: dest} of every
    option, "resolved": {word: {"option", "dest"} or {"ambiguous": [options]} or None}}``."""
    proc = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "batch", "-"],
        input=json.dumps([{"kind": kind, "argv": list(argv), "resolve": list(words)}]),
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"argv_check failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    (result,) = json.loads(proc.stdout)
    if not result["ok"]:
        raise RuntimeError(f"{kind} refused {argv}: {result['error']}")
    return result["options"]


# --------------------------------------------------------------------------------------------
# Checker side: runs inside the serve venv.
# --------------------------------------------------------------------------------------------


class _TritonStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve ``triton`` and ``triton.*`` as empty packages whose attributes are mocks."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "triton" or fullname.startswith("triton."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__version__ = "0.0.0+pdsvc-stub"  # type: ignore[attr-defined]

        def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562 module attribute hook
            if name.startswith("__"):
                raise AttributeError(name)
            return mock.MagicMock(name=f"{module.__name__}.{name}")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


def install_triton_stub() -> None:
    """Make ``import triton`` succeed without the real package (idempotent)."""
    if not any(isinstance(finder, _TritonStub) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TritonStub())


class ParserError(Exception):
    """Raised instead of argparse's print-usage-and-exit."""

    def __init__(self, usage: str, prog: str, message: str) -> None:
        super().__init__(message)
        self.usage = usage
        self.text = f"{prog}: error: {message}"


@dataclasses.dataclass
class _Capture:
    parsed: list[tuple[argparse.ArgumentParser, argparse.Namespace]] = dataclasses.field(
        default_factory=list
    )

    def last(self) -> tuple[argparse.ArgumentParser | None, argparse.Namespace | None]:
        return self.parsed[-1] if self.parsed else (None, None)


@contextlib.contextmanager
def _argparse_hooks() -> Iterator[_Capture]:
    """Record every namespace parse_args returns; turn parser.error() into ParserError."""
    capture = _Capture()
    real_parse_args = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        namespace = real_parse_args(self, *args, **kwargs)
        capture.parsed.append((self, namespace))
        return namespace

    def error(self: argparse.ArgumentParser, message: str) -> Any:
        raise ParserError(self.format_usage(), self.prog, message)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args),
        mock.patch.object(argparse.ArgumentParser, "error", error),
    ):
        yield capture


def json_safe(value: Any) -> Any:
    """Turn parsed values (tuples, enums, Paths, msgspec structs, ...) into plain JSON."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v) for v in value), key=repr)
    if isinstance(value, argparse.Namespace):
        return json_safe(vars(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    struct_fields = getattr(type(value), "__struct_fields__", None)  # msgspec.Struct
    if struct_fields is not None:
        return {name: json_safe(getattr(value, name)) for name in struct_fields}
    return repr(value)


_Parsed = tuple[argparse.ArgumentParser | None, argparse.Namespace | None, Any]


def abbreviations(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[dict[str, str]]:
    """Options in ``argv`` that argparse only accepted as a prefix of a longer option.

    Both launchers keep argparse's default ``allow_abbrev=True``, so ``--tp`` works only as a
    unique prefix of ``--tp-size`` and ``--mem-fraction`` silently means
    ``--mem-fraction-static``; a new flag upstream can make such a prefix ambiguous.
    """
    known = parser._option_string_actions  # argparse's own option-string table
    found = []
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if not name.startswith("--") or name in known:
            continue
        matches = sorted(option for option in known if option.startswith(name))
        if matches:
            found.append({"given": name, "option": matches[0]})
    return found


def resolve(parser: argparse.ArgumentParser, words: Sequence[str]) -> dict[str, Any]:
    """What argparse itself makes of each option word (``ArgumentParser._parse_optional``:
    an exact option, a unique prefix of one, or an ambiguous prefix), and every option's dest."""
    known = parser._option_string_actions
    resolved: dict[str, Any] = {}
    for word in words:
        try:
            found = parser._parse_optional(word)
        except ParserError as exc:  # argparse: "ambiguous option: --p could match ..."
            resolved[word] = {"ambiguous": sorted(o for o in known if o.startswith(word)),
                              "error": exc.text}
            continue
        if isinstance(found, list):  # Python >= 3.12.7: a list of candidates
            found = found[0] if len(found) == 1 else None
        action, option = (found[0], found[1]) if found else (None, None)
        resolved[word] = {"option": option, "dest": action.dest} if action else None
    return {"dests": {o: a.dest for o, a in known.items()}, "resolved": resolved}


def _parse_sglang(argv: list[str]) -> _Parsed:
    install_triton_stub()
    import sglang.launch_server as launch_server  # the module `python -m` runs

    launch_server.load_plugins()
    with _argparse_hooks() as capture:
        server_args = launch_server.prepare_server_args(argv)
    return (*capture.last(), server_args)


def _parse_router(argv: list[str]) -> _Parsed:
    install_triton_stub()  # sglang_router.mini_lb tries `import sglang.srt.tracing`
    import sglang_router.launch_router as launch_router
    from sglang_router.router import Router

    return _parse_with(launch_router, Router, argv)


def _parse_smg(argv: list[str]) -> _Parsed:
    import smg.launch_router as launch_router
    from smg.router import Router

    def igw(router_args: Any) -> None:  # smg/launch_router.py, before _validate_router_args()
        if router_args.selected_discovery_provider() and not router_args.enable_igw:
            router_args.enable_igw = True

    return _parse_with(launch_router, Router, argv, igw)


def _parse_with(launch_router: Any, Router: Any, argv: list[str], before: Any = None) -> _Parsed:
    # argparse's prog comes from sys.argv[0]; make messages read as the launcher's own.
    saved_argv0 = sys.argv[0]
    sys.argv[0] = launch_router.__file__ or "launch_router.py"
    try:
        with _argparse_hooks() as capture:
            router_args = launch_router.parse_router_args(argv)
    finally:
        sys.argv[0] = saved_argv0
    # What launch_router() does next, short of router.start(). from_args() rewrites the
    # record's __dict__ in place, hence the copy.
    if before:
        before(router_args)
    router_args._validate_router_args()
    Router.from_args(copy.deepcopy(router_args))
    return (*capture.last(), router_args)


def _parse_bench(argv: list[str]) -> _Parsed:
    """``python -m sglang.bench_serving`` (sglang 0.5.23: an alias of
    sglang/benchmark/serving.py) runs ``cli_main()``, which builds its parser inline, checks
    the namespace (``--rust-client``, the gsp flags) and calls ``run_benchmark(args)``: this
    runs ``cli_main`` itself with ``run_benchmark`` replaced, so nothing is sent. Its imports
    go through bench_site/sitecustomize.py's stand-ins (the test venv has no GPU stack)."""
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parent / "bench_site" / "sitecustomize.py"))
    import sglang.benchmark.serving as serving

    seen: list[argparse.Namespace] = []
    saved_argv = sys.argv
    sys.argv = ["bench_serving.py", *argv]
    try:
        with _argparse_hooks() as capture, mock.patch.object(serving, "run_benchmark",
                                                             seen.append):
            serving.cli_main()
    finally:
        sys.argv = saved_argv
    parser, _ = capture.last()
    return parser, seen[0], seen[0]


_PARSERS = {"sglang": _parse_sglang, "router": _parse_router, "smg": _parse_smg,
            "bench": _parse_bench}


def check(kind: str, argv: Sequence[str],
          words: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` the way the ``kind`` launcher would; never raises for a bad argv.
    ``words``: option words to look up in the parser afterwards (``resolve``)."""
    if kind not in _PARSERS:
        raise ValueError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    result: dict[str, Any] = {
        "kind": kind,
        "argv": list(argv),
        "ok": False,
        "exit_code": 1,
        "error": None,
        "usage": None,
        "namespace": None,
        "record": None,
        "abbreviated": [],
    }
    # Anything the launcher prints (help, deprecation notes) must not corrupt our JSON.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            parser, namespace, record = _PARSERS[kind](list(argv))
        except ParserError as exc:
            result.update(exit_code=2, error=exc.text, usage=exc.usage)
        except SystemExit as exc:  # e.g. --help: argparse exits by itself
            code = exc.code if isinstance(exc.code, int) else 1
            result.update(exit_code=code, error=f"parser exited early (SystemExit {exc.code})")
        except Exception as exc:  # noqa: BLE001 - the launcher would die on it: a rejection
            result.update(exit_code=1, error=f"{type(exc).__name__}: {exc}")
        else:
            result.update(
                ok=True,
                exit_code=0,
                namespace=json_safe(namespace),
                record=json_safe(record),
                abbreviated=abbreviations(parser, argv) if parser else [],
            )
            if words is not None and parser:
                with _argparse_hooks():  # parser.error() raises ParserError there too
                    result["options"] = resolve(parser, words)
    return result


def _usage(message: str) -> int:
    print(f"argv_check: {message}", file=sys.stderr)
    print("\n\n".join((__doc__ or "").split("\n\n")[1:3]), file=sys.stderr)
    return EX_USAGE


def main(args: Sequence[str]) -> int:
    if len(args) >= 2 and args[0] in KINDS and args[1] == "--":
        result = check(args[0], args[2:])
        if not result["ok"]:
            print(result["error"], file=sys.stderr)
            return int(result["exit_code"]) or 1
        json.dump(result, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    if len(args) == 2 and args[0] == "batch":
        try:
            if args[1] == "-":
                batch = json.load(sys.stdin)
            else:
                batch = json.loads(Path(args[1]).read_text(encoding="utf-8"))
            items = [(entry["kind"], entry["argv"]) for entry in batch]
            words = [entry.get("resolve") for entry in batch]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            return _usage(f"bad batch file: {type(exc).__name__}: {exc}")
        bad = [
            entry
            for entry in items
            if entry[0] not in KINDS
            or not isinstance(entry[1], list)
            or not all(isinstance(arg, str) for arg in entry[1])
        ]
        if bad:
            return _usage(
                f"bad batch entries (kind must be one of {'|'.join(KINDS)}, argv a str list): "
                f"{bad!r}"
            )
        results = [check(kind, argv, w) for (kind, argv), w in zip(items, words, strict=True)]
        json.dump(results, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    return _usage("expected `sglang -- ARGV...`, `router -- ARGV...`, `smg -- ARGV...` or "
                  "`batch FILE.json`")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
