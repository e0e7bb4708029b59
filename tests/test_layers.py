"""The package's layers: data flows one way, cli -> config -> topology -> plan -> render.

Each module's imports (parsed, not run) are checked against its layer's rank: a module may
import its own layer, the leaves and any layer ranked below it, never one ranked above. What
is shipped to the GPU host (pdsvc/ship) imports nothing of pdsvc but itself: it runs there
without pdsvc installed. Within a layer no two modules import each other, however indirectly:
every import counts, one under ``if TYPE_CHECKING:`` or inside a function too (hiding a cycle
there is how the config model and its checks, the systemd renderer and monitoring, once
leaned on each other).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "pdsvc"

#: The layers, lowest first. A module's layer is its first path part under pdsvc/ (a package)
#: or, at the top, the module itself. Leaves are facts every layer may read.
LEAVES = {"errors", "encode", "topology", "sglang", "routers", "__init__"}
RANK = {"ship": 0, "config": 1, "plan": 2, "render": 3, "status": 4, "doctor": 4, "bench": 4,
        "apply": 4, "tune": 5, "profile": 5, "cli": 6}


def layer_of(module: str) -> str:
    """'pdsvc.config.schema' -> 'config'; 'pdsvc.errors' -> 'errors'; 'pdsvc' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, root: Path = PKG) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, root: Path = PKG) -> bool:
    """Whether 'pdsvc.a.b' (or 'a.b' under pdsvc) is a module or package of the tree."""
    rel = Path(*name.removeprefix("pdsvc.").split(".")) if name != "pdsvc" else Path()
    return (root / f"{rel}.py").is_file() or (root / rel / "__init__.py").is_file()


def imports(path: Path, root: Path = PKG) -> list[tuple[int, str]]:
    """(line, absolute module) of every pdsvc import in the file, relative ones resolved; for
    ``from PACKAGE import NAME``, the module NAME when it is one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = module_name(path, root).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "pdsvc"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "pdsvc":
                continue
            # `from pdsvc.x import y`: y is the module imported when it is one
            found += [(node.lineno, f"{name}.{a.name}" if _is_module(f"{name}.{a.name}", root)
                       else name) for a in node.names]
    return found


def backwards(path: Path, root: Path = PKG) -> list[str]:
    """Each import of a layer ranked above the file's own, as 'file:line imports module'."""
    mod = module_name(path, root)
    mine = layer_of(mod)
    bad = []
    for line, target in imports(path, root):
        theirs = layer_of(target)
        where = f"{path.relative_to(root.parent)}:{line} imports {target}"
        if mine == "ship":
            if theirs != "ship":
                bad.append(where + " (shipped code imports only itself)")
        elif mine in LEAVES:
            if theirs not in LEAVES:
                bad.append(where + " (a leaf imports only leaves)")
        elif theirs not in LEAVES and RANK[theirs] > RANK[mine]:
            bad.append(where + f" ({mine} is below {theirs})")
    return bad


SOURCES = sorted(PKG.rglob("*.py"))


def test_every_package_has_a_layer() -> None:
    """A new package under pdsvc/ must be given its place before it can hold code."""
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(RANK), f"give these packages a rank in RANK: {packages - set(RANK)}"
    tops = {p.stem for p in PKG.glob("*.py")}
    assert tops <= LEAVES, f"top-level modules must be leaves (or go into a layer): {tops - LEAVES}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_runs_backwards(path: Path) -> None:
    assert backwards(path) == []


def cycles(root: Path = PKG) -> list[list[str]]:
    """Every set of modules that import each other, however indirectly (Tarjan's strongly
    connected components of the import graph, each larger than one module or importing
    itself), each sorted."""
    graph = {module_name(p, root): {m for _, m in imports(p, root)}
             for p in sorted(root.rglob("*.py"))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1 or v in graph[v]:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other() -> None:
    assert cycles() == [], "break these cycles (a type-only or in-function import counts)"


def _probe_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A throw-away package tree named pdsvc under tmp_path (never the real one)."""
    root = tmp_path / "pdsvc"
    for rel, text in {"__init__.py": "", "config/__init__.py": "", "plan/__init__.py": "",
                      "render/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_check_sees_a_backwards_import(tmp_path: Path) -> None:
    """The walker itself: a config module that imports the plan is caught, relative or not."""
    root = _probe_tree(tmp_path, {
        "plan/build.py": "",
        "render/systemd.py": "",
        "config/probe.py": "from pdsvc.plan.build import build_plan\n"
                           "from ..render import systemd\n",
    })
    found = backwards(root / "config" / "probe.py", root)
    assert len(found) == 2, found
    assert "config is below plan" in found[0] and "config is below render" in found[1]


def test_the_check_sees_a_cycle_hidden_by_type_checking_or_a_function(tmp_path: Path) -> None:
    root = _probe_tree(tmp_path, {
        "config/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from pdsvc.config.b import B\n",
        "config/b.py": "def f():\n    from pdsvc.config import a\n",
        "config/c.py": "from pdsvc.config import a\n",
    })
    assert cycles(root) == [["pdsvc.config.a", "pdsvc.config.b"]]
