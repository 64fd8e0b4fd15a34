"""Issue 21, item 8: namespaces, remapping and two robots, the same on both backends.

Real processes throughout: ``python -m ros_side`` (the companion under its backend's interpreter:
the dds backend here, the rclpy backend on the Kilted rclpy of .venv-ros), UBRB clients on TCP,
and a real rclpy node (Kilted, Fast DDS) as the ROS side. DDS stays on loopback
(``ros_procs.ros_env``).

Before issue 21 the dds backend ignored ``--ros-args -r __ns:=/robot1 -r /odom:=/robot1/odom``
(node ``/ros_side``, topic ``/odom``) while the rclpy backend honoured it; two companions' topics
collided unless the clients prefixed them, and their ``/diagnostics`` statuses were identical
(``ros_side: companion``, hardware_id ``ubrb``) whatever ``--node-name`` said. Now ros_side
resolves every name itself, as rcl does (``names.Names``), and both backends get the result.
"""

import sys

import pytest
from rosbags.typesys import Stores, get_typestore

from ros_helpers import wait_for
from tests.e2e.helpers import E2E_DOMAIN, Client, LinkBridge, e2e_proc
from tests.support.ros_procs import ROS_PYTHON, Peer, require_ros, ros_env

STORE = get_typestore(Stores.ROS2_KILTED)
STR = "std_msgs/msg/String"
DIAG = "diagnostic_msgs/msg/DiagnosticArray"
QOS = {"reliability": "reliable", "durability": "volatile", "depth": 10}


def text(s):
    return bytes(STORE.serialize_cdr(STORE.types[STR](data=s), STR))


def texts(peer, k):
    return [STORE.deserialize_cdr(d, STR).data for d in peer.received(k)]


def python_of(backend):
    return ROS_PYTHON if backend == "rclpy" else sys.executable


@pytest.fixture
def env():
    require_ros()
    return ros_env(domain=E2E_DOMAIN, ROS_DISTRO="kilted")


def deliver(client, peer, slot, k, payload, timeout=10):
    """Publish on ``slot`` until the peer's endpoint ``k`` has it (DDS discovery is not
    symmetric in time: the client's count can be 1 before the peer's reader has matched)."""
    client.publish(slot, text(payload))
    for _ in range(int(timeout / 0.25)):
        if payload in texts(peer, k):
            return True
        if not peer.call("count", id=k)["count"]:
            client.wait(lambda: False, 0.25)
            continue
        client.publish(slot, text(payload))
        client.wait(lambda: False, 0.25)
    return payload in texts(peer, k)


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_ros_args_namespace_and_remap_through_the_link(env, backend):
    """``--ros-args -r __ns:=/robot1 -r /odom:=/robot1/odom``, gateway + UDP link: the node is
    /robot1/ros_side, the client's absolute /odom is remapped to /robot1/odom, its relative
    ``scan`` resolves to /robot1/scan, an absolute /clock stays."""
    peer = Peer("rclpy", env)
    bridge = LinkBridge("udp", companion_python=python_of(backend), backend=backend,
                        companion_env=env,
                        companion_args=("--ros-args", "-r", "__ns:=/robot1",
                                        "-r", "/odom:=/robot1/odom",
                                        # rcl applies one rule, the first that matches: a name
                                        # remapped once is never remapped again by the backend
                                        "-r", "/robot1/odom:=/twice_remapped", "--"))
    client = None
    try:
        k_odom = peer.endpoint("sub", "/robot1/odom", STR, QOS)
        k_scan = peer.endpoint("sub", "/robot1/scan", STR, QOS)
        k_clock = peer.endpoint("sub", "/clock_ns_test", STR, QOS)
        k_bare = peer.endpoint("sub", "/odom", STR, QOS)
        k_twice = peer.endpoint("sub", "/twice_remapped", STR, QOS)
        k_diag = peer.endpoint("sub", "/diagnostics", DIAG, QOS)
        client = Client(bridge.port, "robot1")
        client.advertise(1, "/odom", STR, QOS)
        client.advertise(2, "scan", STR, QOS)
        client.advertise(3, "/clock_ns_test", STR, QOS)
        client.sync()
        assert client.error_codes() == [], client.errors
        assert deliver(client, peer, 1, k_odom, "odom 1"), texts(peer, k_odom)
        assert deliver(client, peer, 2, k_scan, "scan 1"), texts(peer, k_scan)
        assert deliver(client, peer, 3, k_clock, "clock 1"), texts(peer, k_clock)
        graph = peer.call("graph", topic="/robot1/odom")
        assert "/robot1/ros_side" in graph["fqns"], graph["fqns"]
        assert "/ros_side" not in graph["fqns"], graph["fqns"]
        for k_not in (k_bare, k_twice):   # nothing of ours on /odom itself, nor remapped twice
            assert peer.call("count", id=k_not)["count"] == 0
        # /diagnostics: named by the node, its hardware_id the link's peer (the gateway's end)
        gw_port = bridge.driver.t.sock.getsockname()[1]
        want = ("/robot1/ros_side: companion", "udp://127.0.0.1:%d" % gw_port)
        assert wait_for(lambda: want in diag_statuses(peer, k_diag), 10), \
            (want, diag_statuses(peer, k_diag))
    finally:
        if client is not None:
            client.close()
        bridge.close()
        peer.close()
    assert texts(peer, k_bare) == [] and texts(peer, k_twice) == []
    print("%s backend, --ros-args __ns + remap: node %s; /odom -> /robot1/odom, scan -> "
          "/robot1/scan, /clock_ns_test stays" % (backend, "/robot1/ros_side"))


def diag_statuses(peer, k):
    """(name, hardware_id) of every DiagnosticStatus the peer's /diagnostics endpoint got."""
    return {(st.name, st.hardware_id) for data in peer.received(k)
            for st in STORE.deserialize_cdr(data, DIAG).status}


def start_robot(backend, env, *args):
    """A companion in direct mode on a free port (--listen 127.0.0.1:0): (process, port)."""
    proc = e2e_proc([python_of(backend), "-m", "ros_side", "--backend", backend,
                     "--domain", str(E2E_DOMAIN), "--listen", "127.0.0.1:0", *args], env)
    try:
        m = proc.wait_line(r"direct mode: UBRB bridge on [\d.]+:(\d+)", timeout=30)
    except BaseException:
        proc.stop()
        raise
    return proc, int(m.group(1))


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_two_robots_on_one_domain(env, backend):
    """Two companions on one DDS domain, each serving its own client (direct mode): one put
    under /robot1 by the plain flag, the other under /robot2 by ``--ros-args -r __ns:=``. Both
    clients publish the same relative name ``odom``: a ROS node gets each robot's on its own
    topic and nothing crossed; /diagnostics names each companion by its node's fully qualified
    name, with its own hardware_id."""
    peer = Peer("rclpy", env)
    robots, clients = [], []
    try:
        k = {ns: peer.endpoint("sub", ns + "/odom", STR, QOS) for ns in ("/robot1", "/robot2")}
        k_diag = peer.endpoint("sub", "/diagnostics", DIAG, QOS)
        robots.append(start_robot(backend, env, "--namespace", "/robot1"))
        robots.append(start_robot(backend, env, "--ros-args", "-r", "__ns:=/robot2"))
        for i, (_, port) in enumerate(robots):
            c = Client(port, "robot%d" % (i + 1))
            clients.append(c)
            c.advertise(1, "odom", STR, QOS)
            c.sync()
            assert c.error_codes() == [], c.errors
        for i, ns in enumerate(("/robot1", "/robot2")):
            assert deliver(clients[i], peer, 1, k[ns], "from robot%d" % (i + 1)), \
                texts(peer, k[ns])
        seen = {}

        def both_reported():
            seen.update(diag_statuses(peer, k_diag))
            return {"/robot1/ros_side: companion", "/robot2/ros_side: companion"} <= set(seen)
        assert wait_for(both_reported, 10), sorted(seen)
        fqns = peer.call("graph", topic="/robot1/odom")["fqns"]
    finally:
        for c in clients:
            c.close()
        for proc, _ in robots:
            proc.stop()
        peer.close()
    assert set(texts(peer, k["/robot1"])) == {"from robot1"}
    assert set(texts(peer, k["/robot2"])) == {"from robot2"}
    hw = [seen["/robot%d/ros_side: companion" % i] for i in (1, 2)]
    assert hw == ["tcp://127.0.0.1:%d" % port for _, port in robots], hw
    assert {"/robot1/ros_side", "/robot2/ros_side"} <= set(fqns), fqns
    print("%s backend, two robots: topics %s, diagnostics %s"
          % (backend, ["/robot1/odom", "/robot2/odom"],
             {n: h for n, h in sorted(seen.items()) if n.endswith(": companion")}))
