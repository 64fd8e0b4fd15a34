"""The gateway program as a subprocess on both runtimes, on an ephemeral loopback port: CPython
(`python ubrb_min.py` from the source tree, started from another directory) and the MicroPython
port as deployed to a board (tests/support/mp_unix.py)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

from tests.support.mp_unix import MicroPythonGateway
from tests.support.procs import ROOT, Proc


class GatewayProcess(Proc):
    """`python ubrb_min.py ...`, started from another directory, on an ephemeral loopback port."""

    def __init__(self, *args: str) -> None:
        super().__init__([sys.executable, os.path.join(ROOT, "ubrb_min.py"),
                          "--listen", "127.0.0.1:0", *args], cwd="/")
        self.port = int(self.wait_line(r"listening on [\d.]+:(\d+)", 10).group(1))


RUNTIMES = ["cpython", "micropython"]


def start_gateway(runtime: str, *args: str) -> Proc:
    """The gateway on `runtime`: CPython from the source tree, or the deployed MicroPython port."""
    if runtime == "micropython":
        return MicroPythonGateway(*args)
    return GatewayProcess(*args)


def stop_cleanly(g: Proc) -> Optional[int]:
    """Ctrl-C (SIGINT): both ports close every socket, print their counters and exit 0."""
    return g.stop(signal.SIGINT)
