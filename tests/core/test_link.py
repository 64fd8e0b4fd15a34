# The link's sans-IO session (docs/LINK.md): framing, resync, handshake, reliable and
# best-effort channels, fragmentation, limits, liveness, epochs.  Time is injected (no sleeps);
# runs under CPython (pytest) and MicroPython (tests/mp/run.mjs) alike.
import ubrb_keep
import ubrb_min as L
from link_rig import Line, Pair, Rng, rel_payload, sess

MICROPYTHON_ONLY = {"test_mp_allocation_per_message"}


# ---- framing -----------------------------------------------------------------------------

def test_frame_layout_and_crc_residue():
    p = Pair(sess(True, 11), sess(False, 22))
    p.up()
    assert p.a.send(L.LK_T_PUB, 5, b"hello", 0, 5, True) == L.LK_OK
    n = p.a.poll_tx(p.now)
    b = p.a.tx_buf
    assert b[0] == 0xA5 and b[1] == 0x4E
    assert b[2] | (b[3] << 8) == n
    assert b[4] & 15 == L.LK_REL
    assert b[5] == L.lk_hck(b[2], b[3], b[4])
    # record: type, slot varint, len varint, payload
    assert bytes(b[8:11]) == bytes([L.LK_T_PUB, 5, 5])
    assert bytes(b[11:16]) == b"hello"
    assert n == 16 + 4
    # CRC-32 of a frame including its CRC is the fixed residue (seeded with the session key)
    assert L._lk_crc32(memoryview(b)[0:n], p.a.seed) == L.LK_RESIDUE
    assert L.LK_RESIDUE < (1 << 30)  # a small int on 32-bit MicroPython


def test_handshake_roles_and_limits():
    a = sess(True, 100, max_frame=300, max_message=5000)
    b = sess(False, 200, max_frame=500, max_message=7000, window=4)
    p = Pair(a, b)
    p.up()
    assert a.handler.ups == [True] and b.handler.ups == [True]
    assert a.peer_max_frame == 300 and b.peer_max_frame == 300
    assert a.peer_max_message == 7000 and b.peer_max_message == 5000
    assert a.peer_window == 4
    assert a.seed == b.seed
    # two gateways never pair up
    g1 = sess(True, 1)
    g2 = sess(True, 2)
    q = Pair(g1, g2)
    q.run(1000)
    assert not g1.is_up() and not g2.is_up() and g1.counters()["proto"] > 0


def test_reliable_in_order_with_batching():
    p = Pair(sess(True, 1), sess(False, 2))
    p.up()
    for i in range(300):
        assert p.a.send(L.LK_T_PUB, 3, rel_payload(i, 40), 0, 40, True) == L.LK_OK
    frames0 = p.a.counters()["tx_frames"]
    p.run(200)
    got = [m for m in p.b.handler.msgs]
    assert len(got) == 300
    for i, m in enumerate(got):
        assert m == (L.LK_T_PUB, 3, rel_payload(i, 40), True)
    # 300 x 43 bytes in ~1012-byte frames: batching
    assert p.a.counters()["tx_frames"] - frames0 < 20


def test_reliable_fragmentation_large_message():
    a = sess(True, 1, max_frame=128, max_message=20000, rel_bytes=65536)
    b = sess(False, 2, max_frame=128, max_message=20000, rel_bytes=65536)
    p = Pair(a, b)
    p.up()
    big = rel_payload(9, 17000)
    assert a.send(L.LK_T_PUB, 1, big, 0, len(big), True) == L.LK_OK
    assert a.send(L.LK_T_PUB, 1, b"x", 0, 1, True) == L.LK_OK
    p.run(2000, until=lambda: len(b.handler.msgs) == 2)
    assert b.handler.msgs[0][2] == big and b.handler.msgs[1][2] == b"x"
    assert b.counters()["frag_rx"] >= 1


def test_message_too_large_refused():
    a = sess(True, 1, max_message=4000)
    b = sess(False, 2, max_message=1000)
    p = Pair(a, b)
    p.up()
    assert a.max_send() == 1000
    buf = bytes(1001)
    assert a.send(L.LK_T_PUB, 1, buf, 0, 1001, True) == L.LK_TOO_LARGE
    assert a.send(L.LK_T_PUB, 1, buf, 0, 1001, False) == L.LK_TOO_LARGE
    assert a.send(L.LK_T_PUB, 1, buf, 0, 1000, True) == L.LK_OK
    assert a.counters()["too_large"] == 2


def test_reliable_buffer_bounded_control_reserve():
    a = sess(True, 1, rel_bytes=8192, max_message=2000)
    b = sess(False, 2)
    p = Pair(a, b)
    p.up()
    buf = bytes(1000)
    n = 0
    while a.send(L.LK_T_PUB, 1, buf, 0, 1000, True) == L.LK_OK:
        n += 1
    assert n == (8192 - a.reliable.rel_res) // 1003
    assert a.counters()["drop_rel_full"] == 1
    # control records still fit in the reserve
    assert a.send(L.LK_T_ADV, 2, b"{}", 0, 2, True, True) == L.LK_OK
    p.run(500)
    assert len(b.handler.msgs) == n + 1
    assert a.reliable.rel_queued == 0


def test_resync_after_noise_stream():
    rng = Rng(7)
    stats = {"cut": 0}

    def mangle(data, d):
        data = bytearray(data)
        r = rng.next(100)
        if r < 10:  # flip a bit
            i = rng.next(len(data))
            data[i] ^= 1 << rng.next(8)
        elif r < 15:  # truncate (the rest of the frame never arrives)
            data = data[: rng.next(len(data))]
            stats["cut"] += 1
        elif r < 20:  # garbage before, including fake sync bytes
            data = bytes([0xA5, 0x4E, rng.next(256), 0xA5]) + bytes(data)
        elif r < 23:  # drop one byte
            i = rng.next(len(data))
            data = data[:i] + data[i + 1:]
        # random chunking
        out = []
        i = 0
        while i < len(data):
            k = 1 + rng.next(40)
            out.append(bytes(data[i:i + k]))
            i += k
        return out

    a = sess(True, 5, max_frame=256)
    b = sess(False, 6, max_frame=256)
    p = Pair(a, b, mangle)
    p.up()
    N = 400
    sent = 0
    for _ in range(20000):
        while sent < N and a.send(L.LK_T_PUB, 1, rel_payload(sent, 50), 0, 50, True) == L.LK_OK:
            sent += 1
        p.step(2)
        if len(b.handler.msgs) >= N:
            break
    got = b.handler.msgs
    assert len(got) == N
    for i in range(N):
        assert got[i][2] == rel_payload(i, 50), i
    assert b.counters()["crc_err"] + b.counters()["hdr_err"] > 0 and a.counters()["retx"] > 0 and stats["cut"] > 0


def test_best_effort_newest_wins():
    a = sess(True, 1)
    b = sess(False, 2)
    p = Pair(a, b)
    p.up()
    for i in range(10):
        assert a.send(L.LK_T_PUB, 4, bytes([i]) * 8, 0, 8, False) == L.LK_OK
        assert a.send(L.LK_T_PUB, 5, bytes([100 + i]) * 8, 0, 8, False) == L.LK_OK
    assert a.counters()["drop_be"] == 18
    p.run(50)
    got = b.handler.msgs
    assert got == [(L.LK_T_PUB, 4, bytes([9]) * 8, False), (L.LK_T_PUB, 5, bytes([109]) * 8, False)]
    # never retransmitted: a lost best-effort frame is just gone
    a.send(L.LK_T_PUB, 4, b"lost", 0, 4, False)
    a.poll_tx(p.now)  # built and "lost"
    p.run(1000)
    assert len(b.handler.msgs) == 2 and a.counters()["retx"] == 0


def test_best_effort_ring_overflow_drops_oldest():
    a = sess(True, 1, be_bytes=2048, max_message=1000)
    b = sess(False, 2)
    p = Pair(a, b)
    p.up()
    for slot in range(10):
        assert a.send(L.LK_T_PUB, slot, bytes(500), 0, 500, False) == L.LK_OK
    assert a.beq.n <= 2048
    assert a.counters()["drop_be"] == 10 - a.beq.live
    p.run(50)
    assert [m[1] for m in b.handler.msgs] == list(range(10 - a.counters()["drop_be"] - 0, 10))[-len(b.handler.msgs):]


def test_best_effort_fragmentation_and_loss():
    a = sess(True, 1, max_frame=200, max_message=3000)
    b = sess(False, 2, max_frame=200, max_message=3000)
    drop = {"on": False, "n": 0}

    def mangle(data, d):
        if drop["on"] and d == 0 and data[4] & 15 == L.LK_BEFRAG:
            drop["n"] += 1
            if drop["n"] == 3:
                return []
        return [data]

    p = Pair(a, b, mangle)
    p.up()
    big = rel_payload(3, 2500)
    a.send(L.LK_T_PUB, 2, big, 0, len(big), False)
    p.run(50)
    assert b.handler.msgs == [(L.LK_T_PUB, 2, big, False)]
    drop["on"] = True
    a.send(L.LK_T_PUB, 2, big, 0, len(big), False)
    p.run(50)
    assert len(b.handler.msgs) == 1 and b.counters()["frag_drop"] == 1 and not b.reader.frag_active
    a.send(L.LK_T_PUB, 2, big, 0, len(big), False)
    p.run(50)
    assert len(b.handler.msgs) == 2
    # a reassembly left incomplete times out and frees its buffer
    a.send(L.LK_T_PUB, 2, big, 0, len(big), False)
    n = a.poll_tx(p.now)
    b.feed(bytes(a.tx_buf[:n]), 0, n, p.now)
    assert b.reader.frag_active
    a.beq.n = a.beq.live = 0  # forget the rest at the sender
    p.run(L.LK_FRAG_MS + 100)
    assert not b.reader.frag_active and b.counters()["frag_drop"] == 2


def test_datagram_loss_dup_reorder():
    rng = Rng(99)

    def mangle(data, d):
        r = rng.next(100)
        if r < 5:
            return []
        if r < 10:
            return [data, data]
        if r < 15:
            p.held[d].append(data)
            return []
        out = [data]
        if p.held[d] and rng.next(2):
            out.extend(p.held[d])
            p.held[d] = []
        return out

    a = sess(True, 1, datagram=True, max_frame=1400)
    b = sess(False, 2, datagram=True, max_frame=1400)
    p = Pair(a, b, mangle)
    p.up()
    N = 500
    sent = 0
    for _ in range(20000):
        while sent < N and a.send(L.LK_T_PUB, 1, rel_payload(sent, 300), 0, 300, True) == L.LK_OK:
            sent += 1
        a.send(L.LK_T_PUB, 2, b"be", 0, 2, False)
        p.step(1)
        if len([m for m in b.handler.msgs if m[3]]) >= N:
            break
    rel = [m for m in b.handler.msgs if m[3]]
    assert len(rel) == N
    for i in range(N):
        assert rel[i][2] == rel_payload(i, 300)
    assert a.counters()["retx"] > 0 and b.counters()["dup"] + b.counters()["ooo"] > 0


def test_datagram_trailing_garbage_counted():
    a = sess(True, 1, datagram=True)
    b = sess(False, 2, datagram=True)
    n = a.poll_tx(0)
    d = bytes(a.tx_buf[:n]) + b"\x01\x02\x03"
    b.feed(d, 0, len(d), 0)
    assert b.counters()["hello_rx"] == 1 and b.counters()["noise"] == 3


def test_liveness_down_and_resume_without_loss():
    a = sess(True, 1)
    b = sess(False, 2)
    cut = {"on": False}

    def mangle(data, d):
        return [] if cut["on"] else [data]

    p = Pair(a, b, mangle)
    p.up()
    for i in range(5):
        a.send(L.LK_T_PUB, 1, rel_payload(i, 20), 0, 20, True)
    p.run(20)
    cut["on"] = True
    for i in range(5, 10):
        a.send(L.LK_T_PUB, 1, rel_payload(i, 20), 0, 20, True)
    t0 = p.now
    p.run(3000, until=lambda: not a.is_up() and not b.is_up())
    assert p.now - t0 <= L.LK_DEAD_MS + 5  # loss noticed within 2 s (< 3 s)
    assert a.handler.downs == 1 and b.handler.downs == 1
    for i in range(10, 15):  # queued while down
        a.send(L.LK_T_PUB, 1, rel_payload(i, 20), 0, 20, True)
    p.run(5000)
    cut["on"] = False
    t0 = p.now
    p.up()
    assert p.now - t0 <= L.LK_HELLO_MS + 5  # back within 1 s of reachability
    assert a.handler.ups == [True, False] and b.handler.ups == [True, False]
    p.run(500)
    got = [m[2] for m in b.handler.msgs]
    assert got == [rel_payload(i, 20) for i in range(15)]



def test_an_outage_that_cuts_a_frame_each_way_still_resumes_within_a_hello():
    # A serial line goes dead in the middle of a 1 KiB frame in each direction: each end holds
    # the first half of a frame whose header promised 1 KiB. While the link is down only
    # HELLOs count, so the ends must not wait for the rest of it: that took ~4 s of HELLOs
    # (longer than a test's or a user's patience) before the first HELLO was even read.
    a = sess(True, 1)
    b = sess(False, 2)
    line = {"state": "open"}

    def mangle(data, d):
        if line["state"] == "cutting" and len(data) > 100:
            return [data[:len(data) // 2]]      # the first half got through, then the line died
        return [] if line["state"] != "open" else [data]

    p = Pair(a, b, mangle)
    p.up()
    line["state"] = "cutting"
    for x in (a, b):
        assert x.send(L.LK_T_PUB, 1, rel_payload(7, 1000), 0, 1000, True) == L.LK_OK
    p.step(1)
    line["state"] = "dead"
    assert p.run(3000, until=lambda: not a.is_up() and not b.is_up())
    line["state"] = "open"
    t0 = p.now
    p.up()
    assert p.now - t0 <= L.LK_HELLO_MS + 5, p.now - t0
    p.run(500)
    assert [m[2] for m in b.handler.msgs] == [rel_payload(7, 1000)]   # and the frame went again
    assert [m[2] for m in a.handler.msgs] == [rel_payload(7, 1000)]
    assert a.counters()["stale"] >= 1 and b.counters()["stale"] >= 1

def test_an_end_that_stayed_up_hears_link_up_when_the_peer_resumes():
    # The handshake: the companion answers the gateway's HELLO, and its next HELLO (both "reply
    # wanted") goes before the gateway's reply comes: it reaches the gateway after the first
    # brought it up, and is no resume (the companion has sent nothing else yet).
    a = sess(True, 1)
    b = sess(False, 2)
    n = a.poll_tx(1000)
    b.feed(a.tx_buf, 0, n, 1000)
    h = []
    for now in (1000, 1000 + L.LK_HELLO_MS):
        n = b.poll_tx(now)
        h.append(bytes(b.tx_buf[:n]))
    for x in h:
        a.feed(x, 0, len(x), 1300)
    assert not b.is_up()
    assert a.is_up() and a.handler.ups == [True] and a.counters()["peer_resumed"] == 0
    # Up both ways; then the line loses only what the gateway sends: the companion declares
    # the link down, the gateway (hearing the companion) does not. When the companion's HELLO
    # gets through, the gateway hears link_up again (not fresh) and resends what is in flight.
    cut = [False]
    p = Pair(a, b, lambda data, d: [] if cut[0] and d == 0 else [data], now=1300)
    p.up()
    p.run(500)
    cut[0] = True
    assert a.send(L.LK_T_PUB, 1, rel_payload(1, 50), 0, 50, True) == L.LK_OK
    assert p.run(3000, until=lambda: not b.is_up())
    assert a.is_up() and a.handler.downs == 0
    cut[0] = False
    assert p.run(2 * L.LK_HELLO_MS, until=lambda: b.is_up())
    p.run(50)
    assert a.handler.ups == [True, False] and a.counters()["peer_resumed"] == 1
    assert b.handler.ups == [True, False] and b.counters()["peer_resumed"] == 0
    assert [m[2] for m in b.handler.msgs] == [rel_payload(1, 50)]
    p.run(2000)                                      # and only once
    assert a.handler.ups == [True, False] and a.counters()["peer_resumed"] == 1


def test_restart_new_epoch_resets_stream():
    a = sess(True, 1)
    b = sess(False, 2)
    p = Pair(a, b)
    p.up()
    for i in range(20):
        a.send(L.LK_T_PUB, 1, rel_payload(i, 20), 0, 20, True)
    a.send(L.LK_T_ADV, 2, b"{}", 0, 2, True, True)
    a.poll_tx(p.now)  # in flight to the old companion
    # companion restarts: a new process with a new epoch
    b2 = sess(False, 3)
    p.b = b2
    t0 = p.now
    p.up()
    assert p.now - t0 < 300
    assert a.handler.downs == 1 and a.handler.ups == [True, True]  # fresh session
    assert a.reliable.una == 0 and a.reliable.nxt == 0 and a.reliable.rel_queued == ubrb_keep.parked(a)
    # the gateway keeps the PUBLISHes the old companion never acknowledged, not the old
    # session's control records: they wait (nothing goes) until the registrations are queued
    assert a.rel_kept == 20 * 23 and a.counters()["rel_reset_bytes"] == 5
    assert ubrb_keep.parked(a) == 20 * 23
    p.run(100)
    assert b2.handler.msgs == []
    a.send(L.LK_T_ADV, 1, b"{}", 0, 2, True, True)
    ubrb_keep.unpark(a)
    a.send(L.LK_T_PUB, 1, b"new", 0, 3, True)
    p.run(100)
    assert b2.handler.msgs == [(L.LK_T_ADV, 1, b"{}", True)] + [
        (L.LK_T_PUB, 1, rel_payload(i, 20), True) for i in range(20)] + [
        (L.LK_T_PUB, 1, b"new", True)]
    assert a.reliable.rel_queued == 0 and not ubrb_keep.parked(a)
    # gateway restarts: the companion sees a fresh session too, and keeps nothing of it
    b2.send(L.LK_T_MSG, 1, b"old", 0, 3, True)
    a2 = sess(True, 4)
    p.a = a2
    p.up()
    assert b2.handler.ups == [True, True] and b2.handler.downs == 1
    assert getattr(b2, "rel_kept", 0) == 0 and not ubrb_keep.parked(b2)
    # frames of the old session fail the new session key's CRC
    assert b2.seed != 0 and a2.seed == b2.seed


def test_keep_counts_in_the_core_counter():
    if hasattr(L, "_LKC_REL_RESET_BYTES"):  # CPython (MicroPython inlines the core's consts)
        assert ubrb_keep._REL_RESET_BYTES == L._LKC_REL_RESET_BYTES
        assert ubrb_keep._PARKED == L._LK_PARKED
    assert L._LK_COUNTERS.split()[18] == "rel_reset_bytes"


def _kill9_rig(acked_frames, delivered_frames):
    # A gateway sends 12 records of 53 bytes (9 of them PUBs, 3 control records) in frames of
    # 116 bytes of body: most frames end inside a record. The companion gets the first
    # `delivered_frames` of them (it hands their whole records on), the gateway gets its acks
    # for the first `acked_frames`; then the companion dies (kill -9) and a new one pairs.
    a = sess(True, 1, max_frame=128, datagram=True)
    b = sess(False, 2, max_frame=128, datagram=True)
    p = Pair(a, b)
    p.up()
    recs = []
    for i in range(12):
        t = L.LK_T_ADV if i % 4 == 3 else L.LK_T_PUB
        body = rel_payload(i, 50)
        recs.append((t, 1, body, True))
        a.send(t, 1, body, 0, 50, True, t != L.LK_T_PUB)
    frames = []
    while True:
        n = a.poll_tx(p.now)
        if not n:
            break
        frames.append(bytes(a.tx_buf[:n]))
    assert len(frames) == 6  # 636 bytes in 116-byte bodies
    for i in range(delivered_frames):
        b.feed(frames[i], 0, len(frames[i]), p.now)
        if i < acked_frames:
            n = b.poll_tx(p.now)
            a.feed(b.tx_buf, 0, n, p.now)
    b2 = sess(False, 3, max_frame=128, datagram=True)
    p.b = b2
    p.up()
    ubrb_keep.unpark(a)
    p.run(200)
    return a, recs, b.handler.msgs, b2.handler.msgs


def test_new_companion_gets_every_publish_not_wholly_acknowledged():
    # frame 0 (rec 0, rec 1, 10 bytes of rec 2) delivered and acknowledged: rec 2 was not handed
    # to ROS (the companion had 10 bytes of it), so it goes again whole, with everything after
    a, recs, old, new = _kill9_rig(1, 1)
    pubs = [r for r in recs if r[0] == L.LK_T_PUB]
    assert old == recs[:2]
    assert new == [r for r in recs[2:] if r[0] == L.LK_T_PUB]
    assert a.rel_kept == 53 * len(new)
    assert old[:2] + new == pubs[:2] + pubs[2:]  # each PUB once, in order: nothing lost


def test_new_companion_duplicates_only_what_was_delivered_but_not_acknowledged():
    # the old companion got frames 0-2 but its acks of frames 1 and 2 were lost: the records it
    # finished in them (rec 2 to rec 5) come again; the rest once
    a, recs, old, new = _kill9_rig(1, 3)
    assert old == recs[:6]
    assert new == [r for r in recs[2:] if r[0] == L.LK_T_PUB]
    dup = [r for r in new if r in old]
    assert dup == [r for r in recs[2:6] if r[0] == L.LK_T_PUB]


def test_old_session_frames_rejected():
    a = sess(True, 1)
    b = sess(False, 2)
    p = Pair(a, b)
    p.up()
    a.send(L.LK_T_PUB, 1, b"old", 0, 3, True)
    n = a.poll_tx(p.now)
    stale = bytes(a.tx_buf[:n])
    b2 = sess(False, 3)
    p.b = b2
    p.up()
    b2.feed(stale, 0, len(stale), p.now)
    assert b2.handler.msgs == [] and b2.counters()["crc_err"] == 1


def test_window_bounded():
    a = sess(True, 1, max_frame=100)
    b = sess(False, 2, window=3)
    p = Pair(a, b)
    p.up()
    for _ in range(50):
        a.send(L.LK_T_PUB, 1, bytes(80), 0, 80, True)
    k = 0
    while a.poll_tx(p.now):
        k += 1
    assert k == 3 and ((a.reliable.nxt - a.reliable.una) & 255) == 3


def test_buffers_never_grow():
    a = sess(True, 1)
    b = sess(False, 2)
    sizes = [len(x) for x in (a.tx_buf, a.rx, a.reader.rec_buf, a.reader.frag_buf, a.reliable.rel, a.beq.ring)]
    p = Pair(a, b)
    p.up()
    for i in range(2000):
        a.send(L.LK_T_PUB, i % 7, bytes(100), 0, 100, i % 2 == 0)
        if i % 50 == 0:
            p.step(1, budget=1)  # a slow link
    assert sizes == [len(x) for x in (a.tx_buf, a.rx, a.reader.rec_buf, a.reader.frag_buf, a.reliable.rel, a.beq.ring)]
    assert a.reliable.rel_queued <= len(a.reliable.rel) and a.beq.n <= len(a.beq.ring)
    assert a.counters()["drop_rel_full"] > 0 and a.counters()["drop_be"] > 0


def test_counters_dict():
    a = sess(True, 1)
    c = a.counters()
    for k in ("crc_err", "resync", "retx", "drop_be", "drop_rel_full", "frag_tx", "frag_rx"):
        assert k in c
    # each counter is reported under its own name: stat_counts[i] is word i of _LK_COUNTERS,
    # and every _LKC_<NAME> index (CPython keeps const() names; a board has none) is that word's
    # place, so a counter added on one side only (or the old way, as an attribute) fails here
    names = L._LK_COUNTERS.split()
    assert len(a.stat_counts) == len(names) and [k for k in names if c[k] != 0] == []
    assert [k for k in a.__dict__ if k.startswith("c_")] == []
    if hasattr(L, "_LKC_N"):
        assert L._LKC_N == len(names)
        # (the three ubrb_keyed counts too are public: LKC_AUTH, LKC_STALE, LKC_REPLAY)
        idx = [getattr(L, "_LKC_" + k.upper(), None) for k in names]
        idx = [getattr(L, "LKC_" + k.upper()) if i is None else i for i, k in zip(idx, names)]
        assert idx == list(range(len(names)))
    b = sess(False, 2)
    b.feed(b"\x00\x01\x02", 0, 3, 0)
    assert b.counters()["rx_bytes"] == 3 and b.stat_counts[names.index("rx_bytes")] == 3


def test_a_full_window_in_flight_with_loss():
    # The frame table has one entry per frame of the largest window (_LK_WMAX = 64): a peer
    # advertising it gets 64 frames in flight on a line whose round trip holds more, and the
    # repair of lost ones still delivers every record once, in order - whether the receiver
    # keeps frames past a gap (SACK) or not (a board: the sender goes back on its NAK).
    for hold in (0, 64):
        a = sess(True, 1, datagram=True, max_frame=128)
        b = sess(False, 2, datagram=True, max_frame=128, window=64, hold=hold)
        line = Line(a, b, seed=7, loss=3, delay=10)
        line.up()
        assert a.peer_window == 64
        N = 800
        sent = most = 0
        for _ in range(20000):
            while sent < N and a.send(L.LK_T_PUB, 1, rel_payload(sent, 90), 0, 90, True) == L.LK_OK:
                sent += 1
            line.step(1, budget=8)
            most = max(most, (a.reliable.nxt - a.reliable.una) & 255)
            if len(b.handler.msgs) >= N:
                break
        assert most == 64, hold
        assert [m[2] for m in b.handler.msgs] == [rel_payload(i, 90) for i in range(N)]
        assert a.counters()["retx"] > 0


def test_mp_allocation_per_message():
    # measure (and bound) heap use per relayed message on MicroPython: see docs/LINK.md
    import gc

    a = sess(True, 1, max_frame=1024)
    b = sess(False, 2, max_frame=1024)

    class Null:
        def link_up(self, fresh):
            pass

        def link_down(self):
            pass

        def link_message(self, t, slot, buf, off, n, reliable):
            pass

    p = Pair(a, b)
    p.up()
    b.set_handler(Null())
    msg = bytearray(64)
    now = p.now
    gc.collect()
    gc.disable()
    m0 = gc.mem_alloc()
    for _i in range(200):
        for _ in range(15):
            a.send(L.LK_T_PUB, 1, msg, 0, 64, True)
        n = a.poll_tx(now)
        b.feed(a.tx_buf, 0, n, now)
        n = b.poll_tx(now)
        a.feed(b.tx_buf, 0, n, now)
    per = (gc.mem_alloc() - m0) / 3000
    gc.enable()
    print("bytes allocated per 64-byte message:", per)
    assert len(b.counters()) > 0 and per < 16
