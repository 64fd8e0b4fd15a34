"""Companion logic with a scripted in-memory backend (no DDS)."""

import select
import threading

from ros_side.companion import Companion
from ros_side.errors import RosError
from tests.support.fake_backend import FakeBackend
from tests.support.qos import QOS_R


def test_start_reports_up(sink):
    c = Companion(FakeBackend(), sink, max_message=1234, diagnostics_period_ms=0)
    c.start()
    assert sink.calls == [("up", "humble", 1234)] and c.max_message() == 1234
    c.set_max_message(99)
    assert c.max_message() == 99


def test_queue_is_bounded_and_wakes(sink):
    b = FakeBackend()
    c = Companion(b, sink, diagnostics_period_ms=0, queue_limit=3)
    c.subscribe(1, "/s", "std_msgs/msg/String", QOS_R)
    assert select.select([c.wake_fd()], [], [], 0)[0] == []
    t = threading.Thread(target=lambda: [b.callbacks["/s"](b"\0\1\0\0%d" % i) for i in range(5)])
    t.start()
    t.join()
    assert select.select([c.wake_fd()], [], [], 1)[0] == [c.wake_fd()]
    assert c.diagnostics()["queue_len"] == 3 and c.stats["queue_drops"] == 2
    c.poll(0)
    assert sink.messages(1) == [b"\0\1\0\0%d" % i for i in range(3)]
    assert select.select([c.wake_fd()], [], [], 0)[0] == []


def test_reregistration_and_release(sink):
    b = FakeBackend()
    c = Companion(b, sink, diagnostics_period_ms=0)
    c.poll(0)
    c.advertise(1, "/a", "std_msgs/msg/String", QOS_R)
    c.advertise(1, "/a", "std_msgs/String", dict(QOS_R, depth=10))   # the same again (after ros_up)
    assert len(b.created) == 1 and sink.results() == [("pub", 1, None)] * 2
    c.advertise(1, "/b", "std_msgs/msg/String", QOS_R)               # slot reused for another topic
    c.poll(249)
    assert b.destroyed == [] and len(b.created) == 2                 # /a's writer lingers 250 ms
    c.poll(250)
    assert b.destroyed == [b.created[0]]
    c.advertise(2, "/b", "std_msgs/msg/String", dict(QOS_R, depth=1))
    c.advertise(3, "/c", "std_msgs/msg/String", dict(QOS_R, depth=0))
    c.advertise(4, "/c", "std_msgs/msg/String", dict(QOS_R, depth=1))  # depth 0 == 1 on the wire
    assert sink.results()[-3:] == [("pub", 2, "qos_conflict"), ("pub", 3, None), ("pub", 4, None)]
    c.publish(9, b"abcd", 0, 4, True)
    assert c.stats["pub_dropped"] == 1
    b.fail = RuntimeError("boom")
    c.advertise(5, "/d", "std_msgs/msg/String", QOS_R)
    b.fail = RosError("unknown_type", "no such")
    c.advertise(6, "/e", "std_msgs/msg/String", QOS_R)
    assert sink.results()[-2:] == [("pub", 5, "unknown_type"), ("pub", 6, "unknown_type")]
    c.unadvertise(3)
    c.poll(3000)
    assert len(b.destroyed) == 1                                   # slot 4 still uses it
    c.unadvertise(4)
    c.poll(4000)
    assert len(b.destroyed) == 2


def test_counts_grace_and_changes(sink):
    b = FakeBackend()
    c = Companion(b, sink, diagnostics_period_ms=0, sub_count_interval_ms=100,
                  sub_count_grace_ms=200)
    c.advertise(1, "/a", "std_msgs/msg/String", QOS_R)
    c.poll(1000)
    c.poll(1100)
    assert sink.counts(1) == []                  # 0 inside the grace period: not yet reported
    c.poll(1200)
    assert sink.counts(1) == [0]
    b.counts["/a"] = 3
    c.poll(1250)                                 # between two count polls
    assert sink.counts(1) == [0]
    c.poll(1300)
    c.poll(1400)
    assert sink.counts(1) == [0, 3]
    c.advertise(2, "/b", "std_msgs/msg/String", QOS_R)
    b.counts["/b"] = 1
    c.poll(1401)                                 # a new slot is looked at at once
    assert sink.counts(2) == [1]


def test_unknown_group_stats_in_diagnostics(sink):
    c = Companion(FakeBackend(), sink, diagnostics_period_ms=0)
    c.gateway_stats({"clients": 3})
    d = c.diagnostics()
    assert d["gateway.clients"] == 3 and d["backend"] == "fake"


def test_dds_config_follows_the_ros_conventions_and_always_speaks_fast_dds(tmp_path):
    from ros_side.backends.dds import FASTDDS_COMPAT_XML, LOOPBACK_XML, build_config, default_domain
    compat = "," + FASTDDS_COMPAT_XML
    assert build_config({}) == FASTDDS_COMPAT_XML
    assert build_config({"ROS_LOCALHOST_ONLY": "1"}) == LOOPBACK_XML + compat
    assert build_config({"ROS_LOCALHOST_ONLY": "0"}) == FASTDDS_COMPAT_XML
    assert build_config({"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}) == LOOPBACK_XML + compat
    assert build_config({"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"}) == FASTDDS_COMPAT_XML
    # a user's CYCLONEDDS_URI wins over the ROS convention, and gets the Fast DDS settings merged
    user = "file://%s" % (tmp_path / "x.xml")
    (tmp_path / "x.xml").write_text("<CycloneDDS/>")
    assert build_config({"ROS_LOCALHOST_ONLY": "1", "CYCLONEDDS_URI": user}) == user + compat
    # ... less what it already sets itself (inline or in its file): the user's value is kept
    (tmp_path / "y.xml").write_text("<Compatibility><IgnoreTypeInformation>1.16"
                                    "</IgnoreTypeInformation></Compatibility>")
    own = "file://%s" % (tmp_path / "y.xml")
    merged = build_config({"CYCLONEDDS_URI": own})
    assert merged.startswith(own + ",") and "IgnoreTypeInformation" not in merged[len(own):]
    assert "GenerateKeyhash>true<" in merged
    every = ("<X><IgnoreTypeInformation/><GenerateKeyhash>false</GenerateKeyhash><FragmentSize/>"
             "<HeartbeatInterval/></X>")
    assert build_config({"CYCLONEDDS_URI": every}) == every
    assert "IgnoreTypeInformation>1.15<" in FASTDDS_COMPAT_XML
    assert "GenerateKeyhash>true<" in FASTDDS_COMPAT_XML
    # large samples (issue 21): rmw_fastrtps' fragment size, fast repair; a user's own sizes win
    # for both elements (our FragmentSize above their MaxMessageSize would be refused)
    assert "<FragmentSize>65000B<" in FASTDDS_COMPAT_XML and ">5ms</HeartbeatInterval>" in compat
    sized = "<X><General><MaxMessageSize>1400B</MaxMessageSize></General></X>"
    merged = build_config({"CYCLONEDDS_URI": sized})
    assert "FragmentSize" not in merged and "MaxMessageSize>65500B" not in merged
    assert "HeartbeatInterval" in merged
    assert default_domain({}) == 0 and default_domain({"ROS_DOMAIN_ID": "17"}) == 17
    assert "127.0.0.1" in LOOPBACK_XML and "<AllowMulticast>false" in LOOPBACK_XML


def test_the_merged_config_is_one_cyclone_accepts():
    """Cyclone parses the comma-joined list (a typo in the compatibility XML would not be)."""
    import subprocess
    import sys
    code = ("from cyclonedds.domain import Domain, DomainParticipant;"
            "from ros_side.backends.dds import build_config;"
            "Domain(231, build_config({'ROS_LOCALHOST_ONLY': '1'})); DomainParticipant(231)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_pad_to_4_counts_its_padding_in_the_options():
    from ros_side.backends.dds import pad_to_4
    assert pad_to_4(b"\0\1\0\0abcd") == b"\0\1\0\0abcd"
    assert pad_to_4(b"\0\1\0\0a") == b"\0\1\0\3a\0\0\0"
    assert pad_to_4(b"\0\1\0\0abc") == b"\0\1\0\1abc\0"


def test_default_distro_follows_ros_distro():
    from ros_side.backends import default_distro
    assert default_distro(None, {}) == "humble"
    assert default_distro(None, {"ROS_DISTRO": "kilted"}) == "kilted"
    assert default_distro("jazzy", {"ROS_DISTRO": "kilted"}) == "jazzy"


class IncompatibleBackend(FakeBackend):
    def __init__(self):
        FakeBackend.__init__(self)
        self.incompatible = {}

    def incompatible_qos(self, handle):
        return self.incompatible.get(handle, (0, ""))


def test_qos_incompatible_reported_once_per_5_s_per_slot(sink):
    b = IncompatibleBackend()
    c = Companion(b, sink, diagnostics_period_ms=0)
    c.advertise(1, "/m", "std_msgs/msg/String", QOS_R)
    c.subscribe(2, "/n", "std_msgs/msg/String", QOS_R)
    pub, sub = b.created
    c.poll(0)
    assert sink.of("error") == []
    b.incompatible[pub] = (1, "RELIABILITY")
    b.incompatible[sub] = (2, "DURABILITY")
    c.poll(1000)
    errs = [e[1:4] for e in sink.of("error")]
    assert errs == [("pub", 1, "qos_incompatible"), ("sub", 2, "qos_incompatible")]
    assert "RELIABILITY" in sink.of("error")[0][4] and "DURABILITY" in sink.of("error")[1][4]
    b.incompatible[pub] = (2, "RELIABILITY")     # another mismatching peer, too soon
    c.poll(3000)
    assert len(sink.of("error")) == 2
    c.poll(6000)                                 # 5 s later: reported again
    assert [e[1:4] for e in sink.of("error")][2:] == [("pub", 1, "qos_incompatible")]
    c.poll(20000)                                # nothing new: nothing more
    assert len(sink.of("error")) == 3


class PausableBackend(FakeBackend):
    """A backend that takes from its reader in batches of 32 and, once a callback said False in a
    batch, stops after that batch until resume_subscription (as the dds backend's WaitSet thread
    does). step(k) delivers the next k samples of the batch in progress: the reader thread's
    progress, interleaved with the loop thread wherever the test calls it."""

    BATCH = 32

    def __init__(self):
        super().__init__()
        self.pending = []  # samples in the "DDS reader" not taken yet
        self.batch_left = 0
        self.stop = False
        self.paused = False
        self.resumed = 0

    def step(self, topic, k=1):
        cb = self.callbacks[topic]
        for _ in range(k):
            if self.batch_left == 0:
                if self.stop:
                    self.paused, self.stop = True, False
                if self.paused or not self.pending:
                    return
                self.batch_left = min(self.BATCH, len(self.pending))
            self.batch_left -= 1
            if cb(self.pending.pop(0)) is False:
                self.stop = True

    def resume_subscription(self, h):
        self.paused = False
        self.resumed += 1


def test_a_take_batch_during_poll_still_finds_the_held_queue_full():
    # Issue 22: the held queue of reliable messages waiting for link room reached 64 with a bound
    # of 8 (two take batches): the reader thread kept taking while poll() was handing over what
    # it had taken out of the queue, and those messages, out of the queue and not yet held
    # again, did not count, so no sample of the first batch saw the queue full. Here the reader
    # delivers a sample inside each of the link's room() calls: that interleaving, every time.
    b = PausableBackend()
    b.pending = [b"\0\1\0\0m%03d" % i for i in range(200)]

    class LinkSink:
        open = False
        got: list = []

        def ros_message(self, slot, data, off, n):
            self.got.append(bytes(data[off:off + n]))

        def ros_result(self, *a):
            pass

        def room(self, n):
            b.step("/r")  # the reader thread, racing this poll
            return self.open

    sink = LinkSink()
    c = Companion(b, sink, diagnostics_period_ms=0, queue_limit=8)
    c.subscribe(3, "/r", "std_msgs/msg/String", QOS_R)
    b.step("/r", 4)
    for _ in range(40):
        c.poll(0)
        assert len(c._held) <= 8 + PausableBackend.BATCH, len(c._held)
    sink.open = True
    for _ in range(400):
        c.poll(0)
        b.step("/r", 8)
        if len(sink.got) == 200:
            break
    assert sink.got == [b"\0\1\0\0m%03d" % i for i in range(200)]  # every one, in order
    assert c.stats["queue_drops"] == 0 and b.resumed >= 1


# -- /tf_static from several clients: the union (issue 21, item 2) --------------------------------
def _tf(*frames, be=False):
    """A TFMessage CDR (rosbags' encoder) of (parent, child, x) transforms."""
    from rosbags.typesys import Stores, get_typestore
    st = get_typestore(Stores.ROS2_KILTED)
    T, G = st.types, "geometry_msgs/msg/"
    msgs = [T[G + "TransformStamped"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=7, nanosec=9),
                                        frame_id=parent),
        child_frame_id=child,
        transform=T[G + "Transform"](translation=T[G + "Vector3"](x=x, y=-1.5, z=0.25),
                                     rotation=T[G + "Quaternion"](x=0.0, y=0.0, z=0.6, w=0.8)))
        for parent, child, x in frames]
    msg = T["tf2_msgs/msg/TFMessage"](transforms=msgs)
    if be:
        return bytes(st.serialize_cdr(msg, "tf2_msgs/msg/TFMessage", little_endian=False))
    return bytes(st.serialize_cdr(msg, "tf2_msgs/msg/TFMessage"))


def _frames(cdr):
    from rosbags.typesys import Stores, get_typestore
    st = get_typestore(Stores.ROS2_KILTED)
    m = st.deserialize_cdr(cdr, "tf2_msgs/msg/TFMessage")
    return [(t.header.frame_id, t.child_frame_id, t.transform.translation.x) for t in m.transforms]


def test_tf_static_publishes_the_union_of_every_message_newest_per_child_frame(sink):
    b = FakeBackend()
    c = Companion(b, sink, max_message=1 << 16, diagnostics_period_ms=0)
    latched = {"reliability": "reliable", "durability": "transient_local", "depth": 1}
    c.advertise(1, "/tf_static", "tf2_msgs/msg/TFMessage", latched)
    for m in (_tf(("base", "laser", 1.0), ("base", "camera_with_a_long_name", 2.0)),  # world 1
              _tf(("map", "robot2", 3.0)),                                              # world 2
              _tf(("map", "robot3", 4.0), be=True),                                     # world 3
              _tf(("base", "laser", 5.0))):                     # world 1 moves its laser
        c.publish(1, m, 0, len(m), True)
    got = [_frames(d) for _, d in b.published]
    assert got[1] == [("base", "laser", 1.0), ("base", "camera_with_a_long_name", 2.0),
                      ("map", "robot2", 3.0)]
    assert got[-1] == [("base", "camera_with_a_long_name", 2.0), ("map", "robot2", 3.0),
                       ("map", "robot3", 4.0), ("base", "laser", 5.0)]
    # the encoder is rosbags' byte for byte (little endian; what a ROS node decodes)
    assert b.published[-1][1] == _tf(("base", "camera_with_a_long_name", 2.0),
                                     ("map", "robot2", 3.0), ("map", "robot3", 4.0),
                                     ("base", "laser", 5.0))
    # not a TFMessage: published as it is, the union unchanged
    c.publish(1, b"\x00\x01\x00\x00junk", 0, 8, True)
    assert b.published[-1][1] == b"\x00\x01\x00\x00junk"
    assert c._pubs["/tf_static"].tf_union.decode(b"\x00\x01\x00\x00junk") is None
    # volatile TFMessage (/tf) and other latched types pass through untouched
    c.advertise(2, "/tf", "tf2_msgs/msg/TFMessage", QOS_R)
    c.advertise(3, "/latched", "std_msgs/msg/String", latched)
    one = _tf(("odom", "base", 1.0))
    c.publish(2, one, 0, len(one), True)
    c.publish(3, one, 0, len(one), True)
    assert [d for _, d in b.published[-2:]] == [one, one]
    # released with the entity: a new registration starts empty
    c.unadvertise(1)
    c.advertise(1, "/tf_static", "tf2_msgs/msg/TFMessage", latched)
    c.publish(1, one, 0, len(one), True)
    assert _frames(b.published[-1][1]) == [("odom", "base", 1.0)]


def test_tf_static_union_is_bounded():
    from ros_side.companion import TfUnion
    u = TfUnion(max_bytes=1 << 20, max_frames=3)
    for i in range(5):
        u.merge(_tf(("base", "f%d" % i, float(i))))
    assert [c for _, c, _ in _frames(u.encode())] == ["f2", "f3", "f4"] and u.evicted == 2
    small = TfUnion(max_bytes=400)
    for i in range(10):
        out = small.merge(_tf(("base", "g%d" % i, float(i))))
        assert len(out) <= 400
    assert len(_frames(out)) == len(small.frames) < 10
    # truncated or padded input
    one = _tf(("a", "b", 1.0))
    assert TfUnion.decode(one[:-1]) is None and TfUnion.decode(one + b"\0\0\0") is not None
    assert TfUnion.decode(one[:2]) is None


def test_policy_names_are_one_vocabulary():
    """qos_incompatible names a policy as rclpy's QoSPolicyKind does, whatever the backend had:
    an rmw kind (rclpy's event status: its own name is RMW_QOS_POLICY_*), the rmw enum's name,
    or a DDS policy name (the same for every policy ROS has; DDS-only ones stay DDS's)."""
    from ros_side.qos import policy_name
    assert [policy_name(k) for k in (1, 2, 3, 4, 5)] == [
        "DURABILITY", "DEADLINE", "LIVELINESS", "RELIABILITY", "HISTORY"]
    assert policy_name("RMW_QOS_POLICY_RELIABILITY") == "RELIABILITY"
    assert policy_name("DURABILITY") == "DURABILITY"
    assert policy_name("DATA_REPRESENTATION") == "DATA_REPRESENTATION"

    class RmwKind:   # rclpy._rclpy_pybind11.rmw_qos_policy_kind_t: int() and a name
        name = "RMW_QOS_POLICY_DURABILITY"

        def __int__(self):
            return 1
    assert policy_name(RmwKind()) == "DURABILITY"


def test_names_resolve_before_anything_else(sink):
    """A companion under /robot1 with a remap: the backend only ever sees absolute, resolved
    names; a relative and an absolute name for one ROS topic share one entity; the diagnostics
    publisher's topic goes through the same rules; invalid_topic names both spellings."""
    from ros_side.names import Names
    b = FakeBackend()
    c = Companion(b, sink, max_message=1000, diagnostics_period_ms=1000,
                  names=Names("arm", "/robot1", ["/odom:=/robot1/odom",
                                                 "/diagnostics:=/robot1/diagnostics"]),
                  hardware_id=lambda: "udp://10.0.0.2:4000")
    c.advertise(1, "odom", "nav_msgs/msg/Odometry", QOS_R)
    c.advertise(2, "/odom", "nav_msgs/msg/Odometry", QOS_R)
    c.advertise(3, "~/status", "std_msgs/msg/String", QOS_R)
    c.advertise(4, "a/1b", "std_msgs/msg/String", QOS_R)
    assert [h[1] for h in b.created] == ["/robot1/odom", "/robot1/arm/status"]
    assert [r[3] for r in sink.of("result")] == [None, None, None, "invalid_topic"]
    assert "'a/1b' (resolved to '/robot1/a/1b')" in sink.of("result")[3][4]
    c.poll(0)
    assert b.created[-1][1] == "/robot1/diagnostics"
    statuses = c._diag_statuses()
    assert [(s[1], s[3]) for s in statuses] == [("/robot1/arm: companion", "udp://10.0.0.2:4000")]
