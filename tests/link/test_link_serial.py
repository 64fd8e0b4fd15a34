"""The link over real pseudo-terminal pairs (pyserial opens the slave paths) through a proxy
that throttles to 115200 baud and injects bit flips, dropped, duplicated and inserted bytes and
cut-off frames. Virtual clock: see helpers.World."""

from __future__ import annotations

import tracemalloc
from typing import Any, Iterator, Tuple

import pytest

import ubrb_min as L
from tests.support.qos import QOS_BE, QOS_R
from tests.link.helpers import (
    CompanionEnd,
    GatewayEnd,
    SerialProxy,
    World,
    payload,
    seqno,
)


@pytest.fixture
def rig(request: Any) -> Iterator[Tuple[World, SerialProxy, GatewayEnd, CompanionEnd]]:
    noise = getattr(request, "param", 1.0)
    proxy = SerialProxy(seed=1234, noise=noise)
    g = GatewayEnd(proxy.url("gw"), epoch=111)
    c = CompanionEnd(proxy.url("comp"), epoch=222)
    g.gw.pubs[1] = ("/cmd", "std_msgs/msg/String", QOS_R)
    g.gw.pubs[2] = ("/pose", "geometry_msgs/msg/Pose", QOS_BE)
    g.gw.subs[7] = ("/odom", "nav_msgs/msg/Odometry", QOS_R)
    w = World()
    w.drivers += [g.d, c.d]
    w.proxies.append(proxy)
    yield w, proxy, g, c
    g.d.close()
    c.d.close()
    proxy.close()


def up(w: World, g: GatewayEnd, c: CompanionEnd) -> int:
    t0 = w.now
    assert w.run(3000, until=lambda: bool(g.gw.ups) and len(c.comp.live) == 3)
    return w.now - t0


def check_in_order(got: list, n: int) -> None:
    assert [seqno(m) for m in got] == list(range(n))


def test_serial_noise_exactly_once_in_order(rig: Any) -> None:
    w, proxy, g, c = rig
    up(w, g, c)
    N = 200
    sizes = [8, 64, 200, 1100, 40, 2000]
    sent = back = be = 0
    for _ in range(40_000):
        # a fast client: as much as the link takes, plus best-effort on top
        while sent < N:
            data = payload(sent, sizes[sent % len(sizes)])
            if g.s.send(L.LK_T_PUB, 1, data, 0, len(data), True) != L.LK_OK:
                break
            sent += 1
        if w.now % 25 == 0:
            g.port.publish(2, payload(be, 100), 0, 100, False)
            be += 1
        if back < N and w.now % 3 == 0:
            c.end.ros_message(7, payload(back, 120), 0, 120)
            back += 1
        w.step()
        if len(c.comp.published.get(1, [])) == N and len(g.gw.messages.get(7, [])) == N:
            break
    check_in_order(c.comp.published[1], N)
    check_in_order(g.gw.messages[7], N)
    for i, m in enumerate(c.comp.published[1]):
        assert m == payload(i, sizes[i % len(sizes)])
    got_be = c.comp.published.get(2, [])
    assert 0 < len(got_be) <= be
    assert sorted(set(seqno(m) for m in got_be)) == [seqno(m) for m in got_be]  # no dups
    # the noise really happened and was survived, not avoided
    ev = proxy.events
    assert ev["flip"] and ev["drop"] and ev["dup"] and ev["insert"] and ev["cut"]
    cg, cc = g.d.counters(), c.d.counters()
    assert cc["crc_err"] + cc["hdr_err"] > 0 and cc["resync"] > 0 and cg["retx"] > 0
    assert cg["drop_be"] + (be - len(got_be)) >= 0 and cg["frag_tx"] > 0
    assert cg["down"] == 0 and cc["down"] == 0  # noise never looks like a dead peer


@pytest.mark.parametrize("rig", [0.0], indirect=True)
def test_serial_fast_producer_bounded(rig: Any) -> None:
    # 115200 baud behind a much faster client: nothing grows; drops are counted and reported
    w, proxy, g, c = rig
    up(w, g, c)
    w.run(200)
    tracemalloc.start()
    before = None
    big = bytes(800)
    for i in range(3000):
        for _ in range(4):
            g.port.publish(2, big, 0, 800, False)
        g.port.publish(1, big, 0, 800, True)
        w.step()
        if i == 500:
            before = tracemalloc.take_snapshot()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert before is not None
    growth = sum(
        s.size_diff for s in after.compare_to(before, "filename")
        if "ubrb_min" in str(s.traceback) or "ubrb_host" in str(s.traceback)
    )
    assert growth < 64 * 1024
    s = g.s
    assert s.reliable.rel_queued <= len(s.reliable.rel) and s.beq.n <= len(s.beq.ring)
    assert s.counters()["drop_be"] > 0 and s.counters()["drop_rel_full"] > 0
    assert ("pub", 1, "link_congested") in g.gw.errors
    # the link kept flowing at close to the wire rate (~11.5 bytes/ms for 3 s)
    assert g.s.counters()["tx_bytes"] > 0.8 * 3000 * 11.52


@pytest.mark.parametrize("rig", [0.2], indirect=True)
def test_serial_unplug_replug_resumes_same_session(rig: Any) -> None:
    w, proxy, g, c = rig
    up(w, g, c)
    N = 120
    sent = 0

    def produce(now: int) -> None:
        nonlocal sent
        if sent < N and now % 20 == 0:
            g.port.publish(1, payload(sent, 100), 0, 100, True)
            sent += 1

    w.hooks.append(produce)
    w.run(500)
    proxy.a.unplug()  # the gateway's USB adapter is pulled
    t0 = w.now
    w.run(3000, until=lambda: not g.s.is_up() and not c.s.is_up())
    assert w.now - t0 <= 2100  # peer loss noticed within 2 s on both sides
    w.run(1000)
    assert g.d.broken and g.gw.downs == 1
    proxy.a.plug()
    t0 = w.now
    assert w.run(2000, until=lambda: g.s.is_up() and c.s.is_up())
    assert w.now - t0 <= 1000  # within 1 s of reachability (reopen every 0.5 s + handshake)
    assert w.run(10_000, until=lambda: len(c.comp.published.get(1, [])) == N)
    check_in_order(c.comp.published[1], N)  # nothing lost or duplicated across the gap
    assert c.comp.resets == 0 and len(g.gw.ups) == 2 and g.d.c_reopen == 1


@pytest.mark.parametrize("rig", [0.2], indirect=True)
def test_serial_restart_each_end(rig: Any) -> None:
    w, proxy, g, c = rig
    up(w, g, c)
    for i in range(30):
        g.port.publish(1, payload(i, 300), 0, 300, True)
    w.run(200)
    # the companion restarts mid-traffic: a new process, new epoch, same serial port
    c.d.close()
    w.drivers.remove(c.d)
    w.run(300)
    c2 = CompanionEnd(proxy.url("comp"), epoch=333)
    w.drivers.append(c2.d)
    t0 = w.now
    assert w.run(2000, until=lambda: len(c2.comp.live) == 3)
    assert w.now - t0 <= 1000 and g.gw.downs == 1 and len(g.gw.ups) == 2
    for i in range(30, 60):
        g.port.publish(1, payload(i, 300), 0, 300, True)
    assert w.run(5000, until=lambda: c2.comp.published.get(1) and
                 seqno(c2.comp.published[1][-1]) == 59)
    # the new companion gets every message the old one had not acknowledged, then the new
    # ones (issue 20: the gateway keeps them across the new session), in order, once each
    got = [seqno(m) for m in c2.comp.published[1]]
    old = [seqno(m) for m in c.comp.published[1]]
    assert got == list(range(got[0], 60)) and old == list(range(len(old)))
    assert got[0] <= len(old)
    # the gateway restarts: the companion releases the old session's objects, then restores
    g.d.close()
    w.drivers.remove(g.d)
    w.run(300)
    g2 = GatewayEnd(proxy.url("gw"), epoch=444)
    g2.gw.pubs[3] = ("/cmd2", "std_msgs/msg/String", QOS_R)
    w.drivers.append(g2.d)
    t0 = w.now
    assert w.run(2000, until=lambda: c2.comp.live == {("p", 3): "/cmd2"})
    assert w.now - t0 <= 1000 and c2.comp.resets == 1
    for i in range(20):
        g2.port.publish(3, payload(i, 50), 0, 50, True)
    assert w.run(3000, until=lambda: len(c2.comp.published.get(3, [])) == 20)
    check_in_order(c2.comp.published[3], 20)
