"""What the gateway allocates per relay through a real UDP link, on both runtimes (issue 19).

A relay: a UBRB client (a real TCP socket) publishes, the gateway sends the message over the
link (a real UDP socket on 127.0.0.1) to a companion process (tests/support/echo_companion.py:
the CPython link driver and the companion's LinkCompanionEnd, echoing every message back), which
sends it back over the link, and the gateway delivers it to the client as a MESSAGE.

- MicroPython (the unix port of this venv, 64-bit, real sockets): the board's gateway as
  ports/micropython builds it, run by tests/support/mp_link_relay.py, gc.mem_alloc() read around
  every loop step with the collector disabled. Everything but the bytes object recv() makes for
  each datagram received (a MicroPython socket has no recv_into; ports/micropython/link.py says
  why readinto() cannot stand in for it) allocates nothing: CRC, acknowledgements, the client's
  frames. A STATS record no longer makes a link_<name> string and a dict entry for every
  counter of the link.
- CPython (the gateway in this process: core.Gateway, GatewayServer, the ubrb_host link driver):
  tracemalloc. CPython makes short-lived ints and tuples on every call, so the checks are that
  nothing stays (no growth over hundreds of relays) and that no datagram-sized temporary is made
  on the way: the largest transient a loop step needs is the same for 64-byte messages as for
  8 KiB ones (six 1400-byte frames each way).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tracemalloc
from typing import Any, Dict, Iterator, List

import pytest

import ubrb_min as core
import ubrb_setup
from tests.support.loopback_ports import free_port
from tests.support.mp_unix import micropython_exe
from tests.support.procs import ROOT, Proc
from tests.support.ubrb_frames import advertise, hello, publish, subscribe
from ubrb_host import link as host_link
from ubrb_host.loop import GatewayServer


def echo_companion(url: str) -> Proc:
    p = Proc([sys.executable, "-m", "tests.support.echo_companion", "--link", url])
    p.wait_line(r"echo companion on link", 10)
    return p


@pytest.fixture
def companion_url() -> Iterator[str]:
    url = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    p = echo_companion(url)
    try:
        yield url
    finally:
        p.stop()


def fields(line: str) -> Dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.time_limit(60)
def test_the_micropython_gateway_allocates_only_the_datagrams_it_receives(
        companion_url: str) -> None:
    exe = micropython_exe()  # skipped outside CI when the unix port is not installed
    n = 500
    r = subprocess.run(
        [exe, "-X", "heapsize=4M", os.path.join(ROOT, "tests", "support", "mp_link_relay.py"),
         str(free_port()), companion_url, str(n), "64"],
        capture_output=True, text=True, timeout=45, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    relay = fields(re.search(r"^RELAY .*$", r.stdout, re.M).group(0))  # type: ignore[union-attr]
    print(r.stdout)
    assert relay["relays"] == n and relay["rx_frames"] >= n and relay["tx_frames"] >= n
    # The datagrams' bytes objects (one per datagram: 64 bytes of message come back in a
    # 79-byte frame, a 128-byte object on a 64-bit port) ...
    per = relay["recv"] / relay["rx_frames"]
    assert 0 < per <= 128, relay
    # ... and nothing else: the CRC of a sent frame is taken over the send buffer itself (no
    # view of it) and the check of a received one is a small int. On a 32-bit port the CRC of
    # a sent frame is a big int 3 times in 4 (32 B each; the unix port of CI is 64-bit).
    big = 0 if relay["word"] == 64 else 32
    assert relay["bytes"] - relay["recv"] <= big * relay["tx_frames"], relay
    # Before: 192 bytes per relay, the datagram's 128 plus two 32-byte views for the CRC of the
    # two frames sent (the message, the acknowledgement).
    # A STATS record (about once a second) after a little traffic: the dicts of counters
    # (Gateway.counters(), LinkDriver.counters()) and, beyond them, the lists of their names,
    # the record's text and the names of what changed - no more a merged dict with a
    # link_<name> string and an entry for every counter (4,256 bytes beyond the dicts before,
    # 1,536 now).
    stats = fields(re.search(r"^STATS .*$", r.stdout, re.M).group(0))  # type: ignore[union-attr]
    word = relay["word"] // 8
    assert 0 < stats["record"] < 500, stats
    assert stats["bytes"] - stats["given"] <= 256 * word + 2 * stats["record"], stats


class InProcessGateway:
    """The CPython gateway program's parts (ports/cpython/ubrb_host/gateway.py) in this process:
    core.Gateway with the pi profile, the link to `url`, a GatewayServer; and one client."""

    def __init__(self, url: str) -> None:
        prof = ubrb_setup.make_profile("pi", {})
        self.session, self.link = host_link.open_link(url, True, prof["max_payload"],
                                                      max_slots=prof["max_topics"])
        self.ros = core.LinkRosPort(self.session)
        self.gw = core.Gateway(prof, ros=self.ros)
        self.server = GatewayServer(self.gw, ("127.0.0.1", 0), link=self.link)
        for _ in range(2000):
            self.server.step()
            if self.gw.ros_ready:
                break
        assert self.gw.ros_ready, "the link never came up"
        self.c = socket.create_connection(self.server.address)
        self.c.setblocking(False)
        self.c.send(hello() + advertise(1, "/echo") + subscribe(2, "/echo"))
        self.rbuf = bytearray(1 << 17)
        self.got = 0
        self.peak = 0
        for _ in range(5000):
            self.step()
            if self.ros.gens.get(self.gw.subs.find("/echo") * 2 + 1, -1) > 0:
                break

    def step(self) -> None:
        if tracemalloc.is_tracing():
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            self.server.step()
            self.peak = max(self.peak, tracemalloc.get_traced_memory()[1] - base)
        else:
            self.server.step()
        try:
            self.got += self.c.recv_into(self.rbuf)
        except BlockingIOError:
            pass

    def relay(self, n: int, size: int) -> None:
        frame = publish(1, bytes(size))
        want = core.HDR + 4 + size
        for _ in range(n):
            self.c.send(frame)
            end = self.got + want
            for _ in range(20000):
                self.step()
                if self.got >= end:
                    break
            assert self.got >= end, "no MESSAGE came back"
            self.got -= want

    def close(self) -> None:
        self.c.close()
        self.server.close()


@pytest.mark.time_limit(60)
def test_the_cpython_gateway_keeps_nothing_and_copies_no_datagram(companion_url: str) -> None:
    g = InProcessGateway(companion_url)
    peaks: List[Any] = []
    try:
        tracemalloc.start()
        try:
            for size in (64, 8192):
                g.relay(100, size)  # warm-up: first-use allocations happen here
                g.peak = 0
                rx0 = g.session.stat_counts[0]
                before = tracemalloc.get_traced_memory()[0]
                g.relay(200, size)
                grown = tracemalloc.get_traced_memory()[0] - before
                peaks.append((size, g.peak, grown, g.session.stat_counts[0] - rx0))
        finally:
            tracemalloc.stop()
    finally:
        g.close()
    print("payload, largest transient of a loop step, growth over 200 relays, frames received:",
          peaks)
    (_, small, grown_small, _), (_, large, grown_large, frames) = peaks
    assert frames >= 200 * 6  # 8 KiB in 1400-byte frames: six or more per message
    # nothing stays: a byte per relay kept would be 200 bytes
    assert grown_small <= 1024 and grown_large <= 1024, peaks
    # no temporary of a datagram's size (1400 bytes) per frame sent or received: before, the
    # UDP transport's batch copied every frame through a new bytearray first (bytearray[i:j] =
    # memoryview does), and the step's largest transient grew by ~1,150 bytes with the frames
    assert large - small < 512, peaks
