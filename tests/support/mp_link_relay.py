# Heap allocated by the MicroPython gateway per relay through a real UDP link - run under the
# MicroPython unix port, not imported by pytest (tests/link/test_link_alloc.py runs it):
#
#   micropython -X heapsize=8M tests/support/mp_link_relay.py LISTEN_PORT LINK COUNT SIZE [KEY_FILE]
#
# The board's gateway as ports/micropython builds it (gateway.start: the mcu profile, the loop,
# the UDP link driver) with the unix port's real socket, select and time modules, opposite a
# companion process on LINK (tests/support/echo_companion.py: every PUBLISH comes back as a
# MESSAGE). One UBRB client, a plain socket in this process, publishes SIZE bytes and waits for
# them to come back, COUNT times; gc.mem_alloc() is read around every loop.step() only (the
# client's own calls are outside the sums) with the collector disabled, so every byte the
# gateway allocates shows. Output lines (parsed by the test):
#
#   RELAY relays=N bytes=B recv=V rx_frames=R tx_frames=T word=W
#       B: all the steps allocated; V: of it, inside the UDP transport's recv() (the datagrams'
#       bytes objects: MicroPython sockets have no recv_into, see ports/micropython/link.py);
#       W: bits of a machine word (32 or 64)
#   STATS bytes=B given=G record=R first=F first_record=Q
#       a STATS record (LinkRosPort.send_stats, about once a second) after a little traffic:
#       B allocated by the loop's _send_stats, G of which the dicts of counters the port hands
#       over (Gateway.counters(), LinkDriver.counters()), R the record as queued in the link's
#       ring; F and Q the same for the first record (every counter, and the tables of what the
#       companion has filled)
import gc
import sys

_here = __file__.rpartition("/")[0] or "."
sys.path.insert(0, _here + "/../..")

import ubrb_min as U  # noqa: E402
from ports.micropython import gateway as G  # noqa: E402
from tests.support.ubrb_frames import advertise, hello, publish, subscribe  # noqa: E402

try:
    import socket
except ImportError:
    import usocket as socket  # type: ignore


def main(argv):
    port = int(argv[0])
    opts = G.defaults()
    opts["listen"] = "127.0.0.1:%d" % port
    opts["link"] = argv[1]
    count = int(argv[2])
    size = int(argv[3])
    if len(argv) > 4:
        opts["link_key"] = argv[4]
    opts["stats_ms"] = 0  # the STATS record is measured on its own, below
    opts["log_level"] = "warning"
    loop, gw, ros, drv = G.start(opts)
    loop.poll_ms = 20
    for _ in range(500):  # the companion answers: the link is up, the ROS side ready
        loop.step()
        if gw.ros_ready:
            break
    assert gw.ros_ready, "the link never came up"
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.connect(socket.getaddrinfo("127.0.0.1", port)[0][-1])
    c.setblocking(False)
    c.write(hello() + advertise(1, "/echo") + subscribe(2, "/echo"))
    frame = publish(1, bytes(size))
    want = U.HDR + 4 + size  # the MESSAGE that comes back
    rbuf = bytearray(8192)
    acc = [0, 0, 0]  # bytes allocated by the steps; bytes the client received; in recv()
    t = drv.t
    recv = t.recv

    def counted_recv():
        a = gc.mem_alloc()
        d = recv()
        acc[2] += gc.mem_alloc() - a
        return d

    t.recv = counted_recv

    def step():
        a = gc.mem_alloc()
        loop.step()
        acc[0] += gc.mem_alloc() - a
        k = c.readinto(rbuf)
        if k:
            acc[1] += k

    for _ in range(2000):  # the HELLO's answer and both registrations' results
        step()
        if ros.gens.get(gw.subs.find("/echo") * 2 + 1, -1) > 0 and gw.pubs.find("/echo") >= 0:
            break

    def relay(n):
        for _ in range(n):
            c.write(frame)
            got = acc[1] + want
            for _ in range(10000):
                step()
                if acc[1] >= got:
                    break
            assert acc[1] >= got, "no MESSAGE came back"
            acc[1] -= want

    relay(50)  # warm-up: first-use allocations (interned names, grown tables) happen here
    for _ in range(200):  # the last acknowledgements go out and come in
        step()
    acc[1] = 0
    st = drv.s.stat_counts
    rx0 = st[0]
    tx0 = st[1]
    gc.collect()
    gc.disable()
    acc[0] = acc[2] = 0
    relay(count)
    total = acc[0]
    gc.enable()
    print("RELAY relays=%d bytes=%d recv=%d rx_frames=%d tx_frames=%d word=%d"
          % (count, total, acc[2], st[0] - rx0, st[1] - tx0, 64 if sys.maxsize > (1 << 31) else 32))
    loop.ros = ros

    def stats_record():
        gc.collect()
        gc.disable()
        q = ros.s.beq.n
        a = gc.mem_alloc()
        loop._send_stats()
        n = gc.mem_alloc() - a
        gc.enable()
        return n, ros.s.beq.n - q

    first, rec0 = stats_record()  # every counter: the companion has none yet
    for _ in range(50):
        step()
    relay(10)  # a little traffic: the next record carries what changed since
    for _ in range(50):
        step()
    gc.collect()
    gc.disable()
    a = gc.mem_alloc()
    gw.counters()
    drv.counters()
    given = gc.mem_alloc() - a
    gc.enable()
    n, rec = stats_record()
    print("STATS bytes=%d given=%d record=%d first=%d first_record=%d" % (n, given, rec, first, rec0))
    c.close()
    loop.close()


main(sys.argv[1:])
