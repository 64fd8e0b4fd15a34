"""Failures at run time: a missing optional dependency, a port in use, a bridge that is not
there, has no ROS side or refuses the topic. One line naming the cause (and the fix) on
stderr, exit status 1; a client command that did not do what was asked never exits 0."""

from __future__ import annotations

import re
import socket
import time
from typing import Iterator

import pytest

from tests.cli.helpers import CLIENT, COMPANION, DEMO, DOMAIN, GATEWAY, PLAIN, one_line, run
from tests.support.loopback_ports import free_port
from tests.support.procs import Proc, child_env


STRING = "std_msgs/msg/String"


# -- missing optional dependencies: `python -S` has no site-packages --------------------------
def test_companion_without_cyclonedds_names_the_extra() -> None:
    one_line(run(PLAIN + ["-m", "ros_side", "--link", "udp://127.0.0.1:%d"
                          % free_port(socket.SOCK_DGRAM)]),
             1, "python -m ros_side: cyclonedds is not installed", "pip install '.[dds]'")


def test_companion_rclpy_backend_without_ros_says_source_it() -> None:
    one_line(run(PLAIN + ["-m", "ros_side", "--backend", "rclpy"]), 1,
             "rclpy is not installed", "source /opt/ros/<distro>/setup.bash", "--backend dds")


def test_client_help_needs_no_optional_dependency() -> None:
    r = run(PLAIN + ["-m", "ubrb_client", "pub", "--help"])
    assert r.returncode == 0 and "usage:" in r.stdout and not r.stderr, r.stderr


def test_client_without_message_definitions_names_the_extra() -> None:
    one_line(run(PLAIN + ["-m", "ubrb_client", "pub", "/x", STRING, "--wait", "1"]), 1,
             "is not installed", "pip install '.[client]'")


def test_demo_without_cyclonedds_names_the_extra() -> None:
    one_line(run(PLAIN + ["tools/demo.py", "--duration", "1"]), 1,
             "tools/demo.py: cyclonedds is not installed", "pip install '.[dds]'")


def test_observer_without_cyclonedds_names_the_extra() -> None:
    one_line(run(PLAIN + ["tools/ros_observer.py", "echo", "--duration", "1"]), 1,
             "tools/ros_observer.py: cyclonedds is not installed", "pip install '.[dds]'")


def test_unexpected_failure_has_a_traceback_only_with_debug() -> None:
    # a Cyclone configuration that does not parse: not one of the expected failures
    env = child_env(DOMAIN)
    env["CYCLONEDDS_URI"] = "<CycloneDDS><Domain><Nonsense>"
    argv = COMPANION + ["--backend", "dds", "--link", "udp://127.0.0.1:%d"
                        % free_port(socket.SOCK_DGRAM)]
    r = run(argv, env=env)
    # (Cyclone itself prints its own complaint about the file first)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("python -m ros_side: DDSException: "), line
    assert line.endswith("(--log-level debug shows where)"), line
    r = run(argv + ["--log-level", "debug"], env=env)
    assert r.returncode == 1 and "Traceback" in r.stderr


# -- ports in use ------------------------------------------------------------------------------
@pytest.fixture
def busy_tcp() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def busy_udp() -> Iterator[int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def test_gateway_port_in_use(busy_tcp: int) -> None:
    # -q: only warnings and errors, so the failure is the only line
    one_line(run(GATEWAY + ["--listen", "127.0.0.1:%d" % busy_tcp, "--link", "none", "-q"]), 1,
             "ubrb_min.py: cannot listen on 127.0.0.1:%d: address already in use" % busy_tcp)


def test_companion_link_port_in_use(busy_udp: int) -> None:
    one_line(run(COMPANION + ["--link", "udp://127.0.0.1:%d" % busy_udp, "--backend", "dds",
                              "-q"]), 1,
             "python -m ros_side: cannot open link udp://127.0.0.1:%d: address already in use"
             % busy_udp)


def test_demo_port_in_use(busy_tcp: int) -> None:
    one_line(run(DEMO + ["--ports", "%d,%d" % (busy_tcp, free_port(socket.SOCK_DGRAM))]), 1,
             "TCP port 127.0.0.1:%d is in use (try --ports 0)" % busy_tcp)


# -- the client against no bridge, a bridge without ROS side, a refusing ROS side ---------------
def test_pub_to_a_refused_port_says_why_and_exits_1() -> None:
    port = free_port()
    r = run(CLIENT + ["pub", "/x", STRING, "{data: hi}", "--server", "127.0.0.1:%d" % port,
                      "--wait", "2.5", "--reconnect-interval", "0.5"])
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    # after a second it says what it waits for, at the deadline why it gave up
    assert lines[0] == ("pub: waiting for the bridge at 127.0.0.1:%d (connection refused: "
                        "nothing listens there; retrying every 0.5 s)" % port), lines
    assert lines[-1] == ("pub: could not connect to 127.0.0.1:%d within 2.5 s: connection "
                         "refused: nothing listens there" % port), lines
    assert len(lines) == 2 and "Traceback" not in r.stderr


def test_echo_to_a_refused_port_says_what_it_waits_for() -> None:
    port = free_port()
    t0 = time.monotonic()
    p = Proc(CLIENT + ["echo", "/x", STRING, "--server", "127.0.0.1:%d" % port])
    try:
        m = p.wait_line(r"^echo: waiting for the bridge at 127\.0\.0\.1:%d \(connection refused"
                        % port, 10)
        assert m and time.monotonic() - t0 < 8
    finally:
        p.stop()


def test_echo_with_a_duration_and_no_bridge_exits_1() -> None:
    r = run(CLIENT + ["echo", "/x", STRING, "--server", "127.0.0.1:%d" % free_port(),
                      "--duration", "1.5"])
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("echo: could not connect to 127.0.0.1:")


@pytest.fixture
def gateway_without_ros() -> Iterator[int]:
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", "none", "--profile", "mcu"])
    port = int(g.wait_line(r"listening on 127\.0\.0\.1:(\d+)", 20).group(1))
    yield port
    g.stop()


def test_pub_to_a_gateway_without_ros_side_exits_1(gateway_without_ros: int) -> None:
    # --wait 1: it asks again for that long (a just-started gateway's link may come up), silently
    r = run(CLIENT + ["pub", "/chatter", STRING, "{data: hi}", "--server",
                      "127.0.0.1:%d" % gateway_without_ros, "--wait", "1"])
    one_line(r, 1, "pub: the bridge at 127.0.0.1:%d has no ROS side" % gateway_without_ros,
             "nothing was published")
    assert "publishing #1" not in r.stdout


def test_pub_to_a_gateway_just_started_waits_for_its_ros_side() -> None:
    # Issue 22 item 19: a gateway answers HELLO at once, before its link is up (ros_ready
    # false); pub asks again within --wait and publishes once the companion is there.
    lport = free_port(socket.SOCK_DGRAM)
    link = ["--link", "udp://127.0.0.1:%d" % lport]
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--profile", "mcu"] + link)
    port = int(g.wait_line(r"listening on 127\.0\.0\.1:(\d+)", 20).group(1))
    pub = Proc(CLIENT + ["pub", "/ubrb_pub_waits", STRING, "{data: late}", "--server",
                         "127.0.0.1:%d" % port, "--wait", "30"])
    comp = None
    try:
        pub.wait_line(r"^pub: the bridge at 127\.0\.0\.1:%d has no ROS side \(its companion is "
                      r"not connected\): waiting for it \(--wait 30 s\)$" % port, 20)
        comp = Proc(COMPANION + link + ["--backend", "dds", "--domain", str(DOMAIN),
                                        "--no-diagnostics"])
        assert pub.wait(40) == 0, pub.text()
        assert "publishing #1: std_msgs/msg/String {'data': 'late'}" in pub.text(), pub.text()
    finally:
        pub.stop()
        if comp is not None:
            comp.stop()
        g.stop()


def test_echo_says_when_the_ros_side_is_missing_and_when_it_is_back() -> None:
    # The gateway's companion is not running: echo says so at once (not a silent wait), then
    # when the companion starts and when it stops again; data flows while it is there.
    lport = free_port(socket.SOCK_DGRAM)
    link = ["--link", "udp://127.0.0.1:%d" % lport]
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--profile", "mcu",
                        "--max-clients-per-address", "2"] + link)
    port = int(g.wait_line(r"listening on 127\.0\.0\.1:(\d+)", 20).group(1))
    server = "127.0.0.1:%d" % port
    where = r"^echo: the bridge at 127\.0\.0\.1:%d has " % port
    echo = Proc(CLIENT + ["echo", "/ubrb_ros_back", STRING, "--server", server])
    comp = None
    try:
        echo.wait_line(where + r"no ROS side \(its companion is not connected\): waiting for "
                       r"it; nothing arrives on /ubrb_ros_back until then$", 20)
        assert "waiting for its first message" not in echo.text()
        comp = Proc(COMPANION + link + ["--backend", "dds", "--domain", str(DOMAIN),
                                        "--no-diagnostics"])
        echo.wait_line(where + r"a ROS side now \(ROS \w+\): subscribed to /ubrb_ros_back$",
                       30)
        r = run(CLIENT + ["pub", "/ubrb_ros_back", STRING, "{data: back}", "--server", server])
        assert r.returncode == 0, r.stderr
        echo.wait_line(r"^data: back$", 20)
        comp.stop()
        comp = None
        echo.wait_line(where + r"no ROS side any more \(its companion is not connected\)", 20)
    finally:
        echo.stop()
        if comp is not None:
            comp.stop()
        g.stop()
    assert "Traceback" not in echo.text(), echo.text()


@pytest.fixture
def direct_bridge() -> Iterator[int]:
    """The companion in direct mode (gateway core in-process, dds backend): a real ROS side."""
    b = Proc(COMPANION + ["--listen", "127.0.0.1:0", "--backend", "dds", "--domain", str(DOMAIN),
                          "--no-diagnostics"])
    port = int(b.wait_line(r"UBRB bridge on 127\.0\.0\.1:(\d+)", 30).group(1))
    yield port
    b.stop()


def test_pub_to_an_invalid_topic_exits_1(direct_bridge: int) -> None:
    r = run(CLIENT + ["pub", "/bad topic", STRING, "{data: hi}", "--server",
                      "127.0.0.1:%d" % direct_bridge])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.search(r"^pub: the bridge refused /bad topic: invalid_topic: ", r.stderr, re.M), \
        r.stderr
    assert "Traceback" not in r.stderr


def test_echo_of_an_unknown_type_on_the_ros_side_exits_1(direct_bridge: int) -> None:
    # the client knows the type (its distro); the ROS side is asked for a malformed topic
    r = run(CLIENT + ["echo", "/bad topic", STRING, "--server", "127.0.0.1:%d" % direct_bridge,
                      "--duration", "20"])
    assert r.returncode == 1
    assert re.search(r"^echo: the bridge refused /bad topic: invalid_topic", r.stderr, re.M), \
        r.stderr


def test_pub_that_reached_ros_exits_0(direct_bridge: int) -> None:
    r = run(CLIENT + ["pub", "/ubrb_cli_ok", STRING, "{data: hi}", "--server",
                      "127.0.0.1:%d" % direct_bridge])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("publishing #1: std_msgs/msg/String {'data': 'hi'}")


