"""Pairing converges (issue 20 item 4) over real UDP sockets on 127.0.0.1, on the virtual clock:
gateways with the companion's key arrive and leave, the companion restarts; the link is up with
the one live gateway within 2 s of the other leaving, a second gateway is refused while the
first is alive (a WARNING naming both), and no end sends more than its paced HELLOs."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, List, Optional

import pytest

import ubrb_min as L
from ubrb_host import link as host_link
from tests.link.helpers import CompanionEnd, GatewayEnd, World
from tests.support.loopback_ports import free_port


class Rig:
    def __init__(self, key: Optional[bytes]) -> None:
        self.key = key
        self.url = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
        self.w = World()
        self.epoch = 100
        self.gws: List[GatewayEnd] = []
        self.hello_tx = 0  # of ends closed
        self.c = self.companion()

    def companion(self) -> CompanionEnd:
        self.epoch += 1
        c = CompanionEnd(self.url, epoch=self.epoch, key=self.key)
        self.w.drivers.append(c.d)
        return c

    def gateway(self) -> GatewayEnd:
        self.epoch += 1
        g = GatewayEnd(self.url, epoch=self.epoch, key=self.key)
        self.w.drivers.append(g.d)
        self.gws.append(g)
        return g

    def leave(self, end: Any) -> None:
        self.hello_tx += end.s.counters()["hello_tx"]
        end.d.close()
        self.w.drivers.remove(end.d)
        if end in self.gws:
            self.gws.remove(end)

    def paired(self, g: GatewayEnd) -> bool:
        c = self.c
        return (g.s.is_up() and c.s.is_up() and c.s.peer_epoch == g.s.epoch
                and g.s.peer_epoch == c.s.epoch and c.t.peer == g.t.local_address())

    def up_within(self, g: GatewayEnd, ms: int) -> int:
        t0 = self.w.now
        assert self.w.run(ms, until=lambda: self.paired(g)), "not paired within %d ms" % ms
        print("paired after %d ms" % (self.w.now - t0))
        return self.w.now - t0

    def stays(self, g: GatewayEnd, ms: int) -> None:
        downs = g.s.counters()["down"]
        end = self.w.now + ms
        while self.w.now < end:
            self.w.step()
            assert self.paired(g)
        assert g.s.counters()["down"] == downs
        for other in self.gws:
            assert other is g or not other.s.is_up()

    def hellos(self) -> int:
        ends = [self.c] + self.gws
        return self.hello_tx + sum(e.s.counters()["hello_tx"] for e in ends)

    def close(self) -> None:
        for d in list(self.w.drivers):
            d.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_gateways_come_and_go_the_link_follows_the_live_one(keyed: bool, caplog: Any) -> None:
    r = Rig(os.urandom(32) if keyed else None)
    caplog.set_level(logging.INFO, "ubrb.link")
    try:
        t_start = r.w.now
        g1 = r.gateway()
        r.up_within(g1, 1000)
        # a second gateway with the same key: refused while g1 is alive, said once with both
        # addresses; g1's session is never interrupted (before, keyed, g2 took the companion
        # over, and when it stopped g1 and the companion swapped HELLOs nonstop)
        g2 = r.gateway()
        r.stays(g1, 4000)
        assert r.c.d.counters()["refused"] > 0
        refusals = [m.getMessage() for m in caplog.records if "refused the gateway" in m.message]
        assert len(refusals) == 1, refusals
        a1, a2 = (host_link.address(g.t.local_address()) for g in (g1, g2))
        assert "at %s" % a2 in refusals[0] and "the gateway at %s is alive" % a1 in refusals[0]
        # g1 freezes for 3 s (a stalled process, its own network down): g2 has the link within
        # 2 s; g1 comes back and is refused in turn
        r.w.drivers.remove(g1.d)
        assert r.up_within(g2, 2000) <= 2000
        r.w.run(1000)
        r.w.drivers.append(g1.d)
        r.stays(g2, 3000)
        # g2 leaves: g1 within 2 s. Both g1 and the companion were UP with someone else since
        # they last spoke, so neither one's HELLO was verified at the other: before, they
        # answered each other at once, forever, and never paired again
        r.leave(g2)
        assert r.up_within(g1, 2000) <= 2000
        r.stays(g1, 2000)
        # another arrives, g1 leaves: the newcomer within 2 s
        g3 = r.gateway()
        r.w.run(1000)
        assert r.paired(g1)
        r.leave(g1)
        assert r.up_within(g3, 2000) <= 2000
        # the companion restarts while g3 and a fourth gateway both knock: it pairs with one of
        # them within 2 s, and stays with it
        g4 = r.gateway()
        r.w.run(500)
        r.leave(r.c)
        r.c = r.companion()
        t0 = r.w.now
        assert r.w.run(2000, until=lambda: r.paired(g3) or r.paired(g4))
        assert r.w.now - t0 <= 2000
        live = g3 if r.paired(g3) else g4
        r.stays(live, 3000)
        # ... and when that one leaves, the other within 2 s
        other = g4 if live is g3 else g3
        r.leave(live)
        assert r.up_within(other, 2000) <= 2000
        r.stays(other, 2000)
        # HELLOs stayed paced the whole time: each end at most one per 50 ms plus its own
        # 250 ms timer (before, hundreds of thousands)
        secs = (r.w.now - t_start) / 1000
        print("%d HELLOs from all ends in %.1f s" % (r.hellos(), secs))
        assert r.hellos() <= 6 * secs * (1000 / 50 + 1000 / L.LK_HELLO_MS), r.hellos()
    finally:
        r.close()


def test_a_restarted_companion_on_serial_is_logged_as_a_new_session(caplog: Any) -> None:
    """The gateway's link-down line says what happened: the companion restarted on the cable and
    began a new session (before: "nothing from the companion for 2 s", which had not happened;
    the new session came 0.1 s after the restart). LinkWatch on real ptys, virtual clock."""
    from tests.link.helpers import SerialProxy

    proxy = SerialProxy(seed=7, noise=0)
    g = GatewayEnd(proxy.url("gw"), epoch=111)
    c = CompanionEnd(proxy.url("comp"), epoch=222)
    w = World()
    w.drivers += [g.d, c.d]
    w.proxies.append(proxy)
    watch = host_link.LinkWatch(g.d, proxy.url("gw"), "companion", w.now)
    w.hooks.append(watch.check)
    caplog.set_level(logging.INFO, "ubrb.link")
    try:
        assert w.run(3000, until=lambda: g.s.is_up() and c.s.is_up())
        w.run(10)
        c.d.close()                               # the companion restarts at once
        w.drivers.remove(c.d)
        c = CompanionEnd(proxy.url("comp"), epoch=333)
        w.drivers.append(c.d)
        t0 = w.now
        assert w.run(3000, until=lambda: g.s.is_up() and c.s.is_up() and g.s.peer_epoch == 333)
        assert w.now - t0 < L.LK_DEAD_MS       # well before any dead timer
        w.run(10)
        lines = [r.getMessage() for r in caplog.records if r.name == "ubrb.link"]
        assert "link down: the companion began a new session: it restarted" in lines, lines
        assert not any("nothing from the companion" in x for x in lines), lines
        assert any(x.startswith("link up: the companion (restarted: new session)") for x in lines)
    finally:
        for d in w.drivers:
            d.close()
        proxy.close()


def test_keyed_only_a_hello_with_the_key_is_a_refused_gateway() -> None:
    """Keyed, a HELLO from elsewhere while the gateway is alive is a second gateway (refused,
    warned about) only if its MAC is good; one without the key is counted as an auth failure."""
    key = os.urandom(32)
    r = Rig(key)
    stray = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        g1 = r.gateway()
        r.up_within(g1, 1000)
        for k in (os.urandom(32), key):
            x = L.LinkSession(None, 999, True, datagram=True, key=k)
            n = x._hello(0)
            stray.sendto(bytes(x.tx_buf[:n]), ("127.0.0.1", r.c.t.sock.getsockname()[1]))
            r.w.run(20)
        cc = r.c.d.counters()
        assert cc["auth"] == 1 and cc["refused"] == 1 and r.paired(g1)
    finally:
        stray.close()
        r.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_a_restarted_companion_on_udp_is_back_at_once(keyed: bool, caplog: Any) -> None:
    """The companion restarts on its port while the gateway, still UP, sends it heartbeats: the
    new companion answers the first frame it cannot take with a HELLO, and the gateway starts a
    new session at once and says so (before: it waited out its 2 s dead timer, then said
    "nothing from the companion for 2 s")."""
    r = Rig(os.urandom(32) if keyed else None)
    caplog.set_level(logging.INFO, "ubrb.link")
    try:
        g = r.gateway()
        r.up_within(g, 1000)
        watch = host_link.LinkWatch(g.d, r.url, "companion", r.w.now)
        r.w.hooks.append(watch.check)
        r.w.run(100)
        r.leave(r.c)
        r.c = r.companion()
        took = r.up_within(g, 2000)
        assert took <= 600, took       # a heartbeat (<= 400 ms) and a handshake
        r.w.run(10)
        lines = [x.getMessage() for x in caplog.records if x.name == "ubrb.link"]
        assert "link down: the companion began a new session: it restarted" in lines, lines
        assert not any("nothing from the companion" in x for x in lines), lines
    finally:
        r.close()
