"""The render layer: Plan -> files. systemd units, supervisord and Kubernetes outputs, the
monitoring files, and the bundle writer that puts them on disk (ownership, refusals, diffs)."""
