"""Every ERROR code of the ROS side through the whole chain, for each transport: decided by the
companion (it alone knows ROS names, types and its own topics) or by the gateway (conflicts
between its clients, sizes), always delivered to the UBRB client with the client's own id."""

from __future__ import annotations

import time
from typing import Any, Iterator, List

import pytest

from tests.e2e.helpers import (
    both_matched,
    MODES,
    Client,
    Dds,
    RawCollector,
    open_bridge,
    matched,
    ser,
    string_msg,
)
from tests.support import ros_idl as I
from tests.support.qos import QOS_BE, QOS_R
from tests.support.procs import wait_for

S = "std_msgs/msg/String"

GW_MAX = 4096      # the gateway's --max-payload (direct mode: the companion's, same thing)
LINK_MAX = 1024    # link mode: the companion's --max-message (gateway -> ROS direction)


@pytest.fixture(scope="module", params=MODES)
def small(request: Any) -> Iterator[Any]:
    """The bridge of this module, with small message limits (the other tests do not care)."""
    if request.param == "direct":
        yield from open_bridge("direct", extra=("--max-payload", str(GW_MAX)))
    else:
        yield from open_bridge(request.param, profile={"max_payload": GW_MAX},
                               companion_args=("--max-message", str(LINK_MAX)))


# -- decided by the companion ------------------------------------------------------------------
def test_companion_decided_errors(small: Any, connect: Any) -> None:
    c = connect(small)
    cases = [
        ("adv", 1, "/e2e_err_type", "std_msgs/msg/Nope", "unknown_type"),     # not an interface
        ("sub", 2, "/e2e_err_type2", "nopkg/msg/X", "unknown_type"),          # no such package
        ("adv", 3, "/e2e_err_type3", "not a type", "unknown_type"),           # malformed
        ("adv", 4, "chat~ter", S, "invalid_topic"),                           # '~' not first
        ("sub", 5, "/a//b", S, "invalid_topic"),
        ("adv", 6, "/e2e-dash", S, "invalid_topic"),
        # the companion publishes /diagnostics itself (DiagnosticArray): the gateway cannot know
        ("adv", 7, "/diagnostics", S, "type_conflict"),
        ("sub", 8, "/diagnostics", "geometry_msgs/msg/Twist", "type_conflict"),
    ]
    for kind, id_, topic, rtype, _ in cases:
        (c.advertise if kind == "adv" else c.subscribe)(id_, topic, rtype)
    want = sorted((code, id_) for _, id_, _, _, code in cases)
    assert c.wait(lambda: len(c.errors) >= len(cases), 5), c.errors
    assert sorted(c.error_codes()) == want
    assert all(e["message"] for e in c.errors)
    # the registrations ended: a PUBLISH on a refused id is unknown_id, and the id is free again
    c.publish(1, ser(string_msg("x"), S))
    assert c.wait(lambda: ("unknown_id", 1) in c.error_codes(), 5)
    n = len(c.errors)
    c.advertise(1, "/e2e_err_fine", S)
    # its subscriber count: the companion created it (an ERROR would have come first)
    assert c.wait(lambda: c.count_of(1) is not None, 10), c.errors
    assert len(c.errors) == n and not c.closed


def test_companion_error_reaches_every_client_on_the_slot(small: Any, connect: Any) -> None:
    a, b = connect(small, "a"), connect(small, "b")
    a.advertise(10, "/e2e_two_bad", "std_msgs/msg/Nope")
    b.advertise(20, "/e2e_two_bad", "std_msgs/msg/Nope")
    assert a.wait(lambda: a.error_codes() == [("unknown_type", 10)], 5), a.errors
    assert b.wait(lambda: b.error_codes() == [("unknown_type", 20)], 5), b.errors


# -- decided by the gateway --------------------------------------------------------------------
def test_gateway_decided_conflicts(small: Any, connect: Any) -> None:
    """Conflicts between the gateway's own registrations are answered at once: the ERROR comes
    before the PONG of a PING sent right behind the registration (no round trip to ROS)."""
    a, b = connect(small, "a"), connect(small, "b")
    a.advertise(1, "/e2e_conflict", S)
    a.sync()
    b.subscribe(2, "/e2e_conflict", "geometry_msgs/msg/Twist")      # other type, other kind
    b.sync()
    assert b.error_codes() == [("type_conflict", 2)]
    b.advertise(3, "/e2e_conflict", "std_msgs/msg/Bool")             # other type, same kind
    b.sync()
    assert b.error_codes()[-1] == ("type_conflict", 3)
    b.advertise(4, "/e2e_conflict", S, QOS_BE)                       # same type, other QoS
    b.sync()
    assert b.error_codes()[-1] == ("qos_conflict", 4)
    b.subscribe(5, "/e2e_conflict_s", S, QOS_R)
    b.sync()
    a.subscribe(6, "/e2e_conflict_s", S, QOS_BE)                     # subscriptions too
    a.sync()
    assert a.error_codes() == [("qos_conflict", 6)]
    # the holder is unaffected, and a matching registration shares the slot
    b.advertise(7, "/e2e_conflict", S)
    b.sync()
    # markers: whatever the ROS side says about either client's registrations came before them
    b.settle(8, "/e2e_conflict_mark_b")
    a.settle(9, "/e2e_conflict_mark_a")
    assert len(b.errors) == 3 and a.error_codes() == [("qos_conflict", 6)]


# The companion's own qos_conflict (another QoS on a topic it already has an entity for, or a
# QoS value ROS 2 does not have) cannot be reached through a working gateway: the gateway keeps
# one slot per topic and kind and refuses another QoS itself (above), and refuses unknown QoS
# values as protocol_error. tests/ros covers it against the companion directly;
# test_e2e_resilience.py::test_qos_change_during_outage shows the one way it surfaces here.


# -- message_too_large --------------------------------------------------------------------------
def error_times(c: Client, code: str, id_: int) -> List[float]:
    """Arrival times of the ERROR frames with this code and id."""
    with c.cv:
        return [e["_t"] for e in c.errors if e["code"] == code and e["id"] == id_]


def check_rate_limited(c: Client, id_: int, burst_s: float) -> None:
    """A burst longer than a second of too-large messages: a first report, then at most about
    one a second (the tail of the burst may still be reported a second after its end)."""
    assert c.wait(lambda: len(error_times(c, "message_too_large", id_)) >= 2, 3), c.errors
    times = error_times(c, "message_too_large", id_)
    assert len(times) <= int(burst_s) + 2, times
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.8, gaps                      # at most ~1 per second per id


def test_dds_message_too_large_for_the_gateway(small: Any, connect: Any, dds: Dds) -> None:
    """A 30 Hz burst of DDS messages bigger than the gateway takes: dropped, and the client hears
    message_too_large at most about once a second; messages that fit still flow."""
    topic = "/e2e_%s_big_in" % small.mode
    c = connect(small)
    c.subscribe(3, topic, S)
    w = dds.writer("rt" + topic, I.String, depth=100)
    assert wait_for(lambda: matched(w) == 1, 10)
    burst = 1.5
    end = time.monotonic() + burst
    while time.monotonic() < end:
        w.write(I.String(data="x" * (2 * GW_MAX)))
        time.sleep(1 / 30)
    w.write(I.String(data="fits"))
    assert c.wait(lambda: c.messages[3], 5)
    assert [I.String.deserialize(m).data for m in c.messages[3]] == ["fits"]
    check_rate_limited(c, 3, burst)
    assert {code for code, _ in c.error_codes()} == {"message_too_large"}
    assert not c.closed


def test_publish_too_large_for_the_companion(small: Any, connect: Any, dds: Dds) -> None:
    """Link mode: the companion takes at most LINK_MAX bytes per message (negotiated on the link);
    a bigger PUBLISH (still within the gateway's own max_payload) is refused by the gateway with
    message_too_large, at most once a second per id. (Direct mode has no such gap: a PUBLISH
    above max_payload is a malformed frame.)"""
    if small.mode == "direct":
        pytest.skip("direct mode: the ROS side takes whatever the gateway takes")
    topic = "/e2e_%s_big_out" % small.mode
    raw = RawCollector(dds.reader("rt" + topic, I.String, depth=100))
    c = connect(small)
    c.advertise(4, topic, S)
    assert wait_for(lambda: both_matched(c, 4, raw.reader), 10)
    big = ser(string_msg("y" * 2000), S)
    assert LINK_MAX < len(big) <= GW_MAX
    burst = 1.5
    end = time.monotonic() + burst
    while time.monotonic() < end:
        c.publish(4, big)
        time.sleep(1 / 30)
    ok = ser(string_msg("fits ok"), S)               # 16 bytes: 4-aligned
    c.publish(4, ok)
    assert raw.wait(1) == [ok]
    c.sync()
    check_rate_limited(c, 4, burst)
    assert {code for code, _ in c.error_codes()} == {"message_too_large"}
    assert not c.closed
