"""sd_notify (pdsvc/ship/runtime/notify.py): where the socket is, abstract or not.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from pdsvc.ship.runtime.notify import notify


def test_notify_path_and_abstract_and_unset(tmp_path):
    assert notify("READY=1", env={}) is False
    path = tmp_path / "n.sock"
    if len(str(path)) > 100:
        path = Path(tempfile.mkdtemp(prefix="pdsvc-")) / "n.sock"
    for address, bind_to in (
        (str(path), str(path)),
        (f"@pdsvc-test-{os.getpid()}", f"\0pdsvc-test-{os.getpid()}"),
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
            receiver.bind(bind_to)
            receiver.settimeout(2)
            assert notify("READY=1", "STATUS=a\nb", env={"NOTIFY_SOCKET": address})
            assert receiver.recv(4096) == b"READY=1\nSTATUS=a b"
    assert notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "absent")}) is False


