"""`python -m ubrb_client` end to end against the fake bridge in routing mode
(PUBLISH fanned out as MESSAGE to every subscription on the same topic)."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import yaml
from client_fakebridge import FakeServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_started: list = []   # every client process a test started (no_orphans kills what is left)


def cli(server, *args, **kw):
    p = subprocess.Popen([sys.executable, "-m", "ubrb_client", *args,
                          "--server", f"127.0.0.1:{server.port}", "--reconnect-interval", "0.2"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    _started.append(p)
    return p


@pytest.fixture(autouse=True)
def no_orphans():
    """A client a failed test left running goes with the test. One that outlived it (a `sim`
    hung on SIGTERM) reconnected every 0.2 s to its old port for 40 minutes, and later tests'
    gateways on that port got its /odom and /tf_static: a type_conflict and a foreign sample
    in three later runs of the suite on the same machine."""
    yield
    while _started:
        p = _started.pop()
        if p.poll() is None:
            p.kill()
            p.wait(5)


def subscribed(server, topic):
    return lambda: any(topic in c.subs.values() for c in server.conns)


@pytest.fixture
def bridge():
    s = FakeServer(route=True).start()
    yield s
    s.stop()


def test_pub_echo_hz(bridge):
    echo = cli(bridge, "echo", "/chatter", "std_msgs/msg/String", "--count", "2")
    hz = cli(bridge, "hz", "/chatter", "std_msgs/String", "--count", "10")
    assert bridge.wait(subscribed(bridge, "/chatter"), 10)
    assert bridge.wait(lambda: sum("/chatter" in c.subs.values() for c in bridge.conns) == 2, 10)
    pub = cli(bridge, "pub", "/chatter", "std_msgs/msg/String", '{"data": "hi there"}',
              "--rate", "50", "--count", "12", "-q")
    assert pub.wait(10) == 0, pub.stderr.read()
    out, err = echo.communicate(timeout=10)
    assert echo.returncode == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d is not None]
    assert docs == [{"data": "hi there"}, {"data": "hi there"}]
    out, err = hz.communicate(timeout=10)
    assert hz.returncode == 0, err
    assert "average rate:" in out and "std dev:" in out
    rate = float(out.split("average rate:")[-1].split()[0])
    assert 20 < rate < 150


def test_pub_once_nested_and_defaults(bridge):
    echo = cli(bridge, "echo", "/odom_in", "nav_msgs/msg/Odometry", "--count", "1")
    assert bridge.wait(subscribed(bridge, "/odom_in"), 10)
    pub = cli(bridge, "pub", "/odom_in", "nav_msgs/msg/Odometry",
              "{header: {frame_id: odom}, pose: {pose: {position: {x: 1.5}}}}")
    assert pub.wait(10) == 0, pub.stderr.read()
    out, err = echo.communicate(timeout=10)
    assert echo.returncode == 0, err
    d = yaml.safe_load(out.split("---")[0])
    assert d["header"]["frame_id"] == "odom"
    assert d["pose"]["pose"]["position"] == {"x": 1.5, "y": 0.0, "z": 0.0}
    assert d["pose"]["pose"]["orientation"]["w"] == 1.0
    assert len(d["pose"]["covariance"]) == 36


def test_echo_prints_fields_not_the_message_constants(bridge):
    # diagnostic_msgs/msg/DiagnosticStatus defines OK WARN ERROR STALE: constants, not fields
    echo = cli(bridge, "echo", "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", "--count",
               "1")
    assert bridge.wait(subscribed(bridge, "/diagnostics"), 10)
    pub = cli(bridge, "pub", "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray",
              "{status: [{level: 2, name: link, message: down}]}")
    out, err = pub.communicate(timeout=10)
    assert pub.returncode == 0, err
    assert "'status': [{'level': 2, 'name': 'link', 'message': 'down', 'hardware_id': '', " \
           "'values': []}]}" in out and "STALE" not in out, out
    out, err = echo.communicate(timeout=10)
    assert echo.returncode == 0, err
    d = yaml.safe_load(out.split("---")[0])
    assert d["status"] == [{"level": 2, "name": "link", "message": "down", "hardware_id": "",
                            "values": []}], out
    assert "OK" not in out and "STALE" not in out, out


@pytest.mark.parametrize("ack, code, says", [
    # up, but its distro unknown (an rclpy companion without ROS_DISTRO, issue 22): publishes
    ({"ros_distro": "unknown", "ros_ready": True}, 0, ""),
    ({"ros_distro": "unknown", "ros_ready": False},
     1, "has no ROS side (its companion is not connected): nothing was published"),
    # a gateway without ros_ready: ros_distro "unknown" is all it has to go on
    ({"ros_distro": "unknown", "ros_ready": None}, 1, "reports no ROS side (ros_distro"),
    ({"ros_distro": "jazzy", "ros_ready": None}, 0, ""),
], ids=["ready-distro-unknown", "not-ready", "old-gateway-unknown", "old-gateway-jazzy"])
def test_pub_says_no_ros_side_only_when_the_bridge_has_none(bridge, ack, code, says):
    bridge.ack_fields = ack
    # --wait 1 when it has none: it asks again that long (a just-started gateway), silently
    pub = cli(bridge, "pub", "/chatter", "std_msgs/msg/String", "{data: hi}", "--wait",
              "1" if code else "5")
    out, err = pub.communicate(timeout=20)
    assert pub.returncode == code, (out, err)
    if code:
        assert len(err.strip().splitlines()) == 1 and says in err, err
        assert "publishing #1" not in out and not any(
            f[0] == "PUBLISH" for f in bridge.all_frames())
    else:
        assert "no ROS side" not in err and out.startswith("publishing #1"), (out, err)
        assert any(f[0] == "PUBLISH" for f in bridge.all_frames())


def test_pub_rejects_bad_fields(bridge):
    pub = cli(bridge, "pub", "/x", "std_msgs/msg/String", "{nope: 1}")
    assert pub.wait(10) == 2
    assert "unknown field" in pub.stderr.read()


def test_bench_loopback(bridge):
    b = cli(bridge, "bench", "--loopback", "--count", "300", "--size", "256", "--rate", "0",
            "--json")
    out, err = b.communicate(timeout=20)
    assert b.returncode == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    assert r["sent"] == r["received"] == 300 and r["lost"] == 0 and r["duplicates"] == 0
    assert 0 < r["rtt_p50_ms"] <= r["rtt_p90_ms"] <= r["rtt_p99_ms"] <= r["rtt_max_ms"]


def test_sim_reacts_to_cmd_vel_and_stops(bridge):
    sim = cli(bridge, "sim")
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(sim.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        assert bridge.wait(subscribed(bridge, "/cmd_vel"), 10)
        odom = cli(bridge, "echo", "/odom", "nav_msgs/msg/Odometry", "--count", "1")
        scan = cli(bridge, "echo", "/scan", "sensor_msgs/msg/LaserScan", "--count", "1", "--no-arr")
        pub = cli(bridge, "pub", "/cmd_vel", "geometry_msgs/msg/Twist",
                  "{linear: {x: 0.5}, angular: {z: 0.2}}", "--rate", "20", "--count", "40", "-q")
        assert pub.wait(10) == 0, pub.stderr.read()
        n = len(lines)
        # the status line of every second: moving while commanded (2 s, so a line falls inside
        # even when the commands come late: 1 s was missed once on a loaded machine), stopped
        # 0.5 s after the last
        assert bridge.wait(lambda: any("v=+0.00" in s for s in lines[n:]), 3), lines
        status = [s for s in lines if s.startswith("[sim] x=")]
        assert any("v=+0.50" in s and "w=+0.20" in s for s in status), lines
        x = float(status[-1].split("x=")[1].split()[0])
        assert 0.6 < x < 1.6, lines     # ~2.5 s on an arc of radius 2.5 m: x = 1.2
        o = yaml.safe_load(odom.communicate(timeout=10)[0].split("---")[0])
        assert o["header"]["frame_id"] == "odom" and o["child_frame_id"] == "base_link"
        s = yaml.safe_load(scan.communicate(timeout=10)[0].split("---")[0])
        assert s["ranges"] == "<sequence of length 360>" and s["header"]["frame_id"] == "laser"
        frames = [f for c in bridge.conns for f in c.frames if f[0] == "ADVERTISE"]
        qos = {f[1]["topic"]: f[1]["qos"] for f in frames}
        assert {"/clock", "/tf", "/tf_static", "/odom", "/imu", "/scan"} <= set(qos)
        assert qos["/scan"]["reliability"] == qos["/imu"]["reliability"] == "best_effort"
        assert qos["/tf_static"] == {"reliability": "reliable", "durability": "transient_local",
                                     "depth": 1}
        assert qos["/tf"]["reliability"] == "reliable"
    finally:
        sim.send_signal(signal.SIGTERM)
        assert sim.wait(5) == 0


def test_pub_does_not_exit_0_when_its_connection_was_lost_while_publishing(bridge):
    # issue 21: PUBLISHes written to a connection that ended may never have been read; a PONG
    # on the next connection says nothing about them
    bridge.auto_pong = False
    pub = cli(bridge, "pub", "/chatter", "std_msgs/msg/String", "{data: hi}", "--rate", "20",
              "--count", "20", "-q")
    first = bridge.last
    assert bridge.wait(lambda: sum(f[0] == "PUBLISH" for f in first.frames) >= 3, 10)
    first.kill()
    bridge.auto_pong = True
    out, err = pub.communicate(timeout=20)
    assert len(bridge.conns) == 2, "the client did not reconnect"
    assert pub.returncode == 1 and "reconnected while publishing" in err, (out, err)
    assert len(err.strip().splitlines()) == 1, err
