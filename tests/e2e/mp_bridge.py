"""The board's whole chain as one rig: the deployed MicroPython gateway (the real unix port, the
board heap of tests/support/mp_unix.py) == UDP link on 127.0.0.1 == the CPython companion (dds
backend, a subprocess). Used by tests/e2e/test_e2e_micropython.py and test_heap_ci_unix64.py."""

from __future__ import annotations

import os
import re
import signal
import socket
from typing import Callable, Optional, Sequence

from tests.e2e.helpers import E2E_DOMAIN, E2E_XML, companion_argv, e2e_proc
from tests.support.loopback_ports import free_port
from tests.support.mp_unix import HEAP as BOARD_HEAP, MicroPythonGateway
from tests.support.procs import Proc, child_env

S = "std_msgs/msg/String"
# The heap of the chain's gateway: the board heap every MicroPython test uses, 128 KiB (>= 32 KiB
# free after start-up; ports/micropython/README.md, "Memory"); UBRB_MP_E2E_HEAP tries another.
HEAP = os.environ.get("UBRB_MP_E2E_HEAP", BOARD_HEAP)
# KeepLast(1000) at the companion's DDS endpoints: a burst from a test replaces no sample
DEEP = {"reliability": "reliable", "durability": "volatile", "depth": 1000}


class MicroPythonBridge:
    """The deployed MicroPython gateway (mcu profile) == UDP link == companion process."""

    mode = "micropython"

    def __init__(self, *link_args: str, heap: str = HEAP, layout: str = "romfs",
                 gw_args: Sequence[str] = (),
                 link_via: Optional[Callable[[int], int]] = None) -> None:
        # link_args: given to both ends (--link-key FILE); heap, layout and gw_args: the
        # gateway's (tests/support/mp_unix.py: "romfs", or "files", the .mpy files of stock
        # firmware); link_via(companion's UDP port): the port the gateway's link goes to instead
        # (a proxy's: tools/impair.UdpImpairProxy)
        comp_port = free_port(socket.SOCK_DGRAM)
        self.comp_url = "udp://127.0.0.1:%d" % comp_port
        gw_url = self.comp_url if link_via is None else "udp://127.0.0.1:%d" % link_via(comp_port)
        self.link_args = link_args
        self.comp: Optional[Proc] = None
        self.gw: Optional[MicroPythonGateway] = None
        try:
            self.start_companion()
            # both clients come from 127.0.0.1, on the mcu profile's own limits: the per-address
            # one bounds connections before HELLO only
            self.gw = MicroPythonGateway("--link", gw_url, *link_args, *gw_args, heap=heap,
                                         env=child_env(E2E_DOMAIN, E2E_XML), layout=layout)
            self.port = self.gw.port
            self.gw.wait_line(r"ROS side up", 10)
        except BaseException:
            self.close()
            raise

    def start_companion(self) -> None:
        self.comp = e2e_proc(companion_argv(self.comp_url, *self.link_args))
        self.comp.wait_line(r"companion on link")

    def kill_companion(self) -> None:
        assert self.comp is not None
        self.comp.kill()

    def ros_ups(self) -> int:
        assert self.gw is not None
        return len(re.findall(r"ROS side up", self.gw.text()))

    def stop_and_tell(self) -> str:
        """For a failure's message: both ends stopped (they log their counters as they stop) and
        the end of what each said, so a message that went missing can be placed."""
        tell = []
        for name, p in (("gateway", self.gw), ("companion", self.comp)):
            if p is not None:
                p.stop(signal.SIGINT)
                tell.append("-- %s:\n%s" % (name, p.text()[-2500:]))
        return "\n".join(tell)

    def close(self) -> None:
        if self.gw is not None:
            self.gw.stop(signal.SIGINT)
        if self.comp is not None:
            self.comp.stop()
