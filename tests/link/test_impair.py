"""The field impairments of issue 20's rig (tools/impair.py, via tests/support/impair.py) do what
they say: the measurements of tests/e2e/test_link_field.py and bench/link_field.py are only as
good as the loss, duplication, reordering, delay, blackouts and bit errors they are made with."""

from __future__ import annotations

import os
import random
import select
import socket
import time
import tty
from typing import List, Tuple

import pytest

from tests.support.impair import BerLine, Impairment, UdpImpairProxy
from tools.ptyline import PtyLine


def run_through(imp: Impairment, n: int, gap: float = 0.001) -> List[Tuple[float, int]]:
    """n numbered datagrams offered every ``gap`` s; (time sent, number) of what comes out."""
    out: List[Tuple[float, int]] = []
    now = 0.0
    for i in range(n):
        imp.offer(i.to_bytes(4, "little"), now)
        out += [(now, int.from_bytes(d, "little")) for d in imp.due(now)]
        now += gap
    for _ in range(1000):
        out += [(now, int.from_bytes(d, "little")) for d in imp.due(now)]
        now += gap
    return out


def test_loss_and_duplication_at_their_rates_seeded() -> None:
    a = run_through(Impairment(random.Random(7), loss=0.2, dup=0.05), 20000)
    b = run_through(Impairment(random.Random(7), loss=0.2, dup=0.05), 20000)
    assert a == b                                         # the seed decides everything
    got = [i for _, i in a]
    assert 0.18 < 1 - len(set(got)) / 20000 < 0.22        # lost
    assert 0.03 < (len(got) - len(set(got))) / len(set(got)) < 0.07   # sent twice
    assert got == sorted(got)                             # neither reorders


def test_reordering_stays_within_the_depth() -> None:
    imp = Impairment(random.Random(3), reorder=0.1, depth=8)
    got = [i for _, i in run_through(imp, 20000)]
    assert sorted(got) == list(range(20000))              # nothing lost or doubled
    late = [(k, i) for k, i in enumerate(got) if i != k]
    assert late and imp.c["reordered"] > 1500
    # a held datagram leaves after 1..8 later ones: never more than 8 places behind
    assert max(k - i for k, i in enumerate(got)) <= 8 * 2   # two held ones may stack


def test_delay_keeps_the_order_and_its_range() -> None:
    imp = Impairment(random.Random(5), delay=(0.0, 0.020))
    sent = {}
    out = []
    now = 0.0
    for i in range(3000):
        imp.offer(i.to_bytes(4, "little"), now)
        sent[i] = now
        for d in imp.due(now):
            out.append((now, int.from_bytes(d, "little")))
        now += 0.001
    while imp.next_at() is not None:
        now += 0.001
        out += [(now, int.from_bytes(d, "little")) for d in imp.due(now)]
    got = [i for _, i in out]
    assert got == list(range(3000))
    delays = [t - sent[i] for t, i in out]
    assert max(delays) <= 0.0215 and sorted(delays)[1500] > 0.005


def test_a_held_datagram_leaves_when_nothing_follows() -> None:
    imp = Impairment(random.Random(1), reorder=1.0, depth=8, hold_max=0.05)
    imp.offer(b"only", 0.0)
    assert imp.due(0.04) == [] and imp.next_at() == 0.05
    assert imp.due(0.05) == [b"only"]


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(5)
    return s


def test_udp_proxy_both_ways_and_blackout() -> None:
    comp, gw = _udp(), _udp()
    p = UdpImpairProxy(comp.getsockname(), seed=1)
    try:
        gw.sendto(b"hello", ("127.0.0.1", p.port))
        data, back = comp.recvfrom(100)
        assert data == b"hello"
        comp.sendto(b"answer", back)                  # answers go to the gateway's address
        assert gw.recvfrom(100)[0] == b"answer"
        p.dark(True)
        for k in range(20):
            gw.sendto(b"dark %d" % k, ("127.0.0.1", p.port))
            comp.sendto(b"dark %d" % k, back)
        # the proxy has taken all 40 before the line is lit again (counted as it takes them)
        deadline = time.monotonic() + 5
        while sum(c["blackout"] for c in p.counts().values()) < 40:
            assert time.monotonic() < deadline, p.counts()
            time.sleep(0.01)
        p.dark(False)
        gw.sendto(b"after", ("127.0.0.1", p.port))
        assert comp.recvfrom(100)[0] == b"after"      # first thing after the blackout
        comp.sendto(b"after", back)
        assert gw.recvfrom(100)[0] == b"after"
        c = p.counts()
        assert c["gw->comp"]["blackout"] == 20 and c["gw->comp"]["out"] == 2
        p.blackout(0.2)                                 # a timed one ends by itself
        assert p.is_dark()
        gw.sendto(b"lost", ("127.0.0.1", p.port))
        deadline = time.monotonic() + 5
        while p.is_dark():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gw.sendto(b"lit", ("127.0.0.1", p.port))
        assert comp.recvfrom(100)[0] == b"lit"
    finally:
        p.close()
        comp.close()
        gw.close()


def _read_all(fd: int, n: int, timeout: float) -> bytes:
    got = bytearray()
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            got += os.read(fd, 65536)
    return bytes(got)


def _open_end(line: PtyLine, which: str) -> int:
    fd = os.open(line.url(which)[len("serial:"):], os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    tty.setraw(fd)
    return fd


def test_ber_line_flips_bits_at_its_rate_and_keeps_the_pace() -> None:
    baud = 921_600
    line = BerLine(baud, 1e-3, seed=2)
    a, b = _open_end(line, "gw"), _open_end(line, "comp")
    try:
        data = bytes(range(256)) * 180              # 46,080 B: 0.5 s at 92,160 B/s
        t0 = time.monotonic()
        os.set_blocking(a, True)
        os.write(a, data)
        got = _read_all(b, len(data), 10)
        took = time.monotonic() - t0
        assert len(got) == len(data)
        flipped = sum(bin(x ^ y).count("1") for x, y in zip(data, got))
        assert flipped == line.flips[0]
        assert 0.8e-3 < flipped / (8 * len(data)) < 1.2e-3
        assert took >= 0.9 * len(data) / (baud / 10)   # no faster than the line
    finally:
        os.close(a)
        os.close(b)
        line.close()


def test_pty_line_unplug_and_plug_one_end() -> None:
    line = PtyLine(None, "ubrb-test-")
    a, b = _open_end(line, "gw"), _open_end(line, "comp")
    try:
        os.write(a, b"before")
        assert _read_all(b, 6, 5) == b"before"
        line.unplug("gw")
        assert not os.path.exists(line.a.link_path)
        with pytest.raises(OSError):                 # the program's old descriptor is dead
            os.write(a, b"x")
        assert os.read(a, 10) == b""                 # EOF: what the link driver sees
        line.plug("gw")
        os.close(a)
        a = _open_end(line, "gw")                   # the program reopens the same path
        os.write(a, b"after")
        assert _read_all(b, 5, 5) == b"after"
        os.write(b, b"back")
        assert _read_all(a, 4, 5) == b"back"
    finally:
        os.close(a)
        os.close(b)
        line.close()
