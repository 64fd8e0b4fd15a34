"""The link's state is logged the moment it changes (up, down, the peer restarted), and while it
is down each end says what it waits for; a mistyped serial device does not look like success."""

from __future__ import annotations

import signal
import socket
import time

from tests.cli.helpers import COMPANION, DOMAIN, GATEWAY
from tests.support.loopback_ports import free_port
from tests.support.procs import Proc


def test_gateway_says_it_waits_for_the_companion() -> None:
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", link, "--profile", "mcu"])
    try:
        g.wait_line(r"listening on", 20)
        t0 = time.monotonic()
        g.wait_line(r"INFO ubrb\.link: link: waiting for the companion on %s: nothing received "
                    r"\(is the companion running there\? one paired with another gateway does "
                    r"not answer\)$" % link, 10)
        assert time.monotonic() - t0 < 5
    finally:
        g.stop(signal.SIGINT)


def test_mistyped_serial_device_keeps_saying_so() -> None:
    g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", "serial:/dev/ubrb-no-such-tty",
                        "--profile", "mcu"])
    try:
        g.wait_line(r"WARNING ubrb\.link: link: cannot open /dev/ubrb-no-such-tty yet \(no such "
                    r"device: check the path, e\.g\. ls /dev/serial/by-id/\); retrying", 20)
        g.wait_line(r"WARNING ubrb\.link: link: waiting for /dev/ubrb-no-such-tty to open", 10)
    finally:
        g.stop(signal.SIGINT)


def test_link_up_down_and_restart_are_logged_as_they_happen() -> None:
    port = free_port(socket.SOCK_DGRAM)
    link = "udp://127.0.0.1:%d" % port
    comp = Proc(COMPANION + ["--link", link, "--backend", "dds", "--domain", str(DOMAIN),
                             "--no-diagnostics"])
    gw = gw2 = None
    try:
        comp.wait_line(r"companion on link", 30)
        comp.wait_line(r"INFO ubrb\.link: link: waiting for the gateway on %s: nothing received "
                       r"\(no gateway sends to this address\)$" % link, 10)
        gw = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", link, "--profile", "mcu"])
        comp.wait_line(r"INFO ubrb\.link: link up: the gateway answers on %s$" % link, 20)
        gw.wait_line(r"INFO ubrb\.link: link up: the companion answers on %s$" % link, 20)
        gw.wait_line(r"ROS side up \('?humble", 20)

        gw.kill()  # gone without a word: only the silence tells
        t0 = time.monotonic()
        comp.wait_line(r"WARNING ubrb\.link: link down: nothing from the gateway for 2 s; its "
                       r"publishers and subscriptions are kept for 30 s$", 15)
        assert time.monotonic() - t0 < 10  # the session's dead time, not --release-after

        gw2 = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", link, "--profile", "mcu"])
        comp.wait_line(r"link up: the gateway \(restarted: new session\) answers on", 20)

        assert comp.stop(signal.SIGINT) == 0
        gw2.wait_line(r"WARNING ubrb\.link: link down: nothing from the companion for 2 s; "
                      r"clients stay connected, their topics wait for it$", 15)
        gw2.wait_line(r"ROS side unreachable", 5)
    finally:
        for p in (gw, gw2, comp):
            if p is not None:
                p.stop(signal.SIGINT)
    # the companion's shutdown counters: an aligned table of the non-zero ones
    text = comp.text()
    assert "counters (non-zero):" in text and "link.hello_rx" in text, text
