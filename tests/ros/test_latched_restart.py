"""Issue 21, item 3: latched data survives a companion restart, with no client action, on both
backends.

Three UBRB clients (three worlds) publish their static transforms on ``/tf_static`` and a fourth
publishes 5 messages on a transient_local depth-3 topic, through the gateway and a UDP link to
``python -m ros_side``; a fifth publishes on a latched topic and leaves while the companion is
down. The companion is killed with SIGKILL and started again with its defaults (the state file
under ``$XDG_STATE_HOME``, here the test's own directory); the gateway hands its registrations
over on the new session (its clients get ERROR ``link_reset`` and do nothing about it, as the
Unreal plugin does). Then a real rclpy node (Kilted, Fast DDS) joins late: it must get what it
would have got before the restart (the union of every world's transforms; the last 3 of the 5
messages, in order), and the topic whose client left must not come back. Before issue 21 the
late node got nothing on either topic until the clients reconnected.
"""

import glob
import os
import sys
import time

import pytest

from ros_helpers import wait_for
from ros_side.companion import TfUnion
from ros_side.latched import decode
from tests.support.ros_msgs import ensure_tf2_msgs
from tests.support.ros_procs import ROS_PYTHON, Peer, require_ros, ros_env
from tests.support.tf_worlds import LATCHED, TF, WANT, WORLDS, late_node_gets, publish_worlds, tf_cdr

S = "std_msgs/msg/String"
DEEP = {"reliability": "reliable", "durability": "transient_local", "depth": 3}


def string_cdr(text):
    raw = text.encode() + b"\0"
    return b"\x00\x01\x00\x00" + len(raw).to_bytes(4, "little") + raw


def string_of(cdr):
    n = int.from_bytes(cdr[4:8], "little")
    return cdr[8:8 + n - 1].decode()


def kept(state_dir):
    """topic -> the samples the companion's state file holds now ({} when there is none)."""
    files = glob.glob(os.path.join(state_dir, "ubrb", "ros_side-*.latched"))
    if not files:
        return {}
    try:
        with open(files[0], "rb") as f:
            return {e[2]: e[5] for e in decode(f.read())}
    except (OSError, ValueError):
        return {}        # being replaced right now


def frames_in(samples):
    return {t[3] for t in TfUnion.decode(samples[-1])} if samples else set()


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_latched_topics_survive_a_companion_kill(backend, tmp_path):
    require_ros()
    ensure_tf2_msgs()
    from tests.e2e.helpers import E2E_DOMAIN, Client, LinkBridge
    state = str(tmp_path)
    env = ros_env(domain=E2E_DOMAIN, ROS_DISTRO="kilted", XDG_STATE_HOME=state)
    bridge = LinkBridge("udp", companion_python=ROS_PYTHON if backend == "rclpy"
                        else sys.executable, backend=backend, companion_env=env)
    clients = []
    late = None
    try:
        clients = publish_worlds(Client, bridge.port)
        mapper = Client(bridge.port, "mapper")
        clients.append(mapper)
        mapper.advertise(1, "/i21_map", S, DEEP)
        for i in range(5):
            mapper.publish(1, string_cdr("map %d" % i))
        gone = Client(bridge.port, "gone")
        gone.advertise(1, "/i21_gone", S, DEEP)
        gone.publish(1, string_cdr("from a client that leaves"))
        for c in clients + [gone]:
            c.sync()
        assert all(c.error_codes() == [] for c in clients + [gone])
        assert wait_for(lambda: frames_in(kept(state).get("/tf_static")) == set(WANT)
                        and len(kept(state).get("/i21_map", ())) == 3
                        and kept(state).get("/i21_gone"), 10), kept(state)

        bridge.kill_companion()                  # SIGKILL: nothing is written on the way out
        assert wait_for(lambda: not bridge.gw.ros_ready, 10), "the gateway did not notice"
        gone.close()                             # leaves while the companion is away
        assert wait_for(lambda: bridge.gw.pubs.find("/i21_gone") < 0, 5)
        t0 = time.monotonic()
        bridge.start_companion()                 # its defaults: the file under XDG_STATE_HOME
        assert wait_for(lambda: bridge.gw.ros_ready, 20), "the new session did not come up"
        up = time.monotonic() - t0
        for c in clients:                        # told, and doing nothing about it
            assert c.wait(lambda c=c: ("link_reset", None) in c.error_codes(), 10), c.errors

        got = late_node_gets(env, "/tf_static")
        late = Peer("rclpy", env)
        k = late.endpoint("sub", "/i21_map", S, DEEP)
        assert wait_for(lambda: len(late.received(k)) >= 3, 10), late.received(k)
        # the released topic's samples are forgotten (the gateway's UNADV on the new session)
        assert wait_for(lambda: "/i21_gone" not in kept(state), 5), kept(state)
        maps = [string_of(m) for m in late.received(k)]
    finally:
        if late is not None:
            late.close()
        for c in clients:
            c.close()
        bridge.close()
    print("%s backend: companion restarted after kill -9, link up again in %.1f s; a late rclpy "
          "node got /tf_static %s and /i21_map %s" % (backend, up, [sorted(g) for g in got],
                                                       maps))
    assert got == [WANT]
    assert maps == ["map 2", "map 3", "map 4"]


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_the_board_gateway_keeps_nothing_and_the_late_node_gets_it(backend, tmp_path):
    """The board case: the gateway is the deployed MicroPython port in the board's heap
    (tests/support/mp_unix.py, 128 KiB); the copy lives with the companion, so the same holds."""
    require_ros()
    ensure_tf2_msgs()
    import re
    import socket

    from tests.e2e.helpers import E2E_DOMAIN, Client, companion_argv
    from tests.support.loopback_ports import free_port
    from tests.support.mp_unix import MicroPythonGateway
    from tests.support.procs import Proc
    state = str(tmp_path)
    env = ros_env(domain=E2E_DOMAIN, ROS_DISTRO="kilted", XDG_STATE_HOME=state)
    url = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    argv = companion_argv(url, python=ROS_PYTHON if backend == "rclpy" else sys.executable,
                          backend=backend)
    comp = Proc(argv, env=env)
    gw = c = None
    try:
        comp.wait_line(r"companion on link", 30)
        gw = MicroPythonGateway("--link", url, env=env)
        gw.wait_line(r"ROS side up", 15)
        c = Client(gw.port, "world")
        c.advertise(1, "/tf_static", TF, LATCHED)
        c.publish(1, tf_cdr(WORLDS[0] + WORLDS[1]))
        c.sync()
        want = {"laser", "camera", "robot2/base_link"}
        assert wait_for(lambda: frames_in(kept(state).get("/tf_static")) == want, 10), kept(state)
        comp.kill()
        gw.wait_line(r"ROS side unreachable", 10)
        comp = Proc(argv, env=env)
        comp.wait_line(r"companion on link", 30)
        assert wait_for(lambda: len(re.findall(r"ROS side up", gw.text())) == 2, 20), gw.text()
        assert c.wait(lambda: ("link_reset", None) in c.error_codes(), 10), c.errors
        got = late_node_gets(env, "/tf_static")
    finally:
        if c is not None:
            c.close()
        if gw is not None:
            gw.stop()
        comp.stop()
    print("%s backend, MicroPython gateway: after kill -9 of the companion a late rclpy node got "
          "%s" % (backend, [sorted(g) for g in got]))
    assert [set(g) for g in got] == [want]
