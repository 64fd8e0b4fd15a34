"""Issue 21, item 6: direct mode's defaults serve ordinary QoS, on both backends.

``python -m ros_side --listen`` (the gateway core in-process) with no limit flags: a UBRB client
advertises ``/tf`` (TFMessage) and ``/odom`` (Odometry), reliable, depth 100 each, as the
project's simulator does, and a real rclpy node (Kilted, Fast DDS) receives them; the project's
own ``ubrb_client bench`` (a depth-1000 subscription) runs against the same bridge. Before issue
21 each topic reserved depth x 64 MiB (the pc profile's message cap) of a budget of half the
machine's memory: ``/tf`` + ``/odom`` got ``resource_exhausted`` and the bench was refused. Now
the budget counts what the histories hold. A refusal (a tiny ``--max-history-bytes``) names the
flag of this mode, never link mode's ``--max-message``.
"""

import json
import sys

import pytest
from rosbags.typesys import Stores, get_typestore

from ros_helpers import wait_for
from tests.support.procs import Proc
from tests.support.ros_msgs import ensure_tf2_msgs
from tests.support.ros_procs import Peer, python_for, require_ros, ros_env
from tests.support.tf_worlds import TF, tf_cdr

STORE = get_typestore(Stores.ROS2_KILTED)
ODOM = "nav_msgs/msg/Odometry"
DEEP = {"reliability": "reliable", "durability": "volatile", "depth": 100}


def odom_cdr(i):
    T = STORE.types
    m = T[ODOM](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=i, nanosec=0),
                                        frame_id="odom"),
        child_frame_id="base_link",
        pose=T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](
                position=T["geometry_msgs/msg/Point"](x=float(i), y=0.0, z=0.0),
                orientation=T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)),
            covariance=__import__("numpy").zeros(36)),
        twist=T["geometry_msgs/msg/TwistWithCovariance"](
            twist=T["geometry_msgs/msg/Twist"](
                linear=T["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0),
                angular=T["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0)),
            covariance=__import__("numpy").zeros(36)))
    return bytes(STORE.serialize_cdr(m, ODOM))


def direct(backend, env, *extra):
    comp = Proc([python_for(backend), "-m", "ros_side", "--backend", backend,
                 "--listen", "127.0.0.1:0", *extra], env=env)
    try:
        port = int(comp.wait_line(r"direct mode: UBRB bridge on [\d.]+:(\d+)", 30).group(1))
    except BaseException:
        comp.stop()
        raise
    return comp, port


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_tf_odom_and_the_bench_with_direct_modes_defaults(backend):
    require_ros()
    ensure_tf2_msgs()
    from tests.e2e.helpers import Client
    env = ros_env(ROS_DISTRO="kilted")
    comp, port = direct(backend, env)
    peer = Peer("rclpy", env)
    c = None
    try:
        k_tf = peer.endpoint("sub", "/tf", TF, DEEP)
        k_odom = peer.endpoint("sub", "/odom", ODOM, DEEP)
        c = Client(port, "sim")
        c.advertise(1, "/tf", TF, DEEP)
        c.advertise(2, "/odom", ODOM, DEEP)
        c.sync()
        assert c.wait(lambda: c.count_of(1) == 1 and c.count_of(2) == 1, 10), (c.counts, c.errors)
        for i in range(20):
            c.publish(1, tf_cdr([("odom", "base_link", float(i))]))
            c.publish(2, odom_cdr(i))
        c.sync()
        assert wait_for(lambda: len(peer.received(k_tf)) == 20
                        and len(peer.received(k_odom)) == 20, 10), (c.errors, comp.text()[-2000:])
        assert c.error_codes() == [], c.errors
        bench = Proc([sys.executable, "-m", "ubrb_client", "bench", "--server",
                      "127.0.0.1:%d" % port, "--loopback", "-n", "500", "-r", "500", "--json"],
                     env=env)
        assert bench.proc.wait(60) == 0, bench.text()[-3000:]
        bench._join()
        result = json.loads(bench.stdout().strip().splitlines()[-1])
    finally:
        if c is not None:
            c.close()
        peer.close()
        comp.stop()
    got_tf, got_odom = len(peer.received(k_tf)), len(peer.received(k_odom))
    print("direct mode, %s backend, defaults: /tf depth 100 %d/20 and /odom depth 100 %d/20 at "
          "the rclpy node, no ERROR; ubrb_client bench --loopback: %s"
          % (backend, got_tf, got_odom, {k: result.get(k) for k in ("sent", "received", "lost")}))
    assert result["sent"] == 500 and result["received"] == 500 and result["lost"] == 0, result


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_a_refusal_names_direct_modes_flag(backend):
    require_ros()
    from tests.e2e.helpers import Client
    env = ros_env(ROS_DISTRO="kilted")
    comp, port = direct(backend, env, "--max-history-bytes", "2K")
    c = None
    try:
        c = Client(port, "sim")
        c.advertise(1, "/odom", ODOM, DEEP)
        c.sync()
        for i in range(5):                       # 5 x ~700 bytes: past 2 KiB at the 3rd
            c.publish(1, odom_cdr(i))
        c.sync()
        assert c.wait(lambda: c.errors, 10), comp.text()[-2000:]
        errors = list(c.errors)
    finally:
        if c is not None:
            c.close()
        comp.stop()
    print("direct mode, %s backend, --max-history-bytes 2K: %s" % (backend, errors[0]))
    assert [e["code"] for e in errors] == ["resource_exhausted"], errors
    msg = errors[0]["message"]
    assert "--max-history-bytes 2048" in msg and "/odom" in msg, msg
    assert "--max-message" not in msg, msg
