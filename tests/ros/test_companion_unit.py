"""Companion logic with a scripted in-memory backend (no DDS)."""

import select
import threading

from ros_side.companion import Companion
from ros_side.errors import RosError
from tests.support.qos import QOS_R



class FakeBackend:
    name = "fake"
    distro = "humble"

    def __init__(self):
        self.created = []
        self.destroyed = []
        self.published = []
        self.counts = {}
        self.callbacks = {}
        self.fail = None

    def create_publisher(self, topic, ros_type, qos):
        if self.fail:
            raise self.fail
        h = ("pub", topic, len(self.created))
        self.created.append(h)
        return h

    def destroy_publisher(self, h):
        self.destroyed.append(h)

    def publish(self, h, data):
        assert type(data) is bytes
        self.published.append((h[1], data))

    def subscription_count(self, h):
        return self.counts.get(h[1], 0)

    def create_subscription(self, topic, ros_type, qos, cb):
        h = ("sub", topic, len(self.created))
        self.created.append(h)
        self.callbacks[topic] = cb
        return h

    def destroy_subscription(self, h):
        self.destroyed.append(h)

    def close(self):
        pass


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
    c.advertise(1, "/a", "std_msgs/msg/String", QOS_R)
    c.advertise(1, "/a", "std_msgs/String", dict(QOS_R, depth=10))   # the same again (after ros_up)
    assert len(b.created) == 1 and sink.results() == [("pub", 1, None)] * 2
    c.advertise(1, "/b", "std_msgs/msg/String", QOS_R)               # slot reused for another topic
    assert b.destroyed == [b.created[0]] and len(b.created) == 2
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
    assert len(b.destroyed) == 1                                   # slot 4 still uses it
    c.unadvertise(4)
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


def test_dds_env_conventions():
    from ros_side.backends.dds import LOOPBACK_XML, default_domain, implied_config
    assert implied_config({}) is None
    assert implied_config({"ROS_LOCALHOST_ONLY": "1"}) == LOOPBACK_XML
    assert implied_config({"ROS_LOCALHOST_ONLY": "0"}) is None
    assert implied_config({"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}) == LOOPBACK_XML
    assert implied_config({"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"}) is None
    assert implied_config({"ROS_LOCALHOST_ONLY": "1", "CYCLONEDDS_URI": "file:///x.xml"}) is None
    assert default_domain({}) == 0 and default_domain({"ROS_DOMAIN_ID": "17"}) == 17
    assert "127.0.0.1" in LOOPBACK_XML and "<AllowMulticast>false" in LOOPBACK_XML
