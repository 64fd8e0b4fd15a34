"""The rclpy backend wired to the Companion, against the thin fake in fake_rclpy/."""

import os
import sys

import pytest

from tests.support.procs import wait_for
from tests.support.qos import QOS_R

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_rclpy")


@pytest.fixture
def fake_rclpy():
    saved = {k: v for k, v in sys.modules.items()
             if k.split(".")[0] in ("rclpy", "rosidl_runtime_py")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, FAKE)
    try:
        import rclpy
        yield rclpy
    finally:
        sys.path.remove(FAKE)
        for k in [k for k in sys.modules if k.split(".")[0] in ("rclpy", "rosidl_runtime_py")]:
            del sys.modules[k]
        sys.modules.update(saved)
        sys.modules.pop("ros_side.backends.rclpy_backend", None)


def test_rclpy_backend_wiring(fake_rclpy, sink, monkeypatch):
    monkeypatch.setenv("ROS_DISTRO", "jazzy")
    from ros_side.backends import make_backend, rclpy_available
    from ros_side.companion import Companion
    assert rclpy_available()
    backend = make_backend("auto", domain=42)
    assert backend.name == "rclpy" and backend.distro == "jazzy"
    assert fake_rclpy._state["init_kwargs"]["domain_id"] == 42
    node = backend.node
    comp = Companion(backend, sink, max_message=1000, diagnostics_period_ms=0)
    try:
        comp.advertise(1, "/chatter", "std_msgs/msg/String", QOS_R)
        comp.advertise(2, "/forbidden", "std_msgs/msg/String", QOS_R)     # rclpy's own check
        comp.advertise(3, "/x", "nopkg/msg/String", QOS_R)                # ModuleNotFoundError
        comp.advertise(4, "/y", "std_msgs/msg/Nope", QOS_R)               # AttributeError
        comp.advertise(5, "/z", "std_msgs/String", {"reliability": "best_effort",
                                                    "durability": "transient_local", "depth": 0})
        comp.subscribe(1, "/cmd", "geometry_msgs/msg/Twist", QOS_R)
        comp.subscribe(2, "/chatter", "std_msgs/msg/String", QOS_R)       # own sub on a pub topic
        assert sink.results() == [("pub", 1, None), ("pub", 2, "invalid_topic"),
                                  ("pub", 3, "unknown_type"), ("pub", 4, "unknown_type"),
                                  ("pub", 5, None), ("sub", 1, None), ("sub", 2, None)]
        # entities were created on the executor thread, not on ours
        assert {t for _, t in node.calls} == {backend._thread}
        pub = node.publishers[0]
        assert pub.topic == "/chatter" and pub.qos.depth == 10
        z = node.publishers[1].qos
        assert (z.depth, z.reliability.name, z.durability.name) == (1, "BEST_EFFORT",
                                                                     "TRANSIENT_LOCAL")
        sub = node.subscriptions[0]
        assert sub.raw is True and sub.topic == "/cmd"
        # publish from this thread: bytes (not bytearray) reach rclpy
        comp.publish(1, bytearray(b"..\x00\x01\x00\x00abcd"), 2, 8, True)
        assert pub.published == [b"\x00\x01\x00\x00abcd"]
        # a raw message from the executor thread reaches the sink on poll (Jazzy: 2 args)
        sub.callback(b"\x00\x01\x00\x00" + b"\x00" * 48, {"info": 1})
        assert wait_for(lambda: sink.messages(1), poll=lambda: comp.poll(0))
        # counts: foreign subscribers only (own subscription on /chatter subtracted)
        node.foreign_subscribers["/chatter"] = 2
        comp.poll(10_000)
        assert sink.counts(1) == [2]
        comp.reset()
        assert node.publishers == [] and node.subscriptions == []
        assert {t for _, t in node.calls} == {backend._thread}
    finally:
        comp.close()
    assert node.destroyed and not fake_rclpy.ok()


def test_flags_become_node_parameters_on_the_executor_thread(fake_rclpy):
    import argparse

    from ros_side.__main__ import declare_parameters
    from ros_side.backends import make_backend
    from ros_side.companion import Companion

    backend = make_backend("rclpy", domain=7)
    companion = Companion(backend, None, 1024, diagnostics_period_ms=0)
    try:
        args = argparse.Namespace(link="udp://0.0.0.0:8269", baud=921600, listen=None,
                                  no_diagnostics=False, msg_path=[])
        declare_parameters(companion, args)
        node = backend.node
        assert node.parameters == {"link": "udp://0.0.0.0:8269", "baud": 921600,
                                   "no_diagnostics": False}
        threads = {t for what, t in node.calls if what == "declare_parameter"}
        assert threads == {backend._thread}
    finally:
        companion.close()
