"""Issue 20, the link in the field: its targets through the real processes -- ``python
ubrb_min.py`` + a UDP link through an impairment proxy or a paced serial line + ``python -m
ros_side --backend dds`` -- with a UBRB client process offering a reliable 1 KiB stream at a fixed
rate to an independent DDS reader (bench/link_field.py run_condition: the bench's very rig and
figures; its impairments are tools/impair.py, re-exported by tests/support/impair.py).

"Delivered" is distinct sequence numbers at the reader, checked exactly once and in order;
"missing" is what the client wrote into its socket that never arrived (a message the client could
not write within 2 s of its time, the gateway pushing back, is "unsent": not delivered, not
missing). Shorter than the bench (3 s of offered load, 5 s on a noisy line, an outage 2 s in and
2 s of stream after it), the outages and the noisy lines side by side (TOGETHER); the rates are the
issue's: 1,000 msg/s on UDP, 40 msg/s on the 921,600-baud line (about half of it) for the cable
pull, 100 msg/s (above the line's 90) for the bit error rates, whose target is the line's payload
share.

Each test failed with the link of 834d6c0 (go-back-N, no outage hold); each passes now (the
kill -9 and the noisy lines last, issue 20). ``pytest -s``
prints each condition's figures."""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, Optional

import pytest

from tests.e2e.helpers import E2E_DOMAIN, E2E_XML
from tests.support.side_by_side import Outcome, side_by_side

# chainkit (and so link_field) joins this run's DDS domain and discovery tag
os.environ["UBRB_BENCH_XML"] = E2E_XML
os.environ["UBRB_BENCH_DOMAIN"] = str(E2E_DOMAIN)
from tests.support import loopback_ports  # noqa: E402
from bench import chainkit as K  # noqa: E402
K.use_ports(loopback_ports.free_port)  # ports from this worker's share, not the kernel's
from bench import link_field as LF  # noqa: E402

SECONDS = 3.0      # offered load without an outage (3,000 messages at 1,000 msg/s)
BER_SECONDS = 5.0  # a noisy line: 500 messages at 100 msg/s, past the frame fitting's start
EVENT_AT = 2.0     # an outage starts this far into the stream ...
TAIL = 2.0         # ... which goes on this long after it
DRAIN = 6.0


# `make test` runs this module after the rest, not beside other tests (tests/conftest.py,
# "serial"): throughput and p99 targets through real-time impairment.
pytestmark = pytest.mark.serial


@pytest.fixture(autouse=True)
def session_participant(dp: Any) -> None:
    """link_field's DDS reader lives on the e2e session's participant (tests/e2e/conftest.py)."""
    K.use_participant(dp)


# Conditions that mostly wait (a UDP outage; two 92 KB/s lines) run side by side in pairs, each
# through its own processes and topic, before their tests. The rows that assert a latency, and
# the cable pull (its re-pairing lost a session once beside four other chains on a machine
# loaded to 5), run alone.
TOGETHER = [{"blackout10": SECONDS, "blackout3": SECONDS},
            {"ber1e-3": BER_SECONDS, "ber1e-4": BER_SECONDS}]


def measure(name: str, seconds: float) -> Dict[str, Any]:
    return LF.run_condition(name, seconds, drain=DRAIN, event_at=EVENT_AT, tail=TAIL)


@pytest.fixture(scope="module")
def together(dp: Any) -> Dict[str, Outcome]:
    K.use_participant(dp)
    out: Dict[str, Outcome] = {}
    for group in TOGETHER:
        out.update(side_by_side({n: functools.partial(measure, n, s) for n, s in group.items()}))
    return out


def field(name: str, seconds: float = SECONDS,
          together: Optional[Dict[str, Outcome]] = None) -> Dict[str, Any]:
    r = together[name].get() if together is not None else measure(name, seconds)
    print(LF.fmt(r))
    assert r["corrupt"] == 0, "a corrupted message reached ROS: %s" % LF.fmt(r)
    assert r["delivered_unsent"] == 0, LF.fmt(r)
    return r


def assert_stream(r: Dict[str, Any], p99_s: float) -> None:
    """>= 95 % of the offered delivered exactly once, in order, p99 latency within ``p99_s``."""
    assert r["duplicates"] == 0 and r["out_of_order"] == 0, LF.fmt(r)
    assert r["delivered"] >= 0.95 * r["offered"], LF.fmt(r)
    assert r["p99"] is not None and r["p99"] <= p99_s, LF.fmt(r)


def assert_nothing_lost(r: Dict[str, Any], duplicates_allowed: bool = False) -> None:
    """Everything the client wrote arrives, in order; nothing dropped silently by the gateway."""
    assert r["missing"] == 0 and r["out_of_order"] == 0, LF.fmt(r)
    assert duplicates_allowed or r["duplicates"] == 0, LF.fmt(r)
    # (nothing came for 3 s while some were missing: where_stuck looked where, and waited)
    assert not r.get("stuck"), LF.fmt(r)
    assert not r["gw"].get("dropped_no_ros"), LF.fmt(r)


def test_mixed_wifi_keeps_95_percent_in_order_p99_250ms() -> None:
    # 5 % drop + 5 % duplication + 5 % reordered within 8 + 0-20 ms delay, each way
    assert_stream(field("mixed"), 0.25)


def test_20_percent_loss_keeps_95_percent_in_order_p99_1s() -> None:
    assert_stream(field("loss20"), 1.0)


def test_3s_blackout_loses_nothing(together: Dict[str, Outcome]) -> None:
    assert_nothing_lost(field("blackout3", together=together))


def test_10s_blackout_loses_nothing(together: Dict[str, Outcome]) -> None:
    assert_nothing_lost(field("blackout10", together=together))


def test_4s_serial_unplug_loses_nothing() -> None:
    assert_nothing_lost(field("pull4"))


def test_companion_kill9_loses_nothing() -> None:
    # Before the gateway kept what the old companion had not acknowledged: 77-266 lost (the
    # records in flight discarded with the old session, rel_reset_bytes). Duplicates are allowed
    # only by their two causes (bench/link_field.py score): the new companion's latched
    # re-publish (its DDS writer's history, ros_side/latched.py: every transient_local reader
    # that stayed gets it again) and the gateway re-sending a record the old companion had
    # written to ROS but whose acknowledgement never reached it. One writer never delivers
    # a message twice.
    r = field("kill9")
    assert_nothing_lost(r, duplicates_allowed=True)
    assert r["writers"] == 2 and r["gw_link"].get("rel_kept_bytes", 0) > 0, LF.fmt(r)
    assert r["dup_same_writer"] == 0, LF.fmt(r)
    assert r["dup_latched"] <= r["comp"].get("latched_restored", 0), LF.fmt(r)
    assert r["duplicates"] == r["dup_latched"] + r["dup_resent"], LF.fmt(r)


def test_ber_1e3_carries_30_percent_of_the_line(together: Dict[str, Outcome]) -> None:
    r = field("ber1e-3", together=together)
    assert r["payload_share"] >= 0.30, LF.fmt(r)


def test_ber_1e4_carries_60_percent_of_the_line(together: Dict[str, Outcome]) -> None:
    r = field("ber1e-4", together=together)
    assert r["payload_share"] >= 0.60, LF.fmt(r)


# -- what held before issue 20 and must keep holding --------------------------------------------------
@pytest.mark.parametrize("name", ["dup5", "delay"])
def test_duplication_or_in_order_delay_alone_hold(name: str) -> None:
    # 5 % duplication, or 0-20 ms of delay that keeps the order: today every message arrives
    # exactly once, in order (p99 195 / 88 ms in the bench; not asserted: the duplicates cost
    # a few RTOs today, and a loaded machine moves a p99 near its bound)
    r = field(name)
    assert r["duplicates"] == 0 and r["out_of_order"] == 0, LF.fmt(r)
    assert r["delivered"] >= 0.95 * r["offered"] and r["missing"] == 0, LF.fmt(r)
