"""`pdsvc doctor`: does this GPU host fit the plan? A preflight to run before install and start.

Every check reads the host, compares it with the plan and yields rows: ✓ ok, ✗ failed (the
host does not fit the plan; exit 3) or ! warning (it may run, but read the line), each with a
one-line detail and, for ✗ and !, a one-line fix. One finding per fact, a fix said once.

  (the click command and its report are pdsvc/cli/doctor.py)
  checks       the table of checks, run in report order by one guarded loop
  rows         Row, the one result type, and the guard that turns a crash into a row
  facts        what is known of the host, each fact looked up once
  host         where the host is read from (Host: every path and tool injectable)
  gpus         the driver's view of the GPUs: NVML, or nvidia-smi via pdsvc.ship.runtime.gpu
  gpu_checks   driver, gpus, gpus idle, gpu memory
  placement    topology, numa: the GPUs are where the plan put them
  ports        every planned port binds here (and SGLang's dist-init span is free)
  network      one host of several: its address and its UCX_NET_DEVICES links
  routerkey    one host of several: the router takes this host's control-plane key
  venv         runtime.python has the packages, and their parsers accept the units' flags
  probes/      the scripts run under runtime.python for that (linted, stdlib only)
  limits       memlock, /dev/shm, JIT cache disk
  systemd      new enough, and PID 1

Every host input is injectable so tests run against fixture hosts. A missing tool is a row,
never a traceback.
"""

from .checks import run_checks
from .gpu_checks import mem_fraction
from .gpus import (
    QUERY_APPS,
    QUERY_DRIVER,
    QUERY_GPU,
    GpuQueryError,
    parse_query_gpu,
    proc_driver_version,
)
from .host import Host
from .limits import GIB, check_jit_cache, check_memlock, check_shm, fs_space
from .ports import port_use
from .probes import PARSE_MARKER, RESULT_PREFIX, VERSIONS_MARKER
from .rows import Row

__all__ = [
    "GIB", "PARSE_MARKER", "QUERY_APPS", "QUERY_DRIVER", "QUERY_GPU", "RESULT_PREFIX",
    "VERSIONS_MARKER", "GpuQueryError", "Host", "Row", "check_jit_cache", "check_memlock",
    "check_shm", "fs_space", "mem_fraction", "parse_query_gpu", "port_use",
    "proc_driver_version", "run_checks",
]
