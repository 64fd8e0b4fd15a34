"""Issue 21, item 7: the ``transient_local`` publisher / ``volatile`` subscription row of
docs/COMPANION.md's QoS table, against real rclpy subscribers (Kilted, Fast DDS).

A publisher writes "old", then a volatile and a transient_local rclpy subscription join, then it
writes "new". The reference is a native rclpy publisher (Fast DDS to Fast DDS): the volatile
subscription gets "new" only, the transient_local one "old" and "new". The rclpy backend does
the same. The dds backend's Cyclone writer serves its history to any *non-Cyclone* reader that
asks for it, and a Fast DDS volatile reader asks: its volatile subscription gets "old" too,
exactly as from a plain Cyclone writer with rmw_cyclonedds' QoS (``ros_peer.py cyclone``: what a
native rmw_cyclonedds publisher would do), so the test pins the dds backend to that native
behaviour rather than to the table (docs/COMPANION.md, "QoS compatibility": cyclonedds 11.0.1
``ddsi_receive.c: handle_AckNack`` withholds already-acknowledged samples from volatile readers
of its own vendor only; Fast DDS leaves it to the writer). Against a Cyclone volatile reader
the dds backend follows the table (``test_qos_table.py``).
"""

import struct

import pytest

from ros_helpers import wait_for
from tests.support.ros_procs import Host, Peer, require_ros, ros_env

STR = "std_msgs/msg/String"
TL = {"reliability": "reliable", "durability": "transient_local", "depth": 5}
VOL = {"reliability": "reliable", "durability": "volatile", "depth": 5}


def cdr(text):
    raw = text.encode()
    return b"\x00\x01\x00\x00" + struct.pack("<I", len(raw) + 1) + raw + b"\x00"


def texts(peer, k):
    return [d[8:8 + struct.unpack_from("<I", d, 4)[0] - 1].decode() for d in peer.received(k)]


class Writer:
    """The publisher under test: a native node (rclpy or plain Cyclone) or a companion."""

    def __init__(self, kind, env, topic):
        self.kind = kind
        if kind in ("native-rclpy", "native-cyclone"):
            self.proc = Peer(kind.split("-")[1], env)
            self.k = self.proc.endpoint("pub", topic, STR, TL)
        else:
            self.proc = Host(kind, env)
            assert self.proc.advertise(1, topic, STR, TL)["code"] is None

    def write(self, text):
        if self.kind.startswith("native"):
            self.proc.call("write", id=self.k, data=cdr(text).hex())
        else:
            self.proc.publish(1, cdr(text))

    def matched(self):
        if self.kind.startswith("native"):
            return self.proc.call("count", id=self.k)["count"]
        counts = self.proc.counts(1)
        return counts[-1] if counts else 0


def late_subscribers_get(kind, env, topic):
    sub = Peer("rclpy", env)
    w = Writer(kind, env, topic)
    try:
        w.write("old")
        k_vol = sub.endpoint("sub", topic, STR, VOL)
        k_tl = sub.endpoint("sub", topic, STR, TL)
        assert wait_for(lambda: w.matched() >= 2, 10), "the subscriptions did not match"
        assert wait_for(lambda: "old" in texts(sub, k_tl), 10), texts(sub, k_tl)
        # the volatile one has matched too (count 2). One reliable writer's samples arrive in
        # order, so once "new" is there, an "old" it was going to get is there before it.
        w.write("new")
        assert wait_for(lambda: "new" in texts(sub, k_vol) and "new" in texts(sub, k_tl), 10)
        return texts(sub, k_vol), texts(sub, k_tl)
    finally:
        w.proc.close()
        sub.close()


@pytest.fixture(scope="module")
def env():
    require_ros()
    return ros_env(ROS_DISTRO="kilted")


@pytest.mark.parametrize("kind", ["native-rclpy", "rclpy"])
def test_volatile_subscriber_gets_new_messages_only(env, kind):
    """The table's row, as a native rclpy publisher does it: the rclpy backend."""
    vol, tl = late_subscribers_get(kind, env, "/i21_durability_%s" % kind.replace("-", "_"))
    print("%s publisher: volatile subscriber %s, transient_local subscriber %s" % (kind, vol, tl))
    assert vol == ["new"]
    assert tl == ["old", "new"]


def test_dds_backend_behaves_as_a_native_cyclone_publisher(env):
    """The dds backend with a Fast DDS volatile subscriber: what a native Cyclone publisher
    (rmw_cyclonedds' QoS) gives it, the history too (docs/COMPANION.md, "QoS compatibility")."""
    got = {kind: late_subscribers_get(kind, env, "/i21_durability_%s" % kind.replace("-", "_"))
           for kind in ("native-cyclone", "dds")}
    print("volatile / transient_local rclpy subscribers of a Cyclone writer: %s" % got)
    assert got["dds"] == got["native-cyclone"]
    assert got["dds"][1] == ["old", "new"]
