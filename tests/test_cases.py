"""Intent assertions, Quadlet style: each tests/cases/*.yaml is a config plus `## ` lines.

Every line that starts with `##` is a directive; prose in a case is a plain `# ` comment. An
unknown verb, a wrong number of words, or a unit, section, object or file the render does not
have is a CaseError: it fails the case, and `!` never turns it into a pass.

  host: NAME                 fixture host from tests/support/sysfs.py: required for systemd and
                             supervisord, refused for k8s (the scheduler places the engines)
  format: FORMAT             systemd (default) | supervisord | k8s: `render --format FORMAT`

Negation: `## !assert-X …` passes exactly when `## assert-X …` fails (Quadlet's `!`), for every
verb. A verb whose last words are optional asserts presence without them, so `!assert-key U S K`
is "no K= line", `!assert-env U VAR` "VAR is unset", `!assert-argv U W` "W is not in the
command", `!assert-k8s-path OBJ PATH` "no such field".

UNIT: prefill | decode | router, or an instance (prefill-0, decode-1, …); systemd also target
and gate (NAME-pd-ready.service); supervisord also restarts (the event listener); k8s
UNIT/worker is the worker pod of a LeaderWorkerSet (UNIT alone: its leader).
ADDR, where a key lives: systemd `UNIT SECTION`; supervisord `SECTION`, a section's name
(`supervisord`, `program:dsv4-decode`) or a UNIT for its [program:…]/[eventlistener:…]. Key
verbs are not for k8s (assert-k8s-path is).

  assert-units U...          exactly these run: systemd services (besides the target and the
                             gate), supervisord programs and event listeners, k8s workloads
                             (Deployment, LeaderWorkerSet; NAME-UNIT[-lws])
  assert-key ADDR KEY [V...] some KEY= line equals the words V... joined by spaces
  assert-key-is ADDR KEY V...  KEY= is written exactly once, and equals V... . Counted as
                             written: an empty `KEY=` is a line too, so systemd's reset of a
                             list (`KEY=` then `KEY=V`) fails here; assert-key it if meant.
                             (supervisord keeps a repeated key's last value; svconf refuses
                             the file instead, so there every key is written once.)
  assert-same-key U1 U2 [SECTION] KEY   both set KEY identically (SECTION: systemd only)
  assert-env UNIT VAR [VALUE] the service's environment sets VAR (to VALUE)
  assert-same-env U1 U2 VAR...  both give each VAR the same value
  assert-argv UNIT W...      the words W... appear, in order and adjacent, in the service's
                             command: after the runtime's `--` (systemd, supervisord), the
                             container's command with $(VAR) expanded (k8s)
  assert-runtime UNIT W...   the same in the runtime's own words (before its `--`; with
                             supervisord, numactl's too); not for k8s
  assert-k8s-path KIND/NAME PATH [VALUE]  the field at PATH exists (and equals VALUE, read as
                             YAML: 1, '1', true, {type: Recreate} …). PATH is dotted; a [...]
                             segment may hold dots (labels[app.kubernetes.io/component]); an
                             integer segment indexes a list, any other picks the item whose
                             `name` it is (containers.prefill.env.HOME.value)
  assert-text FILE TEXT      the rendered FILE (path in the bundle) contains TEXT: for what
                             only a comment says
  assert-warning TEXT        stderr contains TEXT
  assert-error CODE TEXT     render exits CODE with TEXT in its one stderr line and writes
                             nothing
  assert-error-hint TEXT     that line also contains TEXT

In supervisord cases `%(here)s` in expected words stands for the bundle's directory, as in
the config; values are compared after supervisord's expansion (tests/support/svconf.py).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from k8sdocs import command_of, container_env
from svconf import SupervisordConf

from pdsvc.cli.commands import main
from units import env_of, exec_words, parse_unit

CASES = sorted((Path(__file__).parent / "cases").glob("*.yaml"))
FORMATS = ("systemd", "supervisord", "k8s")


class CaseError(Exception):
    """A case that cannot be checked as written: never inverted by `!`."""


def _split(words: list[str]) -> tuple[list[str], list[str]]:
    """A runtime command's own words and its child's (after `--`; none without one)."""
    if "--" not in words:
        return words, []
    return words[:words.index("--")], words[words.index("--") + 1:]


class Systemd:
    addr_words = 2

    def __init__(self, out: Path) -> None:
        target = next(out.glob("*-pd.target"), None)
        if target is None:
            raise CaseError(f"no *-pd.target in {sorted(p.name for p in out.iterdir())}")
        name = target.name.removesuffix("-pd.target")
        files = {p.name.removeprefix(f"{name}-").removesuffix(".service"): p
                 for p in out.glob(f"{name}-*.service") if p.name != f"{name}-pd-ready.service"}
        self.services = sorted(files)
        files["gate"] = out / f"{name}-pd-ready.service"
        files["target"] = target
        self.unit_files = {k: parse_unit(v.read_text()) for k, v in files.items()}

    def unit(self, unit: str) -> dict[str, dict[str, list[str]]]:
        if unit not in self.unit_files:
            raise CaseError(f"no unit {unit!r}: {sorted(self.unit_files)}")
        return self.unit_files[unit]

    def lines(self, addr: list[str], key: str) -> list[str]:
        unit, section = addr
        return self.unit(unit).get(section, {}).get(key, [])

    def env(self, unit: str) -> dict[str, str]:
        return env_of(self.unit(unit)) if "Service" in self.unit(unit) else {}

    def words(self, unit: str) -> list[str]:
        starts = self.unit(unit).get("Service", {}).get("ExecStart", [])
        if not starts:
            raise CaseError(f"{unit} has no ExecStart=")
        return exec_words(starts[0])

    def expect(self, word: str) -> str:
        return word


class Supervisord:
    addr_words = 1

    def __init__(self, out: Path) -> None:
        path = out / "supervisord.conf"
        if not path.is_file():
            raise CaseError(f"no supervisord.conf in {out}")
        self.here = str(out)
        self.conf = SupervisordConf(path.read_text(), self.here)
        groups = [s for s in self.conf.sections() if s.startswith("group:")]
        if groups:  # each program is a group of its own, so that one can be re-read alone
            raise CaseError(f"expected no [group:] section, got {groups}")
        pidfile = self.conf.get("supervisord", "pidfile") or ""
        name = posixpath.basename(pidfile).removesuffix("-supervisord.pid")
        self.sections = {s.split(":", 1)[1].removeprefix(f"{name}-"): s
                         for s in self.conf.sections()
                         if s.startswith(("program:", "eventlistener:"))}
        self.services = sorted(self.sections)

    def section(self, addr: str) -> str:
        if addr in self.conf.sections():
            return addr
        if addr in self.sections:
            return self.sections[addr]
        raise CaseError(f"no section or unit {addr!r}: {self.conf.sections()}")

    def lines(self, addr: list[str], key: str) -> list[str]:
        value = self.conf.get(self.section(addr[0]), key)
        return [] if value is None else [value]

    def env(self, unit: str) -> dict[str, str]:
        return self.conf.environment(self.section(unit))

    def words(self, unit: str) -> list[str]:
        return self.conf.command(self.section(unit))

    def expect(self, word: str) -> str:
        return word.replace("%(here)s", self.here)


_SEGMENT = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


class K8s:
    addr_words = None

    def __init__(self, out: Path) -> None:
        self.objects = [d for p in sorted(out.glob("*.yaml")) if p.name != "kustomization.yaml"
                        for d in yaml.safe_load_all(p.read_text()) if d]
        names = {d["metadata"]["labels"]["app.kubernetes.io/instance"] for d in self.objects}
        if len(names) != 1:
            raise CaseError(f"expected one app.kubernetes.io/instance, got {names}")
        (name,) = names
        self.workloads = {d["metadata"]["name"].removeprefix(f"{name}-").removesuffix("-lws"): d
                          for d in self.objects
                          if d["kind"] in ("Deployment", "LeaderWorkerSet")}
        self.services = sorted(self.workloads)

    def object(self, ref: str) -> dict[str, Any]:
        kind, _, name = ref.partition("/")
        hits = [d for d in self.objects if d["kind"] == kind and d["metadata"]["name"] == name]
        if len(hits) != 1:
            raise CaseError(f"{ref}: {len(hits)} objects; there are " + ", ".join(
                f"{d['kind']}/{d['metadata']['name']}" for d in self.objects))
        return hits[0]

    def container(self, unit: str) -> dict[str, Any]:
        unit, _, pod = unit.partition("/")
        if unit not in self.workloads:
            raise CaseError(f"no workload {unit!r}: {sorted(self.workloads)}")
        workload = self.workloads[unit]
        if workload["kind"] == "Deployment" and not pod:
            spec = workload["spec"]["template"]["spec"]
        elif workload["kind"] == "LeaderWorkerSet" and pod in ("", "leader", "worker"):
            spec = workload["spec"]["leaderWorkerTemplate"][
                f"{pod or 'leader'}Template"]["spec"]
        else:
            raise CaseError(f"{unit}/{pod}: a {workload['kind']} has no such pod")
        (container,) = spec["containers"]
        return container

    def env(self, unit: str) -> dict[str, str]:
        return container_env(self.container(unit))

    def words(self, unit: str) -> list[str]:
        return ["--", *command_of(self.container(unit))]  # no runtime around it

    def expect(self, word: str) -> str:
        return word

    def path(self, ref: str, path: str) -> Any:
        node: Any = self.object(ref)
        for bracketed, plain in _SEGMENT.findall(path):
            segment = bracketed or plain
            if isinstance(node, dict):
                assert segment in node, f"{ref}: {path}: no {segment!r} in {sorted(node)}"
                node = node[segment]
            elif isinstance(node, list) and segment.isdigit():
                assert int(segment) < len(node), f"{ref}: {path}: no item {segment}"
                node = node[int(segment)]
            elif isinstance(node, list):
                hits = [i for i in node if isinstance(i, dict) and i.get("name") == segment]
                assert len(hits) == 1, f"{ref}: {path}: no item named {segment!r}"
                node = hits[0]
            else:
                raise AssertionError(f"{ref}: {path}: {segment!r} below a {type(node).__name__}")
        return node


class Rendered:
    def __init__(self, fmt: str, result: Result, out: Path) -> None:
        self.format, self.result, self.out = fmt, result, out
        self._view: Systemd | Supervisord | K8s | None = None

    @property
    def view(self) -> Systemd | Supervisord | K8s:
        if self.result.exit_code != 0:
            raise CaseError(f"the render failed, there is nothing to look at: "
                            f"{self.result.stderr.strip()}")
        if self._view is None:
            self._view = {"systemd": Systemd, "supervisord": Supervisord,
                          "k8s": K8s}[self.format](self.out)
        return self._view

    def addr(self, args: list[str], verb: str) -> tuple[list[str], list[str]]:
        n = self.view.addr_words
        if n is None:
            raise CaseError(f"{verb}: key verbs are for systemd and supervisord; "
                            "use assert-k8s-path")
        if len(args) < n + 1:
            raise CaseError(f"{verb}: expected {'UNIT SECTION' if n == 2 else 'SECTION'} KEY")
        return args[:n], args[n:]


def _contains(seq: list[str], sub: list[str]) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


# --------------------------------------------------------------------------- the verbs


def v_units(r: Rendered, *units: str) -> None:
    assert r.view.services == sorted(units), r.view.services


def v_key(r: Rendered, *args: str) -> None:
    addr, (key, *want) = r.addr(list(args), "assert-key")
    got = r.view.lines(addr, key)
    if want:
        assert r.view.expect(" ".join(want)) in got, (addr, key, got)
    else:
        assert got, (addr, key, "not set")


def v_key_is(r: Rendered, *args: str) -> None:
    addr, (key, *want) = r.addr(list(args), "assert-key-is")
    if not want:
        raise CaseError("assert-key-is: expected ADDR KEY V...")
    got = r.view.lines(addr, key)
    assert got == [r.view.expect(" ".join(want))], (addr, key, got)


def v_same_key(r: Rendered, a: str, b: str, *rest: str) -> None:
    if len(rest) != r.view.addr_words:  # SECTION KEY (systemd), KEY (supervisord)
        raise CaseError("assert-same-key: expected U1 U2 [SECTION] KEY")
    *section, key = rest
    got_a, got_b = r.view.lines([a, *section], key), r.view.lines([b, *section], key)
    assert got_a == got_b != [], (key, got_a, got_b)


def v_env(r: Rendered, unit: str, var: str, *value: str) -> None:
    env = r.view.env(unit)
    if value:
        assert env.get(var) == r.view.expect(value[0]), (unit, var, env.get(var))
    else:
        assert var in env, (unit, var, "unset")


def v_same_env(r: Rendered, a: str, b: str, *names: str) -> None:
    env_a, env_b = r.view.env(a), r.view.env(b)
    for var in names:
        assert var in env_a and env_a.get(var) == env_b.get(var), (var, env_a.get(var),
                                                                   env_b.get(var))


def v_argv(r: Rendered, unit: str, *words: str) -> None:
    got = _split(r.view.words(unit))[1]
    assert _contains(got, [r.view.expect(w) for w in words]), (unit, words, got)


def v_runtime(r: Rendered, unit: str, *words: str) -> None:
    if isinstance(r.view, K8s):
        raise CaseError("assert-runtime: a pod runs no runtime around the engine")
    got = _split(r.view.words(unit))[0]
    assert _contains(got, [r.view.expect(w) for w in words]), (unit, words, got)


def v_k8s_path(r: Rendered, ref: str, path: str, *value: str) -> None:
    if not isinstance(r.view, K8s):
        raise CaseError("assert-k8s-path is for format: k8s")
    got = r.view.path(ref, path)
    if value:
        assert got == yaml.safe_load(value[0]), (ref, path, got)


def v_text(r: Rendered, file: str, text: str) -> None:
    path = r.out / file if r.result.exit_code == 0 else None
    if path is None or not path.is_file():
        raise CaseError(f"no rendered file {file}")
    assert text in path.read_text(), (file, text)


def v_warning(r: Rendered, text: str) -> None:
    assert text in r.result.stderr, r.result.stderr


def v_error(r: Rendered, code: str, text: str) -> None:
    line = r.result.stderr.strip().splitlines()[:1]
    assert r.result.exit_code == int(code) and text in "".join(line), (
        r.result.exit_code, r.result.stderr)


def v_error_hint(r: Rendered, text: str) -> None:
    assert text in "".join(r.result.stderr.strip().splitlines()[:1]), r.result.stderr


# verb -> (check, fewest words, most words or None)
VERBS: dict[str, tuple[Callable[..., None], int, int | None]] = {
    "assert-units": (v_units, 1, None),
    "assert-key": (v_key, 2, None),
    "assert-key-is": (v_key_is, 3, None),
    "assert-same-key": (v_same_key, 3, 4),
    "assert-env": (v_env, 2, 3),
    "assert-same-env": (v_same_env, 3, None),
    "assert-argv": (v_argv, 2, None),
    "assert-runtime": (v_runtime, 2, None),
    "assert-k8s-path": (v_k8s_path, 2, 3),
    "assert-text": (v_text, 2, 2),
    "assert-warning": (v_warning, 1, 1),
    "assert-error": (v_error, 2, 2),
    "assert-error-hint": (v_error_hint, 1, 1),
}
SETTINGS = ("host:", "format:")


def directives(text: str) -> list[tuple[int, bool, str, list[str]]]:
    """(line number, negated, verb, words) of each `##` line, checked against VERBS."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.startswith("##"):
            continue
        try:
            verb, *args = shlex.split(line[2:])
        except ValueError as err:
            raise CaseError(f"line {lineno}: {err}: {line}") from None
        negated = verb.startswith("!")
        verb = verb.removeprefix("!")
        if verb in SETTINGS and not negated and len(args) == 1:
            out.append((lineno, False, verb.rstrip(":"), args))
            continue
        if verb not in VERBS:
            raise CaseError(f"line {lineno}: unknown verb {verb!r} (prose is `# `): {line}")
        _, fewest, most = VERBS[verb]
        if len(args) < fewest or (most is not None and len(args) > most):
            span = fewest if most == fewest else f"{fewest} to {most or 'any'}"
            raise CaseError(f"line {lineno}: {verb} takes {span} words, got {len(args)}: {line}")
        out.append((lineno, negated, verb, args))
    return out


def run_case(case: Path, sysfs_hosts: dict[str, Path], tmp_path: Path) -> None:
    """Render the case's config and check each of its `##` lines (see the module's doc)."""
    steps = directives(case.read_text())
    settings = {verb: args[0] for _, _, verb, args in steps if verb in ("host", "format")}
    fmt, host = settings.get("format", "systemd"), settings.get("host")
    if fmt not in FORMATS:
        raise CaseError(f"format: {fmt}: not one of {FORMATS}")
    if (host is None) != (fmt == "k8s"):
        raise CaseError("host: is required for systemd and supervisord, refused for k8s")
    if host is not None and host not in sysfs_hosts:
        raise CaseError(f"host: {host}: not one of {sorted(sysfs_hosts)}")
    out = tmp_path / "bundle"
    argv = ["render", "--config", str(case), "--format", fmt, "--output", str(out)]
    result = CliRunner().invoke(
        main, argv + (["--sysfs-root", str(sysfs_hosts[host])] if host else []))
    if any(verb == "assert-error" and not negated for _, negated, verb, _ in steps):
        assert not out.exists(), "a failed render must write nothing"
        assert "Traceback" not in result.output + result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, \
            f"expected one error line, got {result.stderr!r}"
    else:
        assert result.exit_code == 0, result.output + result.stderr
    rendered = Rendered(fmt, result, out)
    for lineno, negated, verb, args in steps:
        if verb in ("host", "format"):
            continue
        where = f"{case.name}:{lineno}: {'!' if negated else ''}{verb} {shlex.join(args)}"
        try:
            VERBS[verb][0](rendered, *args)
        except AssertionError as err:
            if not negated:
                raise AssertionError(f"{where}\n{err}") from None
        else:
            if negated:
                raise AssertionError(f"{where}: holds")


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case(case: Path, sysfs_hosts: dict[str, Path], tmp_path: Path) -> None:
    run_case(case, sysfs_hosts, tmp_path)


# --------------------------------------------------------------------------- the harness itself

SEED_CASE = "## host: seed\n{lines}\nmodel: {{path: /srv/m}}\n"
K8S_CASE = "## format: k8s\n{lines}\nmodel: {{path: /srv/m}}\n"


@pytest.mark.parametrize(("case", "lines", "outcome"), [
    (SEED_CASE, "## assert-key prefill Service Restart on-failure", None),
    (SEED_CASE, "## assert-key prefill Service Restart always", AssertionError),
    (SEED_CASE, "## !assert-key prefill Service Restart always", None),
    (SEED_CASE, "## !assert-key prefill Service Restart on-failure", AssertionError),
    (SEED_CASE, "## !assert-key prefill Service NoSuchKey", None),
    # decode has two PartOf= lines: assert-key finds one, assert-key-is refuses the pair
    (SEED_CASE, "## assert-key decode Unit PartOf dsv4-pd.target", None),
    (SEED_CASE, "## assert-key-is decode Unit PartOf dsv4-pd.target", AssertionError),
    (SEED_CASE, "## !assert-key-is decode Unit PartOf dsv4-pd.target", None),
    (SEED_CASE, "## assert-key-is prefill Service Restart on-failure", None),
    (SEED_CASE, "## assert-key-is prefill Service CapabilityBoundingSet ''", None),
    (SEED_CASE, "## assert-env decode CUDA_VISIBLE_DEVICES 0,1,2,3", AssertionError),
    (SEED_CASE, "## !assert-argv router --prefill", None),
    (SEED_CASE, "## !assert-warning numa_node", None),
    (SEED_CASE, "## !assert-error 3 GPU", None),
    (SEED_CASE, "## assert-error 3 GPU", AssertionError),
    (SEED_CASE.replace("seed", "seed\n## format: supervisord"),
     "## !assert-env prefill CUDA_VISIBLE_DEVICES 0,1,2,3", AssertionError),
    (SEED_CASE.replace("seed", "seed\n## format: supervisord"),
     "## assert-key prefill command %(here)s/runtime", AssertionError),
    (K8S_CASE, "## assert-k8s-path Deployment/dsv4-prefill spec.replicas 1", None),
    (K8S_CASE, "## assert-k8s-path Deployment/dsv4-prefill spec.replicas 2", AssertionError),
    (K8S_CASE, "## !assert-k8s-path Deployment/dsv4-prefill spec.template.spec.hostNetwork",
     None),
    # a case that cannot be checked as written fails, negated or not
    (SEED_CASE, "## asert-key prefill Service Restart on-failure", CaseError),
    (SEED_CASE, "## assert-no-key prefill Service CPUAffinity", CaseError),
    (SEED_CASE, "## The prefill restarts on failure", CaseError),
    (SEED_CASE, "## !assert-key prefill-9 Service Restart always", CaseError),
    (SEED_CASE, "## !assert-env prefill", CaseError),
    (SEED_CASE, "## !assert-k8s-path Deployment/dsv4-prefill spec", CaseError),
    (K8S_CASE, "## !assert-key prefill Service Restart always", CaseError),
    (K8S_CASE, "## !assert-k8s-path Deployment/dsv4-nope spec", CaseError),
    (K8S_CASE.replace("k8s", "k8s\n## host: seed"), "", CaseError),
    ("## host: laptop\n{lines}\nmodel: {{path: /srv/m}}\n",
     "## assert-error 3 'no NVIDIA GPU found'\n## !assert-key prefill Service Restart", CaseError),
], ids=lambda v: v if isinstance(v, str) and v.startswith("##") else None)
def test_harness(case: str, lines: str, outcome: type[Exception] | None,
                 sysfs_hosts: dict[str, Path], tmp_path: Path) -> None:
    """Each verb can fail; `!` inverts exactly that; a malformed line is never a pass."""
    path = tmp_path / "case.yaml"
    path.write_text(case.format(lines=lines))
    if outcome is None:
        run_case(path, sysfs_hosts, tmp_path)
    else:
        with pytest.raises(outcome):
            run_case(path, sysfs_hosts, tmp_path)
