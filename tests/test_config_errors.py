"""Bad configs: one stderr line naming file:line, the key and the fix; exit 2; nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from pdsvc.cli.commands import main

SEED = ["--topology", str(REPO / "etc/seed-host.topology.json")]
BASE = "model: {path: /srv/m}\n"
P2 = "prefill:\n  - gpus: [0, 1]\n  - gpus: [2, 3]\n"  # two prefills; item 1 starts on line 4
#: prefill and decode on two hosts (lines 2-4), each binding lifecycle.cascade_port
TWO_HOSTS = BASE + ("hosts:\n  a: {address: 10.0.0.2, run: [prefill, router]}\n"
                    "  b: {address: 10.0.0.3, run: [decode]}\n")

CASES = [
    ("typo-top", BASE + "prefil:\n  port: 1\n",
     ":2: unknown key 'prefil'; did you mean 'prefill'?"),
    ("typo-nested", BASE + "router:\n  health_check:\n    intervall_secs: 3\n",
     ":4: unknown key 'router.health_check.intervall_secs'; did you mean "
     "'router.health_check.interval_secs'?"),
    ("missing-model", "name: xy\n", ":1: missing required key 'model'"),
    ("bad-yaml", BASE + "prefill: [\n", "invalid YAML"),
    ("not-a-mapping", "- a\n- b\n", "the config must be a mapping"),
    ("tp-mismatch", BASE + "prefill:\n  gpus: [0, 1]\n  tp: 4\n",
     ":4: prefill.tp: tp is 4 but 2 GPUs are listed; one TP rank runs per GPU, so make it 2"),
    ("shared-gpu", BASE + "decode:\n  gpus: [3, 4]\n",
     ":3: decode.gpus: GPU 3 is also in prefill.gpus"),
    ("dup-gpu", BASE + "decode:\n  gpus: [4, 4]\n", "decode.gpus: GPU 4 is listed twice"),
    ("port-clash", BASE + "router:\n  port: 30001\n",
     "router.port: port 30001 is also decode.port"),
    ("bootstrap-clash", BASE + "prefill:\n  bootstrap_port: 30000\n",
     "prefill.bootstrap_port: port 30000 is also prefill.port"),
    ("dist-init-close", BASE + "decode:\n  dist_init_port: 30380\n",
     "decode.dist_init_port: 30380 is within 100 of prefill.dist_init_port 30335"),
    ("dist-init-covers-port", BASE + "prefill:\n  dist_init_port: 29950\n",
     "prefill.dist_init_port: 29950…30049 is kept for SGLang's ZMQ/NCCL ports but prefill.port"),
    ("cascade-clash", TWO_HOSTS + "lifecycle:\n  cascade_port: 30000\n",
     ":6: lifecycle.cascade_port: port 30000 is also prefill.port (prefill.port is its "
     "default); each service needs its own"),
    ("port-range", BASE + "router:\n  port: 70000\n", "router.port: Input should be less than"),
    ("owned-flag", BASE + "decode:\n  args:\n    port: 1\n",
     "decode.args: --port is set by pdsvc from <role>.port"),
    ("owned-router-flag", BASE + "router:\n  args:\n    prefill: x\n",
     "router.args: --prefill is set by pdsvc"),
    ("owned-env", BASE + "prefill:\n  env:\n    CUDA_VISIBLE_DEVICES: '0'\n",
     "CUDA_VISIBLE_DEVICES is set by pdsvc from <role>.gpus"),
    ("cpu-affinity-env", BASE + "runtime:\n  env:\n    SGLANG_SET_CPU_AFFINITY: 'true'\n",
     "SGLANG_SET_CPU_AFFINITY overrides the unit's NUMA pinning"),
    ("relative-python", BASE + "runtime:\n  python: python3\n",
     "runtime.python: must be an absolute path"),
    ("bad-numa", BASE + "decode:\n  numa_node: near\n",
     "decode.numa_node: must be 'auto' or a NUMA node number"),
    ("bad-backend", BASE + "transfer:\n  backend: rdma\n", "transfer.backend: Input should be"),
    ("bad-name", "name: My Stack\n" + BASE, "name: must be 2-32 lowercase letters, digits"),
    ("bad-flag-name", BASE + "decode:\n  args:\n    --cuda-graph-max-bs: 8\n", "decode.args"),
    # xPyD: roles as lists of instances; keys are named with the list index, lines are exact
    ("xpyd-dup-bootstrap", BASE + P2 + "    bootstrap_port: 8998\n",
     ":5: prefill[1].bootstrap_port: port 8998 is also prefill[0].bootstrap_port "
     "(prefill[0].bootstrap_port was allocated from the instance's index); each service "
     "needs its own"),
    ("xpyd-allocated-clash", BASE + "prefill:\n  - {gpus: [0, 1], port: 30002}\n"
     "  - {gpus: [2, 3]}\n",
     # named where the user wrote it, the allocated one explained
     ":3: prefill[0].port: port 30002 is also prefill[1].port (prefill[1].port was allocated "
     "from the instance's index); each service needs its own"),
    ("xpyd-bootstrap-vs-http", BASE + "prefill:\n  - {gpus: [0, 1], bootstrap_port: 30002}\n"
     "  - {gpus: [2, 3]}\n",
     ":3: prefill[0].bootstrap_port: port 30002 is also prefill[1].port (prefill[1].port was "
     "allocated"),
    ("xpyd-shared-gpu", BASE + "prefill:\n  - gpus: [0, 1]\n  - gpus: [1, 2]\n",
     ":4: prefill[1].gpus: GPU 1 is also in prefill[0].gpus; give each engine its own GPUs"),
    ("xpyd-shared-gpu-across-roles", BASE + "decode:\n  - gpus: [4, 5]\n  - gpus: [3]\n",
     ":4: decode[1].gpus: GPU 3 is also in prefill.gpus"),
    ("xpyd-dist-init-close", BASE + "decode:\n  - gpus: [4, 5]\n  - gpus: [6, 7]\n"
     "    dist_init_port: 30480\n",
     ":5: decode[1].dist_init_port: 30480 is within 100 of decode[0].dist_init_port 30435"),
    ("xpyd-missing-gpus", BASE + "prefill:\n  - port: 31000\n",
     ":3: missing required key 'prefill[0].gpus'"),
    ("xpyd-typo-in-item", BASE + P2 + "    prot: 31000\n",
     ":5: unknown key 'prefill[1].prot'; did you mean 'prefill[1].port'?"),
    ("xpyd-empty-list", BASE + "prefill: []\n", ":2: prefill: List should have at least 1 item"),
    ("xpyd-tp-mismatch", BASE + P2 + "    tp: 4\n", ":5: prefill[1].tp: tp is 4 but 2 GPUs"),
    ("xpyd-owned-flag", BASE + "decode:\n  - gpus: [4]\n    args: {dist-init-addr: x}\n",
     "decode[0].args: --dist-init-addr is set by pdsvc from <role>.dist_init_port"),
    ("xpyd-bad-item", BASE + "decode:\n  - 4\n", ":3: decode[0]: must be a mapping of keys"),
    ("bad-role", BASE + "prefill: 5\n",
     ":2: prefill: must be a mapping of keys (one engine) or a list of them (one engine each)"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config(text: str, message: str, runner, tmp_path: Path) -> None:
    cfg = tmp_path / "pdsvc.yaml"
    cfg.write_text(text)
    out = tmp_path / "units"
    result = runner.invoke(main, ["render", "-c", str(cfg), *SEED, "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"pdsvc: error: {cfg}"), lines[0]
    assert message in lines[0], lines[0]
    assert not out.exists()


def test_the_shipped_config_is_valid(runner) -> None:
    result = runner.invoke(main, ["validate", "-c", str(REPO / "etc/pdsvc.yaml"), *SEED])
    assert result.exit_code == 0, result.output
