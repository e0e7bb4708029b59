"""Rendered systemd bundles of small configs on the seed host, for the tests of `pdsvc
apply`'s plan and command (tests/test_apply.py, tests/test_apply_rollout.py)."""

from __future__ import annotations

from pathlib import Path

from pdsvc.apply.rollout import Rollout, plan_rollout
from pdsvc.cli.kit import load_plan
from pdsvc.render.systemd import render_systemd

REPO = Path(__file__).resolve().parents[2]
TOPO = REPO / "etc" / "seed-host.topology.json"

#: 2P2D, mooncake: no decode is PartOf= a prefill (that coupling is NIXL's)
TWO_TWO = """\
name: dsv4
model: {path: /srv/models/x}
transfer: {backend: mooncake}
prefill:
  - {gpus: [0, 1]%s}
  - {gpus: [2, 3]%s}
decode:
  - {gpus: [4, 5]%s}
  - {gpus: [6, 7]%s}
router: {policy: %s}
"""


def two_two(p: str = "", d: str = "", *, policy: str = "cache_aware",
            backend: str = "mooncake") -> str:
    return TWO_TWO.replace("mooncake", backend) % (p, p, d, d, policy)


ONE_ONE = """\
name: dsv4
model: {path: /srv/models/x}
prefill: {gpus: [0, 1, 2, 3]}
decode: {gpus: [4, 5, 6, 7]%s}
"""


def bundle(tmp_path: Path, text: str, name: str = "c.yaml", topology: Path = TOPO
           ) -> dict[str, str]:
    """The systemd bundle `pdsvc render` makes of config ``text`` (written to ``name``)."""
    cfg = tmp_path / name
    cfg.write_text(text)
    plan = load_plan(cfg, None, topology)
    return {f.path: f.content for f in render_systemd(plan, "pdsvc render")}


def rollout(tmp_path: Path, old: str, new: str) -> Rollout:
    return plan_rollout(bundle(tmp_path, old, "old.yaml"), bundle(tmp_path, new, "new.yaml"))
