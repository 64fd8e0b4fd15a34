"""Companion + DdsBackend against real Cyclone DDS (loopback only, see conftest.py)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from cyclonedds._clayer import ddspy_take
from cyclonedds.builtin import BuiltinTopicDcpsPublication
from cyclonedds.builtin import BuiltinDataReader
from cyclonedds.core import InstanceState
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from rosbags.typesys import Stores, get_typestore

from tests.support import ros_idl as I
from ros_helpers import TEST_DOMAIN, RecordingSink
from tests.support.procs import wait_for
from ros_side.companion import SESSION_LINGER_MS, Companion
from tests.support.qos import QOS_BE, QOS_LATCH, QOS_R

HERE = os.path.dirname(os.path.abspath(__file__))
STORE = get_typestore(Stores.ROS2_HUMBLE)
T = STORE.types



def padded(data):
    """What a DDS reader gets for `data`: zero-padded to 4 bytes, the pad count in the options."""
    pad = -len(data) % 4
    if not pad:
        return data
    b = bytearray(data + b"\0" * pad)
    b[3] |= pad
    return bytes(b)

def dqos(reliable=True, transient_local=False, depth=10):
    return Qos(Policy.Reliability.Reliable(10 ** 9) if reliable else Policy.Reliability.BestEffort,
               Policy.Durability.TransientLocal if transient_local else Policy.Durability.Volatile,
               Policy.History.KeepLast(depth))


@pytest.fixture
def comp(dds_backend, sink):
    c = Companion(dds_backend, sink, max_message=8 * 1024 * 1024, diagnostics_period_ms=0)
    yield c
    c.close(close_backend=False)


def ser(msg, name):
    return bytes(STORE.serialize_cdr(msg, name))


def header(frame="f", sec=1, nanosec=2):
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec),
                                    frame_id=frame)


def tf_msg(child="base", x=1.0):
    G = "geometry_msgs/msg/"
    ts = T[G + "TransformStamped"](
        header=header("world"), child_frame_id=child,
        transform=T[G + "Transform"](translation=T[G + "Vector3"](x=x, y=2.0, z=3.0),
                                     rotation=T[G + "Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)))
    return T["tf2_msgs/msg/TFMessage"](transforms=[ts])


def image(n):
    return T["sensor_msgs/msg/Image"](header=header("cam"), height=1, width=n, encoding="mono8",
                                      is_bigendian=0, step=n,
                                      data=(np.arange(n) % 253).astype(np.uint8))


def twist():
    V = T["geometry_msgs/msg/Vector3"]
    return T["geometry_msgs/msg/Twist"](linear=V(x=0.5, y=0.0, z=0.0), angular=V(x=0.0, y=0.0, z=-1.25))


CASES = [
    ("std_msgs/msg/String", I.String, lambda: T["std_msgs/msg/String"](data="hello ros"),
     lambda o: o.data == "hello ros"),
    ("geometry_msgs/msg/Twist", I.Twist, twist,
     lambda o: (o.linear.x, o.angular.z) == (0.5, -1.25)),
    ("sensor_msgs/msg/Image", I.Image, lambda: image(1024 * 1024 + 3),
     lambda o: len(o.data) == 1024 * 1024 + 3 and o.data[300] == 300 % 253 and o.encoding == "mono8"),
    ("tf2_msgs/msg/TFMessage", I.TFMessage, tf_msg,
     lambda o: o.transforms[0].child_frame_id == "base" and o.transforms[0].transform.rotation.w == 1.0),
]


@pytest.mark.parametrize("rtype,cls,make,check", CASES, ids=[c[0] for c in CASES])
def test_publish_reaches_independent_reader(comp, sink, dp, rtype, cls, make, check):
    topic = "/rt_" + rtype.split("/")[-1].lower()
    t = Topic(dp, "rt" + topic, cls)
    typed = DataReader(dp, t, qos=dqos())
    raw_reader = DataReader(dp, t, qos=dqos())
    comp.advertise(1, topic, rtype, QOS_R)
    assert sink.results() == [("pub", 1, None)]
    # the companion's writer is discovered by both readers
    assert wait_for(lambda: typed.get_subscription_matched_status().current_count == 1)
    data = ser(make(), rtype)
    comp.publish(1, bytearray(b"xx" + data + b"yy"), 2, len(data), True)
    got = wait_for(lambda: typed.take(10))
    assert len(got) == 1 and check(got[0])           # the type matches: typed take decodes it
    raw = wait_for(lambda: ddspy_take(raw_reader._ref, 0xFFFF, 10))
    # and the bytes are untouched (plus zero padding to a multiple of 4, see backends/dds.py)
    assert raw[0][0] == padded(data)
    assert comp.stats["pub_msgs"] == 1


@pytest.mark.parametrize("rtype,cls,make,check", CASES, ids=[c[0] for c in CASES])
def test_independent_writer_reaches_subscription(comp, sink, dp, rtype, cls, make, check):
    topic = "/in_" + rtype.split("/")[-1].lower()
    w = DataWriter(dp, Topic(dp, "rt" + topic, cls), qos=dqos())
    comp.subscribe(7, topic, rtype, QOS_R)
    assert sink.results() == [("sub", 7, None)]
    assert wait_for(lambda: w.get_publication_matched_status().current_count == 1)
    data = ser(make(), rtype)
    sample = cls.deserialize(data)
    w.write(sample)
    assert wait_for(lambda: sink.messages(7), poll=comp.poll)
    got = sink.messages(7)[0]
    assert check(cls.deserialize(got))
    # DataWriter.write pads its own serialization to a multiple of 4: same CDR, maybe + zeros
    assert got[:len(data)] == data and set(got[len(data):]) <= {0} and len(got) % 4 == 0
    assert STORE.deserialize_cdr(got, rtype) is not None


def test_raw_bytes_across_processes(comp, sink):
    """Companion -> another process -> companion, over the loopback wire, 1 MiB+ image."""
    rtype = "sensor_msgs/msg/Image"
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "dds_echo.py"), str(TEST_DOMAIN),
                          "/wire_out", "/wire_back", rtype, "3"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        comp.advertise(1, "/wire_out", rtype, QOS_R)
        comp.subscribe(1, "/wire_back", rtype, QOS_R)
        assert wait_for(lambda: sink.counts(1) == [1], poll=comp.poll)  # the echo's reader
        big = ser(image(1024 * 1024 + 1), rtype)       # fragmented; length not a multiple of 4
        small = ser(image(8), rtype)                   # one datagram; a multiple of 4
        odd = ser(image(9), rtype)                     # one datagram; not a multiple of 4
        assert len(big) % 4 and len(small) % 4 == 0 and len(odd) % 4
        for data in (big, small, odd):
            comp.publish(1, data, 0, len(data), True)
        assert wait_for(lambda: len(sink.messages(1)) == 3, timeout=10, poll=comp.poll)
        back_big, back_small, back_odd = sink.messages(1)
        # the backend pads to a multiple of 4 with zeros (an RTPS DATA payload is 4-aligned and
        # Cyclone would otherwise append whatever is in its buffer); the CDR is untouched
        assert back_big == padded(big)
        assert back_small == small
        assert back_odd == padded(odd)
        assert p.wait(10) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_errors(comp, sink):
    comp.advertise(1, "/err_ok", "std_msgs/msg/String", QOS_R)
    comp.advertise(2, "chat~ter", "std_msgs/msg/String", QOS_R)           # '~' not first
    comp.advertise(3, "/a//b", "std_msgs/msg/String", QOS_R)
    comp.advertise(4, "/err_t", "std_msgs/msg/Nope", QOS_R)               # not an interface
    comp.advertise(5, "/err_t", "not a type", QOS_R)                      # malformed
    comp.subscribe(1, "/err_ok", "geometry_msgs/msg/Twist", QOS_R)        # other type than pub
    comp.advertise(6, "/err_ok", "std_msgs/msg/String", QOS_BE)             # same topic, other qos
    comp.advertise(7, "/err_ok", "std_msgs/String", {"reliability": "reliable",
                                                      "durability": "volatile", "depth": 10})
    comp.advertise(8, "/err_q", "std_msgs/msg/String", {"reliability": "sometimes"})
    comp.subscribe(2, "/err_s", "nopkg/msg/X", QOS_R)
    comp.advertise(9, "/err_ok", "std_msgs/msg/Bool", QOS_R)              # pub vs pub type
    assert sink.results() == [
        ("pub", 1, None), ("pub", 2, "invalid_topic"), ("pub", 3, "invalid_topic"),
        ("pub", 4, "unknown_type"), ("pub", 5, "unknown_type"), ("sub", 1, "type_conflict"),
        ("pub", 6, "qos_conflict"), ("pub", 7, None), ("pub", 8, "qos_conflict"),
        ("sub", 2, "unknown_type"), ("pub", 9, "type_conflict")]
    assert all(c[4] for c in sink.of("result") if c[3])               # every error has a message
    d = comp.diagnostics()
    assert d["pub_slots"] == 2 and d["pub_topics"] == 1                # slots 1 and 7 share a writer


def test_sub_count_follows_reader(comp, sink, dp):
    comp.advertise(3, "/count_me", "std_msgs/msg/String", QOS_R)
    comp.subscribe(3, "/count_me", "std_msgs/msg/String", QOS_R)        # our own reader: not counted
    assert wait_for(lambda: sink.counts(3) == [0], poll=comp.poll)
    r = DataReader(dp, Topic(dp, "rt/count_me", I.String), qos=dqos())
    assert wait_for(lambda: sink.counts(3) == [0, 1], poll=comp.poll)
    r2 = DataReader(dp, Topic(dp, "rt/count_me", I.String), qos=dqos(reliable=False))
    assert wait_for(lambda: sink.counts(3) == [0, 1, 2], poll=comp.poll)
    r.__del__()
    r2.__del__()
    assert wait_for(lambda: sink.counts(3) == [0, 1, 2, 0], poll=comp.poll)


def test_unadvertise_leaves_discovery(comp, sink, dp):
    r = DataReader(dp, Topic(dp, "rt/going_away", I.String), qos=dqos())
    pubs = BuiltinDataReader(dp, BuiltinTopicDcpsPublication)

    def writers():
        # DCPSPublication: one instance per writer; a deleted writer's instance is not alive
        return {s.key for s in pubs.read(1000) if s.topic_name == "rt/going_away"
                and s.sample_info.instance_state == InstanceState.Alive}
    comp.advertise(4, "/going_away", "std_msgs/msg/String", QOS_R)
    assert wait_for(lambda: r.get_subscription_matched_status().current_count == 1)
    assert wait_for(lambda: len(writers()) == 1)
    comp.unadvertise(4)
    # the released writer lingers 250 ms for reuse (Companion linger_ms), deleted by a poll after
    assert wait_for(lambda: r.get_subscription_matched_status().current_count == 0,
                    poll=comp.poll)
    assert wait_for(lambda: len(writers()) == 0)
    comp.unadvertise(4)  # unknown slot: ignored


def test_transient_local_late_joiner(comp, sink, dp):
    comp.advertise(5, "/tf_static_t", "tf2_msgs/msg/TFMessage", QOS_LATCH)
    data = ser(tf_msg("laser", 4.0), "tf2_msgs/msg/TFMessage")
    comp.publish(5, data, 0, len(data), True)
    time.sleep(0.05)
    late = DataReader(dp, Topic(dp, "rt/tf_static_t", I.TFMessage), qos=dqos(True, True, 1))
    got = wait_for(lambda: late.take(10))
    assert got and got[0].transforms[0].child_frame_id == "laser"
    assert got[0].transforms[0].transform.translation.x == 4.0
    # a volatile late reader does not get it (the durability is really transient_local's doing)
    vol = DataReader(dp, Topic(dp, "rt/tf_static_t", I.TFMessage), qos=dqos(True, False, 10))
    assert wait_for(lambda: vol.get_subscription_matched_status().current_count == 1)
    # the event: a message published now reaches it (the union of the frames: laser, camera);
    # the old one, laser alone, would have come first
    data = ser(tf_msg("camera", 5.0), "tf2_msgs/msg/TFMessage")
    comp.publish(5, data, 0, len(data), True)
    got = wait_for(lambda: vol.take(10))
    assert [sorted(t.child_frame_id for t in m.transforms) for m in got] == [["camera", "laser"]]


def test_message_too_large_rate_limited(dds_backend, sink, dp):
    comp = Companion(dds_backend, sink, max_message=100, diagnostics_period_ms=0)
    try:
        w = DataWriter(dp, Topic(dp, "rt/camera_big", I.String), qos=dqos(depth=100))
        comp.subscribe(9, "/camera_big", "std_msgs/msg/String", {"depth": 100})
        assert wait_for(lambda: w.get_publication_matched_status().current_count == 1)
        small = I.String(data="ok")
        for _ in range(30):
            w.write(I.String(data="x" * 200))
        w.write(small)
        now = 1_000_000
        assert wait_for(lambda: sink.messages(9), poll=lambda: comp.poll(now))
        errs = sink.of("error")
        assert len(errs) == 1 and errs[0][1:4] == ("sub", 9, "message_too_large")
        assert comp.stats["too_large_drops"] == 30
        for _ in range(5):
            w.write(I.String(data="y" * 300))
        wait_for(lambda: comp.stats["too_large_drops"] == 35, poll=lambda: comp.poll(now + 500))
        assert len(sink.of("error")) == 1                 # still inside the second
        comp.poll(now + 1000)
        errs = sink.of("error")
        assert len(errs) == 2 and "5 dropped" in errs[1][4]
        assert sink.messages(9)[0][:4] == b"\x00\x01\x00\x00"
    finally:
        comp.close(close_backend=False)


def test_reset_releases_everything(comp, sink, dp):
    r = DataReader(dp, Topic(dp, "rt/reset_pub", I.String), qos=dqos())
    w = DataWriter(dp, Topic(dp, "rt/reset_sub", I.String), qos=dqos())
    comp.advertise(1, "/reset_pub", "std_msgs/msg/String", QOS_R)
    comp.subscribe(1, "/reset_sub", "std_msgs/msg/String", QOS_R)
    assert wait_for(lambda: r.get_subscription_matched_status().current_count == 1
                    and w.get_publication_matched_status().current_count == 1)
    comp.poll(1000)
    comp.reset()      # they linger for the gateway's next session (SESSION_LINGER_MS) ...
    comp.poll(1000 + SESSION_LINGER_MS)    # ... and go when it did not take them again
    assert wait_for(lambda: r.get_subscription_matched_status().current_count == 0
                    and w.get_publication_matched_status().current_count == 0)
    d = comp.diagnostics()
    assert (d["pub_slots"], d["sub_slots"], d["pub_topics"], d["sub_topics"]) == (0, 0, 0, 0)
    # a new session can register the same slots again
    comp.advertise(1, "/reset_pub", "std_msgs/msg/String", QOS_R)
    assert sink.results()[-1] == ("pub", 1, None)


def test_diagnostics_published(dds_backend, sink, dp):
    r = DataReader(dp, Topic(dp, "rt/diagnostics", _diag_cls()), qos=dqos())
    comp = Companion(dds_backend, sink, max_message=1000, diagnostics_period_ms=1000)
    try:
        comp.gateway_stats({"clients": 2, "frames_in": 10})
        comp.set_stats("link", {"crc_errors": 1})
        comp.poll(0)
        raw = wait_for(lambda: ddspy_take(r._ref, 0xFFFF, 10))
        msg = STORE.deserialize_cdr(raw[0][0], "diagnostic_msgs/msg/DiagnosticArray")
        names = [s.name for s in msg.status]
        assert names == ["/ros_side: companion", "/ros_side: gateway", "/ros_side: link"]
        gw = {kv.key: kv.value for kv in msg.status[1].values}
        assert gw == {"clients": "2", "frames_in": "10"}
        own = {kv.key: kv.value for kv in msg.status[0].values}
        assert own["backend"] == "dds" and own["distro"] == "humble" and "queue_drops" in own
        comp.poll(500)
        comp.poll(999)
        comp.poll(1000)                                       # once a second: only this one
        comp.gateway_stats({"clients": 3, "frames_in": 10})
        comp.poll(2000)                                       # the marker: its clients is 3
        taken = []

        def clients_of(cdr):
            m = STORE.deserialize_cdr(cdr, "diagnostic_msgs/msg/DiagnosticArray")
            return {kv.key: kv.value for kv in m.status[1].values}["clients"]

        def marker_seen():
            taken.extend(d for d, _ in (ddspy_take(r._ref, 0xFFFF, 10) or []))
            return any(clients_of(d) == "3" for d in taken)
        assert wait_for(marker_seen)
        assert [clients_of(d) for d in taken] == ["2", "3"]
        # a client cannot take /diagnostics with another type
        comp.advertise(1, "/diagnostics", "std_msgs/msg/String", QOS_R)
        assert sink.results()[-1] == ("pub", 1, "type_conflict")
    finally:
        comp.close(close_backend=False)


def _diag_cls():
    from ros_side.dds_types import TypeRegistry
    return TypeRegistry("humble").idl_type("diagnostic_msgs/msg/DiagnosticArray")


def test_jazzy_endpoints_carry_type_hash(dp):
    from ros_side.backends.dds import DdsBackend
    jazzy = DdsBackend(domain=TEST_DOMAIN, distro="jazzy")
    try:
        h = jazzy.create_publisher("/hashed", "std_msgs/msg/String", QOS_R)
        pubs = BuiltinDataReader(dp, BuiltinTopicDcpsPublication)

        def user_data():
            for s in pubs.read(1000):
                if s.topic_name == "rt/hashed" and s.type_name == "std_msgs::msg::dds_::String_":
                    ud = s.qos[Policy.Userdata]
                    return ud.data if ud else b""
            return None
        assert wait_for(user_data) == (
            b"typehash=RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18;")
        jazzy.destroy_publisher(h)
    finally:
        jazzy.close()


def test_reliable_messages_wait_for_link_room_and_none_is_lost(dds_backend, dp):
    """Issue 12 (ROS -> client): while the link cannot take a reliable message, the companion
    keeps it (in order) and, once its small queue is full, stops taking from the DDS reader, so
    the writer's reliable burst waits in DDS; when room comes back every sample is delivered,
    once, in order, with no queue drop (within the subscription's depth, which is what a DDS
    reader keeps). A best-effort subscription keeps flowing meanwhile."""
    class LinkSink(RecordingSink):
        open = False

        def room(self, n):
            return self.open

    sink = LinkSink()
    # Depth 1000 x the largest message must fit the history budget (issue 13): with the default
    # 64 MiB messages it would not (resource_exhausted); these messages are a few bytes.
    comp = Companion(dds_backend, sink, max_message=64 * 1024, diagnostics_period_ms=0,
                     queue_limit=8)
    try:
        w = DataWriter(dp, Topic(dp, "rt/bp_rel", I.String),
                       qos=Qos(Policy.Reliability.Reliable(10 ** 10), Policy.History.KeepAll))
        wb = DataWriter(dp, Topic(dp, "rt/bp_be", I.String), qos=dqos(reliable=False, depth=1))
        # the subscription's depth is what DDS keeps for a paused reader (KEEP_LAST semantics)
        comp.subscribe(3, "/bp_rel", "std_msgs/msg/String", {"depth": 1000})
        comp.subscribe(4, "/bp_be", "std_msgs/msg/String",
                       {"reliability": "best_effort", "depth": 1})
        assert sink.results() == [("sub", 3, None), ("sub", 4, None)], sink.of("result")
        assert wait_for(lambda: w.get_publication_matched_status().current_count == 1
                        and wb.get_publication_matched_status().current_count == 1)
        n = 300
        for i in range(n):
            w.write(I.String(data="m%04d" % i))
        assert wait_for(lambda: comp.stats["reader_pauses"] >= 1, poll=comp.poll)
        # another reader's data wakes the backend while the reliable one is paused: it must
        # stay paused (it was taken from again, a whole batch past the bound: 64 held)
        wb.write(I.String(data="tick"))
        assert wait_for(lambda: sink.messages(4), poll=comp.poll)  # best effort passes
        assert sink.messages(3) == []                             # reliable waits
        assert comp.stats["reader_pauses"] >= 1
        assert len(comp._held) <= 8 + 32         # the bound plus at most one take batch
        sink.open = True
        assert wait_for(lambda: len(sink.messages(3)) == n, poll=comp.poll)
        got = [I.String.deserialize(m).data for m in sink.messages(3)]
        assert got == ["m%04d" % i for i in range(n)]
        assert comp.stats["queue_drops"] == 0
    finally:
        comp.close(close_backend=False)
