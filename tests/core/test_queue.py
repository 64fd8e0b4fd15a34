# Per-client send queues: eviction order, reserved room for control frames, isolation of clients.
import ubrb_min as U
from scripted import Client, gateway
from tests.support.qos import QOS_BE
from tests.support.ubrb_frames import hello, parse_frames, subscribe


class Owner:
    def __init__(self, best_effort_ids):
        self.be = best_effort_ids

    def evictable(self, sid):
        return sid in self.be


def ids_in(q):
    """Subscription ids of the MESSAGE frames pending in q, in order ('C' for control frames)."""
    out = []
    o = q.head
    while o < q.tail:
        n = U.get_u32(q.buf, o + 8)
        out.append(U.get_u32(q.buf, o + 12) if q.buf[o + 5] == U.OP_MESSAGE else "C")
        o += 12 + n
    return out


def test_best_effort_frames_are_evicted_first_oldest_first():
    q = U.SendQueue(200, 40, Owner({1}))
    body = bytes(100)  # frames of 12 + 4 + 24 = 40 bytes; 160 bytes for data
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24)  # be, oldest
    assert q.push_message(U.OP_MESSAGE, 2, body, 0, 24)  # reliable
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 20)  # be (36 bytes)
    assert q.push_message(U.OP_MESSAGE, 2, body, 0, 24)
    assert ids_in(q) == [1, 2, 1, 2]
    assert q.push_message(U.OP_MESSAGE, 2, body, 0, 24)  # needs room: oldest best-effort goes
    assert ids_in(q) == [2, 1, 2, 2]
    assert q.evicted == 1
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24)
    assert ids_in(q) == [2, 2, 2, 1]
    # Only reliable left to evict: a new frame is refused, order of what is queued is kept.
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24)
    assert not q.push_message(U.OP_MESSAGE, 2, body, 0, 24 + 40)
    assert q.refused == 1
    assert ids_in(q) == [2, 2, 2, 1]


def test_control_frames_use_the_reserved_room():
    q = U.SendQueue(200, 40, Owner(set()))
    body = bytes(100)
    for _ in range(4):
        assert q.push_message(U.OP_MESSAGE, 2, body, 0, 24)
    assert not q.push_message(U.OP_MESSAGE, 2, body, 0, 24)  # data is full at cap - reserve
    assert q.push_control(U.OP_PONG, b"")
    assert q.push_control(U.OP_ERROR, bytes(16))
    assert ids_in(q) == [2, 2, 2, 2, "C", "C"]


def test_partially_sent_frame_is_never_evicted():
    q = U.SendQueue(120, 20, Owner({1}))
    body = bytes(100)
    q.push_message(U.OP_MESSAGE, 1, body, 0, 24)
    q.push_message(U.OP_MESSAGE, 1, body, 0, 24)
    q.sent(5)  # the socket took 5 bytes of the first frame
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24 + 20)  # evicts the second, not the first
    rest = bytes(q.buf[q.head : q.tail])
    assert len(rest) == 35 + 60
    assert U.get_u32(rest, 35 + 8) == 48


def test_queue_wraps_by_compaction_and_keeps_order():
    # The socket takes odd-sized bites; every frame still comes out whole and in order.
    q = U.SendQueue(300, 10, Owner(set()))
    out = b""
    for seq in range(200):
        assert q.push_message(U.OP_MESSAGE, 3, bytes([seq]) * 10, 0, 10)
        take = min(q.pending(), 14 + seq % 25)  # 26 bytes a frame on average
        out += bytes(q.buf[q.head : q.head + take])
        q.sent(take)
    out += bytes(q.buf[q.head : q.tail])
    q.sent(q.pending())
    frames = parse_frames(out)
    assert [p[4] for _, p in frames] == list(range(200))
    assert q.evicted == 0 and q.refused == 0


def test_slow_client_does_not_affect_others():
    gw, ros = gateway(queue_bytes=3000, control_reserve=600, max_payload=1000)
    slow = Client(gw)
    fast = Client(gw)
    for c in (slow, fast):
        c.send(hello() + subscribe(1, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE))
        c.frames()
    slot = gw.subs.find("/scan")
    msg = bytearray(500)
    for i in range(20):
        msg[0] = i
        gw.ros_message(slot, msg, 0, 500)
        got = fast.frames()
        assert len(got) == 1 and got[0][1][4] == i
    # The slow client never read: it holds only the newest frames that fit, oldest evicted.
    frames = slow.frames()
    assert 1 <= len(frames) <= 5
    assert [f[1][4] for f in frames] == list(range(20 - len(frames), 20))
    assert slow.session.queue.evicted == 20 - len(frames)
    # And it can still get control frames (PONG) despite its full data queue.
    for _ in range(20):
        gw.ros_message(slot, msg, 0, 500)
    slow.send(U.encode_frame(U.OP_PING, b""))
    assert slow.frames()[-1][0] == U.OP_PONG
