"""`pdsvc apply`: from an edited config, render, install and restart only what changed, in an
order that keeps serving.

units.py reads rendered unit files; changes.py compares the running bundle with the new one
and rollout.py plans the steps from what changed (pure); execute.py runs them against systemd
and the router; bundles.py keeps the previous bundle and config and calls the installer
through its command line.
"""
