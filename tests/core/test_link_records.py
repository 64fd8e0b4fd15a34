# The record layer over the link (docs/LINK.md section 6): every record from the peer is checked
# before use on both ends, a bad one is counted, logged (rate-limited) and answered with a BAD
# record, and never escapes; registration answers carry the slot's generation, so a late answer
# cannot land on a newer registration. Runs under CPython (pytest) and MicroPython alike.
import json

import ubrb_min as L
from link_app_rig import app_pair
from tests.support.qos import QOS_R


def up():
    p, port, gw, comp, end = app_pair()
    p.run(300)
    gw.take()
    return p, port, gw, comp, end


def raw(session, t, slot, body, reliable=True):
    """Send one record as the peer would, bytes exactly as given."""
    if not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
    assert session.send(t, slot, body, 0, len(body), reliable, True) == L.LK_OK


DEEP = b"[" * 200 + b"]" * 200
DEEP_OBJ = b'{"a":' * 60 + b"1" + b"}" * 60


def test_bad_records_from_the_companion_are_counted_answered_and_contained():
    p, port, gw, comp, end = up()
    cs = p.b
    bad = [
        (L.LK_T_RESULT, 1, b"{not json"),
        (L.LK_T_RESULT, 1, b"[1, 2]"),                       # JSON, not an object
        (L.LK_T_RESULT, 1, DEEP),
        (L.LK_T_ERROR, 1, DEEP_OBJ),
        (L.LK_T_RESULT, 1, b'{"kind": "pub", "code": null, "gen": 1, "message": "\xff\xfe"}'),
        (L.LK_T_RESULT, 1, {"kind": "pub", "code": None}),   # no generation
        (L.LK_T_RESULT, 1, {"kind": ["pub"], "code": None, "gen": 1}),
        (L.LK_T_RESULT, 1, {"kind": "pub", "code": "made_up", "gen": 1}),
        (L.LK_T_RESULT, 1, {"kind": "pub", "code": None, "gen": True}),
        (L.LK_T_RESULT, 1, {"kind": "pub", "code": None, "gen": 1, "message": 7}),
        (L.LK_T_ERROR, 1, {"kind": "sub", "code": None, "gen": 1}),
        (L.LK_T_CHELLO, 0, {"distro": ["humble"]}),
        (L.LK_T_CHELLO, 0, b""),
        (L.LK_T_SUBCOUNT, 1, b"\x01\x00"),
        (L.LK_T_SUBCOUNT, 1, b"\xff\xff\xff\xff\x01\x00\x00\x00"),
        (99, 3, b"whatever"),
    ]
    for t, slot, body in bad:
        raw(cs, t, slot, body)
    p.run(100)
    assert gw.take() == []                       # nothing reached the gateway core
    assert port.c_bad == len(bad)
    assert end.c_rejected == len(bad)            # each was answered with a BAD record
    assert port.counters()["bad_records"] == len(bad)
    # the link and the app layer still work
    gw.pubs[2] = ("/ok", "std_msgs/msg/String", QOS_R)
    port.advertise(2, "/ok", "std_msgs/msg/String", QOS_R)
    p.run(50)
    assert gw.take("result") == [("result", "pub", 2, None)]
    assert p.a.is_up() and p.b.is_up()


def test_bad_records_from_the_gateway_are_counted_answered_and_contained():
    p, port, gw, comp, end = up()
    gs = p.a
    good = {"topic": "/t", "type": "std_msgs/msg/String", "qos": QOS_R, "gen": 5}
    bad = [
        (L.LK_T_ADV, 1, b"{not json"),
        (L.LK_T_ADV, 1, b'"just a string"'),
        (L.LK_T_SUB, 1, DEEP),
        (L.LK_T_SUB, 1, DEEP_OBJ),
        (L.LK_T_ADV, 1, b'{"topic": "\xc3", "type": "a/msg/B", "gen": 1}'),
        (L.LK_T_ADV, 1, {"type": "std_msgs/msg/String", "gen": 1}),         # no topic
        (L.LK_T_ADV, 1, {"topic": 5, "type": "std_msgs/msg/String", "gen": 1}),
        (L.LK_T_ADV, 1, dict(good, qos="reliable")),
        (L.LK_T_ADV, 1, dict(good, qos=[1])),
        (L.LK_T_SUB, 1, dict(good, gen=0)),
        (L.LK_T_SUB, 1, dict(good, gen=1 << 31)),
        (L.LK_T_SUB, 1, {"topic": "/t", "type": None, "gen": 1}),
        (L.LK_T_STATS, L.LK_STATS_SLOT, b"[]"),
        (L.LK_T_MSG, 1, b"not for the companion"),
        (77, 0, b""),
    ]
    for t, slot, body in bad:
        raw(gs, t, slot, body)
    p.run(100)
    assert [c for c in comp.calls if c[0] in ("advertise", "subscribe")] == []
    assert end.c_bad == len(bad) and port.c_rejected == len(bad)
    assert end.counters()["bad_records"] == len(bad)
    raw(gs, L.LK_T_ADV, 1, good)                 # a good one right behind them is served
    p.run(50)
    assert ("advertise", 1, "/t") in comp.calls


def test_a_surrogate_in_a_topic_is_refused_before_the_companion_sees_it():
    p, port, gw, comp, end = up()
    raw(p.a, L.LK_T_ADV, 1, b'{"topic": "/a\\ud800", "type": "a/msg/B", "gen": 1}')
    p.run(50)
    # CPython decodes a lone surrogate, which no UTF-8 encoder (DDS's) takes: refused as bad.
    # (MicroPython's json has no surrogates: whatever it made of it must be encodable.)
    adv = [c for c in comp.calls if c[0] == "advertise"]
    if adv:
        adv[0][2].encode()
    else:
        assert end.c_bad == 1


def test_an_exception_in_the_companion_is_contained_to_its_record():
    p, port, gw, comp, end = up()

    def boom(slot, topic, type, qos):
        raise KeyError("backend bug")
    comp.advertise = boom
    port.advertise(1, "/a", "std_msgs/msg/String", QOS_R)
    p.run(50)
    assert end.c_bad == 1 and port.c_rejected == 1
    # the gateway learns from the BAD answer: that registration ends with an ERROR
    assert gw.take("result") == [("result", "pub", 1, "protocol_error")]
    port.subscribe(2, "/s", "std_msgs/msg/String", QOS_R)
    p.run(50)
    assert gw.take("result") == [("result", "sub", 2, None)]


def test_a_late_answer_cannot_land_on_a_newer_registration():
    p, port, gw, comp, end = up()
    port.advertise(3, "/old", "std_msgs/msg/String", QOS_R)
    old = -port.gens[6]
    port.unadvertise(3)
    port.advertise(3, "/new", "std_msgs/msg/String", QOS_R)
    new = -port.gens[6]
    assert new != old
    p.run(50)
    # the answer about /old came after its release: late, dropped; the one about /new is used
    assert gw.take("result") == [("result", "pub", 3, None)] and port.gens[6] == new
    assert port.c_stale == 1
    # the ROS side's answers about the old registration arrive late: all dropped
    raw(p.b, L.LK_T_RESULT, 3, {"kind": "pub", "code": "invalid_topic", "message": "x", "gen": old})
    raw(p.b, L.LK_T_ERROR, 3, {"kind": "pub", "code": "link_congested", "message": "x", "gen": old})
    raw(p.b, L.LK_T_SUBCOUNT, 3, b"\x07\x00\x00\x00" + bytes([old & 255, old >> 8, 0, 0]))
    p.run(50)
    assert gw.take() == [] and port.c_stale == 4 and port.c_bad == 0
    # the same answers for the live generation are used
    raw(p.b, L.LK_T_SUBCOUNT, 3, b"\x07\x00\x00\x00" + bytes([new & 255, new >> 8, 0, 0]))
    raw(p.b, L.LK_T_RESULT, 3, {"kind": "pub", "code": "invalid_topic", "message": "x", "gen": new})
    p.run(50)
    assert gw.take() == [("count", 3, 7), ("result", "pub", 3, "invalid_topic")]
    assert 6 not in port.gens          # refused: the next registration on slot 3 is a new one


def test_companion_answers_carry_the_generation_of_the_live_registration():
    p, port, gw, comp, end = up()
    port.subscribe(4, "/s", "std_msgs/msg/String", QOS_R)
    p.run(50)
    end.ros_message(4, b"m1", 0, 2)
    end.ros_sub_count(4, 2)            # (a pub slot count: no pub on 4: dropped as late)
    p.run(50)
    assert gw.take("message") == [("message", 4, b"m1")]
    assert gw.take("count") == [] and port.c_stale == 1


def test_messages_of_a_subscription_wait_for_its_acceptance():
    p, port, gw, comp, end = up()
    raw(p.b, L.LK_T_MSG, 5, b"never subscribed")
    port.subscribe(5, "/s", "std_msgs/msg/String", QOS_R)
    p.run(50)
    raw(p.b, L.LK_T_MSG, 5, b"after")
    p.run(50)
    assert gw.take("message") == [("message", 5, b"after")] and port.c_stale == 1
    port.unsubscribe(5)
    raw(p.b, L.LK_T_MSG, 5, b"late")   # sent before the companion saw the UNSUB
    p.run(50)
    assert gw.take("message") == [] and port.c_stale == 2


def test_a_registration_the_link_cannot_carry_is_answered_with_an_error():
    p, port, gw, comp, end = app_pair(max_message=1000)
    p.run(300)
    gw.take()
    port.advertise(1, "/" + "x" * 2000, "std_msgs/msg/String", QOS_R)
    assert gw.take("result") == [("result", "pub", 1, "invalid_topic")]
    assert port.c_reg_failed == 1 and 2 not in port.gens
    # a companion that stops acknowledging: registrations fill the control reserve
    p.mangle = lambda data, d: [] if d == 0 else [data]
    codes = []
    for slot in range(2, 400):
        port.advertise(slot, "/t%d" % slot + "y" * 200, "std_msgs/msg/String", QOS_R)
        codes = [c[3] for c in gw.take("result")]
        if codes:
            break
    assert codes == ["link_congested"]
    assert port.c_reg_failed == 2


def test_a_release_that_cannot_be_sent_is_retried():
    p, port, gw, comp, end = app_pair(max_message=1000)
    p.run(300)
    port.advertise(1, "/a", "std_msgs/msg/String", QOS_R)
    p.run(50)
    assert comp.live == {("p", 1): "/a"}
    held = []
    p.mangle = lambda data, d: (held.append(data) or []) if d == 0 else [data]
    slot = 10
    while not port.unreleased:         # fill the ring until a release cannot be queued
        port.advertise(slot, "/f%d" % slot + "z" * 200, "std_msgs/msg/String", QOS_R)
        port.unadvertise(1) if slot == 10 else port.unadvertise(slot - 1)
        slot += 1
        assert slot < 400
    p.mangle = None
    p.run(3000)
    port.send_stats({"k": 1})          # a periodic record: the owed releases go first
    p.run(200)
    assert not port.unreleased and port.c_release_retry >= 1
    assert ("p", 1) not in comp.live


def test_rate_log_says_how_many_lines_it_held_back():
    lines = []
    r = L.RateLog(lambda level, msg: lines.append((level, msg)))
    for k in range(5):
        r.warn("bad_record", 1000 + k * 10, "bad %d" % k)
    r.warn("other", 1000, "other")
    r.warn("bad_record", 2000, "bad again")
    assert lines == [("warning", "bad 0"), ("warning", "other"),
                     ("warning", "bad again (4 similar suppressed)")]


def test_bad_records_are_logged_once_per_second_escaped():
    p, port, gw, comp, end = up()
    lines = []
    port._log = lambda level, msg: lines.append(msg)
    for _ in range(50):
        raw(p.b, L.LK_T_RESULT, 1, b"{\nCRITICAL forged")
    p.run(100)
    assert port.c_bad == 50 and len(lines) == 1 and "\n" not in lines[0]
    p.run(1000)
    raw(p.b, L.LK_T_RESULT, 1, b"{")
    p.run(50)
    assert len(lines) == 2 and "(49 similar suppressed)" in lines[1]


def test_an_answer_the_companion_cannot_send_is_sent_later():
    p, port, gw, comp, end = app_pair(max_message=1000)
    p.run(300)
    gw.take()
    # the gateway's acknowledgements stop: the companion's ring fills with its answers
    p.mangle = lambda data, d: [] if d == 0 else [data]
    slot = 0
    while not end.owed:
        end.ros_message(99, bytes(900), 0, 900)      # reliable data fills the ring...
        slot += 1
        assert slot < 400
        end.regs[slot * 2] = ["/t", "x/msg/Y", None, slot]
        end.ros_result("pub", slot, None, "")        # ...until an answer finds no room
    owed = sorted(end.owed)
    p.mangle = None
    p.run(3000)
    end.retry_answers()
    p.run(200)
    assert not end.owed and end.c_answer_retry == len(owed)


def test_a_registration_the_companion_rejects_ends_with_an_error():
    p, port, gw, comp, end = up()
    port.advertise(2, "/a", "std_msgs/msg/String", QOS_R)      # pending: no answer yet
    raw(p.b, L.LK_T_BAD, 0, {"type": L.LK_T_ADV, "slot": 2, "message": "cannot read it"})
    raw(p.b, L.LK_T_BAD, 0, {"type": L.LK_T_SUB, "slot": 7, "message": "not ours"})
    raw(p.b, L.LK_T_BAD, 0, b"{unreadable")
    p.run(100)
    assert gw.take() == [("result", "pub", 2, "protocol_error")]
    assert port.c_rejected == 3 and 4 not in port.gens


def test_every_error_the_companion_sends_reaches_the_gateway_core():
    # Regression (merge of issues 10 and 14a): the companion reports a QoS mismatch with a ROS
    # peer as ERROR qos_incompatible, and the gateway's record check once refused that code as a
    # bad record, so the UBRB client never heard of the mismatch.
    p, port, gw, comp, end = up()
    port.advertise(1, "/a", "std_msgs/msg/String", QOS_R)
    port.subscribe(2, "/s", "std_msgs/msg/String", QOS_R)
    p.run(50)
    gw.take()
    codes = ("message_too_large", "link_congested", "qos_incompatible")
    for code in codes:
        end.ros_error("pub", 1, code, "a %s on /a" % code)
        end.ros_error("sub", 2, code, "a %s on /s" % code)
    p.run(50)
    assert gw.take("error") == [e for c in codes for e in (("error", "pub", 1, c),
                                                           ("error", "sub", 2, c))]
    assert port.c_bad == 0 and end.c_rejected == 0
