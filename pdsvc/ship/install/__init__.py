"""pdsvc's installer: installs the systemd bundle it is shipped in (``python3 BUNDLE/install``,
which install.sh runs as root), exactly as install.list says, and records what it made so that
``--uninstall`` removes exactly that. Stdlib only; Python >= 3.9 (the host's python3)."""
