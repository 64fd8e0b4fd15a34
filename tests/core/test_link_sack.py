# The reliable stream under loss, reordering and outages (docs/LINK.md section 5): selective
# acknowledgement, frames past a gap kept by the receiver, loss detection by what the peer
# reports held, the retransmission timeout. Datagram sessions on Line, a virtual-clock line on
# which frames take their own delay (no sleeps); runs under CPython and MicroPython alike.
import ubrb_min as L
from link_rig import Line, Rec, rel_payload

SIZE = 1000  # one message a frame (1400-byte frames), like a camera or a point cloud in chunks


def ends(hold=64, window=64):
    # a CPython UDP end: its rings (ubrb_setup.link_sizes) and window (ubrb_host.link.udp_window)
    a = L.LinkSession(Rec(), 1, True, True, 1400, 65536, window, 262144, 16384, hold=hold)
    b = L.LinkSession(Rec(), 2, False, True, 1400, 65536, window, 262144, 16384, hold=hold)
    return a, b


def stream(line, n, per_ms=1, limit=30000):
    """Offer `n` reliable messages, `per_ms` a millisecond while the link takes them; returns
    (milliseconds until the last arrived, each message's latency in ms)."""
    a, b = line.a, line.b
    sent_at = []
    lat = []
    t0 = line.now
    del b.handler.msgs[:]
    for _ in range(limit):
        k = 0
        while len(sent_at) < n and k < per_ms and a.rel_room(SIZE):
            assert a.send(L.LK_T_PUB, 1, rel_payload(len(sent_at), SIZE), 0, SIZE, True) == L.LK_OK
            sent_at.append(line.now)
            k += 1
        line.step(1)
        while len(lat) < len(b.handler.msgs):
            lat.append(line.now - sent_at[len(lat)])
        if len(lat) >= n:
            break
    got = [m[2] for m in b.handler.msgs]
    assert len(got) == n, "%d of %d delivered in %d ms" % (len(got), n, line.now - t0)
    assert got == [rel_payload(i, SIZE) for i in range(n)]  # exactly once, in order
    return line.now - t0, sorted(lat)


def test_overtaken_frames_are_kept_and_not_sent_again():
    # Frames overtake each other by up to 8 ms at 1 frame/ms. Go-back-N threw every frame
    # after a late one away and sent them all again (16 msg/s, 4,500 resends for 2,000).
    a, b = ends()
    line = Line(a, b, seed=3, delay=2, jitter=8)
    line.up()
    ms, lat = stream(line, 400)
    assert b.counters()["ooo"] > 50                  # the line did reorder
    assert a.counters()["retx"] <= 400 // 20, a.counters()
    assert ms <= 460 and lat[-1] <= 60, (ms, lat[-1])


def test_a_lost_frame_costs_about_one_resend():
    a, b = ends()
    line = Line(a, b, seed=5, loss=5, delay=5)
    line.up()
    ms, lat = stream(line, 400)
    lost = line.lost[0]
    assert lost >= 10 and a.counters()["retx"] <= 2 * lost + 5, (lost, a.counters())
    assert a.counters()["timeouts"] == 0
    assert ms <= 480, ms


def test_20_percent_loss_with_reordering_keeps_the_offered_rate():
    # the worst Wi-Fi row: go-back-N delivered 6-7 msg/s of 1,000 offered
    a, b = ends()
    line = Line(a, b, seed=7, loss=20, dup=5, delay=3, jitter=8)
    line.up()
    ms, lat = stream(line, 400)
    assert ms <= 520, ms                              # >= ~0.8 of the offered rate
    assert lat[len(lat) * 99 // 100] <= 150, lat[-5:]


def test_the_sack_bitmap_on_the_wire():
    # seq 0, 2, 3 arrive, 1 is lost: the receiver delivers 0, keeps 2 and 3, and its ACK says
    # "next expected 1" with bits 0 and 1 (seqs 2 and 3) set in a hold/8-byte body
    a, b = ends(hold=16, window=16)
    line = Line(a, b, seed=1)
    line.up()
    frames = []
    for i in range(4):
        assert a.send(L.LK_T_PUB, 1, rel_payload(i, SIZE), 0, SIZE, True) == L.LK_OK
        n = a.poll_tx(line.now)
        frames.append(bytes(a.tx_buf[:n]))
    assert [f[6] for f in frames] == [0, 1, 2, 3] and all(f[4] & 15 == L.LK_REL for f in frames)
    for i in (0, 2, 3):
        b.feed(frames[i], 0, len(frames[i]), line.now)
    assert [m[2] for m in b.handler.msgs] == [rel_payload(0, SIZE)] and b.hold.held == 2
    n = b.poll_tx(line.now)
    ack = bytes(b.tx_buf[:n])
    assert ack[4] & 15 == L.LK_ACK and ack[7] == 1 and n == L.LK_OVH + 2
    assert ack[8:10] == bytes([0b11, 0])
    a.feed(ack, 0, n, line.now)
    c = a.counters()
    assert a.reliable.sack_n == 2 and c["retx"] == 0
    b.feed(frames[1], 0, len(frames[1]), line.now)  # the gap filled: all four, in order
    assert [m[2] for m in b.handler.msgs] == [rel_payload(i, SIZE) for i in range(4)]
    assert b.hold.held == 0
    n = b.poll_tx(line.now)
    assert b.tx_buf[7] == 4 and n == L.LK_OVH            # nothing held: a plain ACK


def test_a_receiver_that_keeps_nothing_still_gets_everything():
    # a board keeps no frames past a gap (hold 0): its NAK sends the peer back over them
    a, _ = ends()
    _, b = ends(hold=0, window=8)
    line = Line(a, b, seed=9, loss=5, delay=2, jitter=4)
    line.up()
    stream(line, 300)
    assert b.hold is None
    assert a.counters()["retx"] > 0 and a.counters()["fast_retx"] > 0


def test_an_outage_loses_nothing_and_the_window_grows_back():
    a, b = ends()
    line = Line(a, b, seed=11, delay=2)
    line.up()
    stream(line, 50)                 # a measured round trip: the RTO is its floor
    line.down = True                 # 1.5 s without a frame either way: below the dead timer
    for i in range(60):
        assert a.send(L.LK_T_PUB, 1, rel_payload(i, SIZE), 0, SIZE, True) == L.LK_OK
    retx = a.counters()["retx"]
    line.run(1500)
    c = a.counters()
    # the RTO doubled at each timeout, and each sent one frame again, not the whole window
    assert c["timeouts"] >= 4 and c["retx"] - retx == c["timeouts"], c
    assert a.rtt.rto <= 2000 and a.reliable.cwnd == 1 and a.is_up()
    line.down = False
    del b.handler.msgs[:]
    assert line.run(3000, until=lambda: len(b.handler.msgs) == 60)
    assert [m[2] for m in b.handler.msgs] == [rel_payload(i, SIZE) for i in range(60)]
    ms, _ = stream(line, 200)        # afterwards, the full rate again
    assert ms <= 240 and a.reliable.cwnd >= 32, (ms, a.reliable.cwnd)
