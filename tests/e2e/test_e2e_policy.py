"""Issue 13 items 3-5 through real processes: the gateway program (`python ubrb_min.py`) linked
over UDP to the companion (`python -m ros_side`), DDS on loopback, UBRB clients on TCP.

- throttle: a DDS writer publishes a fast topic; the gateway's --throttle holds it to 50 Hz per
  client, newest wins, and the last message of the burst still arrives;
- the companion's --max-history-bytes: the issue's case (transient_local, depth 100000, 64 KiB
  messages) holds what the budget allows, the rest is refused with resource_exhausted, and the
  companion's memory grows by the budget at most; what a registration held is given back when
  it ends;
- direct mode takes --deny-topics as a ROS parameter (`--ros-args -p deny_topics:=...`).
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import Any, Iterator

import pytest

from tests.e2e.helpers import Client, DirectBridge, Dds, companion_argv, e2e_proc, matched
from tests.support import ros_idl as I
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, Proc, wait_for
from tests.support.qos import QOS_R

THROTTLE_HZ = 50
HISTORY_BUDGET = 100 << 20           # the companion's --max-history-bytes in these tests
MAX_MESSAGE = 66000                  # its --max-message (the link rounds it up to ~128 KiB)
LATCHED_CAP = 16 << 20               # its --latched-max-bytes: the copy of latched samples it
                                     # keeps for a restart (ros_side/latched.py), beside DDS's
BIG = 64 * 1024                      # the issue's message size


def rss(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


class GatewayAndCompanion:
    """`python ubrb_min.py --link udp://...` and `python -m ros_side --link udp://...`."""

    def __init__(self, gateway_args: tuple, companion_args: tuple) -> None:
        url = "udp://127.0.0.1:%d" % free_port(__import__("socket").SOCK_DGRAM)
        self.comp = e2e_proc(companion_argv(url, *companion_args))
        self.gw: Any = None
        try:
            self.comp.wait_line(r"companion on link")
            self.gw = Proc([sys.executable, os.path.join(ROOT, "ubrb_min.py"), "--listen",
                            "127.0.0.1:0", "--link", url, *gateway_args], cwd="/")
            self.port = int(self.gw.wait_line(r"listening on [\d.]+:(\d+)", 15).group(1))
            self.gw.wait_line(r"ROS side up", 15)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.gw is not None:
            self.gw.stop()
        self.comp.stop()


@pytest.fixture(scope="module")
def pair() -> Iterator[GatewayAndCompanion]:
    p = GatewayAndCompanion(("--throttle", "/thr/fast=%d" % THROTTLE_HZ),
                            ("--max-history-bytes", str(HISTORY_BUDGET),
                             "--max-message", str(MAX_MESSAGE),
                             "--latched-max-bytes", str(LATCHED_CAP)))
    yield p
    p.close()


def string_data(cdr: bytes) -> str:
    n = struct.unpack_from("<I", cdr, 4)[0]
    return cdr[8:8 + n - 1].decode()


def test_throttle_holds_a_fast_topic_to_its_rate_newest_wins(pair: GatewayAndCompanion,
                                                             dds: Dds) -> None:
    c = Client(pair.port, "throttled")
    try:
        # depth 100: the companion's readers must not overflow at 1 kHz on a busy machine
        qos = dict(QOS_R, depth=100)
        c.subscribe(1, "/thr/fast", "std_msgs/msg/String", qos)
        c.subscribe(2, "/thr/all", "std_msgs/msg/String", qos)     # same stream, no throttle
        fast = dds.writer("rt/thr/fast", I.String, depth=1000)
        full = dds.writer("rt/thr/all", I.String, depth=1000)
        assert wait_for(lambda: matched(fast) == 1 and matched(full) == 1, 10)
        n = 1000
        t0 = time.monotonic()
        for i in range(n):           # ~1 kHz (as fast as this shared machine goes)
            fast.write(I.String(data=str(i)))
            full.write(I.String(data=str(i)))
            time.sleep(0.001)
        elapsed = time.monotonic() - t0
        assert c.wait(lambda: len(c.messages[2]) >= n, 20), len(c.messages[2])
        assert c.wait(lambda: c.messages[1] and string_data(c.messages[1][-1]) == str(n - 1), 5)
        # nothing more of the burst may come: a marker written now arrives after anything the
        # throttle or the link still held (in order, as the assertions below check)
        fast.write(I.String(data=str(n)))
        full.write(I.String(data=str(n)))
        assert c.wait(lambda: string_data(c.messages[1][-1]) == str(n)
                      and string_data(c.messages[2][-1]) == str(n), 10)
        got = [int(string_data(m)) for m in c.messages[1]][:-1]
        everything = [int(string_data(m)) for m in c.messages[2]][:-1]
        assert everything == list(range(n))       # the unthrottled topic: all, in order
        assert got == sorted(set(got))            # throttled: in order, no repeats
        assert got[-1] == n - 1                   # the burst's last one arrived (newest wins)
        # 50 Hz over the burst: one per 20 ms period, plus the held last one. The gateway sees
        # the burst through the companion and the link, whose delays stretch or squeeze it by
        # a few periods on a loaded machine; the input was 1000 messages (~20 times more).
        expected = elapsed * THROTTLE_HZ
        print("throttle: %d of %d messages in %.2f s = %.1f Hz (limit %d Hz; unthrottled "
              "topic: %d messages = %.0f Hz)" % (len(got), n, elapsed, len(got) / elapsed,
                                                  THROTTLE_HZ, len(everything),
                                                  len(everything) / elapsed))
        assert 0.8 * expected <= len(got) <= 1.15 * expected + 3, (len(got), expected)
        assert c.error_codes() == []
    finally:
        c.close()


def _pump(c: Client, id_: int, n: int, body: bytes) -> None:
    """n PUBLISHes of `body` on `id_`, paced for the link (reliable: a burst can fill its ring)."""
    for start in range(0, n, 20):
        for _ in range(min(20, n - start)):
            c.publish(id_, body)
        c.sync(20)
        time.sleep(0.02)


def test_the_issues_history_case_is_held_to_the_budget(pair: GatewayAndCompanion) -> None:
    """transient_local depth 100000 and 64 KiB messages: the companion holds what the budget
    allows (the budget counts what the writer's history holds: issue 21, item 6) and refuses the
    rest with resource_exhausted; its memory grows by the budget at most."""
    pid = pair.comp.pid
    before = rss(pid)
    c = Client(pair.port, "hoarder")
    try:
        latch = {"reliability": "reliable", "durability": "transient_local", "depth": 100000}
        c.advertise(1, "/hoard", "std_msgs/msg/String", latch)
        c.subscribe(1, "/hoard_in", "std_msgs/msg/String", latch)
        c.sync(10)
        body = b"\x00\x01\x00\x00" + struct.pack("<I", BIG - 8) + b"x" * (BIG - 9) + b"\0"
        _pump(c, 1, 2000, body)      # 128 MiB: 1600 fit the 100 MiB budget
        assert c.wait(lambda: ("resource_exhausted", 1) in c.error_codes(), 10), c.errors
        time.sleep(1.0)
        after = rss(pid)
        print("companion RSS: %.1f MiB before, %.1f MiB after a depth-100000 transient_local "
              "writer was sent 2000 x 64 KiB (budget %d MiB, latched copy at most %d MiB)"
              % (before / 2**20, after / 2**20, HISTORY_BUDGET >> 20, LATCHED_CAP >> 20))
        assert after - before < HISTORY_BUDGET + LATCHED_CAP + (32 << 20), (before, after)
        for e in c.errors:
            if e["code"] == "resource_exhausted":
                assert "--max-history-bytes %d" % HISTORY_BUDGET in e["message"], e
                assert "/hoard" in e["message"], e
        # nothing else went wrong (link_congested on a burst is issue 12's business)
        assert {code for code, _ in c.error_codes()} <= {"resource_exhausted", "link_congested"}
    finally:
        c.close()


def test_what_a_registration_holds_is_given_back(pair: GatewayAndCompanion) -> None:
    pid = pair.comp.pid
    latch = {"reliability": "reliable", "durability": "transient_local", "depth": 1000}
    body = b"\x00\x01\x00\x00" + struct.pack("<I", BIG - 8) + b"y" * (BIG - 9) + b"\0"
    c = Client(pair.port, "latched")
    try:
        base = rss(pid)
        c.advertise(1, "/latched_big", "std_msgs/msg/String", latch)
        c.advertise(2, "/latched_big2", "std_msgs/msg/String", latch)
        c.sync(10)
        _pump(c, 1, 1000, body)      # 62.5 MiB held
        assert ("resource_exhausted", 1) not in c.error_codes(), c.errors
        _pump(c, 2, 800, body)       # past the 100 MiB after ~600: refused, naming the flag
        assert c.wait(lambda: ("resource_exhausted", 2) in c.error_codes(), 10), c.errors
        time.sleep(1.0)
        peak = rss(pid)
        print("companion RSS: %.1f MiB before, %.1f MiB holding two depth-1000 transient_local "
              "writers after 1800 x 64 KiB (budget %d MiB, latched copy at most %d MiB)"
              % (base / 2**20, peak / 2**20, HISTORY_BUDGET >> 20, LATCHED_CAP >> 20))
        assert peak - base <= HISTORY_BUDGET + LATCHED_CAP + (32 << 20), (base, peak)
        assert ("resource_exhausted", 1) not in c.error_codes(), c.errors
    finally:
        c.close()
    # what those writers held ends with their registrations: 600 x 64 KiB fit again
    d = Client(pair.port, "after")
    try:
        d.advertise(1, "/after_big", "std_msgs/msg/String", latch)
        d.sync(10)
        _pump(d, 1, 600, body)
        time.sleep(0.3)              # the companion's answer crosses the link after the PONG
        d.sync(10)
        assert ("resource_exhausted", 1) not in d.error_codes(), d.errors
    finally:
        d.close()


def test_direct_mode_takes_deny_topics_as_a_ros_parameter() -> None:
    b = DirectBridge(("--ros-args", "-p", "deny_topics:=/secret/*", "-p",
                      "allow_topics:=/secret/*,/open/*"))
    try:
        c = Client(b.port, "direct")
        try:
            c.subscribe(1, "/secret/plans", "std_msgs/msg/String", QOS_R)
            c.subscribe(2, "/open/data", "std_msgs/msg/String", QOS_R)
            c.advertise(3, "/elsewhere", "std_msgs/msg/String", QOS_R)
            c.sync()
            assert c.wait(lambda: len(c.errors) >= 2, 5)
            c.settle(4, "/open/mark")  # the ROS side's answer to 2 came before the marker's
            assert sorted(c.error_codes()) == [("topic_denied", 1), ("topic_denied", 3)]
        finally:
            c.close()
    finally:
        b.close()
    assert "policy: topics denied: /secret/*" in b.comp.text()
