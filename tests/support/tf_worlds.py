"""Static transforms from several Unreal worlds, and a late ROS node that listens for them.

Shared by the ``/tf_static`` tests of issue 21 (tests/ros/test_tf_static.py, test_latched_restart.py,
test_direct_defaults.py): three worlds' frames as ``tf2_msgs/msg/TFMessage`` CDR, the clients that
publish them through a gateway, and what a real rclpy node (Kilted, Fast DDS) that subscribes
afterwards receives.
"""

import time

from rosbags.typesys import Stores, get_typestore

from tests.support.procs import wait_for
from tests.support.ros_procs import Peer

STORE = get_typestore(Stores.ROS2_KILTED)
TF = "tf2_msgs/msg/TFMessage"
LATCHED = {"reliability": "reliable", "durability": "transient_local", "depth": 1}
# (parent, child, x) per world: 4 child frames from 3 clients, world 1 moves its laser later
WORLDS = [[("base_link", "laser", 0.1), ("base_link", "camera", 0.2)],
          [("map", "robot2/base_link", 2.0)],
          [("map", "robot3/base_link", 3.0)]]
UPDATE = [("base_link", "laser", 0.15)]
WANT = {"laser": 0.15, "camera": 0.2, "robot2/base_link": 2.0, "robot3/base_link": 3.0}


def tf_cdr(frames):
    T, G = STORE.types, "geometry_msgs/msg/"
    return bytes(STORE.serialize_cdr(T[TF](transforms=[T[G + "TransformStamped"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0),
                                        frame_id=parent),
        child_frame_id=child,
        transform=T[G + "Transform"](translation=T[G + "Vector3"](x=x, y=0.0, z=0.5),
                                     rotation=T[G + "Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)))
        for parent, child, x in frames]), TF))


def children(cdr):
    return {t.child_frame_id: t.transform.translation.x
            for t in STORE.deserialize_cdr(cdr, TF).transforms}


def publish_worlds(client_class, port):
    """One UBRB client per world, each latching its frames on ``/tf_static``; world 1 then moves
    its laser (UPDATE). Returns the clients, still connected (their registrations stay)."""
    clients = []
    for i, frames in enumerate(WORLDS):
        c = client_class(port, "world%d" % (i + 1))
        clients.append(c)
        c.advertise(1, "/tf_static", TF, LATCHED)
        c.publish(1, tf_cdr(frames))
        c.sync()
    clients[0].publish(1, tf_cdr(UPDATE))
    clients[0].sync()
    return clients


def late_node_gets(env, topic):
    """What a real rclpy node subscribing ``topic`` (transient_local, depth 1) now receives."""
    late = Peer("rclpy", env)
    try:
        k = late.endpoint("sub", topic, TF, LATCHED)
        assert wait_for(lambda: late.received(k), 10), "the late node received nothing"
        time.sleep(0.3)                         # anything more would come now
        msgs = late.of("msg", id=k)
        assert all(m["decoded"] for m in msgs), "rclpy (generated tf2_msgs) could not decode it"
        return [children(bytes.fromhex(m["data"])) for m in msgs]
    finally:
        late.close()
