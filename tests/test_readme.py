"""README.md stays true: its config reference is the schema's, its set-up commands exist."""

from __future__ import annotations

import re

from conftest import REPO

from pdsvc.reference import reference_markdown


def test_config_reference_is_generated_from_the_schema() -> None:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- reference:start -->\n(.*)<!-- reference:end -->", text, re.S)
    assert block, "README.md lost its reference markers"
    assert block.group(1) == reference_markdown(), (
        "README config reference is stale: run python -m pdsvc.reference and paste it between "
        "the markers"
    )


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash .ci/run" in readme and "python -m pytest -q" in readme
    assert "python3 -m pytest -q" in ci and "make_serve_venv.sh" in ci
