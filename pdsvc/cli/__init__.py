"""The `pdsvc` command line: one click group (commands) and the options and loaders that its
commands share (kit)."""
