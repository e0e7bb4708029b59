"""docs/lifecycle.md and its pages (docs/lifecycle/) stay true to the runtime they describe:
the transitions listed are states.TRANSITIONS, the diagram and the state sections name every
state in order, the endings table says each Ending's phase and exit status, and they name every
timing, every state-file kind and every option the config owns."""

from __future__ import annotations

import dataclasses
import re

from conftest import REPO

from pdsvc.ship.runtime import timings
from pdsvc.ship.runtime.endings import Ending
from pdsvc.ship.runtime.options import Options
from pdsvc.ship.runtime.statefile import Kind
from pdsvc.ship.runtime.states import TRANSITIONS, State

#: docs/lifecycle.md and its pages (docs/lifecycle/*.md), a page's title its section's heading
PAGES = {p.stem: p.read_text() for p in sorted((REPO / "docs" / "lifecycle").glob("*.md"))}
DOC = "\n".join([(REPO / "docs" / "lifecycle.md").read_text(),
                 *(text.replace("# ", "## ", 1) for text in PAGES.values())])


def fenced(info: str) -> list[str]:
    """The bodies of the fenced blocks whose info string is ``info`` ("" for none)."""
    return re.findall(rf"^```{re.escape(info)}\n(.*?)^```", DOC, re.S | re.M)


def section(title: str) -> str:
    """The text under the level-2 heading ``title``, up to the next one."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert match, f"docs/lifecycle.md and its pages lost the section {title!r}"
    return match.group(1)


def test_the_pages_are_the_index_s_and_each_links_its_neighbours() -> None:
    index = (REPO / "docs" / "lifecycle.md").read_text()
    assert all(f"](lifecycle/{name}.md)" in index for name in PAGES), sorted(PAGES)
    for name, text in PAGES.items():
        assert text.splitlines()[2].startswith("[Lifecycle](../lifecycle.md)"), name


def test_the_listed_transitions_are_the_table_the_code_enforces() -> None:
    blocks = fenced("transitions")
    assert len(blocks) == 1, "docs/lifecycle.md needs one ```transitions block"
    listed = set()
    for line in blocks[0].splitlines():
        if line.strip():
            source, _, target = line.partition(" -> ")
            listed.add((State[source.strip()], State[target.strip()]))
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    extra = sorted((a.name, b.name) for a, b in listed - table)
    missing = sorted((a.name, b.name) for a, b in table - listed)
    assert listed == table, (f"docs/lifecycle.md lists {extra} that states.TRANSITIONS lacks, "
                             f"and lacks {missing}")


def test_the_diagram_and_the_state_sections_name_every_state() -> None:
    states = section("The states")
    diagram = next(b for b in fenced("") if "PREFLIGHT" in b)
    assert {s.name for s in State} == set(re.findall(r"\b[A-Z][A-Z_]{4,}\b", diagram))
    headings = re.findall(r"^### (\w+)$", states, re.M)
    assert headings == [s.name for s in State], "one ### section per state, in the enum's order"


def test_the_endings_table_is_endings_py() -> None:
    text = section("How a run ends")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.M)}
    assert set(rows) == {e.name for e in Ending}
    for e in Ending:
        cells = [c.strip() for c in rows[e.name].strip("|").split("|")]
        assert f"`{e.phase.value}`" == cells[2], (e.name, cells[2])
        if e.exit is not None:
            assert cells[3].startswith(str(int(e.exit))), (e.name, cells[3])
        else:
            assert "the child's" in cells[3], (e.name, cells[3])
        assert cells[4] == ("yes" if e.own_stop else "no"), (e.name, cells[4])


def test_every_timing_and_state_file_kind_is_named() -> None:
    table = section("Timings and options")
    for name in (n for n in dir(timings) if n.isupper()):
        row = re.search(rf"^\| `{name}` \| ([\d.]+) \|", table, re.M)
        assert row, f"docs/lifecycle.md's timings table lacks {name}"
        assert float(row.group(1)) == getattr(timings, name), name
    files = section("State files")
    for kind in Kind:
        assert f".{kind.value}.json` (`Kind.{kind.name}`)" in files, kind


def test_every_option_the_config_owns_is_named_with_its_default() -> None:
    table = section("Timings and options")
    for f in dataclasses.fields(Options):
        if not f.metadata.get("config"):
            continue
        flag = "--" + f.name.replace("_", "-")
        row = re.search(rf"^\| `{flag}` \| ([\d.]+) \|.*\| `(\w+)` \|", table, re.M)
        assert row, f"docs/lifecycle.md's options table lacks {flag} (config-owned)"
        assert float(row.group(1)) == f.default, flag


def test_layout_names_every_runtime_module() -> None:
    """docs/layout.md's paragraph on runtime/ names each of its modules."""
    layout = (REPO / "docs" / "layout.md").read_text()
    block = re.search(r"^  runtime/ (.*?)^  \S", layout, re.S | re.M)
    assert block, "docs/layout.md lost its runtime/ paragraph"
    words = set(re.findall(r"\w+", block.group(1)))
    modules = {p.stem for p in (REPO / "pdsvc" / "ship" / "runtime").glob("*.py")
               if not p.stem.startswith("__")}
    assert modules <= words, f"docs/layout.md does not name {sorted(modules - words)}"
