"""The link over UDP on 127.0.0.1: 5% loss, duplication and reordering through a proxy; peer
locking; restarts of either end. Virtual clock: see helpers.World."""

from __future__ import annotations

import socket

import ubrb_min as L
import ubrb_setup
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



def stream_in_order(g: GatewayEnd, c: CompanionEnd, w: World, n: int) -> None:
    """Send `n` reliable 1 KiB records as fast as the gateway end's window takes them; all arrive
    at the companion end, in order."""
    sent = 0
    for _ in range(2000):
        while sent < n and g.s.rel_room(1024):
            assert g.s.send(L.LK_T_PUB, 1, payload(sent, 1024), 0, 1024, True) == L.LK_OK
            sent += 1
        w.step()
        if len(c.comp.published.get(1, [])) == n:
            break
    assert [seqno(m) for m in c.comp.published.get(1, [])] == list(range(n))

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
    from ubrb_setup import parse_link_url

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
    for mtu in (ubrb_setup.LINK_DEFAULT_MTU, 8192, 16384, 60000):
        z = ubrb_setup.link_sizes(1 << 20, True, mtu)
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
        stream_in_order(g, c, w, 3000)
        cg = g.d.counters()
        assert (cg["retx"], cg["timeouts"], cg["fast_retx"]) == (0, 0, 0)
        assert c.d.counters()["ooo"] == 0
    finally:
        g.d.close()
        c.d.close()


def _frames(sizes: list) -> list:
    return [bytes([i & 255]) * n for i, n in enumerate(sizes)]


def _plain_receiver() -> socket.socket:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # no GRO: like a board's socket
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    return rx


def _drain(rx: socket.socket) -> list:
    got = []
    try:
        while True:
            got.append(rx.recv(65536))
    except BlockingIOError:
        return got


# Runs of equal frames (one batch each), a short one ending a batch, a longer one starting the
# next, a single frame, and more than the kernel's 64 segments of one size.
BATCH_SIZES = [1400] * 5 + [700] + [1400] * 3 + [12] + [900, 900, 1400, 64] + [100] * 70


def test_udp_batched_frames_arrive_one_datagram_each() -> None:
    """Frames written during one flush leave in a few sendmsg calls (UDP segmentation), yet a
    peer without GRO (a MicroPython board) receives each frame as a datagram of its own, with
    its bytes and in its order: batching is invisible on the wire."""
    rx = _plain_receiver()
    tx = host_link.UdpTransport("127.0.0.1", rx.getsockname()[1], gateway=True)
    try:
        frames = _frames(BATCH_SIZES)
        for f in frames:
            assert tx.write(bytearray(f), 0, len(f)) == len(f)
        assert tx.push() and not tx.pending()
        assert _drain(rx) == frames
    finally:
        rx.close()
        tx.close()


def test_udp_gro_reads_several_frames_at_once_and_the_driver_splits_them() -> None:
    """A CPython end receives a batch of same-size frames in one read (UDP GRO) and hands each
    frame to its session on its own: reliable 1 KiB messages cross in order, fewer reads than
    frames."""
    cport = free_port(socket.SOCK_DGRAM)
    c = CompanionEnd(f"udp://127.0.0.1:{cport}", epoch=2)
    g = GatewayEnd(f"udp://127.0.0.1:{cport}", epoch=1)
    registrations(g)
    if not c.d.t.gro:
        import pytest
        pytest.skip("this kernel has no UDP_GRO (Linux >= 5.0): frames arrive one per read")
    reads = [0]
    real = c.d.t.read_into

    def counting(buf: bytearray) -> int:
        n = real(buf)
        reads[0] += n > 0
        return n

    c.d.t.read_into = counting  # type: ignore[method-assign]
    w = World()
    w.drivers += [g.d, c.d]
    try:
        assert w.run(3000, until=lambda: bool(g.gw.ups) and len(c.comp.live) == 3)
        reads[0] = 0
        rx0 = c.d.counters()["rx_frames"]
        stream_in_order(g, c, w, 600)
        frames = c.d.counters()["rx_frames"] - rx0
        assert reads[0] * 4 <= frames, "%d reads for %d frames" % (reads[0], frames)
        assert g.d.counters()["retx"] == 0
    finally:
        g.d.close()
        c.d.close()


def test_udp_segmentation_refused_falls_back_to_one_send_per_frame() -> None:
    """Where the kernel refuses UDP segmentation (here for real: a socket without UDP checksums,
    SO_NO_CHECK, gets EINVAL; elsewhere an old kernel, a device without checksum offload), the
    batch is sent again one datagram per frame, and later flushes no longer batch: nothing is
    lost, the peer sees the same datagrams."""
    rx = _plain_receiver()
    tx = host_link.UdpTransport("127.0.0.1", rx.getsockname()[1], gateway=True)
    try:
        tx.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_NO_CHECK", 11), 1)
        frames = _frames([1400] * 4 + [300])
        for f in frames:
            assert tx.write(bytearray(f), 0, len(f)) == len(f)
        assert tx.push()
        assert tx.batch is None  # no more batching on this socket
        more = _frames([1400] * 3)
        for f in more:
            assert tx.write(bytearray(f), 0, len(f)) == len(f)
        assert tx.push()
        assert _drain(rx) == frames + more
    finally:
        rx.close()
        tx.close()


def test_cpython_udp_window_fits_even_a_default_receive_queue() -> None:
    """A CPython end announces 64 frames on UDP at the default MTU (fewer at bigger MTUs:
    UDP_WINDOW_BYTES of them), and a whole such window, sent in one flush while the receiver
    does not read, waits whole in a default-size receive queue."""
    w = host_link.udp_window(16, ubrb_setup.LINK_DEFAULT_MTU)
    assert w == 64
    assert host_link.udp_window(8, 8192) == 11
    assert host_link.udp_window(4, 16384) == 5
    cport = free_port(socket.SOCK_DGRAM)
    s, d = host_link.open_link(f"udp://127.0.0.1:{cport}", False, 1 << 20)
    try:
        assert s.window == w
    finally:
        d.close()
    for mtu in (ubrb_setup.LINK_DEFAULT_MTU, 8192, 16384):
        rx = _plain_receiver()
        tx = host_link.UdpTransport("127.0.0.1", rx.getsockname()[1], gateway=True)
        try:
            frame = bytearray(mtu)
            n = host_link.udp_window(1, mtu)
            for _ in range(n):
                assert tx.write(frame, 0, len(frame)) == len(frame)
            assert tx.push()
            assert len(_drain(rx)) == n, mtu
        finally:
            rx.close()
            tx.close()
