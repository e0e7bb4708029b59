"""The README's zero-loss table, made from benchmarks/results/zero_loss.txt (what
benchmarks/zero_loss.py printed), so the README never states a figure the last run did not.

    python benchmarks/zero_loss_table.py        # prints the Markdown table

tests/test_readme.py checks that the README holds exactly this table.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "zero_loss.txt"

#: one event's row, as tests/support/zero_loss.py `Outcome.row` prints it
ROW = re.compile(r"^  (?P<event>\S.{0,33}?)\s+(?P<sent>\d+)\s+(?P<failed>\d+)"
                 r"(?: \(≤(?P<bound>\d+)\))?\s+"
                 r"(?P<kinds>\S.*?)\s+(?P<p99b>\d+\.\d+)\s+(?P<p99d>\d+\.\d+)\s+"
                 r"(?P<cap>\d+\.\d+)(?:\s+MISSES: (?P<miss>.*))?$")
SECTION = re.compile(r"^(?P<router>[\w.-]+): 2P2D(?:, 2 routers behind HAProxy,)? under steady "
                     r"load")
OUTAGE = re.compile(r"^  1P1D apply outage: (?P<gap>\d+\.\d+) s against the engine's load time "
                    r"(?P<load>[\d.]+) s \(goal ≤ (?P<goal>[\d.]+) s\)")
ROUTERS = {"sglang-router": "sglang-router 0.3.2", "smg": "smg 1.13.0"}


def parse(text: str) -> tuple[dict[str, dict[str, str]], str]:
    """{event: {router: cell}} in the order the events ran, and the goal of the 1P1D line."""
    cells: dict[str, dict[str, str]] = {}
    router, goal = "", ""
    for line in text.splitlines():
        if m := SECTION.match(line):
            router = m["router"]
        elif (m := ROW.match(line)) and router:
            kinds = "" if m["kinds"] == "-" else f": {m['kinds']}"
            if m["bound"]:  # a kill: the streams in flight on the engine, the most it may cut
                kinds += f", {m['bound']} in flight"
            # a rolling apply's goal includes its latency: p99 during <= 2x steady
            p99 = (f", p99 {m['p99b']} → {m['p99d']} s" if m["event"].startswith("apply")
                   else "")
            cells.setdefault(m["event"].strip(), {})[router] = (
                f"{m['failed']} of {m['sent']}{kinds} ({m['cap']} s{p99})")
        elif (m := OUTAGE.match(line)) and router:
            cells.setdefault("1P1D apply: outage", {})[router] = f"{m['gap']} s"
            goal = f"load {m['load']} s + 2 s = {m['goal']} s"
    return cells, goal


def table(text: str) -> str:
    cells, goal = parse(text)
    if not cells:
        raise ValueError("no event rows in the results")
    lines = ["| event (2P2D, steady load) | " + " | ".join(ROUTERS.values()) + " | goal |",
             "|---|" + "---|" * (len(ROUTERS) + 1)]
    for event, by in cells.items():
        what = event.removeprefix("front: ")  # router.replicas: 2 behind HAProxy
        want = (goal if event.startswith("1P1D") else
                "one router: as few as it allows; behind the front: 0"
                if event == "systemctl restart router" else
                "0 plain; streams cut ≤ in flight" if what.startswith("kill") else
                "0; p99 ≤ 2 × steady" if what.startswith("apply") else "0")
        lines.append(f"| {event} | " + " | ".join(by.get(r, "–") for r in ROUTERS)
                     + f" | {want} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table(RESULTS.read_text()) + "\n")
