"""The installer's command line: options, help, the refusals that come before anything is read
or changed, and the exit codes (0 done, 1 refused or failed, 2 usage)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import Refused, Usage
from .host import PROG, Host
from .install import Run, install, read_key
from .listfile import Bundle, load
from .manifest import Manifest, parse_manifest, sha256_file
from .uninstall import uninstall

HELP = """\
install.sh — install the systemd bundle that `pdsvc render` wrote (units/ beside install.sh).

Every path comes from the bundle's install.list (written by the renderer from the plan); the
installer derives none. It never overwrites a file an admin edited in place (it shows the diff
and refuses, before changing anything, unless --force), never touches a *.d/ drop-in directory,
records what it created in a manifest (the path install.list names) so that --uninstall removes
exactly that, and ends by printing systemd's real state — never an unconditional "success".
The service user and group, directories and env files come from the bundle's sysusers.d and
tmpfiles.d files, applied with systemd-sysusers / systemd-tmpfiles (useradd and mkdir where the
host lacks them). The target is enabled when its units are first installed and started only
with --start; a re-install keeps the enablement the admin chose (`systemctl disable` sticks).

Usage: sudo ./install.sh [options]
  --bundle DIR      the rendered bundle (default: units/ beside install.sh)
  --config FILE     the config the bundle was rendered from, to check that the bundle is
                    current (default: the config path install.list records; if that is not
                    here, the file of that name beside the bundle directory)
  --unit-dir DIR    where units go (default: /etc/systemd/system)
  --key-from FILE   on an engine host of several: install FILE, the router host's
                    control-plane key (/etc/NAME/router.key there, made by its install.sh),
                    root:GROUP 0640; a key that is not one token (RFC 6750 b64token) is
                    refused. The router's host makes its own and refuses this option.
  --start           start the target after installing, and fail unless every unit is active
  --force           replace (or with --uninstall: remove) files edited in place; diff shown
  --dry-run         print every action, change nothing (allowed without root)
  --json            with --dry-run: the actions as one JSON document (format
                    pdsvc-install-plan/1), for tools such as `pdsvc apply`
  --uninstall       stop and disable the stack, remove exactly what the manifest lists; the
                    JIT cache, state dir, env files you filled and the service user stay
  --purge           with --uninstall: remove those too
  -h, --help
DESTDIR=/path stages the files under /path for packaging: no systemctl, no useradd/chown,
no root needed (the package's postinst creates the user and enables the target).

Refusals (exit 1, before anything changes): not root (unless --dry-run or DESTDIR); systemd
is not PID 1 (also with --dry-run, since the real run would refuse the same way; DESTDIR
needs no systemd); no bundle; a bundle older than its config; a file edited in place;
--key-from on a host that makes the key or reads none, or with a malformed key.

Exit codes: 0 done · 1 refused or failed (the message says why) · 2 usage.
"""

_VALUE = {"--bundle": "a directory", "--config": "a file", "--unit-dir": "a directory",
          "--key-from": "a file"}
_FLAGS = ("--start", "--force", "--dry-run", "--json", "--uninstall", "--purge")


@dataclass
class Options:
    bundle: str
    config: str = ""
    unit_dir: str = "/etc/systemd/system"
    key_from: str = ""
    start: bool = False
    force: bool = False
    dry_run: bool = False
    json: bool = False
    uninstall: bool = False
    purge: bool = False
    dest: str = ""
    help: bool = False


def parse_args(argv: list[str], default_bundle: str, destdir: str = "") -> Options:
    """The options, checked for what goes together; Usage when they are wrong."""
    o = Options(bundle=default_bundle)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUE:
            if i + 1 >= len(argv) or not argv[i + 1]:
                raise Usage(f"{arg} needs {_VALUE[arg]}")
            setattr(o, arg[2:].replace("-", "_"), argv[i + 1])
            i += 1
        elif arg in _FLAGS:
            setattr(o, arg[2:].replace("-", "_"), True)
        elif arg in ("-h", "--help"):
            o.help = True
        else:
            raise Usage(f"unknown option {arg}")
        i += 1
    o.dest = destdir.rstrip("/")
    if o.dest and not o.dest.startswith("/"):
        raise Usage("DESTDIR must be an absolute path")
    if o.purge and not o.uninstall:
        raise Usage("--purge only goes with --uninstall")
    if o.start and (o.uninstall or o.dest):
        raise Usage("--start does not go with --uninstall or DESTDIR")
    if o.key_from and o.uninstall:
        raise Usage("--key-from does not go with --uninstall")
    if o.json and not o.dry_run:
        raise Usage("--json goes with --dry-run")
    o.unit_dir = o.unit_dir.rstrip("/") or "/"
    return o


def refuse_host(o: Options, euid: int, systemd_dir: Path = Path("/run/systemd/system")) -> None:
    """The refusals about where it runs: not root, no systemd as PID 1."""
    if not o.dest and not o.dry_run and euid != 0:
        raise Refused("must run as root (sudo ./install.sh); --dry-run shows what it would do")
    if not o.dest and not systemd_dir.is_dir():
        raise Refused("systemd is not PID 1 here (no /run/systemd/system), so the units cannot "
                      "run: install on a host booted with systemd (without one: pdsvc's "
                      "supervisord bundle), or stage the files for a package with DESTDIR=DIR")


def config_candidates(src: str, bundle: str, here: str | None, cwd: str) -> list[str]:
    """Where the config that install.list names may be, in order."""
    parent = os.path.abspath(os.path.join(bundle, ".."))
    if src.startswith("/"):
        return [src, os.path.join(parent, os.path.basename(src))]
    return [os.path.join(d, src) for d in ([here] if here else []) + [parent, cwd]]


def check_fresh(b: Bundle, o: Options, host: Host, here: str | None) -> None:
    """Refuse a bundle rendered from an older config: install.list's `config` line records
    the config's path and sha256."""
    if not b.config_sha:
        host.warn(f"{b.dir / 'install.list'} records no config checksum: cannot tell whether "
                  "the bundle is current")
        return
    config = o.config
    if config and not os.path.isfile(config):
        raise Refused(f"--config {config}: no such file")
    if not config:
        found = [c for c in config_candidates(b.config_src, o.bundle, here, os.getcwd())
                 if os.path.isfile(c)]
        if not found:
            host.warn(f"cannot check that the bundle is current: its config {b.config_src} is "
                      "not here (pass --config FILE)")
            return
        config = found[0]
    try:
        have = sha256_file(config)
    except OSError:
        raise Refused(f"cannot read {config} (to check that the bundle is current)") from None
    if not have.startswith(b.config_sha):
        raise Refused(f"{config} changed since the bundle in {o.bundle} was rendered from it "
                      f"(sha256 {b.config_sha}): run `pdsvc render` first")
    host.status(f"bundle {o.bundle} is current (rendered from {config})")


def load_manifest(host: Host, b: Bundle) -> Manifest:
    path = host.at(b.manifest)
    if not path.is_file():
        return Manifest()
    m = parse_manifest(path.read_text(encoding="utf-8"))
    for kind in m.unknown:
        host.warn(f"{path}: unknown entry '{kind}' ignored")
    return m


def default_bundle() -> str:
    """install.sh's units/ beside it (it says so in PDSVC_DEFAULT_BUNDLE), else the bundle
    this installer is shipped in (BUNDLE/install/)."""
    return os.environ.get("PDSVC_DEFAULT_BUNDLE") or str(Path(__file__).resolve().parents[1])


def run(argv: list[str]) -> int:
    o = parse_args(argv, default_bundle(), os.environ.get("DESTDIR", ""))
    if o.help:
        sys.stdout.write(HELP)
        return 0
    refuse_host(o, os.geteuid())
    b = load(Path(o.bundle))
    host = Host(dry=o.dry_run, dest=o.dest, json=o.json)
    key = read_key(b, o.key_from) if o.key_from else ""
    old = load_manifest(host, b)
    script = os.environ.get("PDSVC_INSTALL_SH") or PROG
    if o.uninstall:
        rc = uninstall(host, b, old, purge=o.purge, force=o.force)
    else:
        here = os.path.dirname(os.path.abspath(script)) if "PDSVC_INSTALL_SH" in os.environ \
            else None
        check_fresh(b, o, host, here)
        rc = install(Run(host=host, bundle=b, shown=o.bundle, unit_dir=o.unit_dir, old=old,
                         force=o.force, start=o.start, key=key, key_from=o.key_from,
                         script=script))
    if o.json:
        print(json.dumps({"format": "pdsvc-install-plan/1", "name": b.name, "target": b.target,
                          "bundle": o.bundle, "uninstall": o.uninstall, "changes": host.changed,
                          "steps": host.records}, indent=2))
    return rc


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except Usage as e:
        print(f"{PROG}: {e} (see --help)", file=sys.stderr)
        return 2
    except Refused as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
