"""Pairing through the real programs (issue 20 item 4): gateways with the companion's key arrive
and leave; a second one is refused while the first is alive (a WARNING naming both addresses);
when the one in use leaves, the other has the link within 2 s, and the companion says why its
link went down. Before, the second gateway took the companion over, and when it stopped, the
first one and the companion swapped HELLOs nonstop (553k in 90 s) and never paired again."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from typing import Any, List

from tests.cli.helpers import COMPANION, DOMAIN, GATEWAY
from tests.support.loopback_ports import free_port
from tests.support.procs import Proc


def key_file(tmp: Any) -> str:
    path = os.path.join(str(tmp), "link.key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, os.urandom(32).hex().encode() + b"\n")
    os.close(fd)
    return path


def test_a_second_gateway_is_refused_and_takes_over_when_the_first_leaves(tmp_path: Any) -> None:
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    key = ["--link-key", key_file(tmp_path)]
    comp = Proc(COMPANION + ["--link", link, "--backend", "dds", "--domain", str(DOMAIN),
                             "--no-diagnostics"] + key)
    procs: List[Proc] = [comp]

    def gateway() -> Proc:
        g = Proc(GATEWAY + ["--listen", "127.0.0.1:0", "--link", link, "--profile", "mcu"] + key)
        procs.append(g)
        return g

    try:
        comp.wait_line(r"companion on link", 30)
        t_start = time.monotonic()
        g1 = gateway()
        g1.wait_line(r"INFO ubrb\.link: link up: the companion answers on", 20)
        a1 = comp.wait_line(r"link: peer is now \('127\.0\.0\.1', (\d+)\)", 5).group(1)
        g2 = gateway()
        m = comp.wait_line(r"WARNING ubrb\.link: link: refused the gateway at 127\.0\.0\.1:(\d+): "
                           r"the gateway at 127\.0\.0\.1:%s is alive on this link" % a1, 20)
        assert m.group(1) != a1
        g2.wait_line(r"link: waiting for the companion on %s: nothing received" % link, 10)
        assert "link down" not in g1.text() and "link up" not in g2.text()

        g1.kill()                      # the gateway in use is gone: g2 within 2 s
        t0 = time.monotonic()
        g2.wait_line(r"INFO ubrb\.link: link up: the companion answers on", 5)
        took = time.monotonic() - t0
        print("g2 up %.2f s after g1 was killed" % took)
        assert took < 2.0, took
        # the companion says what happened: a new session, not 2 s of silence
        comp.wait_line(r"WARNING ubrb\.link: link down: the gateway began a new session: it "
                       r"restarted \(or another gateway took over\); its publishers", 5)
        comp.wait_line(r"link up: the gateway \(restarted: new session\) answers", 5)
        assert "nothing from the gateway" not in comp.text()

        g3 = gateway()                 # a third one, refused; the one in use stops
        comp.wait_line(r"refused the gateway at 127\.0\.0\.1:\d+: the gateway at "
                       r"127\.0\.0\.1:%s is alive" % m.group(1), 20)
        assert g2.stop(signal.SIGINT) == 0
        t0 = time.monotonic()
        g3.wait_line(r"INFO ubrb\.link: link up: the companion answers on", 5)
        took = time.monotonic() - t0
        print("g3 up %.2f s after g2 stopped" % took)
        assert took < 2.0, took
        assert comp.stop(signal.SIGINT) == 0
        elapsed = time.monotonic() - t_start
    finally:
        for p in procs:
            p.stop(signal.SIGINT)
    # HELLOs stayed paced: the companion's own count, in its shutdown table (before: ~3,000/s)
    hellos = int(re.search(r"link\.hello_tx\s+(\d+)", comp.text()).group(1))  # type: ignore
    refused = int(re.search(r"link\.refused\s+(\d+)", comp.text()).group(1))  # type: ignore
    print("companion: %d HELLOs sent, %d refused, in %.1f s" % (hellos, refused, elapsed))
    assert hellos <= elapsed * 24 and refused > 0
