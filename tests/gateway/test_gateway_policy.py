"""Allow-lists through the gateway program (`python ubrb_min.py`) on real TCP sockets: peers
outside --allow-clients are closed at accept and counted, topics outside --allow-topics or in
--deny-topics get ERROR topic_denied, bad lists stop the program with one line."""

from __future__ import annotations

import os
import re
import socket
import sys

import pytest

import ubrb_min as U
from tests.support.gateway_procs import RUNTIMES, GatewayProcess, start_gateway
from tests.support.procs import ROOT, Proc
from tests.support.qos import QOS_R
from tests.support.raw_client import RawClient
from tests.support.ubrb_frames import advertise, hello, ping, subscribe


@pytest.fixture(scope="module", params=RUNTIMES)
def gateway(request):
    # on MicroPython too: the board forgets the Policy's parser and constructors once built
    # (ports/micropython/run.py START_UP_ONLY) and serves with what stays; the throttle runs
    # on every tick and on the /cmd_vel subscription below
    g = start_gateway(request.param, "--link", "none", "--profile", "mcu",
                      "--allow-clients", "127.0.0.1/32,::1",
                      "--allow-topics", "/ue/*,/cmd_vel", "--deny-topics", "/ue/private/*",
                      "--throttle", "/cmd_vel=20")
    yield g
    g.stop()


def connect_from(source: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def test_a_peer_outside_allow_clients_is_closed_without_a_word(gateway):
    s = connect_from("127.0.0.2", gateway.port)
    try:
        s.sendall(hello("outsider"))
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            data = b""
        assert data == b""  # no HELLO_ACK, no ERROR: closed
    finally:
        s.close()
    gateway.wait_line(r"refusing \('127\.0\.0\.2', \d+\): not in --allow-clients")
    # a peer inside the list is served as usual
    c = RawClient(gateway.port)
    c.send(hello("insider") + ping())
    c.expect_json(U.OP_HELLO_ACK)
    c.expect(U.OP_PONG)
    c.close()


def test_topics_outside_the_allow_list_or_in_the_deny_list_get_topic_denied(gateway):
    c = RawClient(gateway.port)
    c.send(hello("t") + advertise(1, "/ue/cmd", "std_msgs/msg/String", QOS_R)
           + advertise(2, "/odom", "nav_msgs/msg/Odometry", QOS_R)
           + subscribe(1, "/ue/private/key", "std_msgs/msg/String", QOS_R)
           + subscribe(2, "/cmd_vel", "geometry_msgs/msg/Twist", QOS_R)
           + advertise(1, "/ue/cmd", "std_msgs/msg/String", QOS_R))
    c.expect_json(U.OP_HELLO_ACK)
    assert c.expect_error() == ("topic_denied", 2)
    assert c.expect_error() == ("topic_denied", 1)
    assert c.expect_error() == ("duplicate_id", 1)  # the allowed ones were registered
    c.close()


def test_counters_at_shutdown_show_refusals():
    g = GatewayProcess("--link", "none", "--allow-clients", "127.0.0.1", "--deny-topics", "/x")
    s = connect_from("127.0.0.3", g.port)
    s.close()
    c = RawClient(g.port)
    c.send(hello() + subscribe(5, "/x", "std_msgs/msg/String", QOS_R))
    c.expect_json(U.OP_HELLO_ACK)
    assert c.expect_error() == ("topic_denied", 5)
    c.close()
    g.wait_line(r"not in --allow-clients")
    assert g.stop() == 0
    text = g.text()
    assert re.search(r"clients_refused_address\s+1\n", text), text
    assert re.search(r"topics_denied\s+1\n", text), text


@pytest.mark.parametrize("flags, words", [
    (["--allow-clients", "10.0.0.300/8"], "not an IPv4 or IPv6 address"),
    (["--allow-clients", "10.0.0.0/40"], "prefix length"),
    (["--throttle", "/imu"], "GLOB=HZ"),
    (["--throttle", "/imu=0"], "GLOB=HZ"),
])
def test_a_bad_list_stops_the_gateway_with_one_line(flags, words):
    p = Proc([sys.executable, os.path.join(ROOT, "ubrb_min.py"), "--link", "none", *flags],
             cwd="/")
    assert p.wait(15) == 2
    lines = p.text().strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("ubrb_min.py: "), lines
