"""KV-path figures: `pdsvc doctor --kv`'s own check (same launcher, probe and judging) on the GPUs
this machine has, side by side in one run:

  host memory   both halves with no GPU visible (the path CI proves);
  GPU 0 → GPU 0 the pair on one device (a one-GPU machine), UCX_TLS unset;
  GPU 0 → GPU 1 two devices, where cuda_ipc against cuda_copy matters (two GPUs or more);
  UCX_TLS=tcp   on GPU memory, which NIXL must refuse (the check's ✗ and its fix);

each at the default block batch (256 MiB in 64 blocks) and at 1 GiB in 256 blocks. The plan is
the bundled config's, laid on the seed host's topology; only each role's CUDA_VISIBLE_DEVICES is
remapped to the GPUs this machine has, since the bundled pair wants eight.

    python benchmarks/kv_path.py [--python PY] [--out FILE]   # PY: an interpreter with nixl
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pdsvc.cli.doctor import format_rows  # noqa: E402
from pdsvc.cli.kit import load_plan  # noqa: E402
from pdsvc.doctor.host import Host  # noqa: E402
from pdsvc.doctor.kv import check_kv  # noqa: E402
from pdsvc.plan.build import KvCheck, Plan  # noqa: E402

SIZES = ((256 << 20, 64), (1 << 30, 256))


def gpu_count(python: str) -> int:
    import subprocess

    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, check=False)
    return int(out.stdout.strip() or 0) if out.returncode == 0 else 0


def remap(plan: Plan, devices: dict[str, str], extra: dict[str, str]) -> Plan:
    """Each role's CUDA_VISIBLE_DEVICES set to devices[role], and extra env for both."""
    engines = []
    for e in plan.engines:
        env = {**dict(e.env), "CUDA_VISIBLE_DEVICES": devices[e.role], **extra}
        engines.append(replace(e, env=tuple(env.items())))
    return replace(plan, engines=tuple(engines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", type=lambda p: str(Path(p).absolute()), default=sys.executable)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each half's output (UCX_PROTO_INFO's tables) under this directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "pdsvc.yaml"
        config.write_text(_with_python(REPO / "etc" / "pdsvc.yaml", args.python))
        base = load_plan(config, None, REPO / "etc" / "seed-host.topology.json")
    gpus = gpu_count(args.python)
    cases = [("host memory", {"prefill": "", "decode": ""}, {})]
    if gpus >= 1:
        cases.append(("GPU 0 → GPU 0", {"prefill": "0", "decode": "0"}, {}))
    if gpus >= 2:
        cases.append(("GPU 0 → GPU 1", {"prefill": "0", "decode": "1"}, {}))
    if gpus >= 1:
        cases.append(("GPU 0 → GPU 0, UCX_TLS=tcp", {"prefill": "0", "decode": "0"},
                      {"UCX_TLS": "tcp"}))
    lines = [f"# benchmarks/kv_path.py — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{gpus} GPU(s) visible to {args.python}"]
    for label, devices, extra in cases:
        for size, blocks in SIZES:
            plan = replace(remap(base, devices, extra), kv_check=KvCheck(size, blocks, None))
            t0 = time.monotonic()
            slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{label}-{size >> 20}M")
            keep = args.keep / slug if args.keep else None
            # host memory on purpose: no "the halves saw no GPU" warning
            rows = check_kv(plan, plan, Host(), "direct", keep=keep,
                            gpus_here=None if devices["prefill"] else False)
            took = time.monotonic() - t0
            head = f"## {label}, {size >> 20} MiB in {blocks} blocks ({took:.1f} s)"
            lines += [head, *format_rows(rows, colour=False)]
            print("\n".join([head, *format_rows(rows, colour=False)]), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def _with_python(config: Path, python: str) -> str:
    """The bundled config with runtime.python pointed at ``python`` and pinning off (the
    seed host's CPUs are not this machine's)."""
    import yaml

    data = yaml.safe_load(config.read_text())
    data.setdefault("runtime", {}).update(python=python, pinning="off")
    return yaml.safe_dump(data)


if __name__ == "__main__":
    sys.exit(main())
