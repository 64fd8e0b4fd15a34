# Client sessions: every ERROR code of the spec and of the [decided] rules, timers, pipelining.
import json

import ubrb_min as U
from scripted import Client, gateway
from tests.support.qos import QOS_BE
from tests.support.ubrb_frames import advertise, hello, parse_frames, publish, subscribe


def test_hello_ack_fields_and_unknown_distro_until_ros_reports():
    gw, ros = gateway(ros_up=False)
    c = Client(gw)
    c.send(hello("ue-world"))
    (ack,) = c.json_frames(U.OP_HELLO_ACK)
    assert ack == {"protocol": 1, "server": U.SERVER_NAME, "ros_distro": "unknown",
                   "ros_ready": False}
    ros.up()
    c2 = Client(gw)
    c2.send(hello())
    ack = c2.json_frames(U.OP_HELLO_ACK)[0]
    assert ack["ros_distro"] == "humble" and ack["ros_ready"] is True


def test_hello_ack_says_unknown_again_while_the_ros_side_is_unreachable():
    gw, ros = gateway()
    gw.ros_down()
    c = Client(gw)
    c.send(hello())
    ack = c.json_frames(U.OP_HELLO_ACK)[0]
    assert ack["ros_distro"] == "unknown" and ack["ros_ready"] is False


def test_hello_ack_ros_ready_when_the_ros_side_names_no_distro():
    # a ROS side that is up but could not say its distro (an rclpy without ROS_DISTRO, before
    # the companion read it from the installation): ros_ready, not ros_distro, says it is there
    for distro in (None, "", "unknown"):
        gw, ros = gateway(ros_up=False)
        ros.distro = distro
        ros.up()
        c = Client(gw)
        c.send(hello())
        ack = c.json_frames(U.OP_HELLO_ACK)[0]
        assert ack["ros_distro"] == "unknown" and ack["ros_ready"] is True, distro


def test_ping_gets_pong():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello() + U.encode_frame(U.OP_PING, b""))
    assert [op for op, _ in c.frames()] == [U.OP_HELLO_ACK, U.OP_PONG]


def test_frames_before_hello_get_hello_required_and_register_nothing():
    gw, ros = gateway()
    c = Client(gw)
    c.send(advertise(1, "/a") + publish(1, b"x"))
    assert c.errors() == [("hello_required", None), ("hello_required", None)]
    assert not c.closing()
    assert ros.names() == []
    c.send(hello() + advertise(1, "/a"))
    assert ros.names() == ["advertise"]


def test_ping_before_hello_gets_hello_required_not_pong():
    # The spec's [decided] rule has no exception for PING (or PONG): hello_required, no PONG,
    # the connection stays and a PING after HELLO is answered.
    gw, ros = gateway()
    c = Client(gw)
    c.send(U.encode_frame(U.OP_PING, b"") + U.encode_frame(U.OP_PONG, b""))
    frames = c.frames()
    assert [op for op, _ in frames] == [U.OP_ERROR, U.OP_ERROR]
    assert [json.loads(p)["code"] for _, p in frames] == ["hello_required", "hello_required"]
    assert not c.closing()
    c.send(hello() + U.encode_frame(U.OP_PING, b""))
    assert [op for op, _ in c.frames()] == [U.OP_HELLO_ACK, U.OP_PONG]


def test_hello_deadline_is_5_s():
    gw, ros = gateway()
    c = Client(gw, now=1000)
    gw.tick(5999)
    assert not c.closing()
    gw.tick(6000)
    assert c.closing()
    assert c.errors() == [("hello_required", None)]


def test_hello_in_time_cancels_the_deadline():
    gw, ros = gateway()
    c = Client(gw, now=0)
    c.send(hello(), now=4000)
    gw.tick(9000)
    assert not c.closing()


def test_idle_for_10_s_closes():
    gw, ros = gateway()
    c = Client(gw, now=0)
    c.send(hello(), now=100)
    c.send(U.encode_frame(U.OP_PING, b""), now=5000)
    gw.tick(14999)
    assert not c.closing()
    gw.tick(15000)
    assert c.closing()


def test_unsupported_protocol_then_close():
    gw, ros = gateway()
    c = Client(gw)
    c.send(U.encode_json_frame(U.OP_HELLO, {"protocol": 2, "client": "future"}))
    assert c.errors() == [("unsupported_protocol", None)]
    assert c.closing()


def test_too_many_clients():
    gw, ros = gateway(max_clients=2)
    Client(gw)
    Client(gw)
    assert gw.accept(0) == -1
    ((op, payload),) = [(f[0], f[1]) for f in parse_frames(gw.reject_frame())]
    assert op == U.OP_ERROR
    assert json.loads(payload)["code"] == "too_many_clients"


def test_malformed_header_gets_protocol_error_and_close_others_untouched():
    gw, ros = gateway()
    a = Client(gw)
    b = Client(gw)
    a.send(hello())
    b.send(hello())
    a.frames()
    b.frames()
    a.send(b"XXXX" + bytes(8))
    assert a.errors() == [("protocol_error", None)]
    assert a.closing()
    b.send(U.encode_frame(U.OP_PING, b""))
    assert [op for op, _ in b.frames()] == [U.OP_PONG]
    assert not b.closing()


def test_client_may_not_send_bridge_only_ops():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello() + U.encode_frame(U.OP_MESSAGE, b"\x00\x00\x00\x00"))
    assert ("protocol_error", None) in c.errors()
    assert c.closing()


def test_bad_json_keeps_the_connection():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello())
    c.frames()
    c.send(U.encode_frame(U.OP_ADVERTISE, b"{not json"))
    c.send(U.encode_frame(U.OP_ADVERTISE, b"[1, 2]"))
    c.send(U.encode_json_frame(U.OP_ADVERTISE, {"id": 5, "topic": "/a"}))  # no type
    c.send(U.encode_json_frame(U.OP_ADVERTISE, {"id": 6, "topic": "/a", "type": "x/msg/Y", "qos": {"reliability": "sometimes"}}))
    assert c.errors() == [
        ("protocol_error", None),
        ("protocol_error", None),
        ("protocol_error", 5),
        ("protocol_error", 6),
    ]
    assert not c.closing()
    c.send(U.encode_frame(U.OP_PING, b""))
    assert [op for op, _ in c.frames()] == [U.OP_PONG]


def test_hello_with_bad_json_is_protocol_error_not_a_close():
    gw, ros = gateway()
    c = Client(gw)
    c.send(U.encode_frame(U.OP_HELLO, b"\xff\xfe"))
    assert c.errors() == [("protocol_error", None)]
    assert not c.closing()


def test_pipelined_registration_right_after_hello():
    gw, ros = gateway()
    c = Client(gw)
    c.send(
        hello()
        + advertise(1, "/odom", "nav_msgs/msg/Odometry")
        + advertise(2, "/tf", "tf2_msgs/msg/TFMessage", QOS_BE)
        + subscribe(1, "/cmd_vel", "geometry_msgs/msg/Twist")
        + publish(2, b"\x00\x01\x00\x00tf")
    )
    assert [op for op, _ in c.frames()] == [U.OP_HELLO_ACK]
    calls = ros.take()
    assert calls[0] == ("advertise", 0, "/odom", "nav_msgs/msg/Odometry", "reliable")
    assert calls[1] == ("advertise", 1, "/tf", "tf2_msgs/msg/TFMessage", "best_effort")
    assert calls[2] == ("subscribe", 0, "/cmd_vel", "geometry_msgs/msg/Twist", "reliable")
    assert calls[3] == ("publish", 1, b"\x00\x01\x00\x00tf", 0)


def test_unknown_id_is_dropped_and_reported_once_per_second():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello())
    c.frames()
    for t in (0, 10, 999):
        c.send(publish(9, b"x"), now=t)
    c.send(publish(8, b"x"), now=999)
    assert c.errors() == [("unknown_id", 9), ("unknown_id", 8)]
    c.send(publish(9, b"x"), now=1000)
    assert c.errors() == [("unknown_id", 9)]
    assert ros.published == 0


def test_duplicate_id_changes_nothing():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello() + advertise(1, "/a") + advertise(1, "/b") + subscribe(1, "/c") + subscribe(1, "/d"))
    assert c.errors() == [("duplicate_id", 1), ("duplicate_id", 1)]
    assert [x[2] for x in ros.take()] == ["/a", "/c"]
    c.send(publish(1, b"data"))
    assert ros.last_slot == gw.pubs.find("/a")


def test_unregister_of_unknown_id():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello() + U.encode_json_frame(U.OP_UNADVERTISE, {"id": 3}))
    c.send(U.encode_json_frame(U.OP_UNSUBSCRIBE, {"id": 4}))
    assert c.errors() == [("unknown_id", 3), ("unknown_id", 4)]


def test_ids_per_client_are_bounded_with_a_clear_error():
    gw, ros = gateway(max_pubs=2)
    c = Client(gw)
    c.send(hello() + advertise(1, "/a") + advertise(2, "/b") + advertise(3, "/c"))
    errs = c.json_frames(U.OP_ERROR)
    assert [(e["code"], e["id"]) for e in errs] == [("resource_exhausted", 3)]
    assert "--max-pubs" in errs[0]["message"]


def test_topic_slots_are_bounded_with_a_clear_error():
    gw, ros = gateway(max_topics=2, max_pubs=4)
    c = Client(gw)
    c.send(hello() + advertise(1, "/a") + advertise(2, "/b") + advertise(3, "/c"))
    errs = c.json_frames(U.OP_ERROR)
    assert [(e["code"], e["id"]) for e in errs] == [("resource_exhausted", 3)]
    assert "--max-topics" in errs[0]["message"]
    # Freeing a slot makes room again.
    c.send(U.encode_json_frame(U.OP_UNADVERTISE, {"id": 1}) + advertise(4, "/c"))
    assert c.errors() == []


def test_second_hello_is_answered_and_keeps_registrations():
    gw, ros = gateway()
    c = Client(gw)
    c.send(hello() + advertise(1, "/a") + hello())
    assert [op for op, _ in c.frames()] == [U.OP_HELLO_ACK, U.OP_HELLO_ACK]
    c.send(publish(1, b"x"))
    assert ros.published == 1


def test_a_closing_client_that_stops_reading_is_cut_off_after_2_s():
    gw, ros = gateway()
    c = Client(gw, now=0)
    gw.tick(5000)  # no HELLO: ERROR hello_required, then close once it is flushed
    assert c.closing()
    assert not gw.close_overdue(c.ci, 6999)  # the port keeps trying to flush it
    assert gw.close_overdue(c.ci, 7000)  # ...but not forever: the peer stopped reading


def test_what_the_port_waits_for_on_a_client_socket():
    # Both ports ask the core (interest, flushed_close) instead of deciding it themselves.
    gw, ros = gateway()
    c = Client(gw)
    assert gw.interest(c.ci) == U.WANT_READ  # nothing queued: read only
    c.send(hello())
    assert gw.interest(c.ci) == U.WANT_READ | U.WANT_WRITE  # HELLO_ACK queued
    c.frames()
    c.send(U.encode_frame(U.OP_HELLO, b'{"protocol": 9}'))  # unsupported: ERROR, then close
    assert c.closing() and gw.interest(c.ci) == U.WANT_WRITE  # no more reading, flush first
    assert not gw.flushed_close(c.ci)  # its ERROR is still queued
    c.frames()
    assert gw.flushed_close(c.ci)  # sent: the port closes the socket now
