"""Writing a bundle (the Files a renderer made) into an output directory, atomically and
without losing what is not pdsvc's: a record of what was written (config, format, sha256 of
each file), edited or foreign files refused unless forced, stale files of ours removed, one
writer at a time (flock), and `--diff`'s preview of all that."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdsvc.errors import OutputError
from pdsvc.plan.build import Plan
from pdsvc.render.kit import MARKER, RUNTIME_DIR, File, header_lines
from pdsvc.ship.install.manifest import edited as _edited
from pdsvc.ship.install.manifest import sha256_bytes, unified

#: In a bundle of several hosts (units/HOST/…), the file that lists them: it is how a later
#: render knows which subdirectories are its own to clean up, and nothing else is ever scanned.
HOSTS_INDEX = "hosts.list"


def diff_bundle(files: list[File], outdir: Path) -> str:
    """A unified diff of what writing `files` into `outdir` would change ('' when nothing)."""
    chunks: list[str] = []
    for f in files:
        target = outdir / f.path
        old = target.read_text(encoding="utf-8") if target.is_file() else ""
        chunks.append(unified(old, f.content, f"a/{f.path}" if old else "/dev/null",
                              f"b/{f.path}"))
    for stale in _stale(files, outdir):
        rel = stale.relative_to(outdir)
        chunks.append(f"--- a/{rel}\n+++ /dev/null\n@@ stale file, would be removed @@\n")
    return "".join(chunks)


#: What pdsvc wrote into an output directory, beside the bundle: the format, the config (from
#: the output directory) and each file's sha256. A file whose hash differs was edited since;
#: a record of another config or format is another bundle. Neither is replaced unless forced.
RECORD = ".pdsvc-bundle.json"
RECORD_SCHEMA = "pdsvc-bundle/1"


@dataclass(frozen=True)
class Origin:
    """What a bundle was rendered from: its format and config file."""

    format: str
    config: Path

    def describe(self) -> str:
        return f"the {self.format} bundle of {self.config}"


def bundle_record(files: list[File], outdir: Path, origin: Origin | None) -> File:
    """The record written beside `files` (deterministic: no time, no absolute path)."""
    doc: dict = {"format": RECORD_SCHEMA}
    if origin is not None:
        config = os.path.relpath(os.path.abspath(origin.config), os.path.abspath(outdir))
        doc.update(bundle=origin.format, config=Path(config).as_posix())
    doc["files"] = {f.path: sha256_bytes(f.content.encode())
                    for f in sorted(files, key=lambda f: f.path)}
    return File(RECORD, json.dumps(doc, indent=2) + "\n")


def _read_record(outdir: Path) -> dict | None:
    try:
        doc = json.loads((outdir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and doc.get("format") == RECORD_SCHEMA and isinstance(
        doc.get("files"), dict)
    return doc if ok else None


def _recorded_origin(outdir: Path, record: dict | None) -> Origin | None:
    """The origin of the bundle now in `outdir`: its record's, or for a bundle of an older
    pdsvc (no record) what its files' headers say; None when nothing says."""
    if record is not None:
        if "bundle" not in record or "config" not in record:
            return None
        return Origin(str(record["bundle"]), Path(os.path.normpath(outdir / record["config"])))
    for p in sorted(outdir.iterdir()) if outdir.is_dir() else ():
        if not (p.is_file() and _ours(p)):
            continue
        head = p.read_text(encoding="utf-8", errors="replace")[:2048]
        source = re.search(r"Source: (.+?) \(sha256 ", head)
        command = re.search(r"Command: (.*)", head)
        if source and command:
            fmt = re.search(r"--format (\S+)", command.group(1))
            return Origin(fmt.group(1) if fmt else "systemd", Path(source.group(1)))
    return None


def _same_origin(a: Origin, b: Origin) -> bool:
    return a.format == b.format and os.path.realpath(a.config) == os.path.realpath(b.config)


def _stale(files: list[File], outdir: Path) -> list[Path]:
    """Files an older render left in `outdir` (or in the host directories its hosts.list
    named, the directories its record lists files in, or that this render writes) that this
    render does not write: pdsvc's, so removable.
    Files without pdsvc's header are the user's and are never listed, nor are hidden files:
    the record, and the staging files of a render that runs (or died) there."""
    wanted = {outdir / f.path for f in files}
    dirs = {outdir} | {p.parent for p in wanted}
    # ... and where the bundle there had files: a bundle of another format or of other hosts
    # writes none in them (runtime/ beside the units, HOST/runtime/), yet they are its files
    record = _read_record(outdir)
    for rel in record["files"] if record else ():
        if isinstance(rel, str) and not os.path.isabs(rel) and ".." not in rel.split("/"):
            dirs.add((outdir / rel).parent)
    dirs.add(outdir / RUNTIME_DIR)  # a bundle of an older pdsvc has no record
    index = outdir / HOSTS_INDEX
    if index.is_file() and _ours(index):
        for line in index.read_text(encoding="utf-8").splitlines():
            host = line.split("\t", 1)[0]
            if not line.startswith("#") and _HOST_DIR.fullmatch(host):
                dirs.add(outdir / host)
    dirs = {d for d in dirs if (d == outdir and d.is_dir()) or _own_subdir(outdir, d)}
    for d in [d for d in dirs if d != outdir]:  # a host's own subdirectories (its runtime/)
        dirs |= {sub for sub in d.rglob("*") if _own_subdir(outdir, sub)}
    return [p for d in sorted(dirs) for p in sorted(d.iterdir())
            if p.is_file() and p not in wanted and not p.name.startswith(".") and _ours(p)]


#: A host's directory in a bundle of several: a host name (config HostName), nothing else.
_HOST_DIR = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def _own_subdir(outdir: Path, d: Path) -> bool:
    """A real directory inside outdir (a host's, or the runtime's in it): no step of the way
    from outdir to it is a symlink that could lead elsewhere."""
    if d == outdir or outdir not in d.parents or not d.is_dir():
        return False
    while d != outdir:
        if d.is_symlink():
            return False
        d = d.parent
    return True


def hosts_index(plan: Plan, command: str) -> File:
    """hosts.list: which subdirectory holds which host's bundle (and what a later render may
    clean up)."""
    lines = [f"# {line}" for line in header_lines(plan, command)]
    lines.append("# host\taddress\tunits — on each host install its directory of this one: "
                 "sudo ./install.sh --bundle THIS_DIR/HOST")
    lines += [f"{h.name}\t{h.address}\t{' '.join(h.units)}" for h in plan.hosts]
    return File(HOSTS_INDEX, "\n".join(lines) + "\n")


def _ours(path: Path) -> bool:
    """Whether a file carries pdsvc's provenance header (so pdsvc may replace or remove it)."""
    try:
        with path.open(encoding="utf-8") as fh:
            return MARKER in fh.read(1024)
    except (OSError, UnicodeDecodeError):
        return False


@contextlib.contextmanager
def _locked(outdir: Path) -> Iterator[bool]:
    """One render at a time per output directory: an exclusive flock on the directory itself
    (no lock file to leave behind), created if missing. Yields whether this render created
    it. A render that waited re-checks that the directory it locked is still the one at that
    path (the one before it may have failed and removed the directory it had made)."""
    while True:
        created = not outdir.exists()
        try:
            outdir.mkdir(parents=True, exist_ok=True)
            fd = os.open(outdir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise OutputError(f"{outdir}: cannot create the output directory: {e.strerror}",
                              hint="pass --output DIR") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held, now = os.fstat(fd), os.stat(outdir)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                break
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield created
    finally:
        os.close(fd)


def write_bundle(files: list[File], outdir: Path, *, origin: Origin | None = None,
                 force: bool = False) -> list[tuple[str, str]]:
    """Write all files or none, and report (path, created|updated|unchanged|removed|
    overwritten|discarded).

    One render at a time per output directory (`_locked`). Every file is first written to a
    temp file of this process beside its target; only when all of them are on disk are they
    renamed into place (rename is atomic per file), so an error leaves the old bundle
    untouched. A file of that name that pdsvc did not write is the user's: refuse, always.
    Refused too, unless ``force`` (then reported as overwritten/discarded): replacing or
    removing a file edited since pdsvc wrote it (its hash differs from the record), and
    replacing or removing files of a bundle of another ``origin`` (config or format).
    Stale files an older render left (with pdsvc's header) are removed; others are left alone.
    """
    if outdir.exists() and not outdir.is_dir():
        raise OutputError(f"{outdir}: exists and is not a directory", hint="pass --output DIR")
    for sub in sorted({(outdir / f.path).parent for f in files} - {outdir}):
        if sub.is_symlink() or (sub.exists() and not _own_subdir(outdir, sub)):
            raise OutputError(
                f"{sub}: exists and is not a directory of the bundle (a file or a symlink); "
                "refusing to write through it",
                hint="move it away or render into another directory (--output DIR)",
            )
    with _locked(outdir) as created:
        try:
            return _write_locked(files, outdir, origin, force)
        except BaseException:
            if created:
                with contextlib.suppress(OSError):
                    outdir.rmdir()  # only when empty: what this render made, nothing else
            raise


def _write_locked(files: list[File], outdir: Path, origin: Origin | None,
                  force: bool) -> list[tuple[str, str]]:
    """write_bundle's work under the lock: refuse what would lose another bundle or an edit
    (unless ``force``), then stage, replace and remove; (path, what happened) per file."""
    record = _read_record(outdir)
    survey = _survey(files, outdir, record["files"] if record else {})
    if not force:
        _refuse_other_origin(outdir, _recorded_origin(outdir, record), origin, survey)
        _refuse_edited(outdir, survey.edited)
    report = survey.report
    if survey.edited:
        report = [(p, "overwritten" if p in survey.edited else s) for p, s in report]
    staged = _stage([*files, bundle_record(files, outdir, origin)], outdir)
    for part, dest in staged:  # the record last: what it lists is in place
        os.replace(part, dest)
    return report + _remove_stale(survey.gone, outdir, survey.edited)


@dataclass
class _Survey:
    """What a render would do to the directory, before it does anything."""

    report: list[tuple[str, str]]  # (path, created/unchanged/updated) per file rendered
    replaced: list[str]  # pdsvc's files this render changes or removes
    edited: list[str]  # … of which edited since pdsvc wrote them
    gone: list[Path]  # pdsvc's files this render no longer makes


def _survey(files: list[File], outdir: Path, recorded: dict) -> _Survey:
    """Each file against what lies in ``outdir``; OutputError for a file pdsvc did not write."""
    survey = _Survey([], [], [], _stale(files, outdir))
    for f in files:
        old = outdir / f.path
        if not old.exists():
            survey.report.append((f.path, "created"))
            continue
        if not _ours(old):
            raise OutputError(
                f"{old}: exists and was not written by pdsvc; refusing to overwrite it",
                hint="move it away or render into another directory (--output DIR)",
            )
        data = old.read_bytes()
        same = data == f.content.encode() and (old.stat().st_mode & 0o777) == f.mode
        survey.report.append((f.path, "unchanged" if same else "updated"))
        if data != f.content.encode():
            survey.replaced.append(f.path)
            if f.path in recorded and _edited(old, recorded[f.path]):
                survey.edited.append(f.path)
    for p in survey.gone:
        rel = p.relative_to(outdir).as_posix()
        survey.replaced.append(rel)
        if rel in recorded and _edited(p, recorded[rel]):
            survey.edited.append(rel)
    return survey


def _refuse_other_origin(outdir: Path, there: Origin | None, origin: Origin | None,
                         survey: _Survey) -> None:
    """OutputError when the directory holds another deployment's bundle that this render
    would change."""
    if there is None or origin is None or _same_origin(there, origin) or not survey.replaced:
        return
    removes = [str(p.relative_to(outdir)) for p in survey.gone]
    changes = [r for r in survey.replaced if r not in removes]
    lose = "; ".join(
        f"{verb} {len(names)} of its files ({_some(names)})"
        for verb, names in (("remove", removes), ("replace", changes)) if names)
    raise OutputError(
        f"{outdir} holds {there.describe()}; rendering {origin.describe()} there would "
        f"{lose}",
        hint="render into another directory (--output DIR), or pass --force to replace it",
    )


def _refuse_edited(outdir: Path, edited: list[str]) -> None:
    """OutputError when the render would lose an edit made since pdsvc wrote a file."""
    if edited:
        raise OutputError(
            f"{outdir}: {_some(edited)} edited since pdsvc wrote "
            f"{'them' if len(edited) > 1 else 'it'}; this render would lose the edit "
            "(see it with --diff)",
            hint="keep changes in drop-ins (systemctl edit UNIT) or in the config, or pass "
            "--force to replace the file",
        )


def _stage(todo: list[File], outdir: Path) -> list[tuple[Path, Path]]:
    """Each file written beside its destination, (temporary, destination) per file; on a
    failure nothing is left behind (OutputError)."""
    staged: list[tuple[Path, Path]] = []
    made = [d for d in sorted({(outdir / f.path).parent for f in todo}) if not d.exists()]
    try:
        for d in made:
            d.mkdir(parents=True, exist_ok=True)
        for f in todo:
            dest = outdir / f.path
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp",
                                       dir=dest.parent)
            staged.append((Path(tmp), dest))
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(f.content)
            os.chmod(tmp, f.mode)
    except OSError as e:
        for part, _ in staged:
            part.unlink(missing_ok=True)
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise OutputError(f"{outdir}: cannot write the bundle: {e.strerror}") from None
    return staged


def _remove_stale(gone: list[Path], outdir: Path, edited: list[str]) -> list[tuple[str, str]]:
    """pdsvc's files the render no longer makes removed, with the directories they leave
    empty; (path, removed/discarded) per file."""
    report = []
    for p in gone:
        p.unlink()
        rel = p.relative_to(outdir).as_posix()
        report.append((rel, "discarded" if rel in edited else "removed"))
        d = p.parent  # a host that left the inventory: its emptied directories too
        while d != outdir and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
    return report


def _some(names: list[str], most: int = 4) -> str:
    """`a, b, c` — or the first few and how many more."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
