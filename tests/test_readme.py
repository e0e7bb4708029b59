"""README.md and docs/ stay true: the README's first screen (a config that validates, the path
from install to serving, the set-up commands), the config reference in docs/config.md is the
schema's, the configs side by side in docs/hosts.md are the example files, every link resolves."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from conftest import REPO

from pdsvc.config.reference import reference_markdown

DOCS = REPO / "docs"


def test_config_reference_is_generated_from_the_schema() -> None:
    text = (DOCS / "config.md").read_text()
    block = re.search(r"<!-- reference:start -->\n(.*)<!-- reference:end -->", text, re.S)
    assert block, "docs/config.md lost its reference markers"
    assert block.group(1) == reference_markdown(), (
        "docs/config.md's config reference is stale: run python -m pdsvc.config.reference and "
        "paste it between the markers"
    )


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash .ci/run" in readme and "make_serve_venv.sh" in ci
    # the command the README and docs/testing.md give is the one .ci/run runs
    run = re.search(r"^python3 -m pytest -q -n \"\$\{PDSVC_TEST_WORKERS:-(\d+)\}\" (.*)$", ci, re.M)
    assert run, "the pytest line of .ci/run changed: update this test, the README and docs"
    given = f"python3 -m pytest -q -n {run.group(1)} --dist loadgroup"
    assert "--dist loadgroup" in run.group(2)
    assert given in readme and given in (DOCS / "testing.md").read_text()


def test_readme_shows_the_path_from_install_to_serving_first() -> None:
    readme = (REPO / "README.md").read_text()
    first = readme[:readme.index("\n## ")]  # before the first section: the first screen
    path = re.findall(r"^(pip install -e \.|pdsvc \w+|sudo \./install\.sh|systemctl start \S+)",
                      first, re.M)
    assert path == ["pip install -e .", "pdsvc doctor", "pdsvc render", "sudo ./install.sh",
                    "systemctl start dsv4-pd.target", "pdsvc status"]


def test_every_doc_is_linked_and_every_link_resolves() -> None:
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", readme))
    assert linked == {p.name for p in DOCS.glob("*.md")}
    for doc in [REPO / "README.md", REPO / "CONTRIBUTING.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), (doc.name, target)


def _within(part: object, whole: object) -> bool:
    """Whether the docs' abbreviated YAML says nothing the config file does not."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and _within(v, whole[k]) for k, v in part.items())
    if isinstance(part, list) and part and isinstance(part[0], dict):
        return isinstance(whole, list) and len(part) == len(whole) and all(
            _within(p, w) for p, w in zip(part, whole, strict=True))
    return part == whole


def test_the_readme_config_is_the_default_abridged_and_validates(runner, tmp_path) -> None:
    import yaml

    from pdsvc.cli.commands import main

    text = (REPO / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    assert _within(yaml.safe_load(block), yaml.safe_load((REPO / "etc/pdsvc.yaml").read_text()))
    (tmp_path / "short.yaml").write_text(block)
    result = runner.invoke(main, ["validate", "-c", str(tmp_path / "short.yaml"),
                                  "--topology", str(REPO / "etc/seed-host.topology.json")])
    assert result.exit_code == 0, (result.output, result.stderr)


def test_the_three_configs_side_by_side_are_the_example_files_and_render(runner) -> None:
    import yaml

    from pdsvc.cli.commands import main

    text = (DOCS / "hosts.md").read_text()
    table = text[text.index("<th>1P1D on one host"):text.index("</table>")]
    blocks = re.findall(r"```yaml\n(.*?)```", table, re.S)
    files = ["etc/pdsvc.yaml", "etc/examples/2p1d.yaml", "etc/examples/three-hosts.yaml"]
    assert len(blocks) == len(files)
    for block, path in zip(blocks, files, strict=True):
        config = yaml.safe_load((REPO / path).read_text())
        assert _within(yaml.safe_load(block), config), path
        result = runner.invoke(main, ["validate", "-c", str(REPO / path),
                                      "--topology", str(REPO / "etc/seed-host.topology.json")])
        assert result.exit_code == 0, (path, result.output, result.stderr)


def _zero_loss_table() -> ModuleType:
    """benchmarks/zero_loss_table.py (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(
        "zero_loss_table", REPO / "benchmarks" / "zero_loss_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_zero_loss_table_is_the_last_benchmark_run() -> None:
    """The README's table is made from benchmarks/results/zero_loss.txt, never typed: after a
    new run, `python benchmarks/zero_loss_table.py` prints the table to paste."""
    zero_loss_table = _zero_loss_table()
    table = zero_loss_table.table(zero_loss_table.RESULTS.read_text())
    assert table in (REPO / "README.md").read_text(), (
        "README.md's zero-loss table is not the last run's: paste the output of "
        "`python benchmarks/zero_loss_table.py`")
    rows = table.splitlines()[2:]
    assert any(r.startswith("| apply, pair-incompatible") for r in rows), table
    assert all(r.count("|") == 5 for r in rows), table


def test_the_zero_loss_table_reads_every_row_kind() -> None:
    zero_loss_table = _zero_loss_table()
    text = ("smg: 2P2D under steady load (...)\n"
            "  kill -9 decode-0's engine            55      2 (≤3)  cut 2"
            "                                 0.94    1.44      5.4\n"
            "  apply, pair-incompatible change      108      1       http 503 1"
            "                            0.94    0.94     14.5   MISSES: 1 failed, goal 0\n"
            "  1P1D apply outage: 3.1 s against the engine's load time 2 s (goal ≤ 4 s)\n")
    cells, goal = zero_loss_table.parse(text)
    assert cells["kill -9 decode-0's engine"]["smg"] == "2 of 55: cut 2, 3 in flight (5.4 s)"
    assert (cells["apply, pair-incompatible change"]["smg"]
            == "1 of 108: http 503 1 (14.5 s, p99 0.94 → 0.94 s)")
    assert cells["1P1D apply: outage"]["smg"] == "3.1 s" and goal == "load 2 s + 2 s = 4 s"
