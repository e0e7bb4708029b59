"""pdsvc: one YAML file -> a topology-checked plan -> systemd units for SGLang PD serving."""

__version__ = "0.1.0"
