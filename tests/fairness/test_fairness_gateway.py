"""No client can slow down the others (issue 13, items 1 and 2), through the real gateway process
(`python ubrb_min.py`) on loopback sockets: clients that never read, flood, or dribble one byte
at a time; connections per address; a refused client's ERROR; SIGTERM under load.

The heavy case drives the ROS side with the real companion (`python -m ros_side --backend dds`)
over the UDP link and a plain cyclonedds writer process (tests/support/dds_writer.py), DDS
confined to loopback with this run's domain and discovery tag (tests/e2e/helpers.py).
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import sys
import time
from typing import List, Optional

import pytest

import ubrb_min as U
from tests.e2e.helpers import E2E_DOMAIN, companion_argv, e2e_proc
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, Proc, wait_for
from tests.support.qos import QOS_R
from tests.support.raw_client import RawClient
from tests.support.ubrb_frames import hello, ping, split_frames, subscribe

HERE = os.path.dirname(os.path.abspath(__file__))


# `make test` runs this module after the rest, not beside other tests (tests/conftest.py,
# "serial"): an honest client's service under a flood, in time.
pytestmark = pytest.mark.serial


class Gateway(Proc):
    """`python ubrb_min.py --listen 127.0.0.1:0 ...` on an ephemeral loopback port."""

    def __init__(self, *args: str) -> None:
        super().__init__([sys.executable, os.path.join(ROOT, "ubrb_min.py"),
                          "--listen", "127.0.0.1:0", *args])
        self.port = int(self.wait_line(r"listening on [\d.]+:(\d+)", 10).group(1))


@pytest.fixture
def procs():
    made: List[Proc] = []
    yield made
    for p in reversed(made):
        p.stop()


def served(port: int, source: str) -> float:
    """Connect from `source`, HELLO, PING: seconds until the PONG (fails if not served)."""
    t0 = time.monotonic()
    c = RawClient(port, source=source)
    c.send(hello("honest") + ping())
    c.expect(U.OP_HELLO_ACK)
    c.expect(U.OP_PONG)
    c.close()
    return time.monotonic() - t0


def test_dribbling_connections_from_one_address_leave_another_address_served(procs):
    gw = Gateway("--link", "none", "--profile", "pi", "--frame-timeout", "3")
    procs.append(gw)
    # Eight connections from 127.0.0.1 that never finish their HELLO: one byte every second.
    # Connections before HELLO are what --max-clients-per-address bounds (pi: 4 of 8 slots).
    frame = hello("dribbler")
    dribblers = [RawClient(gw.port, source="127.0.0.1") for _ in range(8)]
    for d in dribblers:
        d.send(frame[:1])
    # the event: four are refused (pi: 8 clients, 4 per address before HELLO) and hear their
    # ERROR; a held one hears nothing (checked once those four have theirs)
    wait_for(lambda: len(select.select([d.sock for d in dribblers], [], [], 0)[0]) >= 4, 10)
    held, refused = [], []
    for d in dribblers:
        if not select.select([d.sock], [], [], 0)[0]:
            held.append(d)
            continue
        f = d.recv_frame()  # the ERROR arrives before the close, not a reset
        assert f is not None and f[0] == U.OP_ERROR and b"too_many_clients" in f[1], f
        assert b"--max-clients-per-address" in f[1]
        assert d.expect_closed() == []
        refused.append(d)
    assert len(held) == 4 and len(refused) == 4  # pi: 8 clients, 4 per address before HELLO
    for k in range(1, 3):
        for d in held:
            d.send(frame[k:k + 1])
        # Another address is served at once, while the dribblers hold their slots.
        assert served(gw.port, "127.0.0.2") < 1.0
        time.sleep(1.0)
    # Three seconds after their frame's first byte, the dribblers are closed with a reason.
    for d in held:
        frames = d.expect_closed(timeout=4)
        assert [f[0] for f in frames] == [U.OP_ERROR] and b"protocol_error" in frames[0][1]
    gw.wait_line(r"dribbling client")
    assert served(gw.port, "127.0.0.1") < 1.0  # their address has its slots back
    for d in dribblers:
        d.close()


def test_a_refused_client_that_already_sent_hello_reads_too_many_clients(procs):
    gw = Gateway("--link", "none", "--profile", "mcu", "--max-clients", "1")
    procs.append(gw)
    holder = RawClient(gw.port)
    holder.send(hello("holder"))
    holder.expect(U.OP_HELLO_ACK)
    for _ in range(20):
        c = RawClient(gw.port, source="127.0.0.3")
        c.send(hello("late") + ping())  # in the gateway's receive buffer before it refuses
        frames = c.expect_closed()  # a reset would raise ConnectionResetError here
        assert len(frames) == 1 and frames[0][0] == U.OP_ERROR
        assert b"too_many_clients" in frames[0][1]
        c.close()
    holder.close()


def test_a_client_that_stops_reading_is_closed_and_sigterm_is_honoured_under_flood(procs):
    gw = Gateway("--link", "none", "--profile", "pi", "--slow-client-timeout", "1")
    procs.append(gw)
    flood = Proc([sys.executable, os.path.join(HERE, "flood.py"), str(gw.port), "30"])
    procs.append(flood)
    flood.wait_line("flooding")
    # Its PONGs and ERRORs fill its queue; it reads nothing: closed after about 1 s.
    m = flood.wait_line(r"closed after ([\d.]+) s", 15)
    assert float(m.group(1)) < 8.0
    gw.wait_line(r"slow client")
    # Meanwhile and afterwards, others are served.
    assert served(gw.port, "127.0.0.2") < 1.0
    # A new flood, and SIGTERM in the middle of it: the gateway stops within a second.
    flood2 = Proc([sys.executable, os.path.join(HERE, "flood.py"), str(gw.port), "30"])
    procs.append(flood2)
    flood2.wait_line("flooding")
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(gw.pid, signal.SIGTERM)
    assert gw.wait(5) == 0
    assert time.monotonic() - t0 < 1.0, "SIGTERM took %.2f s" % (time.monotonic() - t0)


class Honest:
    """A UBRB client from 127.0.0.2 that reads everything: MESSAGE on /fast counted per writer
    tag, and one PING in flight every 20 ms, its round trip recorded."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(hello("honest") + subscribe(1, "/fast", "std_msgs/msg/String", QOS_R))
        self.got: dict = {}  # tag -> set of sequence numbers
        self.rtts: dict = {}  # tag (the phase) -> [seconds]
        self.phase = "-"  # pings are counted for phase A or B while its writer writes
        self.running = True
        self.closed = False

    def run(self) -> None:
        buf = bytearray()
        ping_at: Optional[float] = None
        next_ping = time.monotonic()
        while self.running:
            now = time.monotonic()
            try:
                if ping_at is None and now >= next_ping:
                    ping_at = now
                    self.sock.sendall(ping())
                r, _, _ = select.select([self.sock], [], [], 0.005)
                if not r:
                    continue
                data = self.sock.recv(1 << 20)
            except OSError:  # reset: the gateway went (the test's SIGTERM) with bytes unread
                data = b""
            if not data:
                self.closed = True
                return
            buf += data
            frames, used = split_frames(buf)
            del buf[:used]
            for op, p in frames:
                if op == U.OP_MESSAGE:
                    text = p[4 + 8:]  # id, CDR encapsulation, string length
                    tag = chr(text[0])
                    self.got.setdefault(tag, set()).add(int(text[1:7]))
                elif op == U.OP_PONG and ping_at is not None:
                    t = time.monotonic()
                    self.rtts.setdefault(self.phase, []).append(t - ping_at)
                    ping_at = None
                    next_ping = t + 0.02


def p99(xs: List[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def test_an_honest_client_keeps_its_messages_and_pings_beside_a_stalled_and_a_flooding_client(
        procs):
    import threading

    cport = free_port(socket.SOCK_DGRAM)
    link = "udp://127.0.0.1:%d" % cport
    comp = e2e_proc(companion_argv(link))
    procs.append(comp)
    comp.wait_line(r"companion on link")
    # Small queues so the stalled client's fills in half a second; never closed during the run
    # (--slow-client-timeout 60): the cost of serving it while full is what is measured.
    gw = Gateway("--link", link, "--profile", "pi", "--max-payload", "262144",
                 "--queue-bytes", "1048576", "--slow-client-timeout", "60")
    procs.append(gw)
    gw.wait_line(r"ROS side up", 15)
    honest = Honest(gw.port)
    t = threading.Thread(target=honest.run, daemon=True)
    t.start()

    def write(tag: str, count: int) -> None:
        # (the writer process's start-up, DDS discovery included, is not part of the phase)
        w = e2e_proc([sys.executable, "-m", "tests.support.dds_writer", str(E2E_DOMAIN),
                      "/fast", "1000", str(count), "string", tag, "1000"])
        procs.append(w)
        w.wait_line(r"writing", 30)
        honest.phase = tag
        w.wait_line(r"sent \d+", 60)
        honest.phase = "-"

    try:
        # Phase A, the in-run comparison: the honest client alone, 2000 messages at 1 kHz.
        write("A", 2000)
        # Phase B: a client subscribed to the same topic that never reads, and a client that
        # floods PUBLISH for unknown ids and PING without reading either.
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", gw.port))
        stalled.sendall(hello("stalled") + subscribe(1, "/fast", "std_msgs/msg/String", QOS_R))
        flood = Proc([sys.executable, os.path.join(HERE, "flood.py"), str(gw.port), "60"])
        procs.append(flood)
        flood.wait_line("flooding")
        time.sleep(1.0)  # the stalled client's queue and the flooder's replies are full by now
        write("B", 5000)
        # SIGTERM while the flood goes on: the gateway stops within a second.
        assert not honest.closed, "the honest client's connection ended before the SIGTERM"
        t0 = time.monotonic()
        os.kill(gw.pid, signal.SIGTERM)
        assert gw.wait(5) == 0
        stop_s = time.monotonic() - t0
    finally:
        honest.running = False
        t.join(5)
    share_a = len(honest.got.get("A", ())) / 2000
    share_b = len(honest.got.get("B", ())) / 5000
    p99_a, p99_b = p99(honest.rtts["A"]), p99(honest.rtts["B"])
    gw.wait_line(r"counters \(non-zero\):")
    counters = gw.text()[gw.text().rindex("counters (non-zero):"):]
    print("\nhonest client: messages kept %.1f%% alone, %.1f%% beside a stalled and a flooding "
          "client; ping p99 %.1f ms alone, %.1f ms beside them (%d / %d pings); SIGTERM -> exit "
          "in %.2f s\ngateway counters: %s" % (100 * share_a, 100 * share_b, 1000 * p99_a,
                                               1000 * p99_b, len(honest.rtts["A"]),
                                               len(honest.rtts["B"]), stop_s, counters))
    assert share_b >= 0.95
    assert p99_b < 0.020
    assert stop_s < 1.0
    # The stalled client's queue was full the whole time: its frames were refused, counted.
    assert re.search(r"gateway\.queue_refused\s+[1-9]", counters), counters
    assert re.search(r"gateway\.dropped_queue\s+[1-9]", counters), counters
    stalled.close()
