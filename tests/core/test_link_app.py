# The app layer over the link: LinkRosPort (gateway end, a RosPort that replays GatewaySink
# calls) and ros_side.link_end.LinkCompanionEnd (companion end, a GatewaySink that drives a RosPort).
# Runs under CPython (pytest) and MicroPython (tests/mp/run.mjs) alike.
import ubrb_min as L
import ubrb_policy
from link_app_rig import FakeCompanion, FakeGateway, app_pair
from ros_side.link_end import LinkCompanionEnd
from tests.support.qos import QOS_BE, QOS_R


def test_up_registration_and_data_both_ways():
    p, port, gw, comp, end = app_pair()
    gw.pubs[1] = ("/chatter", "std_msgs/msg/String", QOS_R)
    gw.subs[2] = ("/scan", "sensor_msgs/msg/LaserScan", QOS_BE)
    p.run(300)
    assert gw.take("up") == [("up", "humble", port.max_message())]
    assert ("advertise", 1, "/chatter") in comp.calls and ("subscribe", 2, "/scan") in comp.calls
    assert gw.take("result") == [("result", "pub", 1, None), ("result", "sub", 2, None)]
    port.publish(1, b"xxabcxx", 2, 3, True)
    port.publish(1, b"be", 0, 2, False)
    p.run(50)
    assert ("publish", 1, b"abc", True) in comp.calls and ("publish", 1, b"be", False) in comp.calls
    end.ros_message(2, b"-scan-", 1, 4)
    end.ros_sub_count(1, 3)
    p.run(50)
    assert gw.take("message") == [("message", 2, b"scan")]
    assert gw.take("count") == [("count", 1, 3)]
    # failed registration travels back as a result code
    port.advertise(3, "bad topic", "x/msg/Y", QOS_R)
    p.run(50)
    assert gw.take("result") == [("result", "pub", 3, "invalid_topic")]
    port.unsubscribe(2)
    p.run(50)
    assert ("unsubscribe", 2) in comp.calls and ("s", 2) not in comp.live


def test_publish_too_large_reported_to_sink():
    p, port, gw, comp, end = app_pair(max_message=1000)
    p.run(300)
    port.publish(1, bytes(1001), 0, 1001, True)
    port.publish(1, bytes(1001), 0, 1001, False)
    assert gw.take("error") == [("error", "pub", 1, "message_too_large")] * 2
    p.run(50)
    assert not [c for c in comp.calls if c[0] == "publish"]


def test_companion_message_too_large_reported_as_sub_error():
    p, port, gw, comp, end = app_pair(max_message=1000)
    gw.subs[4] = ("/big", "x/msg/Big", QOS_R)
    p.run(300)
    gw.take()
    end.ros_message(4, bytes(1500), 0, 1500)
    end.ros_message(4, bytes(1500), 0, 1500)  # rate limited: one report per second
    p.run(50)
    assert gw.take("error") == [("error", "sub", 4, "message_too_large")]
    assert gw.take("message") == []


def test_reliable_buffer_full_is_a_reported_drop():
    p, port, gw, comp, end = app_pair(rel_bytes=16384, max_message=4000)
    p.run(300)
    gw.take()
    n = 0
    for _ in range(20):
        port.publish(1, bytes(3000), 0, 3000, True)
        n += 1
    assert port.c_congested > 0
    assert gw.take("error") == [("error", "pub", 1, "link_congested")]
    p.run(500)
    got = [c for c in comp.calls if c[0] == "publish"]
    assert len(got) == n - port.c_congested


def test_gateway_restart_resets_companion_and_restores():
    p, port, gw, comp, end = app_pair()
    gw.pubs[1] = ("/a", "std_msgs/msg/String", QOS_R)
    p.run(300)
    assert comp.live == {("p", 1): "/a"}
    # a new gateway process (new epoch) with the same registrations
    gs2 = L.LinkSession(None, 303, True)
    port2 = L.LinkRosPort(gs2)
    gw2 = FakeGateway()
    gw2.port = port2
    port2.sink = gw2
    gw2.pubs[1] = ("/a", "std_msgs/msg/String", QOS_R)
    gw2.pubs[5] = ("/b", "std_msgs/msg/String", QOS_R)
    p.a = gs2
    t0 = p.now
    p.run(1000, until=lambda: len(gw2.take("result")) == 2)
    assert p.now - t0 < 1000
    assert ("reset",) in comp.calls
    assert comp.live == {("p", 1): "/a", ("p", 5): "/b"}


def test_companion_restart_gets_registrations_again():
    p, port, gw, comp, end = app_pair()
    gw.pubs[1] = ("/a", "std_msgs/msg/String", QOS_R)
    gw.subs[2] = ("/s", "std_msgs/msg/String", QOS_R)
    p.run(300)
    cs2 = L.LinkSession(None, 404, False)
    comp2 = FakeCompanion("jazzy")
    end2 = LinkCompanionEnd(cs2, comp2)
    comp2.sink = end2
    p.b = cs2
    port.publish(1, b"in flight", 0, 9, True)
    gw.take()
    p.run(1000, until=lambda: len(comp2.live) == 2)
    assert gw.take("down") == [("down",)]
    assert gw.take("up") == [("up", "jazzy", port.max_message())]
    # the gateway tells its clients that a new session replaced the old one
    lost = gw.take("lost")
    assert len(lost) == 1 and "new session" in lost[0][1]
    assert ("reset",) not in comp2.calls
    assert comp2.live == {("p", 1): "/a", ("s", 2): "/s"}
    # the PUBLISH the old companion never acknowledged reaches the new one, after the
    # registrations (issue 20: kept by the gateway's session, sent on the new CHELLO)
    p.run(200)
    got = [c[0] for c in comp2.calls]
    assert comp2.calls.count(("publish", 1, b"in flight", True)) == 1
    assert got.index("publish") > got.index("advertise") and got.index("subscribe") < \
        got.index("publish")


def test_a_registration_that_does_not_fit_behind_kept_publishes_goes_first():
    # A board-sized ring full of PUBLISHes the old companion never acknowledged: the
    # registrations for the new one need the room, so the kept ones go (counted), never the
    # registrations (their clients would get ERROR link_congested and lose them)
    p, port, gw, comp, end = app_pair(rel_bytes=4096, max_message=1000)
    p.run(300)
    cut = [True]
    p.mangle = lambda data, d: [] if cut[0] else [data]
    n = 0
    while port.room(900):
        port.publish(1, bytes(900), 0, 900, True)
        n += 1
    gw.pubs[1] = ("/" + "a" * 1500, "std_msgs/msg/String", QOS_R)  # 1.5 KiB of registration
    cs2 = L.LinkSession(None, 404, False)
    comp2 = FakeCompanion()
    end2 = LinkCompanionEnd(cs2, comp2)
    comp2.sink = end2
    p.b = cs2
    cut[0] = False
    p.run(1000, until=lambda: len(comp2.live) == 1)
    assert comp2.live == {("p", 1): "/" + "a" * 1500}
    assert port.s.rel_kept == n * 904 and port.s.counters()["rel_reset_bytes"] == n * 904
    assert not [c for c in comp2.calls if c[0] == "publish"]


def test_glitch_resume_dedups_registrations():
    cut = {"on": False}
    p, port, gw, comp, end = app_pair()
    p.mangle = lambda data, d: [] if cut["on"] else [data]
    gw.pubs[1] = ("/a", "std_msgs/msg/String", QOS_R)
    p.run(300)
    n_adv = len([c for c in comp.calls if c[0] == "advertise"])
    port.publish(1, b"m1", 0, 2, True)
    cut["on"] = True
    port.publish(1, b"m2", 0, 2, True)
    p.run(3000)
    assert gw.take("down") == [("down",)]
    port.publish(1, b"m3", 0, 2, True)
    gw.take()
    cut["on"] = False
    p.run(1000)
    assert gw.take("up")
    assert gw.take("lost") == []          # a resumed session lost nothing: no notice
    # the same gateway epoch: nothing reset, registrations not re-created, results re-sent
    assert ("reset",) not in comp.calls
    assert len([c for c in comp.calls if c[0] == "advertise"]) == n_adv
    assert gw.take("result") == [("result", "pub", 1, None)]
    pubs = [c[2] for c in comp.calls if c[0] == "publish"]
    assert pubs == [b"m1", b"m2", b"m3"]


def test_stats_to_companion():
    p, port, gw, comp, end = app_pair()
    p.run(300)
    port.send_stats({"clients": 2, "link": {"crc_err": 0}})
    p.run(20)
    assert comp.stats == {"clients": 2, "link": {"crc_err": 0}}
    assert "pub_congested" in port.counters() and "msg_too_large" in end.counters()


def test_an_outage_only_the_gateway_saw_gives_it_the_ros_side_back():
    # The line loses only what the companion sends, for longer than the dead timer: the gateway
    # declares the link down (ros_down); the companion, still hearing the gateway, never does,
    # so it never says hello (CHELLO) again. When the line heals, the gateway must have its ROS
    # side back at once: it was left without one for good (its clients' PUBLISHes refused as
    # dropped_no_ros) - the serial outage failure of issue 20, where the companion's dead timer
    # runs up to a heartbeat later than the gateway's and the line came back in between.
    cut = [False]
    p, port, gw, comp, end = app_pair()
    p.mangle = lambda data, d: [] if cut[0] and d == 1 else [data]
    gw.pubs[1] = ("/a", "std_msgs/msg/String", QOS_R)
    p.run(300)
    assert gw.take("up")
    cut[0] = True
    assert p.run(3000, until=lambda: not p.a.is_up())
    assert p.b.is_up() and gw.take("down") == [("down",)]
    port.publish(1, b"held", 0, 4, True)             # queued while the ROS side is away
    cut[0] = False
    t_heal = p.now
    assert p.run(1000, until=lambda: gw.take("up")), "the gateway never got its ROS side back"
    assert p.now - t_heal <= 2 * L.LK_HELLO_MS        # within a HELLO or two of the line
    k = p.b.counters()                                # the companion never saw it go down,
    assert k["down"] == 0 and k["peer_resumed"] == 1  # ... only the gateway come back
    p.run(200)
    assert [c[2] for c in comp.calls if c[0] == "publish"] == [b"held"]
    assert gw.take("lost") == []                      # the same session: nothing to tell


def test_a_session_that_does_not_come_back_releases_everything():
    p, port, gw, comp, end = app_pair()
    gw.pubs[1] = ("/a", "std_msgs/msg/String", QOS_R)
    p.run(300)
    assert comp.live == {("p", 1): "/a"}
    cut = [True]
    p.mangle = lambda data, d: [] if cut[0] else [data]
    # A short outage (a cable re-plugged) keeps the companion's entities...
    p.run(3000, dt=10, until=lambda: not p.b.is_up())
    t_down = p.now
    p.run(1000, dt=10)
    assert not end.expire(p.now, 5000)
    assert comp.live == {("p", 1): "/a"}
    # ...a long one releases them, once.
    p.run(4000, dt=10)
    assert p.now - t_down >= 5000
    assert end.expire(p.now, 5000)
    assert comp.live == {} and ("reset",) in comp.calls
    assert not end.expire(p.now + 10000, 5000)
    # The same session comes back later: the gateway hands its registrations over again.
    cut[0] = False
    p.run(2000, dt=10, until=lambda: comp.live == {("p", 1): "/a"})
    assert comp.live == {("p", 1): "/a"}


def _imu_over_link(policy, seconds=2):
    # A 1 kHz ROS topic offered to the companion end for `seconds`; returns what reached the
    # gateway (messages) and the bytes that crossed the link companion -> gateway meanwhile.
    p, port, gw, comp, end = app_pair()
    gw.policy = policy              # as Policy.install leaves it for LinkRosPort.subscribe
    gw.subs[3] = ("/imu", "sensor_msgs/msg/Imu", QOS_BE)
    p.run(300)
    gw.take()
    w0 = p.wire[1]
    for i in range(seconds * 1000):
        end.ros_message(3, b"imu%06d" % i + bytes(300), 0, 309)
        end.tick(p.now)
        p.step()
    for _ in range(50):             # the last period ends: its held message goes out
        end.tick(p.now)
        p.step()
    return [m[2][:9] for m in gw.take("message")], p.wire[1] - w0, end


def test_throttle_holds_a_topic_to_its_rate_before_the_link():
    got, wire, end = _imu_over_link(ubrb_policy.Policy(throttle=[("/imu", 20)]))
    full, wire_full, _ = _imu_over_link(None)
    assert len(full) == 2000
    assert 99 <= len(got) <= 101               # 50 Hz for 2 s, not 1000 Hz
    assert got[-1] == b"imu001999"              # the newest of the last period is delivered
    assert got == sorted(set(got))              # in order, no repeats
    assert wire * 8 < wire_full                 # the link carries ~1/20 of the bytes
    assert end.counters()["throttle_superseded"] >= 1890


def test_sub_record_carries_the_period_and_an_older_gateway_none():
    p, port, gw, comp, end = app_pair()
    p.run(300)
    sent = []
    real = port.s.send
    port.s.send = lambda t, s, b, o, n, r, c: sent.append(bytes(b[o:o + n])) or real(t, s, b, o, n, r, c)
    gw.policy = ubrb_policy.Policy(throttle=[("/imu*", 20)])  # (glob, period in ms): 50 Hz
    port.subscribe(4, "/imu/data", "sensor_msgs/msg/Imu", QOS_BE)
    port.subscribe(5, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE)
    p.run(50)
    recs = [L.link_record_json(b, 0, len(b)) for b in sent]
    assert recs[0]["period_ms"] == 20 and "period_ms" not in recs[1]
    assert end.throttle.idx == {4: 0}           # only the throttled one holds a buffer
    port.unsubscribe(4)
    p.run(50)
    assert end.throttle.idx == {}


def test_a_bad_period_is_a_rejected_record():
    p, port, gw, comp, end = app_pair()
    p.run(300)
    for bad in (-1, "20", True, 1 << 31):
        b = L.link_record_body({"topic": "/a", "type": "std_msgs/msg/String", "qos": None,
                                "gen": 7, "period_ms": bad})
        port.s.send(L.LK_T_SUB, 9, b, 0, len(b), True, True)
        p.run(50)
    assert end.c_bad == 4 and port.c_rejected == 4
    assert not [c for c in comp.calls if c[0] == "subscribe"]


def test_qos_incompatible_crosses_the_link_to_the_gateway():
    p, port, gw, comp, end = app_pair()
    gw.subs[2] = ("/imu", "sensor_msgs/msg/Imu", QOS_R)
    p.run(300)
    gw.take()
    end.ros_error("sub", 2, "qos_incompatible", "/imu: a ROS publisher with incompatible QoS "
                  "(RELIABILITY) does not match this subscription")
    p.run(50)
    assert gw.take("error") == [("error", "sub", 2, "qos_incompatible")]
    assert port.c_bad == 0


def test_a_held_reliable_message_waits_for_link_room_at_its_period_end():
    p, port, gw, comp, end = app_pair(rel_bytes=16384, max_message=4000)
    gw.policy = ubrb_policy.Policy(throttle=[("/thr", 20)])
    gw.subs[1] = ("/thr", "std_msgs/msg/String", QOS_R)
    gw.subs[2] = ("/bulk", "std_msgs/msg/String", QOS_R)
    p.run(300)
    gw.take()
    end.ros_message(1, b"first", 0, 5)          # a quiet topic: goes at once
    end.ros_message(1, b"held!", 0, 5)          # same period: held
    while end.s.rel_room(3000):                 # the link's reliable ring fills up (no acks yet)
        end.ros_message(2, bytes(3000), 0, 3000)
    p.now += 25                                 # the period ends while the link has no room
    end.tick(p.now)
    assert end.throttle.t.held[end.throttle.t.pool_of[0]] == 5   # still held, not dropped
    for _ in range(400):
        end.tick(p.now)
        p.step()
    assert [m[2] for m in gw.take("message") if m[1] == 1] == [b"first", b"held!"]
    assert end.c_congested == 0 and not gw.take("error")
