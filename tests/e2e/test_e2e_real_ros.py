"""One whole chain per backend against a real ROS 2 node: UBRB client -> gateway -> UDP link ->
companion (``python -m ros_side``) -> a real rclpy node (Kilted wheels, Fast DDS) and back.

The companion runs its backend's interpreter: ``--backend rclpy`` under .venv-ros's python (the
real rclpy), ``--backend dds`` under this one. DDS stays on loopback (ros_procs.ros_env: Fast DDS
profile, loopback CYCLONEDDS_URI; no discovery tag here, since a Fast DDS participant carries none).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.e2e.helpers import E2E_DOMAIN, Client, LinkBridge, ser, string_msg, twist, wait_for
from tests.support.qos import QOS_BE, QOS_R

from tests.support.ros_procs import ROS_PYTHON, Peer, require_ros, ros_env


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_client_to_real_ros_node_and_back(backend: str) -> None:
    require_ros()
    env = ros_env(domain=E2E_DOMAIN, ROS_DISTRO="kilted")
    peer = Peer("rclpy", env)
    bridge = LinkBridge("udp", companion_python=ROS_PYTHON if backend == "rclpy" else sys.executable,
                        backend=backend, companion_env=env)
    client: Any = None
    try:
        assert bridge.comp is not None
        bridge.comp.wait_line(r"backend %s" % {"dds": "DdsBackend", "rclpy": "RclpyBackend"}[backend])
        client = Client(bridge.port, "real-ros")
        # client -> ROS: the node's subscription is counted, then the message arrives decoded
        k_sub = peer.endpoint("sub", "/e2e_chatter", "std_msgs/msg/String", QOS_R)
        client.advertise(1, "/e2e_chatter", "std_msgs/msg/String")
        assert client.wait(lambda: client.count_of(1) == 1, 10), client.counts
        assert wait_for(lambda: peer.call("count", id=k_sub)["count"] == 1, 10)
        data = ser(string_msg("through the chain"), "std_msgs/msg/String")
        client.publish(1, data)
        assert wait_for(lambda: peer.received(k_sub), 10)
        got = peer.of("msg", id=k_sub)[0]
        assert got["decoded"] and bytes.fromhex(got["data"])[4:len(data)] == data[4:]
        # ROS -> client
        k_pub = peer.endpoint("pub", "/e2e_cmd_vel", "geometry_msgs/msg/Twist", QOS_R)
        client.subscribe(2, "/e2e_cmd_vel", "geometry_msgs/msg/Twist")
        assert wait_for(lambda: peer.call("count", id=k_pub)["count"] == 1, 10)
        cmd = ser(twist(0.75, -0.5), "geometry_msgs/msg/Twist")
        for _ in range(20):   # until the companion's reader has matched the node's writer too
            peer.call("write", id=k_pub, data=cmd.hex())
            if client.wait(lambda: client.messages[2], 0.25):
                break
        assert client.messages[2] and client.messages[2][0][:len(cmd)] == cmd
        # the companion's /diagnostics reaches the ROS node (DiagnosticArray has sequences)
        k_diag = peer.endpoint("sub", "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", QOS_R)
        assert wait_for(lambda: peer.received(k_diag), 5)
        assert peer.of("msg", id=k_diag)[0]["decoded"]
        assert client.error_codes() == []
        # a QoS mismatch with the node reaches the client as ERROR qos_incompatible (its own id)
        peer.endpoint("sub", "/e2e_strict", "std_msgs/msg/String", QOS_R)
        client.advertise(3, "/e2e_strict", "std_msgs/msg/String", QOS_BE)
        assert client.wait(lambda: ("qos_incompatible", 3) in client.error_codes(), 5), \
            client.errors
        assert "RELIABILITY" in [e for e in client.errors if e["id"] == 3][0]["message"]
    finally:
        if client is not None:
            client.close()
        bridge.close()
        peer.close()
