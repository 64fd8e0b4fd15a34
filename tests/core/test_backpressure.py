# Issue 12 in the core: a reliable PUBLISH the ROS side cannot take yet waits in the client's
# decoder (the port stops reading that socket, TCP pushes back) instead of being dropped; waiting
# clients get the room in turn; and the link changes that keep a slow line busy with useful bytes
# (stats within a budget, RTO floor from the frame time, ACK repeat, pacing wake-up).
# Runs under CPython (pytest) and MicroPython (tests/mp/run.mjs) alike.
import ubrb_min as U
from scripted import Client, ScriptedRos, profile
from link_rig import Pair
from tests.support.qos import QOS_BE, QOS_R
from tests.support.ubrb_frames import advertise, hello, publish


class RoomRos(ScriptedRos):
    """A ROS side with a send budget, like a link: room(n) while `budget` bytes are left."""

    def __init__(self, budget):
        ScriptedRos.__init__(self)
        self.budget = budget

    def room(self, n):
        return n <= self.budget

    def publish(self, slot, buf, off, n, reliable):
        assert not reliable or n <= self.budget, "a reliable message was pushed past the budget"
        if reliable:
            self.budget -= n
        ScriptedRos.publish(self, slot, buf, off, n, reliable)


def setup(budget, clients=2):
    ros = RoomRos(budget)
    gw = U.Gateway(profile(max_clients=clients), ros=ros)
    ros.up()
    cs = []
    for i in range(clients):
        c = Client(gw)
        c.send(hello("c%d" % i) + advertise(1, "/r", qos=QOS_R) + advertise(2, "/b", qos=QOS_BE))
        cs.append(c)
    ros.take()
    return gw, ros, cs


def feed(c, data, now=0):
    """What a port does: copy what fits into the decoder, hand it over once; bytes not taken."""
    d = c.session.decoder
    n = min(len(data), d.space())
    U.copy_into(d.buf, d.fill, data, 0, n)
    c.gw.received(c.ci, n, now)
    return len(data) - n


def published(ros):
    return [(c[2], c[3]) for c in ros.take() if c[0] == "publish"]


def test_a_reliable_publish_without_room_waits_and_is_not_dropped():
    gw, ros, (a, b) = setup(budget=10)
    feed(a, publish(1, b"0123456789") + publish(1, b"abcdef") + publish(2, b"be"))
    assert published(ros) == [(b"0123456789", True)]      # the first fits, the second waits
    assert a.session.blocked and gw.interest(a.ci) & U.WANT_READ == 0
    assert a.errors() == []                                # no link_congested, no drop
    assert gw.interest(b.ci) & U.WANT_READ                # others are still read
    gw.tick(10)
    assert published(ros) == []                           # still no room: it keeps waiting
    ros.budget = 100
    gw.tick(20)
    # in order, and what followed the held frame (best effort) comes after it
    assert published(ros) == [(b"abcdef", True), (b"be", False)]
    assert not a.session.blocked and gw.interest(a.ci) & U.WANT_READ


def test_best_effort_and_control_frames_of_other_clients_flow_while_one_waits():
    gw, ros, (a, b) = setup(budget=0)
    feed(a, publish(1, b"held"))
    assert a.session.blocked
    b.send(publish(2, b"be1") + U.encode_frame(U.OP_PING, b""))
    assert published(ros) == [(b"be1", False)]
    assert [op for op, _ in b.frames()][-1] == U.OP_PONG


def test_waiting_clients_share_the_room_in_turn():
    gw, ros, cs = setup(budget=0, clients=3)
    for i, c in enumerate(cs):
        feed(c, publish(1, b"%d-0" % i) + publish(1, b"%d-1" % i) + publish(1, b"%d-2" % i))
    assert all(c.session.blocked for c in cs)
    ros.budget = 3 * 4             # room for three 3-byte messages... and a bit
    gw.tick(1)
    got = [m for m, _ in published(ros)]
    assert len(got) == 4 and len(set(g[:1] for g in got[:3])) == 3, got  # one each, then on
    ros.budget = 1000
    gw.tick(2)
    got += [m for m, _ in published(ros)]
    for i in range(3):             # each client's messages in its own order, none lost
        assert [g for g in got if g[:1] == b"%d" % i] == [b"%d-%d" % (i, k) for k in range(3)]


def test_a_newcomer_waits_behind_clients_already_waiting():
    gw, ros, (a, b) = setup(budget=0)
    feed(a, publish(1, b"first"))
    ros.budget = 5                 # room appears, but a was first in line
    feed(b, publish(1, b"later"))
    assert b.session.blocked and published(ros) == []
    ros.budget = 10
    gw.tick(1)
    assert [m for m, _ in published(ros)] == [b"first", b"later"]


IDLE_TIMEOUT_MS = 10000  # the core's idle limit (a const there: not an attribute on MicroPython)
LK_RTO_MIN = 40  # the link's RTO floor without a paced line (likewise)


def test_a_waiting_client_is_not_closed_as_idle_and_its_close_releases_the_wait():
    gw, ros, (a, b) = setup(budget=0)
    feed(a, publish(1, b"held"), now=0)
    b.send(U.encode_frame(U.OP_PING, b""), now=IDLE_TIMEOUT_MS)
    gw.tick(IDLE_TIMEOUT_MS + 1)
    assert not a.closing()
    gw.closed(a.ci, "test")
    assert gw.n_blocked == 0
    ros.budget = 100
    feed(b, publish(1, b"goes"), now=IDLE_TIMEOUT_MS + 2)
    assert [m for m, _ in published(ros)] == [b"goes"]


def test_decoder_hold_returns_the_same_frame_again():
    d = U.FrameDecoder(64, 64, U.OP_PUBLISH, U.CLIENT_OPS)
    d.feed(publish(1, b"abc") + publish(1, b"de"))
    assert d.next() == U.OP_PUBLISH and d.plen == 7
    d.hold()
    assert d.next() == U.OP_PUBLISH and d.plen == 7
    assert d.next() == U.OP_PUBLISH and d.plen == 6


def up_pair(**kw):
    g = U.LinkSession(None, 11, True, False, max_frame=256, max_message=1024, window=2,
                      rel_bytes=4096, be_bytes=2048, **kw)
    c = U.LinkSession(None, 22, False, False, max_frame=256, max_message=1024, window=2,
                      rel_bytes=4096, be_bytes=2048, **kw)
    port = U.LinkRosPort(g)
    sink = []

    class H:
        def link_up(self, fresh):
            pass

        def link_down(self):
            pass

        def link_message(self, t, slot, buf, off, n, reliable):
            sink.append((t, bytes(buf[off:off + n])))
    c.set_handler(H())
    p = Pair(g, c)
    p.up()
    return p, g, c, port, sink


def test_link_room_is_one_window_of_unsent_frames():
    p, g, c, port, sink = up_pair()
    # the companion has not read anything yet: fill the gateway's ring without polling
    n = 0
    while port.room(100):
        assert g.send(U.LK_T_PUB, 1, bytes(100), 0, 100, True) == U.LK_OK
        n += 1
    assert 2 * 256 <= n * 103 < 2 * 256 + 103    # a window (2 x 256 B frames) queued, no more
    assert g.reliable.rel_queued < len(g.reliable.rel) // 2      # far below the ring: the rest waits upstream
    p.run(500, until=lambda: port.room(100))
    assert port.room(100)


def test_stats_send_only_changes_within_a_line_budget():
    p, g, c, port, sink = up_pair()
    d = {"a": 1, "b": 2, "c": 3}
    assert port.send_stats(d)
    p.run(20)
    assert sink[-1][0] == U.LK_T_STATS
    assert U.link_record_json(sink[-1][1], 0, len(sink[-1][1])) == {"a": 1, "b": 2, "c": 3}
    d["b"] = 5
    p.run(1000)
    assert port.send_stats(d)
    p.run(20)
    assert U.link_record_json(sink[-1][1], 0, len(sink[-1][1])) == {"b": 5}
    assert not port.send_stats(d)             # nothing changed: nothing sent
    # a paced line: small records, spaced so that they take <= 1/200 of the line
    g.rtt.line_bps = 11520
    big = {}
    for i in range(40):
        big["counter_%d" % i] = i
    assert port.send_stats(big)
    p.run(20)
    first = U.link_record_json(sink[-1][1], 0, len(sink[-1][1]))
    assert 0 < len(sink[-1][1]) <= U.LK_STATS_CHUNK and len(first) < 40
    assert not port.send_stats(big)           # within the budget's gap
    p.run(port.stats_gap)
    assert port.send_stats(big)               # the next counters, where the last record stopped
    p.run(20)
    second = U.link_record_json(sink[-1][1], 0, len(sink[-1][1]))
    assert not set(first) & set(second)


def linked(d, link):
    """What a STATS record of send_stats(d, link) stands for: d, and link's as link_<name>."""
    want = dict(d)
    for k in link:
        want["link_" + k] = link[k]
    return want


def test_stats_carry_the_link_counters_as_link_names():
    # send_stats(d, link): the port hands over the link's counters as they are (no merged dict,
    # no link_<name> string for each of them every second); the companion gets what the merged
    # dict used to be, and later only what changed
    p, g, c, port, sink = up_pair()
    d = {"clients": 2, "ros_ready": True, "frames_in": 12345}
    lc = g.counters()
    assert port.send_stats(d, lc)
    p.run(20)
    assert sink[-1][0] == U.LK_T_STATS
    got = U.link_record_json(sink[-1][1], 0, len(sink[-1][1]))
    assert got == linked(d, lc) and len(got) == len(d) + len(lc)
    p.run(1000)
    d["frames_in"] += 1
    lc = g.counters()
    assert port.send_stats(d, lc)
    p.run(20)
    got = U.link_record_json(sink[-1][1], 0, len(sink[-1][1]))
    want = linked(d, lc)
    for k in got:
        assert got[k] == want[k], k
    assert got["frames_in"] == 12346 and "clients" not in got
    assert "link_tx_frames" in got and "link_up" not in got  # only what changed
    # a record that could not be sent: the link's counters all go again in the next one
    g.peer_epoch = 0
    assert not port.send_stats({}, {"io_err": 1})
    g.peer_epoch = c.epoch
    assert port.send_stats({}, lc)
    p.run(20)
    assert len(U.link_record_json(sink[-1][1], 0, len(sink[-1][1]))) == len(lc)
    # a paced line: records of at most LK_STATS_CHUNK bytes take turns over both dicts
    g.rtt.line_bps = 11520
    port.link_up(True)  # a new companion: every counter again
    seen = {}
    for _ in range(40):
        p.run(port.stats_gap + 1)
        if port.send_stats(d, lc):
            p.run(20)
            assert len(sink[-1][1]) <= U.LK_STATS_CHUNK
            seen.update(U.link_record_json(sink[-1][1], 0, len(sink[-1][1])))
    assert seen == linked(d, lc)


def test_rto_floor_covers_a_whole_frame_each_way_on_a_paced_line():
    p, g, c, port, sink = up_pair()
    U.LinkOutput(g, 11520)                    # what a port's driver does on a 115200 line
    g.rtt.sample(2, g.peer_max_frame)
    assert g.rtt.rto >= LK_RTO_MIN + 2 * 256 * 1000 // 11520
    g2 = up_pair()[1]
    g2.rtt.sample(2, g2.peer_max_frame)
    assert g2.rtt.rto == LK_RTO_MIN             # unpaced (UDP): as before


def test_ack_repeat_is_cancelled_by_any_later_frame():
    p, g, c, port, sink = up_pair()
    g.send(U.LK_T_PUB, 1, b"x", 0, 1, True)
    p.run(5)                                  # the companion acks (and would repeat it)
    assert c.ack_rep
    c.send(U.LK_T_MSG, 1, b"y", 0, 1, True)
    p.step()                                  # a data frame carries the same ack
    assert c.ack_rep == 0


def test_paced_output_says_when_the_next_frame_may_go():
    p, g, c, port, sink = up_pair()
    out = U.LinkOutput(g, 11520)
    out.start(0)
    out.start(10)                             # 10 ms of credit: 115 bytes
    assert out.wait_ms(10) == 0
    g.send(U.LK_T_PUB, 1, bytes(200), 0, 200, True)
    n = out.next(10)
    assert n and out.wrote(n)
    w = out.wait_ms(10)
    assert 0 < w <= (n * 1000) // 11520 + 1   # the line time of what exceeded the credit


def test_the_loss_timer_wakes_the_loop_when_a_frame_is_due_again():
    # a loop sleeps up to 20-50 ms; a frame RACK will deem lost at rack_at must go then (a
    # noisy serial line waited for the RTO on every loss while the loop slept past it)
    p, g, c, port, sink = up_pair()
    out = U.LinkOutput(g, 0)                  # unpaced (UDP)
    assert g.reliable.rack_at < 0 and out.wait_ms(10) == 0
    g.reliable.rack_at = 30
    assert out.wait_ms(10) == 20 and out.wait_ms(31) == 0   # due: this turn's flush sends it
    paced = U.LinkOutput(g, 11520)
    paced.start(0)
    paced.start(10)                           # 10 ms of credit: 115 bytes
    g.send(U.LK_T_PUB, 1, bytes(400), 0, 400, True)
    n = paced.next(10)
    assert n and paced.wrote(n)               # past the credit: the line is busy a while
    g.reliable.rack_at = -1
    line = paced.wait_ms(10)
    assert line >= 10
    g.reliable.rack_at = 12                            # due before the line is free: the line's time
    assert paced.wait_ms(10) == line
    g.reliable.rack_at = 10 + line + 30                # due after it: the timer's
    assert paced.wait_ms(10) == line + 30


def test_best_effort_keeps_the_topics_depth_newest_and_sends_them_in_one_frame():
    p, g, c, port, sink = up_pair()
    port.advertise(1, "/t", "std_msgs/msg/String",
                   {"reliability": "best_effort", "durability": "volatile", "depth": 3})
    port.advertise(2, "/u", "std_msgs/msg/String",
                   {"reliability": "best_effort", "durability": "volatile", "depth": 1})
    p.run(20)
    del sink[:]
    for i in range(5):
        g.send(U.LK_T_PUB, 1, b"t%d" % i, 0, 2, False)
        g.send(U.LK_T_PUB, 2, b"u%d" % i, 0, 2, False)
    assert g.counters()["drop_be"] == 2 + 4                # superseded before they ever went out
    seq = g.beq.seq
    p.run(5)
    assert [m for t, m in sink if t == U.LK_T_PUB] == [b"t2", b"t3", b"t4", b"u4"]
    assert (g.beq.seq - seq) & 255 == 1         # one frame for the four


def test_an_outage_holds_reliable_publishes_pings_the_clients_and_drops_only_after_its_bound():
    # Issue 20 item 2: the link is down (ros_down) but was up: a reliable PUBLISH waits, the
    # client is not read, but it hears a PING every 3 s (the Unreal plugin drops a session
    # after 10 s of silence); when the ROS side is back the held frame goes first.
    gw, ros, (a, b) = setup(budget=1 << 20)
    a.frames()
    ros.sink.ros_down()
    now = 1000
    gw.tick(now)
    assert feed(a, publish(1, b"held") + publish(2, b"be"), now) == 0
    assert published(ros) == [] and a.session.blocked and gw.interest(a.ci) & U.WANT_READ == 0
    for _ in range(9):                                   # 9 s of outage
        now += 1000
        gw.tick(now)
    assert [op for op, _ in a.frames()].count(U.OP_PING) == 3 and not a.closing()
    assert [op for op, _ in b.frames()].count(U.OP_PING) == 3  # (idle itself: it sent nothing)
    ros.up()
    gw.tick(now + 10)
    assert published(ros)[:2] == [(b"held", True), (b"be", False)] and a.errors() == []
    # a second outage, longer than its bound: dropped, with an ERROR, counted
    ros.sink.ros_down()
    now += 100
    gw.tick(now)
    feed(a, publish(1, b"late"), now)
    assert a.session.blocked
    now += U.OUTAGE_HOLD_MS
    gw.tick(now)
    assert not a.session.blocked and published(ros) == []
    assert a.errors() == [("link_congested", 1)]
    assert gw.counters()["dropped_no_ros"] == 1


class RegRoomRos(RoomRos):
    """RoomRos with a registration budget too, like a link's reg_room()."""

    def __init__(self, budget):
        RoomRos.__init__(self, budget)
        self.reg_open = True

    def reg_room(self):
        return self.reg_open


def test_a_client_waiting_to_register_holds_no_one_elses_publishes_nor_the_reverse():
    ros = RegRoomRos(1000)
    gw = U.Gateway(profile(max_clients=3), ros=ros)
    ros.up()
    a, b, c = Client(gw), Client(gw), Client(gw)
    for x, name in ((a, "a"), (b, "b"), (c, "c")):
        x.send(hello(name))
    b.send(advertise(1, "/r", qos=QOS_R))
    ros.take()
    ros.reg_open = False
    feed(a, advertise(1, "/a"))                  # a waits for room to register
    assert a.session.blocked and ros.take() == []
    feed(b, publish(1, b"one") + publish(1, b"two") + publish(1, b"three"))
    assert published(ros) == [(b"one", True), (b"two", True), (b"three", True)]
    ros.budget = 0                               # now b waits for data room ...
    feed(b, publish(1, b"four"))
    assert b.session.blocked
    ros.reg_open = True                          # ... which holds no registration up: c's
    feed(c, advertise(1, "/c"))                  # waits only behind a's, already waiting
    assert c.session.blocked
    gw.tick(1)
    assert [x[2] for x in ros.take() if x[0] == "advertise"] == ["/a", "/c"]
    assert not a.session.blocked and not c.session.blocked and b.session.blocked
