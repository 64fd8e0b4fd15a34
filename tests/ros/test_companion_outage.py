"""ROS -> client data across a link outage at the companion (issue 20, item 2): the real
Companion (a scripted backend, tests/support/fake_backend.py) behind its link end, the gateway's
LinkRosPort opposite, both LinkSessions on a virtual wire (tests/core/link_rig.Pair).

Reliable messages from a ROS subscription wait while the link is down -- in the link's ring up
to a window, then in the companion's hand-over queue -- and arrive, in order, when it resumes.
The bound is ``--release-after`` (LinkCompanionEnd.expire, 30 s by default; 5 s here): past it
the companion releases the gateway's entities, and the messages still waiting go with them --
counted (``release_drops``), logged by the program, and told to the clients of each
subscription (ERROR link_congested) when the gateway hands it over again. Never silently."""

from typing import Any, List, Tuple

import ubrb_min as L
from link_rig import Pair
from ros_side.companion import Companion
from ros_side.link_end import LinkCompanionEnd
from tests.support.fake_backend import FakeBackend
from tests.support.qos import QOS_R

RELEASE_MS = 5000


class Gw:
    """GatewaySink: re-subscribes on ros_up (as Gateway does), records messages and errors."""

    def __init__(self) -> None:
        self.port: Any = None
        self.messages: List[bytes] = []
        self.errors: List[Tuple[str, int, str, str]] = []
        self.subscribed = False

    def ros_up(self, distro: str, max_message: int) -> None:
        self.port.subscribe(2, "/r", "std_msgs/msg/String", QOS_R)

    def ros_down(self) -> None:
        pass

    def ros_session_lost(self, message: str) -> None:
        pass

    def ros_result(self, kind: str, slot: int, code: Any, message: str) -> None:
        self.subscribed = code is None

    def ros_error(self, kind: str, slot: int, code: str, message: str) -> None:
        self.errors.append((kind, slot, code, message))

    def ros_message(self, slot: int, buf: Any, off: int, n: int) -> None:
        self.messages.append(bytes(buf[off:off + n]))

    def ros_sub_count(self, slot: int, count: int) -> None:
        pass


def rig() -> Tuple[Pair, Gw, Companion, LinkCompanionEnd, FakeBackend, List[bool]]:
    gs = L.LinkSession(None, 101, True)
    cs = L.LinkSession(None, 202, False)
    port = L.LinkRosPort(gs)
    gw = Gw()
    gw.port = port
    port.sink = gw
    b = FakeBackend()
    comp = Companion(b, None, diagnostics_period_ms=0, queue_limit=1000)
    end = LinkCompanionEnd(cs, comp)
    comp.sink = end
    cut = [False]
    p = Pair(gs, cs, lambda data, d: [] if cut[0] else [data])
    return p, gw, comp, end, b, cut


def run(p: Pair, comp: Companion, end: LinkCompanionEnd, ms: int, until: Any = None) -> int:
    """The companion's loop (ros_side/__main__.py run_link) on the virtual clock."""
    released = 0
    for _ in range(ms // 10):
        p.run(10)
        comp.poll(p.now)
        if end.expire(p.now, RELEASE_MS):
            released += 1
        if until is not None and until():
            break
    return released


def msg(i: int) -> bytes:
    return b"\0\1\0\0" + (b"%04d" % i) * 125  # a 504-byte String CDR


def test_reliable_messages_from_ros_wait_for_an_outage_and_arrive_in_order() -> None:
    p, gw, comp, end, b, cut = rig()
    run(p, comp, end, 500, until=lambda: gw.subscribed)
    assert gw.subscribed
    cut[0] = True
    run(p, comp, end, 2500)                   # the link is down (2 s without the peer)
    assert not p.a.is_up() and not p.b.is_up()
    for i in range(100):                      # ROS goes on publishing meanwhile
        b.callbacks["/r"](msg(i))
    run(p, comp, end, 1000)
    assert len(comp._held) > 0, "the link's ring took them all: the test proves nothing"
    cut[0] = False
    released = run(p, comp, end, 3000, until=lambda: len(gw.messages) == 100)
    assert released == 0 and gw.messages == [msg(i) for i in range(100)]
    assert comp.stats["release_drops"] == 0 and comp.stats["queue_drops"] == 0 and not gw.errors


def test_past_release_after_the_waiting_messages_are_dropped_counted_and_told() -> None:
    p, gw, comp, end, b, cut = rig()
    run(p, comp, end, 500, until=lambda: gw.subscribed)
    cut[0] = True
    for i in range(100):
        b.callbacks["/r"](msg(i))
    released = run(p, comp, end, 2500 + RELEASE_MS)
    assert released == 1
    held = comp.stats["release_drops"]
    assert held > 0 and end.last_drops == held
    # the same gateway session comes back: it hands the subscription over again, its clients
    # are told how many were dropped, and whatever the link itself held still arrives
    gw.subscribed = False
    cut[0] = False
    run(p, comp, end, 2000, until=lambda: gw.errors)
    assert gw.subscribed
    assert [e[:3] for e in gw.errors] == [("sub", 2, "link_congested")]
    assert ("%d reliable message(s)" % held) in gw.errors[0][3]
    got = gw.messages
    assert got == [msg(i) for i in range(len(got))]        # in order, a prefix
    assert len(got) + held == 100                          # nothing unaccounted for
