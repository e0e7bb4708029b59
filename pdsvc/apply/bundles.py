"""The bundles apply compares and keeps: the one in the output directory (what was rendered
and installed last), the previous one with its config (for the way back), and the installer,
called only through its command line (`install.sh --bundle DIR [--config FILE] [--force]`)
so that whatever implements it may change."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from pdsvc.render.bundle import RECORD
from pdsvc.render.kit import File

#: Beside the bundle: the bundle and config that ran before the last apply (the way back).
PREVIOUS = ".pdsvc-previous"
#: Beside the bundle: a copy of the config the bundle now there was applied from.
APPLIED = ".pdsvc-applied.yaml"
PREVIOUS_CONFIG = "config.yaml"


def read_bundle(outdir: Path) -> dict[str, str]:
    """Every file of the bundle in `outdir` (path in the bundle -> text), hidden ones left out
    (the record, the kept previous bundle, a render's staging files), and Python's bytecode
    caches: a runtime that runs from the bundle (supervisord's) writes runtime/__pycache__/
    wherever the host's Python writes bytecode (the default), which is no change of its code."""
    out: dict[str, str] = {}
    if not outdir.is_dir():
        return out
    for p in sorted(outdir.rglob("*")):
        rel = p.relative_to(outdir)
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                   for part in rel.parts):
            out[rel.as_posix()] = p.read_text(encoding="utf-8", errors="replace")
    return out


def as_bundle(files: list[File]) -> dict[str, str]:
    return {f.path: f.content for f in files}


def recorded_config_sha(bundle: dict[str, str]) -> str:
    """The config's sha256 that install.list records (the config the bundle came from); a
    bundle of several hosts records it in each HOST/install.list, the same in each."""
    lists = [t for p, t in sorted(bundle.items())
             if p == "install.list" or (p.endswith("/install.list") and p.count("/") == 1)]
    for text in lists:
        for line in text.splitlines():
            kind, _, rest = line.partition("\t")
            if kind == "config":
                return rest.split("\t")[1] if "\t" in rest else ""
    return ""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def running_config(outdir: Path, bundle: dict[str, str], config: Path) -> bytes | None:
    """The text of the config the bundle in `outdir` was rendered from, when it is still to
    be had: the copy the last apply kept, the file its render recorded or the config file
    itself, while unedited."""
    want = recorded_config_sha(bundle)
    for candidate in (outdir / APPLIED, recorded_config(outdir), config):
        try:
            data = candidate.read_bytes() if candidate else b""
        except OSError:
            continue
        if want and _sha(data).startswith(want):
            return data
    return None


def recorded_config(outdir: Path, *, kept: bool = False) -> Path | None:
    """The config the render of the bundle in `outdir` recorded (`kept`: of the previous one
    kept there); the record's path is relative to `outdir`. None without a record."""
    try:
        record = outdir / PREVIOUS / RECORD if kept else outdir / RECORD
        doc = json.loads(record.read_text(encoding="utf-8"))
        return Path(os.path.normpath(outdir / str(doc["config"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_previous(outdir: Path, config_text: bytes | None) -> Path:
    """Copy the bundle now in `outdir` (and its config, when known) to outdir/.pdsvc-previous/,
    replacing the one kept before."""
    prev = outdir / PREVIOUS
    tmp = outdir / f"{PREVIOUS}.new"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(outdir, tmp, symlinks=True, ignore=lambda d, names: [
        n for n in names if n.startswith(".") and not (n == RECORD and Path(d) == outdir)])
    if config_text is not None:
        (tmp / PREVIOUS_CONFIG).write_bytes(config_text)
    shutil.rmtree(prev, ignore_errors=True)
    tmp.rename(prev)
    return prev


def previous_files(outdir: Path) -> tuple[list[File], Path]:
    """The kept previous bundle as Files, and its config (for --rollback)."""
    prev = outdir / PREVIOUS
    config = prev / PREVIOUS_CONFIG
    files = [File(path, text, (prev / path).stat().st_mode & 0o777)
             for path, text in read_bundle(prev).items() if path != PREVIOUS_CONFIG]
    return files, config


def save_applied(outdir: Path, config_text: bytes) -> None:
    (outdir / APPLIED).write_bytes(config_text)


def install(script: Path, outdir: Path, config: Path | None, *, force: bool,
            dry_run: bool = False) -> tuple[int, list[str]]:
    """Run the installer on the bundle; (exit status, its output lines). Its closing hint to
    restart the whole target is left out: apply restarts what changed, one step at a time."""
    argv = ["bash", str(script), "--bundle", str(outdir)]
    if config is not None:
        argv += ["--config", str(config)]
    argv += ["--force"] * force + ["--dry-run"] * dry_run
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "still running the previous definition" not in line]
    return proc.returncode, lines


def previous_origin_config(outdir: Path, fallback: Path) -> Path:
    """The config path the kept previous bundle's record names (what its render recorded), so
    that going back leaves the bundle directory `pdsvc render` of that config's own."""
    return recorded_config(outdir, kept=True) or fallback
