"""Fuzzing in CI, bounded: the mutational fuzzers of fuzzers.py (a few hundred thousand inputs
each, each capped in time so a loaded machine cannot stretch the run) and hypothesis properties
(fewer, structured examples: arbitrary JSON into both ends of the record layer, arbitrary byte
chunks into a client session and into the link parser). No exception may escape, and the
invariants (reference counts, queue bounds, slot ownership, ring bounds) must hold.
`make fuzz` runs the same fuzzers for longer, with fresh seeds."""

from __future__ import annotations

import json
import os
from typing import Any, List

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ubrb_min as U
from scripted import ScriptedRos, profile
from tests.fuzz import fuzzers as Z
from tests.support import ubrb_frames as F

# Inputs per CI run and the time cap of each fuzzer; the minimum is what a run must reach even on
# a busy machine for the test to count (fewer means the fuzzer itself got slow: a failure).
N = int(os.environ.get("UBRB_FUZZ_INPUTS", "300000"))
CAP_S = float(os.environ.get("UBRB_FUZZ_CAP_S", "12"))
MIN_INPUTS = min(N, 100000)


def run(fuzzer: Any, seed: int) -> None:
    n = fuzzer(N, CAP_S, seed)
    print("%s: %d inputs" % (fuzzer.__name__, n))
    assert n >= MIN_INPUTS, "only %d inputs in %.0f s" % (n, CAP_S)


def test_fuzz_ubrb_decoder_and_sessions() -> None:
    run(Z.fuzz_ubrb, 101)


def test_fuzz_link_frame_parser() -> None:
    run(Z.fuzz_link_frames, 202)


def test_fuzz_link_records_both_ends() -> None:
    run(Z.fuzz_records, 303)


def test_fuzz_companion_end_with_the_real_companion() -> None:
    run(Z.fuzz_companion, 404)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.sampled_from(["pub", "sub", "/a", "std_msgs/msg/String"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(Z.KEYS) | st.text(max_size=5), inner, max_size=6),
    max_leaves=20)

ENDS = Z.record_ends()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.sampled_from(sorted(Z.record_corpus())) | st.integers(0, 255), value=json_values,
       slot=st.integers(0, (1 << 21) - 1))
def test_any_json_record_is_used_or_refused_never_raises(t: int, value: Any, slot: int) -> None:
    gs, cs, port, gw, end, comp = ENDS
    body = json.dumps(value).encode()
    before = port.c_bad + end.c_bad
    port.link_message(t, slot, body, 0, len(body), True)
    end.link_message(t, slot, body, 0, len(body), True)
    if not isinstance(value, dict) and t not in (U.LK_T_PUB, U.LK_T_MSG, U.LK_T_UNADV,
                                                 U.LK_T_UNSUB, U.LK_T_SUBCOUNT, U.LK_T_BAD):
        assert port.c_bad + end.c_bad >= before + 1     # refused by at least one end
    for s in (gs, cs):
        while s.poll_tx(s.now):
            pass
    Z.check_gateway(gw)


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=80) | st.sampled_from(Z.ubrb_corpus()), max_size=12))
def test_any_bytes_from_a_client_keep_the_registry_consistent(chunks: List[bytes]) -> None:
    ros = ScriptedRos()
    gw = U.Gateway(profile(max_clients=2, max_pubs=2, max_subs=2, max_topics=2,
                           max_payload=1024, max_control=512, queue_bytes=8192,
                           control_reserve=1024), ros=ros)
    ros.up()
    ci = gw.accept(0)
    Z._feed(gw, ci, F.hello("h"), 0)
    for k, c in enumerate(chunks):
        Z._feed(gw, ci, c, k)
        Z.check_gateway(gw)
    gw.closed(ci, "end")
    Z.check_gateway(gw)
    assert gw.pubs.used() == 0 and gw.subs.used() == 0


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.binary(max_size=120), max_size=8), datagram=st.booleans())
def test_any_bytes_on_the_link_are_parsed_within_bounds(data: List[bytes], datagram: bool) -> None:
    a, s = Z.link_pair(datagram)
    now = Z.handshake(a, s)
    for d in data:
        s.feed(Z.reseal(bytearray(d), s.seed) if len(d) > 20 and d[0] & 1 else d, 0, len(d), now)
        Z.check_link(s)
