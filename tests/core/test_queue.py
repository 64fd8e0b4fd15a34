# Per-client send queues: eviction order, reserved room for control frames, isolation of clients,
# bounded work per event.
import ubrb_min as U
from scripted import Client, gateway
from tests.support.qos import QOS_BE, QOS_R
from tests.support.ubrb_frames import hello, parse_frames, subscribe


def drain(q, limit=None):
    """What the socket would take, as the ports write it: peek(), write, sent()."""
    out = b""
    while True:
        n = q.peek()
        if limit is not None:
            n = min(n, limit - len(out))
        if n <= 0:
            return out
        out += bytes(q.buf[q.out : q.out + n])
        q.sent(n)


def ids_in(q):
    """Subscription ids of the frames pending in q, in the order they would be written ('C' for
    control frames), without taking them."""
    out = []
    for k in (U.RING_CONTROL, U.RING_RELIABLE, U.RING_BEST_EFFORT):
        r = q.rings[k]
        o = r.head
        left = r.frames
        while left:
            if r.wrap >= 0 and o == r.wrap:
                o = r.lo
            n = U.get_u32(q.buf, o + 8)
            out.append(U.get_u32(q.buf, o + 12) if q.buf[o + 5] == U.OP_MESSAGE else "C")
            o += 12 + n
            left -= 1
    return out


def test_best_effort_frames_are_evicted_oldest_first_reliable_never():
    # 40 bytes of control room, then 80 for reliable and 80 for best_effort frames.
    q = U.SendQueue(200, 40)
    body = bytes(100)  # frames of 12 + 4 + 24 = 40 bytes
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24, True)  # be, oldest
    assert q.push_message(U.OP_MESSAGE, 2, body, 0, 24)  # reliable
    assert q.push_message(U.OP_MESSAGE, 3, body, 0, 24, True)  # be
    assert q.push_message(U.OP_MESSAGE, 4, body, 0, 24)
    assert ids_in(q) == [2, 4, 1, 3]
    assert q.push_message(U.OP_MESSAGE, 5, body, 0, 24, True)  # needs room: oldest be goes
    assert ids_in(q) == [2, 4, 3, 5] and q.evicted == 1 and not q.refused
    # A reliable frame that does not fit is refused; nothing queued is touched.
    assert not q.push_message(U.OP_MESSAGE, 6, body, 0, 24)
    assert q.refused == 1 and ids_in(q) == [2, 4, 3, 5]
    assert q.full
    # What goes out: the data rings take turns, each ring in its own order.
    frames = parse_frames(drain(q))
    assert sorted(U.get_u32(p, 0) for _, p in frames) == [2, 3, 4, 5]
    got = [U.get_u32(p, 0) for _, p in frames]
    assert got.index(2) < got.index(4) and got.index(3) < got.index(5)
    assert q.pending() == 0 and q.progress


def test_a_best_effort_frame_larger_than_its_ring_is_refused_without_evicting():
    q = U.SendQueue(200, 40)
    body = bytes(100)
    assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24, True)
    assert not q.push_message(U.OP_MESSAGE, 1, body, 0, 80, True)  # 96 > 80: can never fit
    assert q.evicted == 0 and ids_in(q) == [1]


def test_control_frames_use_the_reserved_room_and_go_first():
    q = U.SendQueue(200, 40)
    body = bytes(100)
    for _ in range(2):
        assert q.push_message(U.OP_MESSAGE, 2, body, 0, 24)
    assert not q.push_message(U.OP_MESSAGE, 2, body, 0, 24)  # the reliable ring is full
    assert q.push_control(U.OP_PONG, b"")
    assert q.push_control(U.OP_ERROR, bytes(16))
    assert not q.push_control(U.OP_PONG, b"")  # 12 + 28 + 12 > 40: dropped, counted
    assert q.refused == 2
    assert [op for op, _ in parse_frames(drain(q))] == [U.OP_PONG, U.OP_ERROR] + [U.OP_MESSAGE] * 2


def test_control_frames_wait_for_a_partly_written_frame_only():
    q = U.SendQueue(400, 40)
    body = bytes(100)
    for i in range(3):
        assert q.push_message(U.OP_MESSAGE, i, body, 0, 24)
    assert q.peek() == 120  # the three frames in one write
    q.sent(50)  # the socket took the first frame and 10 bytes of the second
    assert q.push_control(U.OP_PONG, b"")
    assert q.peek() == 30  # the rest of the second frame, then the PONG
    q.sent(30)
    frames = parse_frames(drain(q))
    assert [op for op, _ in frames] == [U.OP_PONG, U.OP_MESSAGE]


def test_partially_sent_frame_is_never_evicted():
    q = U.SendQueue(180, 20)  # 80 bytes for best_effort frames
    body = bytes(100)
    q.push_message(U.OP_MESSAGE, 1, body, 0, 8, True)  # 24 bytes
    q.push_message(U.OP_MESSAGE, 2, body, 0, 8, True)
    start = drain(q, 5)  # the socket took 5 bytes of the first frame
    # A 44-byte frame needs the room behind the half-written one: what is queued behind it
    # goes (older first), the half-written frame stays whole.
    assert q.push_message(U.OP_MESSAGE, 3, body, 0, 28, True)
    assert q.evicted == 1
    frames = parse_frames(start + drain(q))
    assert [(U.get_u32(p, 0), len(p)) for _, p in frames] == [(1, 12), (3, 32)]


def test_rings_wrap_without_moving_bytes_and_keep_order():
    # The socket takes odd-sized bites; every frame still comes out whole and in order, and no
    # queued byte is ever moved (each frame is written once, where it stays until sent).
    q = U.SendQueue(300, 20)
    out = b""
    for seq in range(200):
        assert q.push_message(U.OP_MESSAGE, 3, bytes([seq]) * 10, 0, 10)
        out += drain(q, 14 + seq % 25)  # 26 bytes a frame on average
    out += drain(q)
    frames = parse_frames(out)
    assert [p[4] for _, p in frames] == list(range(200))
    assert q.evicted == 0 and q.refused == 0


def test_best_effort_ring_wraps_with_evictions_and_keeps_newest():
    q = U.SendQueue(20 + 2 * 100, 20)  # 100 bytes per data ring
    out = b""
    accepted = 0
    for seq in range(300):
        body = bytes([seq & 0xFF, seq >> 8]) * 10
        accepted += q.push_message(U.OP_MESSAGE, 7, body, 0, 4 + seq % 17, True)
        if seq % 3 == 0:
            out += drain(q, 9 + seq % 30)
    out += drain(q)
    seqs = [p[4] | (p[5] << 8) for _, p in parse_frames(out)]
    assert seqs == sorted(set(seqs))  # in order, none twice
    assert len(seqs) == accepted - q.evicted and accepted + q.refused == 300
    # A frame is refused only when a half-written one blocks the room it needs: rare.
    assert seqs[-1] == 299 and q.evicted > 50 and q.refused < 30


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
    # And it can still get control frames (PONG) despite its full data queue: first.
    for _ in range(20):
        gw.ros_message(slot, msg, 0, 500)
    slow.send(U.encode_frame(U.OP_PING, b""))
    assert slow.frames()[0][0] == U.OP_PONG


def test_a_client_whose_queue_stays_full_is_closed_after_slow_client_timeout():
    gw, ros = gateway(queue_bytes=3000, control_reserve=600, max_payload=1000,
                      slow_client_timeout=5)
    slow = Client(gw)
    reader = Client(gw)
    for c in (slow, reader):
        c.send(hello() + subscribe(1, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE))
        c.frames()
    slot = gw.subs.find("/scan")
    msg = bytearray(500)
    t = 0
    while t <= 6000:  # 100 messages a second for 6 s
        gw.now = t
        gw.ros_message(slot, msg, 0, 500)
        if t % 100 == 0:
            drain(reader.session.queue, 600)  # slower than the data comes: evictions, progress
        gw.tick(t)
        if t == 4900:
            assert not slow.closing()
        t += 10
    assert slow.closing() and gw.close_overdue(slow.ci, t)  # closed at once: nothing to flush
    assert "slow client" in slow.session.close_reason
    assert not reader.closing() and reader.session.queue.evicted > 0
    assert gw.counters()["closed_slow"] == 1


def test_errors_for_a_client_that_does_not_read_them_are_counted_not_queued():
    gw, ros = gateway(control_reserve=1024)
    c = Client(gw)
    c.send(hello())
    c.frames()
    q = c.session.queue
    for i in range(2000):  # unknown ids, each a new one: no repeat suppression helps
        c.send(U.encode_frame(U.OP_PUBLISH, bytes([i & 0xFF, i >> 8, 0, 0])))
    assert q.rings[U.RING_CONTROL].pend <= 1024
    assert gw.counters()["errors_sent"] < 20 and c.session.dropped >= 1980
    errs = c.errors()
    assert errs and all(e[0] == "unknown_id" for e in errs)


def test_cost_of_a_push_does_not_depend_on_what_is_queued():
    # The work of an event is bounded: a full best_effort ring drops one frame per push (the
    # old linear queue scanned every queued frame), a full reliable ring refuses at once.
    q = U.SendQueue(40 + 2 * 40000, 40)
    body = bytes(24)
    for _ in range(1000):
        assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24, True)  # 1000 x 40 bytes: full
    for _ in range(500):
        before = q.evicted
        assert q.push_message(U.OP_MESSAGE, 1, body, 0, 24, True)
        assert q.evicted - before == 1


def test_random_pushes_and_partial_writes_keep_every_promise():
    # A model check over 20,000 random operations: frames come out whole, each class in its own
    # order, none twice; every accepted reliable and control frame comes out; a best_effort frame
    # is lost only by eviction; and the queue ends empty.
    seed = [12345]

    def rnd(n):
        seed[0] = (seed[0] * 1103515245 + 12345) & 0x7FFFFFFF
        return (seed[0] >> 8) % n

    q = U.SendQueue(64 + 2 * 300, 64)
    body = bytes(range(64))
    out = bytearray()
    pushed = {0: [], 1: [], 2: []}  # class -> sequence numbers accepted
    seq = 0
    for _ in range(20000):
        r = rnd(10)
        if r < 6:
            cls = rnd(3)
            n = 2 + rnd(40)
            tag = bytes([seq & 0xFF, (seq >> 8) & 0xFF])
            if cls == 0:
                ok = q.push_control(U.OP_PONG, tag + body[:n])
            else:
                src = bytearray(tag + body[:n])
                ok = q.push_message(U.OP_MESSAGE, cls, src, 0, 2 + n, cls == 2)
            if ok:
                pushed[cls].append(seq)
            seq += 1
        else:
            out += drain(q, 1 + rnd(60))
    out += drain(q)
    got = {0: [], 1: [], 2: []}
    for op, p in parse_frames(bytes(out)):
        if op == U.OP_PONG:
            cls, tag = 0, p[0:2]
        else:
            cls, tag = U.get_u32(p, 0), p[4:6]
        got[cls].append(tag[0] | (tag[1] << 8))
    assert got[0] == pushed[0] and got[1] == pushed[1]  # nothing accepted is lost
    be = got[2]
    assert be == sorted(set(be)) and set(be) <= set(pushed[2])  # in order, none twice
    assert len(pushed[2]) - len(be) == q.evicted
    assert q.pending() == 0 and q.evicted > 100 and q.refused > 100


def test_a_burst_of_reliable_messages_reaches_a_client_that_reads_but_not_one_that_does_not():
    # The link hands over a window of frames at once when a gap is filled (reordering, a
    # retransmission): 8 reliable 1 KiB messages in one go, where an mcu queue (5 KiB) holds two.
    # Before, the 6 others were refused even for a client that reads all it is sent: a board on
    # Wi-Fi lost ~1 % of a 200 msg/s stream to its clients (bench/board_reorder.py). The port now
    # writes what the client's socket takes (Gateway.write_now) and the message is tried again;
    # a client whose socket takes nothing still gets the gap, counted
    gw, ros = gateway(queue_bytes=5 * 1024, control_reserve=768, max_payload=2048)
    reader, stuck = Client(gw), Client(gw)
    for c in (reader, stuck):
        c.send(hello() + subscribe(1, "/cmd", "std_msgs/msg/String", QOS_R))
        c.frames()
    slot = [call[1] for call in ros.calls if call[0] == "subscribe"][0]
    got = []

    def write_now(ci):  # the reader's socket takes everything, the stuck one's nothing
        if ci == reader.ci:
            got.extend(reader.frames())

    gw.write_now = write_now
    for i in range(8):
        gw.ros_message(slot, b"%04d" % i + bytes(1020), 0, 1024)
    got.extend(reader.frames())
    sent = [p[4:8] for op, p in got if op == U.OP_MESSAGE]
    assert sent == [b"%04d" % i for i in range(8)]
    kept = [p[4:8] for op, p in stuck.frames() if op == U.OP_MESSAGE]
    assert kept == [b"0000", b"0001"]
    assert gw.counters()["queue_refused"] == 6 and gw.counters()["message_out"] == 10
