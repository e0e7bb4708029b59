"""Size limits of pdsvc's code (issues 32 and 51): no function over 60 lines anywhere in
pdsvc/, no module over 500 lines, and no runtime module (pdsvc/ship/runtime/, read on the
GPU host) over 450, so that each can be read whole.

A function's length runs from its ``def`` line to its last line (its decorators not counted).
The allow-lists name what is over its limit today, with why; they only shrink: an entry that
is no longer over its limit fails too, so that it is taken off when the code is.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "pdsvc"
RUNTIME = PKG / "ship" / "runtime"

MAX_FUNCTION_LINES = 60
MAX_RUNTIME_MODULE_LINES = 450
MAX_MODULE_LINES = 500

#: Runtime modules over MAX_RUNTIME_MODULE_LINES while they are split, path -> why; empty
#: since the runtime's rework (issue 32) brought lifecycle.py and canary.py under the limit.
MODULES_OVER: dict[str, str] = {}

#: Functions over MAX_FUNCTION_LINES while they are split, "path:name" (a method:
#: "path:Class.name") -> why; empty since Unit.duties was split and liveness_loop became watch.step.
FUNCTIONS_OVER: dict[str, str] = {}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def function_lengths(path: Path) -> dict[str, int]:
    """'name' (nested: 'outer.inner') -> lines from its def to its last line, of every
    function and method in the file."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                assert child.end_lineno is not None
                lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return lengths


def long_functions() -> dict[str, int]:
    """'path:name' -> length of every function in pdsvc/ over the limit."""
    return {f"{_rel(path)}:{name}": n
            for path in sorted(PKG.rglob("*.py"))
            for name, n in function_lengths(path).items() if n > MAX_FUNCTION_LINES}


def long_modules(under: Path, limit: int) -> dict[str, int]:
    """path -> lines of every module under ``under`` over ``limit``."""
    return {_rel(path): n for path in sorted(under.rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit}


def long_runtime_modules() -> dict[str, int]:
    return long_modules(RUNTIME, MAX_RUNTIME_MODULE_LINES)


def _unlisted(over: dict[str, int], allowed: dict[str, str]) -> str:
    """'name (length), …' of what is over its limit and not on the allow-list."""
    return ", ".join(f"{k} ({n})" for k, n in sorted(over.items()) if k not in allowed)


def test_no_function_over_the_limit() -> None:
    unlisted = _unlisted(long_functions(), FUNCTIONS_OVER)
    assert not unlisted, (f"functions over {MAX_FUNCTION_LINES} lines (def to last line): "
                          f"{unlisted}; split each by idea into functions of their own")


def test_no_runtime_module_over_the_limit() -> None:
    unlisted = _unlisted(long_runtime_modules(), MODULES_OVER)
    assert not unlisted, (f"runtime modules over {MAX_RUNTIME_MODULE_LINES} lines: "
                          f"{unlisted}; split the module by idea")


def test_no_module_over_the_limit() -> None:
    unlisted = _unlisted(long_modules(PKG, MAX_MODULE_LINES), {})
    assert not unlisted, (f"modules over {MAX_MODULE_LINES} lines: {unlisted}; split the "
                          "module by idea, not by line count")


def test_the_allow_lists_only_shrink() -> None:
    """An entry whose code is now within its limit (or gone) is taken off the list."""
    fixed = sorted(set(FUNCTIONS_OVER) - set(long_functions()))
    fixed += sorted(set(MODULES_OVER) - set(long_runtime_modules()))
    assert not fixed, f"within the limit now: take {', '.join(fixed)} off the allow-list"


def test_the_measure(tmp_path: Path) -> None:
    """Lengths count from the def line (not the decorators) to the last line, nested
    functions and methods under their own dotted names."""
    src = tmp_path / "m.py"
    src.write_text(
        "@decorator\n"
        "def f():\n"
        "    def g():\n"
        "        return 1\n"
        "    return g\n"
        "\n"
        "class C:\n"
        "    async def h(self):\n"
        "        pass\n",
        encoding="utf-8",
    )
    assert function_lengths(src) == {"f": 4, "f.g": 2, "C.h": 2}
