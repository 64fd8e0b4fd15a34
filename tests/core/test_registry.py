# Registry and fan-out: shared slots, ref counts, conflicts, release, SUB_COUNT, ROS results.

import ubrb_min as U
import ubrb_setup
from scripted import Client, gateway
from tests.support.qos import QOS_BE
from tests.support.ubrb_frames import advertise, hello, publish, subscribe


def ready(gw, n=1):
    out = []
    for _ in range(n):
        c = Client(gw)
        c.send(hello())
        c.frames()
        out.append(c)
    return out


def test_one_slot_per_topic_ref_counted_across_clients():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/odom"))
    b.send(advertise(7, "/odom"))
    assert ros.names() == ["advertise"]
    a.send(U.encode_json_frame(U.OP_UNADVERTISE, {"id": 1}))
    assert ros.names() == ["advertise"]  # b still holds it
    b.close()
    assert ros.names() == ["advertise", "unadvertise"]


def test_subscriptions_are_shared_the_same_way():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(subscribe(1, "/cmd_vel"))
    b.send(subscribe(1, "/cmd_vel"))
    assert ros.names() == ["subscribe"]
    a.close()
    b.send(U.encode_json_frame(U.OP_UNSUBSCRIBE, {"id": 1}))
    assert ros.names() == ["subscribe", "unsubscribe"]


def test_type_conflict_and_qos_conflict():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/x", "std_msgs/msg/String"))
    b.send(advertise(1, "/x", "std_msgs/msg/Int32"))
    b.send(advertise(2, "/x", "std_msgs/msg/String", QOS_BE))
    b.send(subscribe(1, "/x", "std_msgs/msg/Int32"))  # the other table counts too
    assert b.errors() == [("type_conflict", 1), ("qos_conflict", 2), ("type_conflict", 1)]
    b.send(publish(1, b"x"))
    assert b.errors() == [("unknown_id", 1)]
    assert ros.names() == ["advertise"]


def test_disconnect_releases_everything_the_connection_registered():
    gw, ros = gateway()
    (a,) = ready(gw)
    a.send(advertise(1, "/a") + advertise(2, "/b") + subscribe(1, "/c"))
    ros.take()
    a.close()
    assert sorted(ros.names()) == ["unadvertise", "unadvertise", "unsubscribe"]
    assert gw.pubs.used() == 0 and gw.subs.used() == 0
    # The slot table and the client entry are reusable.
    (b,) = ready(gw)
    b.send(advertise(1, "/a", "std_msgs/msg/Int32"))
    assert b.errors() == []


def test_message_fans_out_to_every_subscribed_client_with_its_own_id():
    gw, ros = gateway()
    a, b, c = ready(gw, 3)
    a.send(subscribe(3, "/cmd_vel"))
    b.send(subscribe(5, "/cmd_vel") + subscribe(6, "/cmd_vel"))
    c.send(subscribe(1, "/other"))
    slot = gw.subs.find("/cmd_vel")
    gw.ros_message(slot, b"..\x00\x01\x00\x00twist", 2, 9)
    assert a.frames() == [(U.OP_MESSAGE, b"\x03\x00\x00\x00\x00\x01\x00\x00twist")]
    assert b.frames() == [
        (U.OP_MESSAGE, b"\x05\x00\x00\x00\x00\x01\x00\x00twist"),
        (U.OP_MESSAGE, b"\x06\x00\x00\x00\x00\x01\x00\x00twist"),
    ]
    assert c.frames() == []


def test_sub_count_goes_to_affected_clients_at_most_every_half_second():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/odom") + advertise(2, "/tf"))
    b.send(advertise(4, "/scan"))
    odom = gw.pubs.find("/odom")
    gw.ros_sub_count(odom, 1)
    gw.tick(1000)
    assert a.json_frames(U.OP_SUB_COUNT) == [{"counts": {"1": 1}}]
    assert b.frames() == []
    gw.ros_sub_count(odom, 2)
    gw.tick(1200)
    assert a.frames() == []  # within 0.5 s of the last report
    gw.ros_sub_count(gw.pubs.find("/tf"), 0)
    gw.tick(1499)
    assert a.frames() == []
    gw.tick(1500)
    assert a.json_frames(U.OP_SUB_COUNT) == [{"counts": {"1": 2, "2": 0}}]
    gw.ros_sub_count(odom, 2)  # unchanged: nothing to say
    gw.tick(3000)
    assert a.frames() == []


def test_late_advertiser_learns_the_known_count():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/odom"))
    gw.ros_sub_count(gw.pubs.find("/odom"), 3)
    gw.tick(100)
    b.send(advertise(9, "/odom"))
    gw.tick(200)
    assert b.json_frames(U.OP_SUB_COUNT) == [{"counts": {"9": 3}}]


def test_ros_refusal_reaches_every_registered_client_and_frees_the_slot():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/bad", "nope/msg/Nope"))
    b.send(advertise(2, "/bad", "nope/msg/Nope"))
    slot = gw.pubs.find("/bad")
    gw.ros_result("pub", slot, "unknown_type", "nope/msg/Nope is not a known interface")
    assert a.errors() == [("unknown_type", 1)]
    assert b.errors() == [("unknown_type", 2)]
    assert gw.pubs.used() == 0
    a.send(publish(1, b"x"))
    assert a.errors() == [("unknown_id", 1)]
    gw.ros_result("sub", 0, "invalid_topic", "ignored: no such slot")
    assert a.errors() == [] and b.errors() == []


def test_sub_refusal_reaches_subscribers():
    gw, ros = gateway()
    (a,) = ready(gw)
    a.send(subscribe(4, "bad name"))
    gw.ros_result("sub", gw.subs.find("bad name"), "invalid_topic", "not absolute")
    assert a.errors() == [("invalid_topic", 4)]
    assert gw.subs.used() == 0


def test_registrations_wait_for_the_ros_side_and_are_handed_over_on_every_up():
    gw, ros = gateway(ros_up=False)
    (a,) = ready(gw)
    a.send(advertise(1, "/a") + subscribe(2, "/b") + publish(1, b"lost"))
    assert ros.calls == []
    assert gw.counters()["dropped_no_ros"] == 1
    ros.up()
    assert sorted(ros.names()) == ["advertise", "subscribe"]
    ros.take()
    gw.ros_down()
    a.send(publish(1, b"also lost"))
    ros.up()  # a restarted companion gets everything again
    assert sorted(ros.names()) == ["advertise", "subscribe"]
    a.send(publish(1, b"delivered"))
    assert ros.calls[-1] == ("publish", 0, b"delivered", 1)


def test_message_too_large_for_the_ros_side_is_refused_at_the_gateway():
    gw, ros = gateway()
    ros.max = 8
    ros.up()
    (a,) = ready(gw)
    a.send(advertise(1, "/img"))
    a.send(publish(1, bytes(9)) + publish(1, bytes(9)))
    a.send(publish(1, bytes(8)))
    assert a.errors() == [("message_too_large", 1)]
    assert ros.published == 1


def test_ros_error_on_a_subscription_is_rate_limited_and_keeps_it():
    gw, ros = gateway()
    (a,) = ready(gw)
    a.send(subscribe(2, "/camera"))
    slot = gw.subs.find("/camera")
    for t in (0, 30, 60):
        gw.now = t
        gw.ros_error("sub", slot, "message_too_large", "frame of 9 MiB dropped")
    assert a.errors() == [("message_too_large", 2)]
    gw.ros_message(slot, b"ok", 0, 2)
    assert a.frames() == [(U.OP_MESSAGE, b"\x02\x00\x00\x00ok")]


def test_ros_error_during_publish_goes_to_the_publishing_client_only():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/x"))
    b.send(advertise(2, "/x"))
    assert gw.pubs.find("/x") >= 0

    def refuse(slot_, buf, off, n, reliable):
        gw.ros_error("pub", slot_, "message_too_large", "link refused it")

    ros.publish = refuse
    b.send(publish(2, b"big"))
    assert b.errors() == [("message_too_large", 2)]
    assert a.errors() == []


def test_clients_of_this_gateway_count_as_subscribers():
    # The companion reports foreign ROS subscribers only; a UE client listening to the same topic
    # through this gateway is a subscriber too, or the publishing client would skip its data.
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/cmd_vel"))
    gw.ros_sub_count(gw.pubs.find("/cmd_vel"), 0)
    gw.tick(1000)
    assert a.json_frames(U.OP_SUB_COUNT) == [{"counts": {"1": 0}}]
    b.send(subscribe(2, "/cmd_vel"))
    gw.tick(2000)
    assert a.json_frames(U.OP_SUB_COUNT) == [{"counts": {"1": 1}}]
    b.close()
    gw.tick(3000)
    assert a.json_frames(U.OP_SUB_COUNT) == [{"counts": {"1": 0}}]


def test_releases_during_an_outage_reach_the_ros_side_when_it_is_back():
    # A resumed link session still holds the entities: what was released meanwhile must be
    # released there too, before the live registrations are handed over again.
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/a") + subscribe(2, "/b"))
    b.send(advertise(1, "/c"))
    ros.take()
    gw.ros_down()
    a.close()
    assert ros.calls == []
    ros.up()
    calls = ros.take()
    assert calls[:2] == [("unadvertise", 0), ("unsubscribe", 0)]
    assert calls[2:] == [("advertise", 1, "/c", "std_msgs/msg/String", "reliable")]
    gw.ros_down()
    ros.up()
    assert ros.names() == ["advertise"]  # owed once, not forever


def test_depth_0_and_1_are_the_same_qos():
    gw, ros = gateway()
    a, b = ready(gw, 2)
    a.send(advertise(1, "/x", qos={"reliability": "reliable", "durability": "volatile", "depth": 0}))
    b.send(advertise(1, "/x", qos={"reliability": "reliable", "durability": "volatile", "depth": 1}))
    assert b.errors() == []


# ---------------------------------------------------------------------------------------------
# The Registry unit on its own: rules and reference counts, no Gateway around it
# ---------------------------------------------------------------------------------------------
def _registry_and_clients(n=2):
    p = ubrb_setup.make_profile("mcu", {"max_pubs": 2, "max_subs": 2, "max_topics": 2})
    return U.Registry(p["max_topics"]), [U.ClientSession(i, p) for i in range(n)]


def _refused(fn, *args):
    try:
        fn(*args)
    except U.Refused as e:
        return e.code
    raise AssertionError("not refused")


QOS_R = {"reliability": "reliable", "durability": "volatile", "depth": 10}


def test_registry_shares_a_slot_and_frees_it_with_its_last_holder():
    reg, (a, b) = _registry_and_clients()
    s1 = reg.register(a, U.PUB, 1, "/odom", "nav_msgs/msg/Odometry", QOS_R)
    s2 = reg.register(b, U.PUB, 9, "/odom", "nav_msgs/msg/Odometry", QOS_R)
    assert s1 == s2 and reg.holders(U.PUB, s1) == 2
    assert reg.next_on(a, U.PUB, s1, 0) == 0 and reg.next_on(a, U.PUB, s1, 1) == -1
    assert reg.release(a, U.PUB, 0) == -1  # b still holds it
    assert reg.holds(U.PUB, s1)
    assert reg.release(b, U.PUB, reg.find(b, U.PUB, 9)) == s1  # the last holder: slot is free
    assert not reg.holds(U.PUB, s1) and reg.pubs.used() == 0


def test_registry_rules_refuse_with_the_spec_codes():
    reg, (a, b) = _registry_and_clients()
    reg.register(a, U.SUB, 1, "/scan", "sensor_msgs/msg/LaserScan", QOS_R)
    assert _refused(reg.register, a, U.SUB, 1, "/x", "std_msgs/msg/Empty", QOS_R) == "duplicate_id"
    assert _refused(reg.register, b, U.PUB, 1, "/scan", "std_msgs/msg/String", QOS_R) == (
        "type_conflict")
    be = {"reliability": "best_effort", "durability": "volatile", "depth": 1}
    assert _refused(reg.register, b, U.SUB, 1, "/scan", "sensor_msgs/msg/LaserScan", be) == (
        "qos_conflict")
    reg.register(a, U.SUB, 2, "/b", "std_msgs/msg/Empty", QOS_R)
    assert _refused(reg.register, a, U.SUB, 3, "/c", "std_msgs/msg/Empty", QOS_R) == (
        "resource_exhausted")  # 2 ids per client
    assert _refused(reg.register, b, U.SUB, 3, "/c", "std_msgs/msg/Empty", QOS_R) == (
        "resource_exhausted")  # 2 topic slots
    # Refusals changed nothing: two slots, one holder each, and a's per-slot counts match.
    assert reg.subs.used() == 2
    assert reg.holders(U.SUB, reg.subs.find("/scan")) == 1
    assert a.sub_refs[reg.subs.find("/scan")] == 1 and b.sub_refs[reg.subs.find("/scan")] == 0
