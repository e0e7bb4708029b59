"""The package's layers: data flows one way, cli -> config -> topology -> plan -> render.

Each module's imports (parsed, not run) are checked against its layer's rank: a module may
import its own layer, the leaves and any layer ranked below it, never one ranked above. What
is shipped to the GPU host (pdsvc/ship) imports nothing of pdsvc but itself: it runs there
without pdsvc installed.
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
        "apply": 4, "cli": 5}


def layer_of(module: str) -> str:
    """'pdsvc.config.schema' -> 'config'; 'pdsvc.errors' -> 'errors'; 'pdsvc' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    return (PKG / f"{name}.py").is_file() or (PKG / name / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every pdsvc import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = module_name(path).split(".")
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
            if name == "pdsvc":  # `from pdsvc import X`: X is the module imported
                found += [(node.lineno, f"pdsvc.{a.name}" if _is_module(a.name) else "pdsvc")
                          for a in node.names]
            else:
                found.append((node.lineno, name))
    return found


def backwards(path: Path) -> list[str]:
    """Each import of a layer ranked above the file's own, as 'file:line imports module'."""
    mod = module_name(path)
    mine = layer_of(mod)
    bad = []
    for line, target in imports(path):
        theirs = layer_of(target)
        where = f"{path.relative_to(PKG.parent)}:{line} imports {target}"
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


def test_the_check_sees_a_backwards_import(tmp_path: Path) -> None:
    """The walker itself: a config module that imports the plan is caught, relative or not."""
    fake = PKG / "config" / "_probe_backwards.py"
    try:
        fake.write_text("from pdsvc.plan.build import build_plan\nfrom ..render import systemd\n")
        found = backwards(fake)
    finally:
        fake.unlink()
    assert len(found) == 2, found
    assert "config is below plan" in found[0] and "config is below render" in found[1]
