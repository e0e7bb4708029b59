"""`pdsvc status`, the output: a Report as the table a person reads, or as the JSON document
(`status --json`, schema STATUS_SCHEMA) a machine reads."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pdsvc.status import runstate
from pdsvc.status.model import Report, RouterList

#: The schema tag of `status --json` (as doctor's and topology's carry theirs).
STATUS_SCHEMA = "pdsvc-status/1"


def human_age(secs: float | None) -> str:
    """42s, 3m12s, 2h05m, 3d04h; `-` when unknown."""
    if secs is None:
        return "-"
    s = int(secs)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_text(report: Report) -> str:
    """The table, the router's view of its workers, the client URL, and the verdict."""
    rows = [["UNIT", "STATE", "SINCE", "RESTARTS", "PROBE", "STATUS"]]
    for u in report.units:
        s = u.state
        probe = "-"
        if u.probe is not None:
            path = "/readiness" if u.role == "router" else "/health"
            probe = f"{path} {u.probe.summary()}"
        rows.append([
            s.unit, s.describe(), human_age(s.since_secs),
            "-" if s.restarts is None else str(s.restarts), probe, s.error or s.status_text,
        ])
    lines = [f"{report.name} PD stack ({report.backend})", "", *_table(rows), ""]
    lists = [RouterList(report.workers_probe, report.workers, report.workers_error),
             *report.more]
    for i, one in enumerate(lists):
        lines += [""] if i else []
        lines.append(f"router workers (GET {one.probe.url}):")
        if one.workers is None:
            lines.append(f"  unknown: {one.error}")
        elif not one.workers:
            lines.append("  none")
        else:
            lines += ["  " + line for line in _table([
                [w.type, w.url, "healthy" if w.healthy else "UNHEALTHY"] for w in one.workers])]
    if report.front is not None:
        lines += ["", "the front's routers (HAProxy show stat):"]
        lines += ["  " + line for line in _table([
            [f.name, f.status, f"{f.sessions} in flight"] for f in report.front])]
    elif report.front_error:
        lines += ["", f"the front's routers: unknown: {report.front_error}"]
    if report.address is not None:
        address, here = report.address
        lines += ["", f"the moving address {address}: " + (
            "on this host (its front serves the clients)" if here else
            "not on this host (another router host has it while its keepalived and front run)")]
    pairs = runstate.format_pairs(list(report.pairs))
    lines += ["", *pairs] if pairs else []
    lines += ["", f"send requests to: {report.url}", "", report.verdict]
    return "\n".join(lines)


def report_dict(report: Report) -> dict[str, Any]:
    """The same facts as the table, for machines."""
    return {
        "format": STATUS_SCHEMA,
        "name": report.name,
        "backend": report.backend,
        "serving": report.serving,
        "verdict": report.verdict,
        "problems": list(report.problems),
        "url": report.url,
        "units": [
            {"role": u.role, **asdict(u.state),
             "probe": u.probe.to_dict() if u.probe else None}
            for u in report.units
        ],
        "workers": None if report.workers is None else [asdict(w) for w in report.workers],
        "workers_error": report.workers_error,
        "workers_probe": report.workers_probe.to_dict(),
        # the other routers behind the front (router.replicas ≥ 2), each as the first above
        "more_routers": [{"workers": None if m.workers is None else [asdict(w) for w in m.workers],
                          "workers_error": m.error, "workers_probe": m.probe.to_dict()}
                         for m in report.more],
        "front": None if report.front is None else [asdict(f) for f in report.front],
        "front_error": report.front_error,
        # a router host of a moving address (router.vip): whether this host has it now
        "address": None if report.address is None else {
            "address": report.address[0], "here": report.address[1]},
        **runstate.to_dict(list(report.runs), list(report.pairs)),
    }
