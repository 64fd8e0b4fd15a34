"""Issue 21, item 2: several worlds, one ``/tf_static``, on both backends.

Three UBRB clients (three Unreal worlds) publish their static transforms on ``/tf_static``
(``tf2_msgs/msg/TFMessage``, reliable, transient_local, depth 1) through one gateway, which
shares one publisher slot per topic among its clients; a real rclpy node (Kilted, Fast DDS)
subscribes afterwards. It must receive the union of every client's transforms, as if each
client were its own static broadcaster. Before issue 21 the companion's latched sample was the
last client's message: the late node got 1 of the 4 frames.

The Kilted wheels have no tf2_msgs: ``tests.support.ros_msgs.ensure_tf2_msgs()`` generates it
with the wheels' own rosidl generators (type hash equal to rosbags' Kilted one), for the late
node and for the rclpy backend. Two set-ups: the companion alone (``companion_host.py``, the
three clients' messages on one slot as the gateway hands them over) and the whole chain
(UBRB clients -> gateway -> UDP link -> ``python -m ros_side``).
"""

import sys
import time

import pytest

from tests.support.ros_msgs import ensure_tf2_msgs
from tests.support.ros_procs import ROS_PYTHON, Host, require_ros, ros_env
from tests.support.tf_worlds import LATCHED, TF, UPDATE, WANT, WORLDS, late_node_gets, \
    publish_worlds, tf_cdr


@pytest.fixture(scope="module")
def tf_env():
    require_ros()
    ensure_tf2_msgs()
    return ros_env(ROS_DISTRO="kilted")


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_late_node_gets_every_worlds_static_transforms(tf_env, backend):
    """The companion alone: three worlds' messages arrive on the one slot of /tf_static."""
    host = Host(backend, tf_env)
    try:
        topic = "/i21_tf_static_%s" % backend
        assert host.advertise(1, topic, TF, LATCHED)["code"] is None
        for frames in WORLDS + [UPDATE]:
            host.publish(1, tf_cdr(frames))
        got = late_node_gets(tf_env, topic)
    finally:
        host.close()
    print("late rclpy node (%s backend, companion alone): %d sample(s), frames %s"
          % (backend, len(got), [sorted(g) for g in got]))
    assert got == [WANT]


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_three_clients_through_the_gateway_one_union(backend):
    """The whole chain: three UBRB clients -> gateway -> UDP link -> companion -> a late node."""
    require_ros()
    ensure_tf2_msgs()
    from tests.e2e.helpers import E2E_DOMAIN, Client, LinkBridge
    env = ros_env(domain=E2E_DOMAIN, ROS_DISTRO="kilted")
    bridge = LinkBridge("udp", companion_python=ROS_PYTHON if backend == "rclpy"
                        else sys.executable, backend=backend, companion_env=env)
    clients = []
    try:
        clients = publish_worlds(Client, bridge.port)
        assert all(c.error_codes() == [] for c in clients), [c.errors for c in clients]
        time.sleep(0.5)                         # the link has handed everything over
        got = late_node_gets(env, "/tf_static")
    finally:
        for c in clients:
            c.close()
        bridge.close()
    print("late rclpy node (%s backend, 3 clients via gateway + UDP link): %d sample(s), "
          "frames %s" % (backend, len(got), [sorted(g) for g in got]))
    assert got == [WANT]
