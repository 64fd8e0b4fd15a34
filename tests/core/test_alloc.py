# No allocation per relayed PUBLISH or MESSAGE in steady state.
#
# MicroPython: with the collector disabled, gc.mem_alloc() must not move across 10,000 relays
# (every heap allocation would show). CPython allocates small temporaries for any call; there the
# check is that tracemalloc sees no net growth.
import gc

import ubrb_min as U
from scripted import Client, gateway
from tests.support.qos import QOS_BE
from tests.support.ubrb_frames import advertise, hello, publish, subscribe

N = 10000


def setup():
    gw, ros = gateway(queue_bytes=65536)
    ros.record = False
    pubc = Client(gw)
    subc = Client(gw)
    pubc.send(hello() + advertise(1, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE))
    subc.send(hello() + subscribe(4, "/odom", "nav_msgs/msg/Odometry"))
    pubc.frames()
    subc.frames()
    frame = publish(1, bytes(range(200)))
    msg = bytearray(300)
    return gw, ros, pubc, subc, frame, msg


def relay(gw, pubc, subc, frame, msg, slot, rounds):
    dec = pubc.session.decoder
    q = subc.session.queue
    n = len(frame)
    for i in range(rounds):
        # A PUBLISH arrives from one client and goes to the ROS side...
        U.copy_into(dec.buf, dec.fill, frame, 0, n)
        gw.received(pubc.ci, n, i)
        # ...and a ROS message goes out as MESSAGE to another, which the socket then takes.
        gw.ros_message(slot, msg, 0, 300)
        k = q.peek()
        while k:
            q.sent(k)
            k = q.peek()


def measure(run):
    if U.IS_MICROPYTHON:
        gc.collect()
        gc.disable()
        try:
            before = gc.mem_alloc()
            run()
            return gc.mem_alloc() - before
        finally:
            gc.enable()
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_relaying_10000_publish_and_message_frames_allocates_nothing():
    gw, ros, pubc, subc, frame, msg = setup()
    slot = gw.subs.find("/odom")
    relay(gw, pubc, subc, frame, msg, slot, 100)  # warm-up: first-use allocations happen here

    def run():
        relay(gw, pubc, subc, frame, msg, slot, N)

    grown = measure(run)
    assert ros.published == N + 100
    assert gw.counters()["message_out"] == N + 100
    assert ros.last_len == 200 and ros.last[199] == 199
    # MicroPython: exactly nothing. CPython: tracemalloc's own bookkeeping of the first frames
    # costs a few hundred bytes once; a per-relay allocation kept alive would be >= 10,000 bytes.
    limit = 0 if U.IS_MICROPYTHON else 1024
    assert grown <= limit, "heap grew by %d bytes over %d relays" % (grown, N)


def test_a_client_that_never_reads_costs_no_allocation():
    # The issue-13 client: subscribed to a busy best_effort topic, never reading, flooding PING
    # and PUBLISH for ids it never advertised. Once its queue is full every event is an O(1)
    # eviction or a counted refusal: nothing allocated, nothing scanned.
    gw, ros = gateway(queue_bytes=16384)
    ros.record = False
    c = Client(gw)
    c.send(hello() + subscribe(2, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE))
    slot = gw.subs.find("/scan")
    dec = c.session.decoder
    flood = bytearray(U.encode_frame(U.OP_PING, b"") + publish(77, bytes(20)))
    n = len(flood)
    msg = bytearray(1000)

    def rounds(k):
        for i in range(k):
            gw.ros_message(slot, msg, 0, 1000)
            U.copy_into(dec.buf, dec.fill, flood, 0, n)
            gw.received(c.ci, n, 5000 + i)  # unknown_id reported once a second: then dropped

    rounds(200)  # fills the rings (the ERROR and its JSON are made here, once)
    q = c.session.queue
    ev = q.evicted
    grown = measure(lambda: rounds(N))
    assert q.evicted - ev == N  # one eviction per message
    assert c.session.dropped >= N  # every PONG and PUBLISH beyond the room: counted
    limit = 0 if U.IS_MICROPYTHON else 1024
    assert grown <= limit, "heap grew by %d bytes over %d events" % (grown, N)
