"""`pdsvc profile --role both` with the lifecycle and router settings etc/pdsvc.yaml ships, on
1P1D and 2P2D stacks under a real systemd (nspawn), each router generation, while a steady
side load runs through the router; the stand-in engines freeze FREEZE s while they write each
capture's traces, as sglang PR #35115 measured one (108 s).

Printed per layout and router, from one run on one machine: the side load's failed requests
of those sent while pdsvc profile ran; restarts and heals of any engine; the seconds pdsvc
profile took and how they split (the load's warm-up and the tok/s measure, the two freezes,
the rest); the traces per engine; the top kernel of each role and its share.

    sudo python benchmarks/profile.py                # every layout, both routers (~6 min)
    sudo python benchmarks/profile.py 1P1D           # only the named layouts
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "tests"))

from bench_stack import make_tokenizer  # noqa: E402
from loadgen import Load, failures  # noqa: E402
from stack import Stack  # noqa: E402
from test_e2e_profile import profile_argv  # noqa: E402

FREEZE = 110
SHIPPED = yaml.safe_load((REPO / "etc" / "pdsvc.yaml").read_text())
LAYOUTS = {
    "1P1D": {"prefill": {"gpus": [0, 1], "tp": 2}, "decode": {"gpus": [2, 3], "tp": 2}},
    "2P2D": {"prefill": [{"gpus": [0, 1], "tp": 2}, {"gpus": [2, 3], "tp": 2}],
             "decode": [{"gpus": [4, 5], "tp": 2}, {"gpus": [6, 7], "tp": 2}]},
}
PYTHON = REPO / ".venv-serve" / "bin" / "python"


def run(layout: str, package: str) -> str:
    router = SHIPPED["router"]
    with tempfile.TemporaryDirectory(prefix="profile-bench-") as tmp:
        work = Path(tmp)
        make_tokenizer(PYTHON, work / "model")
        stack = Stack.up(work, PYTHON.parent.parent, gpus=8, start=False, lifetime=1500, **{
            **LAYOUTS[layout],
            "router.package": package,
            "router.policy": "round_robin",
            "lifecycle": dict(SHIPPED["lifecycle"]),
            "router.health_check": dict(router["health_check"]),
            "router.retry": dict(router["retry"]),
            "router.circuit_breaker": router["circuit_breaker"],
            "router.args": {},
            "runtime.env.FAKE_SGLANG_PROFILE_WRITE_SECS": FREEZE,
            "runtime.env.FAKE_SGLANG_PACED": 1})
        try:
            stack.start(timeout=300)
            return measure(stack)
        finally:
            stack.down()


def measure(stack: Stack) -> str:
    roles = [e["name"].removeprefix(f"{stack.name}-") for e in stack.plan["engines"]]
    before = {r: (stack.invocation(r), stack.restarts(r)) for r in roles}
    load = Load(f"{stack.plan['client_url']}/generate", rate=4, tokens=8,
                timeout=FREEZE + 60, netns=stack.netns, stream_share=0.5, max_in_flight=2000)
    load.start()
    t0 = time.monotonic()
    try:
        out = stack.c.run(profile_argv(stack, "--role", "both", "--input-len", "16",
                                       "--output-len", "64", "--concurrency", "8", "--json"),
                          check=False, timeout=2 * FREEZE + 400)
        took = time.monotonic() - t0
    finally:
        load.stop(wait=FREEZE + 60)
    sent = load.between(t0, time.monotonic())
    if out.returncode != 0:
        return f"pdsvc profile exited {out.returncode}: {out.stderr.strip()[-300:]}"
    doc = json.loads(out.stdout)
    failed = failures(sent)
    moved = [r for r in roles if (stack.invocation(r), stack.restarts(r)) != before[r]]
    heals = sum(len(json.loads(stack.c.read_file(
        f"/run/{stack.name}/{stack.name}-{r}.restart.json")).get("heal_log") or [])
        for r in roles)
    tops = "; ".join(f"{r['role']}: {r['kernels'][0]['name']} "
                     f"{100 * r['kernels'][0]['share']:.1f} %" for r in doc["roles"])
    traces = sorted({len(e["traces"]) for r in doc["roles"] for e in r["engines"]})
    return (f"{sum(failed.values())} of {len(sent)} failed{f' {dict(failed)}' if failed else ''}"
            f" (skipped {load.skipped}); restarted: {', '.join(moved) or 'none'}; heals: "
            f"{heals}; took {took:.0f} s = warm-up {doc['warmup_s']:.0f} + 2 x {FREEZE} frozen"
            f" + {took - doc['warmup_s'] - 2 * FREEZE:.0f}; traces per engine {traces}; {tops}")


def main() -> None:
    wanted = sys.argv[1:] or list(LAYOUTS)
    print(f"pdsvc profile --role both, shipped lifecycle and router settings, stand-ins frozen "
          f"{FREEZE} s per capture, side load 4 req/s", flush=True)
    results: dict[tuple[str, str], str] = {}

    def one(layout: str, package: str) -> None:
        try:
            results[(layout, package)] = run(layout, package)
        except Exception as e:  # noqa: BLE001 - a row says what broke
            results[(layout, package)] = f"error: {e!r}"[:300]

    threads = [threading.Thread(target=one, args=(layout, package))
               for layout in wanted for package in ("sglang-router", "smg")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (layout, package), line in sorted(results.items()):
        print(f"{layout:5} {package:14} {line}", flush=True)


if __name__ == "__main__":
    main()
