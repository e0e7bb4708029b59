"""What doctor knows of the host, each fact looked up once, on first use, by whichever check
asks first (the GPU listing, the sysfs topology, the venv's package versions)."""

from __future__ import annotations

from functools import cached_property

from pdsvc.errors import TopologyError
from pdsvc.plan.build import Plan
from pdsvc.topology import Topology, read_sysfs

from .gpus import GpuFacts, gpu_facts, proc_driver_version
from .host import Host
from .venv import Installed, ProbeFailed, probe_versions


class Facts:
    """The host (and the plan, None when none could be made for it) the checks read."""

    def __init__(self, host: Host, plan: Plan | None) -> None:
        self.host = host
        self.plan = plan

    @property
    def planned(self) -> Plan:
        """The plan, for a check whose ``when`` runs it only when one could be made."""
        assert self.plan is not None
        return self.plan

    @cached_property
    def driver_version(self) -> str | None:
        """The loaded NVIDIA kernel module's version (/proc), None when none is loaded."""
        return proc_driver_version(self.host.proc_root)

    @cached_property
    def gpus(self) -> GpuFacts:
        """The GPUs and their compute processes, from NVML or nvidia-smi (which is also asked
        for the driver's version when /proc does not say it)."""
        return gpu_facts(self.host, want_driver=self.driver_version is None)

    @cached_property
    def topology(self) -> Topology | TopologyError:
        """This host's GPUs and NUMA nodes, re-read from sysfs."""
        try:
            return read_sysfs(self.host.sysfs_root)
        except TopologyError as exc:
            return exc

    @cached_property
    def installed(self) -> Installed | ProbeFailed:
        """What runtime.python has installed (the version probe, run once)."""
        return probe_versions(self.planned)
