"""Intent assertions, Quadlet style: each tests/cases/*.yaml is a config plus `## verb …` lines.

Verbs (unit = prefill | decode | router | target | gate (NAME-pd-ready.service), or an
instance: prefill-0, decode-1, …):
  host: NAME                         fixture host from tests/support/sysfs.py
  assert-units U...                  exactly these services are rendered (besides the target)
  assert-key UNIT SECTION KEY V...   some KEY= line equals the words V... joined by spaces
  assert-no-key UNIT SECTION KEY [V] no KEY= line (with value V)
  assert-same-key U1 U2 SECTION KEY  both units set KEY identically
  assert-env UNIT VAR VALUE          Environment= sets VAR to VALUE
  assert-no-env UNIT VAR
  assert-same-env U1 U2 VAR...       both units give each VAR the same value
  assert-argv UNIT W...              the words W... appear, in order and adjacent, in the
                                     service's command (after supervise.py's `--`)
  assert-no-argv UNIT W
  assert-runtime UNIT W...           the words W... appear, in order and adjacent, in the
                                     runtime's own options (before its `--`)
  assert-no-runtime UNIT W
  assert-warning TEXT                stderr warns with TEXT
  assert-error CODE TEXT             render exits CODE with TEXT on stderr, one line, writes nothing
  assert-error-hint TEXT
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pdsvc.cli import main
from units import env_of, exec_words, parse_unit

CASES = sorted((Path(__file__).parent / "cases").glob("*.yaml"))


def _directives(path: Path) -> list[list[str]]:
    out = []
    for line in path.read_text().splitlines():
        verb = line[3:].split(" ", 1)[0] if line.startswith("## ") else ""
        if verb.startswith("assert-") or verb == "host:":
            out.append([verb.rstrip(":"), *shlex.split(line[3 + len(verb):])])
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case(case: Path, sysfs_hosts: dict[str, Path], runner, tmp_path: Path) -> None:
    directives = _directives(case)
    host = next(d[1] for d in directives if d[0] == "host")
    out = tmp_path / "units"
    result = runner.invoke(
        main, ["render", "--config", str(case), "--sysfs-root", str(sysfs_hosts[host]),
               "--output", str(out)],
    )
    errors = [d for d in directives if d[0].startswith("assert-error")]
    if errors:
        assert not out.exists(), "a failed render must write nothing"
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, f"expected one error line, got {result.stderr!r}"
        assert "Traceback" not in result.output
        for verb, *args in errors:
            if verb == "assert-error":
                assert result.exit_code == int(args[0]), result.stderr
                assert args[1] in lines[0], lines[0]
            else:
                assert args[0] in lines[0], lines[0]
        return
    assert result.exit_code == 0, result.output + result.stderr
    name = next(p.name for p in out.glob("*.target")).removesuffix("-pd.target")
    files = {p.name.removeprefix(f"{name}-").removesuffix(".service"): p
             for p in out.glob(f"{name}-*.service") if p.name != f"{name}-pd-ready.service"}
    files["gate"] = out / f"{name}-pd-ready.service"
    files["target"] = out / f"{name}-pd.target"
    units = {k: parse_unit(v.read_text()) for k, v in files.items()}

    def values(unit: str, section: str, key: str) -> list[str]:
        return units[unit].get(section, {}).get(key, [])

    def command(unit: str) -> list[str]:
        words = exec_words(values(unit, "Service", "ExecStart")[0])
        return words[words.index("--") + 1:]

    def runtime(unit: str) -> list[str]:
        words = exec_words(values(unit, "Service", "ExecStart")[0])
        return words[:words.index("--")]

    def contains(seq: list[str], sub: list[str]) -> bool:
        return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))

    for verb, *args in directives:
        if verb == "assert-units":
            assert sorted(files) == sorted([*args, "target", "gate"]), sorted(files)
        elif verb == "assert-key":
            unit, section, key, *want = args
            got = values(unit, section, key)
            assert " ".join(want) in got, (unit, key, got)
        elif verb == "assert-no-key":
            unit, section, key, *want = args
            got = values(unit, section, key)
            assert (" ".join(want) not in got) if want else not got, (unit, key, got)
        elif verb == "assert-same-key":
            a, b, section, key = args
            assert values(a, section, key) == values(b, section, key) != []
        elif verb == "assert-env":
            unit, var, value = args
            assert env_of(units[unit]).get(var) == value, (unit, var, env_of(units[unit]).get(var))
        elif verb == "assert-no-env":
            assert args[1] not in env_of(units[args[0]])
        elif verb == "assert-same-env":
            a, b, *names = args
            for var in names:
                assert env_of(units[a])[var] == env_of(units[b])[var], var
        elif verb == "assert-argv":
            unit, *words = args
            assert contains(command(unit), words), (unit, words, command(unit))
        elif verb == "assert-no-argv":
            assert args[1] not in command(args[0])
        elif verb == "assert-runtime":
            unit, *words = args
            assert contains(runtime(unit), words), (unit, words, runtime(unit))
        elif verb == "assert-no-runtime":
            assert args[1] not in runtime(args[0])
        elif verb == "assert-warning":
            assert args[0] in result.stderr, result.stderr
        elif verb != "host":
            raise AssertionError(f"{case.name}: unknown verb {verb}")
