"""Throttle accuracy and the companion's history budget, through real processes.

`python ubrb_min.py --link udp://...` and `python -m ros_side --link udp://...` (dds backend, DDS
on loopback, as in tests/e2e), one UBRB client on TCP, one DDS writer in this process.

Prints, in one run:
  * throttle: a ~1 kHz DDS stream on four topics, three of them throttled (10, 50, 100 Hz), one
    not: the rate each reaches the client at, beside its limit and the input rate, and whether the
    burst's last message arrived;
  * history budget: the issue's case (a client advertises transient_local depth 100000 and
    publishes 64 KiB messages) against a companion with --max-history-bytes 100M (the writer holds
    100 MiB, the rest is refused), and the same against one whose budget is out of the way
    (1024G): companion RSS before and after. The
    publishing is capped (--mib, default 256) so the control does not take the machine's memory
    (the issue let it run to 3 GB).

Usage: .venv/bin/python bench/policy.py [--seconds S] [--mib N]
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))

from tests.e2e.helpers import (E2E_DOMAIN, E2E_XML, Client, companion_argv,  # noqa: E402
                               e2e_proc)
from tests.support.loopback_ports import free_port  # noqa: E402
from tests.support.procs import Proc  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

RATES = {"/bench/t10": 10, "/bench/t50": 50, "/bench/t100": 100, "/bench/all": 0}
BIG = 64 * 1024


def rss(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Pair:
    def __init__(self, gateway_args: List[str], companion_args: List[str]) -> None:
        url = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
        self.comp = e2e_proc(companion_argv(url, *companion_args))
        self.comp.wait_line(r"companion on link")
        self.gw = Proc([sys.executable, os.path.join(ROOT, "ubrb_min.py"), "--listen",
                        "127.0.0.1:0", "--link", url, *gateway_args], cwd="/")
        self.port = int(self.gw.wait_line(r"listening on [\d.]+:(\d+)", 15).group(1))
        self.gw.wait_line(r"ROS side up", 15)

    def close(self) -> None:
        self.gw.stop()
        self.comp.stop()


def string_data(cdr: bytes) -> str:
    n = struct.unpack_from("<I", cdr, 4)[0]
    return cdr[8:8 + n - 1].decode()


def bench_throttle(seconds: float) -> None:
    from cyclonedds.domain import Domain, DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.topic import Topic
    from tests.e2e.helpers import dds_qos, matched
    from tests.support import ros_idl as I

    args: List[str] = []
    for topic, hz in RATES.items():
        if hz:
            args += ["--throttle", "%s=%d" % (topic, hz)]
    pair = Pair(args, [])
    domain = Domain(E2E_DOMAIN, config=E2E_XML)
    dp = DomainParticipant(E2E_DOMAIN)
    c = Client(pair.port, "bench")
    try:
        writers: Dict[str, Any] = {}
        for k, topic in enumerate(RATES):
            c.subscribe(k + 1, topic, "std_msgs/msg/String",
                        {"reliability": "reliable", "durability": "volatile", "depth": 200})
            writers[topic] = DataWriter(dp, Topic(dp, "rt" + topic, I.String), qos=dds_qos(depth=200))
        end = time.monotonic() + 10
        while time.monotonic() < end and not all(matched(w) for w in writers.values()):
            time.sleep(0.05)
        n = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for w in writers.values():
                w.write(I.String(data=str(n)))
            n += 1
            time.sleep(0.001)
        elapsed = time.monotonic() - t0
        c.wait(lambda: all(c.messages[k + 1] and string_data(c.messages[k + 1][-1]) == str(n - 1)
                           for k in range(len(RATES))), 10)
        time.sleep(0.5)
        print("throttle: %d messages per topic in %.2f s (input %.0f Hz)" % (n, elapsed, n / elapsed))
        for k, (topic, hz) in enumerate(RATES.items()):
            got = c.messages[k + 1]
            last = string_data(got[-1]) == str(n - 1) if got else False
            share = ("%5.1f%% of the limit" % (100.0 * len(got) / elapsed / hz) if hz
                     else "%5.1f%% of the input" % (100.0 * len(got) / n))
            print("  %-12s %s: %5d delivered = %6.1f Hz (%s), last message %s"
                  % (topic, "limit %3d Hz" % hz if hz else "unthrottled ", len(got),
                     len(got) / elapsed, share, "delivered" if last else "MISSING"))
        for w in writers.values():
            w.__del__()
    finally:
        c.close()
        dp.__del__()
        domain.__del__()
        pair.close()


def bench_history(mib: int, budget: str) -> Optional[tuple]:
    # --latched-state none: the restart copy of latched samples (up to 64 MiB) is not measured here
    pair = Pair([], ["--max-history-bytes", budget, "--latched-state", "none"])
    c = Client(pair.port, "hoarder")
    try:
        pid = pair.comp.pid
        before = rss(pid)
        c.advertise(1, "/bench/hoard", "std_msgs/msg/String",
                    {"reliability": "reliable", "durability": "transient_local", "depth": 100000})
        c.sync(10)
        body = b"\x00\x01\x00\x00" + struct.pack("<I", BIG - 8) + b"x" * (BIG - 9) + b"\0"
        count = mib * 16
        t0 = time.monotonic()
        for _batch in range(0, count, 50):
            for _ in range(50):
                c.publish(1, body)
            c.sync(30)
            time.sleep(0.02)
        time.sleep(1.0)
        after = rss(pid)
        refused = [e for e in c.errors if e["code"] == "resource_exhausted"]
        print("  --max-history-bytes %-4s: %s; companion RSS %.0f MiB -> %.0f MiB after %d x "
              "64 KiB PUBLISH (%.1f s)" % (budget, "messages past the budget refused "
                                           "(resource_exhausted)" if refused else "all held",
                                           before / 2**20, after / 2**20, count,
                                           time.monotonic() - t0))
        return before, after
    finally:
        c.close()
        pair.close()


def main() -> None:
    ap = host_cli.script_parser("bench/policy.py", __doc__ or "")
    ap.add_argument("--seconds", type=host_cli.duration, default=3.0)
    ap.add_argument("--mib", type=host_cli.positive_int, default=256)
    a = ap.parse_args()
    bench_throttle(a.seconds)
    print("history budget: transient_local depth 100000, 64 KiB messages (the issue's case)")
    bench_history(a.mib, "100M")
    bench_history(a.mib, "1024G")


if __name__ == "__main__":
    main()
