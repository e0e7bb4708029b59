"""The plan layer: Config + Topology -> Plan (build), every port, GPU, CPU, flag, path and env
var decided once: its types, CPU/NUMA pinning, the plan cache, and the host-to-host connections
a firewall must allow. It reads the config layer and the leaves, never a renderer."""
