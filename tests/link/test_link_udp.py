"""The link over UDP on 127.0.0.1: 5% loss, duplication and reordering through a proxy; peer
locking; restarts of either end. Virtual clock: see helpers.World."""

from __future__ import annotations

import socket

import ubrb_min as L
from ubrb_host import link as host_link
from tests.support.loopback_ports import free_port
from tests.support.qos import QOS_BE, QOS_R
from tests.link.helpers import (
    CompanionEnd,
    GatewayEnd,
    UdpProxy,
    World,
    payload,
    seqno,
)


def registrations(g: GatewayEnd) -> None:
    g.gw.pubs[1] = ("/cmd", "std_msgs/msg/String", QOS_R)
    g.gw.pubs[2] = ("/pose", "geometry_msgs/msg/Pose", QOS_BE)
    g.gw.subs[7] = ("/odom", "nav_msgs/msg/Odometry", QOS_R)


def test_udp_loss_dup_reorder_exactly_once() -> None:
    cport = free_port(socket.SOCK_DGRAM)
    c = CompanionEnd(f"udp://127.0.0.1:{cport}", epoch=2)
    proxy = UdpProxy(("127.0.0.1", cport), seed=42)
    g = GatewayEnd(f"udp://127.0.0.1:{proxy.port}", epoch=1)
    registrations(g)
    w = World()
    w.drivers += [g.d, c.d]
    w.proxies.append(proxy)
    try:
        assert w.run(3000, until=lambda: bool(g.gw.ups) and len(c.comp.live) == 3)
        N = 400
        sizes = [10, 300, 1390, 5000, 64]
        sent = back = be = 0
        for _ in range(20_000):
            while sent < N and g.s.send(L.LK_T_PUB, 1, payload(sent, sizes[sent % 5]), 0,
                                        sizes[sent % 5], True) == L.LK_OK:
                sent += 1
            if w.now % 2 == 0:
                g.port.publish(2, payload(be, 200), 0, 200, False)
                be += 1
            if back < N:
                c.end.ros_message(7, payload(back, 500), 0, 500)
                back += 1
            w.step()
            if len(c.comp.published.get(1, [])) == N and len(g.gw.messages.get(7, [])) == N:
                break
        assert [seqno(m) for m in c.comp.published[1]] == list(range(N))
        for i, m in enumerate(c.comp.published[1]):
            assert m == payload(i, sizes[i % 5])
        assert [seqno(m) for m in g.gw.messages[7]] == list(range(N))
        got_be = [seqno(m) for m in c.comp.published.get(2, [])]
        assert 0 < len(got_be) <= be and len(set(got_be)) == len(got_be)  # never duplicated
        st = proxy.stats
        assert st["lost"] and st["dup"] and st["reordered"]
        cg = g.d.counters()
        assert cg["retx"] > 0 and cg["frag_tx"] > 0 and cg["down"] == 0
        assert c.d.counters()["dup"] + c.d.counters()["ooo"] > 0
    finally:
        for x in (g.d, c.d, proxy):
            x.close()


def test_udp_peer_locked_foreign_ignored_and_restarts() -> None:
    cport = free_port(socket.SOCK_DGRAM)
    url = f"udp://127.0.0.1:{cport}"
    c = CompanionEnd(url, epoch=20)
    g = GatewayEnd(url, epoch=10)
    registrations(g)
    w = World()
    w.drivers += [g.d, c.d]
    stray = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert w.run(3000, until=lambda: bool(g.gw.ups) and len(c.comp.live) == 3)
        assert c.t.peer == g.t.local_address()
        # datagrams from another address: ignored and counted, the session is untouched
        g.s.send(L.LK_T_PUB, 1, b"real", 0, 4, True)
        n = g.s.poll_tx(w.now)  # a valid data frame, replayed from a stranger
        stray.sendto(bytes(g.s.tx_buf[:n]), ("127.0.0.1", cport))
        stray.sendto(b"garbage", ("127.0.0.1", cport))
        w.run(100)
        assert c.d.counters()["foreign"] == 2
        # the gateway restarts: new process, new ephemeral port, new epoch
        old_addr = g.t.local_address()
        g.d.close()
        w.drivers.remove(g.d)
        g2 = GatewayEnd(url, epoch=11)
        g2.gw.pubs[4] = ("/new", "std_msgs/msg/String", QOS_R)
        w.drivers.append(g2.d)
        t0 = w.now
        assert w.run(4000, until=lambda: c.comp.live == {("p", 4): "/new"})
        # unkeyed, the companion answers a stranger's HELLO only once its own session is over
        # (a live companion tells no stranger its epoch): 2 s after the old gateway went silent
        assert w.now - t0 <= L.LK_DEAD_MS + 500 and c.comp.resets == 1
        assert c.t.peer == g2.t.local_address() != old_addr
        for i in range(50):
            g2.port.publish(4, payload(i, 100), 0, 100, True)
        assert w.run(2000, until=lambda: len(c.comp.published.get(4, [])) == 50)
        assert [seqno(m) for m in c.comp.published[4]] == list(range(50))
        # the companion restarts on the same port
        c.d.close()
        w.drivers.remove(c.d)
        w.run(2500)  # long enough for the gateway to notice (< 3 s)
        assert g2.gw.downs == 1
        c2 = CompanionEnd(url, epoch=21)
        w.drivers.append(c2.d)
        t0 = w.now
        assert w.run(2000, until=lambda: c2.comp.live == {("p", 4): "/new"})
        assert w.now - t0 <= 1000 and len(g2.gw.ups) == 2
        for i in range(50, 80):
            g2.port.publish(4, payload(i, 100), 0, 100, True)
        assert w.run(2000, until=lambda: len(c2.comp.published.get(4, [])) == 30)
        assert [seqno(m) for m in c2.comp.published[4]] == list(range(50, 80))
    finally:
        stray.close()
        for d in w.drivers:
            d.close()


def test_udp_parse_urls() -> None:
    from ubrb_min import parse_link_url

    assert parse_link_url("udp://10.0.0.2:9000") == ("udp", "10.0.0.2", 9000)
    assert parse_link_url("udp://[::1]:9000") == ("udp", "::1", 9000)
    assert parse_link_url("udp://host") == ("udp", "host", 8269)
    assert parse_link_url("serial:/dev/ttyUSB0") == ("serial", "/dev/ttyUSB0", 0)
    assert parse_link_url("serial:socket://localhost:7000") == (
        "serial", "socket://localhost:7000", 0)


def test_udp_big_mtu_window_fits_the_receive_queue() -> None:
    """A whole window of full-size frames, sent while the receiver does not read, must wait in
    its socket's receive queue: the kernel drops what does not fit, silently. At --link-mtu 8192
    a 16-frame window overflowed Linux's default queue (12 such datagrams) on every burst. The
    receiver here keeps the default queue size, as a MicroPython port or a host whose rmem_max
    forbids more must (the CPython transport asks for more, as headroom)."""
    for mtu in (L.LINK_DEFAULT_MTU, 8192, 16384, 60000):
        z = L.link_sizes(1 << 20, True, mtu)
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx = host_link.UdpTransport("127.0.0.1", rx.getsockname()[1], gateway=True)
        try:
            frame = bytearray(z["max_frame"])
            for _ in range(z["window"]):
                assert tx.write(frame, 0, len(frame)) == len(frame)
            assert tx.push()  # what LinkDriver.flush does after its frames (one batch)
            got = 0
            try:
                while len(rx.recv(65536)) == len(frame):
                    got += 1
            except BlockingIOError:
                pass
            assert got == z["window"], "mtu %d: %d of a %d-frame window queued" % (
                mtu, got, z["window"])
        finally:
            rx.close()
            tx.close()


def test_udp_big_mtu_streams_without_retransmissions() -> None:
    """Reliable 1 KiB messages as fast as rel_room admits them, at --link-mtu 8192 on both ends,
    over real sockets: every window reaches the companion whole, so nothing is retransmitted and
    the stream never waits for an RTO (before: retx on every burst, RTO doubling to seconds,
    ~500 msg/s instead of ~100k in bench/chain_throughput.py's chain)."""
    cport = free_port(socket.SOCK_DGRAM)
    c = CompanionEnd(f"udp://127.0.0.1:{cport}", epoch=2, mtu=8192, max_message=1 << 20)
    g = GatewayEnd(f"udp://127.0.0.1:{cport}", epoch=1, mtu=8192, max_message=1 << 20)
    registrations(g)
    w = World()
    w.drivers += [g.d, c.d]
    try:
        assert w.run(3000, until=lambda: bool(g.gw.ups) and len(c.comp.live) == 3)
        N = 3000
        sent = 0
        for _ in range(2000):
            while sent < N and g.s.rel_room(1024):
                assert g.s.send(L.LK_T_PUB, 1, payload(sent, 1024), 0, 1024, True) == L.LK_OK
                sent += 1
            w.step()
            if len(c.comp.published.get(1, [])) == N:
                break
        assert [seqno(m) for m in c.comp.published.get(1, [])] == list(range(N))
        cg = g.d.counters()
        assert (cg["retx"], cg["timeouts"], cg["fast_retx"]) == (0, 0, 0)
        assert c.d.counters()["ooo"] == 0
    finally:
        g.d.close()
        c.d.close()
