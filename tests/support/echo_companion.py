"""A companion process reduced to its link end, for tests that measure the gateway through a real
link: the CPython link driver and transport (ports/cpython/ubrb_host/link.py) and the companion's
LinkCompanionEnd (ros_side/link_end.py), as `python -m ros_side --link` runs them, with a ROS side
that echoes: every message published on any publisher slot goes straight back as a message on
every subscribed slot. So one PUBLISH from a UBRB client comes back to its subscribers as one
MESSAGE, through the gateway's link twice, with no DDS in the way.

    python -m tests.support.echo_companion --link udp://127.0.0.1:PORT [--link-key FILE]

Prints "echo companion on link URL" when it listens; runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import sys
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for p in (ROOT, os.path.join(ROOT, "ports", "cpython")):
    if p not in sys.path:
        sys.path.insert(0, p)

import ubrb_setup  # noqa: E402
from ros_side.link_end import LinkCompanionEnd  # noqa: E402
from ubrb_host import link as host_link  # noqa: E402
from ubrb_host.loop import now_ms  # noqa: E402


class EchoRos:
    """The RosPort of the companion end: registrations accepted, publishes echoed."""

    distro = "humble"

    def __init__(self) -> None:
        self.sink: Any = None
        self.subs: List[int] = []
        self.echoed = 0

    def advertise(self, slot: int, topic: str, type_: str, qos: Any) -> None:
        self.sink.ros_result("pub", slot, None, "")

    def unadvertise(self, slot: int) -> None:
        pass

    def subscribe(self, slot: int, topic: str, type_: str, qos: Any) -> None:
        if slot not in self.subs:
            self.subs.append(slot)
        self.sink.ros_result("sub", slot, None, "")

    def unsubscribe(self, slot: int) -> None:
        if slot in self.subs:
            self.subs.remove(slot)

    def publish(self, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
        for s in self.subs:
            self.sink.ros_message(s, buf, off, n)
        self.echoed += 1

    def reset(self) -> None:
        self.subs = []

    def gateway_stats(self, d: Dict[str, Any]) -> None:
        pass


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="echo_companion")
    ap.add_argument("--link", required=True)
    ap.add_argument("--link-key", default=None)
    ap.add_argument("--max-message", type=int, default=65536)
    args = ap.parse_args(argv)
    key = None
    if args.link_key:
        with open(args.link_key) as f:
            key = ubrb_setup.parse_link_key(f.read())
    session, driver = host_link.open_link(args.link, False, args.max_message, key=key)
    ros = EchoRos()
    end = LinkCompanionEnd(session, ros)
    ros.sink = end
    running = [True]

    def stop(*_: Any) -> None:
        running[0] = False

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    sel = selectors.DefaultSelector()
    sel.register(driver.fileno(), selectors.EVENT_READ)
    print("echo companion on link %s" % args.link, flush=True)
    while running[0]:
        for _ in sel.select(0.01):
            driver.on_readable(now_ms())
        now = now_ms()
        driver.tick(now)
        if end.owed:
            end.retry_answers()
        driver.flush(now)
    print("echoed %d; link counters: %s" % (ros.echoed, driver.counters()), flush=True)
    driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
