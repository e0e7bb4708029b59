"""Re-generate tests/golden/seed/, the seed bundle that tests/test_golden.py pins byte for byte.

It is what `pdsvc render --topology etc/seed-host.topology.json` writes into units/ in the
checkout (etc/pdsvc.yaml for the seed host), without two derived parts: the runtime copy
(runtime/, which the golden test compares with pdsvc/ship/runtime instead) and the bundle record
(.pdsvc-bundle.json: the files' hashes and where the config lies from the output). Run it from
anywhere, then review `git diff tests/golden/` and commit it:

    python tests/golden/regenerate.py
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "seed"
CONFIG = Path("etc/pdsvc.yaml")
TOPOLOGY = Path("etc/seed-host.topology.json")
COMMAND = f"pdsvc render --config {CONFIG} --topology {TOPOLOGY}"
REGENERATE = "python tests/golden/regenerate.py"


def seed_bundle() -> list:
    """The seed bundle's files as `pdsvc render` in the checkout makes them (paths in their
    headers relative to the checkout), less the copies of pdsvc/ship (runtime/, install/)."""
    from pdsvc.cli.kit import load_plan
    from pdsvc.render.kit import INSTALLER_DIR, RUNTIME_DIR
    from pdsvc.render.systemd import render_systemd

    here = Path.cwd()
    os.chdir(REPO)
    try:
        files = render_systemd(load_plan(CONFIG, None, TOPOLOGY), COMMAND)
    finally:
        os.chdir(here)
    return [f for f in files if Path(f.path).parts[0] not in (RUNTIME_DIR, INSTALLER_DIR)]


def main() -> None:
    files = seed_bundle()
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for f in files:
        dest = GOLDEN / f.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.content, encoding="utf-8")
        dest.chmod(f.mode)
    print(f"wrote {len(files)} files to {GOLDEN.relative_to(REPO)}/; "
          "review: git diff tests/golden/")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # this checkout's pdsvc, whichever one is installed
    main()
