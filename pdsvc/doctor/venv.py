"""The SGLang venv (runtime.python): its interpreter, the packages the units import, and the
installed launchers' own parsers asked about every command line the units run (through the
probes in ``probes/``, run under that interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pdsvc import routers
from pdsvc.plan.build import JIT_CACHE_ENV, Plan

from .host import said
from .probes import result_line, run_probe
from .rows import Row, fail, ok, warn

VERSION_PROBE_TIMEOUT_S = 60.0
PARSER_PROBE_TIMEOUT_S = 300.0  # importing sglang (torch, triton) takes tens of seconds cold

ENGINE_LAUNCHER = "sglang.launch_server"
ROUTER_LAUNCHER = "sglang_router.launch_router"


@dataclass(frozen=True)
class Requirement:
    label: str
    dists: tuple[str, ...]
    module: str


def requirements(plan: Plan) -> list[Requirement]:
    """What the units import: SGLang, the router, and the KV transfer library."""
    router = routers.package(plan.router.package if plan.router else routers.DEFAULT)
    reqs = [Requirement("sglang", ("sglang",), "sglang"),
            Requirement(router.name, (router.name, router.name.replace("-", "_")),
                        router.module.split(".")[0])]
    if plan.transfer_backend == "nixl":
        reqs.append(Requirement("nixl", ("nixl", "nixl-cu12", "nixl-cu13", "nixl_cu12",
                                         "nixl_cu13"), "nixl"))
    elif plan.transfer_backend.startswith("mooncake"):
        reqs.append(Requirement("mooncake", ("mooncake-transfer-engine",), "mooncake"))
    return reqs


def resolve_python(python: str) -> str | None:
    if "/" not in python:
        return shutil.which(python)
    return python if os.path.isfile(python) and os.access(python, os.X_OK) else None


@dataclass(frozen=True)
class Installed:
    """What the version probe found: the interpreter and {label: version or None}."""

    python: str  # the resolved path
    python_version: str
    versions: dict[str, str | None]


@dataclass(frozen=True)
class ProbeFailed:
    """The version probe got no answer: why, and what to do."""

    detail: str
    fix: str


def probe_versions(plan: Plan) -> Installed | ProbeFailed:
    """Ask runtime.python which of the units' packages it has."""
    python = resolve_python(plan.python)
    reqs = requirements(plan)
    venv = Path(plan.python).parent.parent
    fix_venv = (f"create it (python3 -m venv {venv} && {venv}/bin/pip install "
                f"{' '.join(r.dists[0] for r in reqs)}; pyproject.toml's serve extra pins the "
                "tested versions) or set runtime.python")
    if python is None:
        return ProbeFailed(f"{plan.python} (runtime.python) not found or not executable",
                           fix_venv)
    wanted = json.dumps({r.label: {"dists": list(r.dists), "module": r.module} for r in reqs})
    proc = None
    try:
        proc = run_probe(python, "versions.py", [wanted], VERSION_PROBE_TIMEOUT_S)
        answer = result_line(proc.stdout)
        return Installed(python, str(answer.get("python", "?")), dict(answer["versions"]))
    except subprocess.TimeoutExpired:
        return ProbeFailed(f"{python} did not answer within {VERSION_PROBE_TIMEOUT_S:g} s",
                           f"run {python} -c 'import sys' by hand and fix what hangs")
    except OSError as exc:
        return ProbeFailed(f"cannot run {python}: {exc.strerror or exc}", fix_venv)
    except (ValueError, KeyError, TypeError, AttributeError):
        gist = said(proc) if proc is not None else "no answer"
        return ProbeFailed(f"{python} failed the version probe: {gist}",
                           f"run {python} -c 'import importlib.metadata' by hand")


def check_python(plan: Plan, installed: Installed | ProbeFailed) -> list[Row]:
    """The interpreter exists and has the packages."""
    if isinstance(installed, ProbeFailed):
        return [fail("python", installed.detail, installed.fix)]
    reqs = requirements(plan)
    versions = installed.versions
    listed = ", ".join(f"{r.label} {versions.get(r.label) or 'MISSING'}" for r in reqs)
    detail = f"{installed.python} (Python {installed.python_version}): {listed}"
    missing = [r.dists[0] for r in reqs if not versions.get(r.label)]
    if missing:
        return [fail("python", detail, f"{installed.python} -m pip install {' '.join(missing)}")]
    return [ok("python", detail), *check_router_package(plan, installed)]


def check_router_package(plan: Plan, installed: Installed) -> list[Row]:
    """The router package the config chose (router.package), at the version pdsvc renders for;
    the other generation installed instead is named."""
    if plan.router is None:
        return []
    chosen = routers.package(plan.router.package)
    have = installed.versions.get(chosen.name)
    if have == chosen.version:
        return [ok("router package", f"{chosen.name} {have} (router.package)")]
    return [warn("router package",
                 f"{chosen.name} {have} installed; pdsvc renders for {chosen.pin}",
                 f"{installed.python} -m pip install {chosen.pin}")]


def probe_env(env: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The unit's environment for the parser probe, less HOME and the JIT cache directories
    (importing SGLang as root must not create the service user's cache directories)."""
    skip = {var for var, _ in JIT_CACHE_ENV} | {"HOME", "CUDA_CACHE_MAXSIZE"}
    return {k: v for k, v in env if k not in skip}


@dataclass(frozen=True)
class ParseJob:
    """One command line for a launcher's own parser."""

    check: str  # row name: "flags prefill", "flags router"
    unit: str
    kind: Literal["sglang", "router"]
    config_key: str  # where its extra flags come from in the config
    argv: tuple[str, ...]  # the full argv: [python, -m, module, flags...]
    env: dict[str, str]

    @property
    def launcher(self) -> str:
        return ENGINE_LAUNCHER if self.kind == "sglang" else ROUTER_LAUNCHER

    @property
    def dist(self) -> str:
        return "sglang" if self.kind == "sglang" else "sglang-router"


def parse_jobs(plan: Plan) -> list[ParseJob]:
    jobs = [ParseJob(f"flags {e.role}", e.name, "sglang", f"{e.role}.args", e.argv,
                     probe_env(e.env)) for e in plan.engines]
    r = plan.router
    if r is not None:
        jobs.append(ParseJob("flags router", r.name, "router", "router.args", r.argv,
                             dict(r.env)))
    return jobs


def check_flags(plan: Plan, installed: Installed | ProbeFailed) -> list[Row]:
    """Ask the installed launchers' own parsers about every command line the units run."""
    if isinstance(installed, ProbeFailed):
        return []  # the python row failed: nothing to ask
    versions = installed.versions
    rows: list[Row] = []
    asked: list[ParseJob] = []
    for job in parse_jobs(plan):
        module = job.argv[2] if len(job.argv) > 2 and job.argv[1] == "-m" else "?"
        if module != job.launcher:
            rows.append(warn(job.check, f"{job.unit} runs {module}, not {job.launcher}: its "
                                        "flags were not checked",
                             f"check them with `{plan.python} -m {module} --help`"))
        elif versions.get(job.dist):  # else the python row names the missing package
            asked.append(job)
    if not asked:
        return rows
    results = _ask_parsers(installed, asked)
    if isinstance(results, str):
        return rows + [fail(j.check, f"{j.unit}: the parser probe died: {results}",
                            f"run `{plan.python} -m {j.launcher} --help` and fix what it prints")
                       for j in asked]
    if results is None:
        return rows + [warn(j.check, f"{j.unit}: the parser probe took over "
                                     f"{PARSER_PROBE_TIMEOUT_S:g} s",
                            "re-run pdsvc doctor (a cold import can be slow)") for j in asked]
    return rows + [_flags_row(plan, job, result, versions)
                   for job, result in zip(asked, results, strict=True)]


def _ask_parsers(installed: Installed, asked: list[ParseJob]) -> list[dict] | str | None:
    """The parser probe's answer, one dict a job; None when it timed out; a str saying why
    when it died."""
    batch = [{"kind": j.kind, "argv": list(j.argv[3:]), "env": j.env} for j in asked]
    gist = "it printed no result"
    try:
        proc = run_probe(installed.python, "parser.py", [], PARSER_PROBE_TIMEOUT_S,
                         stdin=json.dumps(batch))
        gist = said(proc)
        results = result_line(proc.stdout)
    except subprocess.TimeoutExpired:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    except (ValueError, KeyError, TypeError):
        return gist
    if not isinstance(results, list) or len(results) != len(asked):
        return gist
    return results


def _flags_row(plan: Plan, job: ParseJob, result: dict, versions: dict[str, str | None]) -> Row:
    version = f"{job.dist} {versions.get(job.dist)}"
    flags = sum(1 for w in job.argv[3:] if w.startswith("--"))
    short = result.get("abbreviated") or []
    if result.get("ok") and short:
        named = ", ".join(f"{given} as {full}" for given, full in short)
        return warn(job.check, f"{version} accepts {job.unit} only by abbreviation: {named}",
                    f"spell the flags out in {job.config_key} (a new flag upstream makes an "
                    "abbreviation ambiguous)")
    if result.get("ok"):
        return ok(job.check, f"{version} accepts {job.unit}'s {flags} flags")
    if result.get("parser", True):
        return fail(job.check, f"{version} refuses {job.unit}: {result.get('error')}",
                    f"fix {job.config_key} in the config (or install the version it was "
                    "written for), then `pdsvc render`")
    return fail(job.check, f"{job.unit}: {job.launcher} fails before starting: "
                           f"{result.get('error')}",
                f"run `{plan.python} -m {job.launcher} --help` and fix what it prints")
