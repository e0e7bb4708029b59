"""README.md stays true: its config reference is the schema's, its set-up commands exist."""

from __future__ import annotations

import re

from conftest import REPO

from pdsvc.config.reference import reference_markdown


def test_config_reference_is_generated_from_the_schema() -> None:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- reference:start -->\n(.*)<!-- reference:end -->", text, re.S)
    assert block, "README.md lost its reference markers"
    assert block.group(1) == reference_markdown(), (
        "README config reference is stale: run python -m pdsvc.config.reference and paste it "
        "between the markers"
    )


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash .ci/run" in readme and "python -m pytest -q" in readme
    assert "python3 -m pytest -q" in ci and "make_serve_venv.sh" in ci


def _within(part: object, whole: object) -> bool:
    """Whether the README's abbreviated YAML says nothing the config file does not."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and _within(v, whole[k]) for k, v in part.items())
    if isinstance(part, list) and part and isinstance(part[0], dict):
        return isinstance(whole, list) and len(part) == len(whole) and all(
            _within(p, w) for p, w in zip(part, whole, strict=True))
    return part == whole


def test_the_three_configs_side_by_side_are_the_example_files_and_render(runner) -> None:
    import yaml

    from pdsvc.cli.commands import main

    text = (REPO / "README.md").read_text()
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
