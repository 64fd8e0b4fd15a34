"""The heap CI leg on the 64-bit MicroPython unix port (issue 19, item 5), with real sockets.

The board: the layout `tools/deploy.py build` makes for stock firmware (the .mpy files, loaded
into the heap), started by its main.py under `micropython -X heapsize=H64`
(tests/support/mp_unix.py, layout "files"), mcu profile, a UDP link on 127.0.0.1 to the real
companion (`python -m ros_side`, dds backend), no key and keyed: the chain of
tests/e2e/test_e2e_micropython.py. Two real TCP clients: each advertises a topic the other
subscribes (the companion's DDS writer and reader of that topic carry it across) and publishes
100 reliable messages a second for 10 s.

Asserted: start-up leaves >= F64 free (the gateway's memory line); no MemoryError anywhere (the
gateway's output: contained errors are logged); all 1,000 messages of each client delivered, in
order, no ERROR, nothing dropped (the gateway's counters at stop); the free heap at stop (Ctrl-C,
buffers still held, clients gone) within HEAP_CI_DRIFT64 of start-up's.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time
from typing import Any, Dict

import pytest

from tests.e2e.helpers import Client, key_file, ser, string_msg
from tests.e2e.mp_bridge import DEEP, S, MicroPythonBridge
from tests.support import mp_unix
from tests.support.side_by_side import Outcome, literal_eval, side_by_side

# UBRB_HEAPCI_H64 / UBRB_HEAPCI_H64_KEYED ("166k") try another heap (finding the smallest)
HEAPS = {False: os.environ.get("UBRB_HEAPCI_H64", mp_unix.H64),
         True: os.environ.get("UBRB_HEAPCI_H64_KEYED", mp_unix.H64_KEYED)}
FREE = {False: mp_unix.F64, True: mp_unix.F64_KEYED}
RATE_S = 0.01                   # each client publishes every 10 ms: 100 msg/s
SECONDS = 10
N = int(SECONDS / RATE_S)       # messages per client


def texts(c: Client, tag: str) -> list:
    with c.cv:
        got = [m for m in c.messages[2]]
    return [m for m in (bytes(g[8:]).split(b"\0")[0].decode() for g in got) if m.startswith(tag)]


def run_load(keyed: bool, tmp: Any) -> Dict[str, Any]:
    heap = HEAPS[keyed]
    # each leg its own topics: both legs run at once, on one DDS domain
    ab, ba = "/heapci%s_ab" % ("k" if keyed else ""), "/heapci%s_ba" % ("k" if keyed else "")
    t0 = time.monotonic()
    bridge = MicroPythonBridge(*(("--link-key", key_file(tmp)) if keyed else ()), heap=heap,
                               layout="files")
    a = b = None
    try:
        assert bridge.gw is not None
        gw = bridge.gw
        used, free = gw.heap_after_start()
        a, b = Client(bridge.port, "heapci-a"), Client(bridge.port, "heapci-b")
        a.advertise(1, ab, S, DEEP)
        a.subscribe(2, ba, S, DEEP)
        b.advertise(1, ba, S, DEEP)
        b.subscribe(2, ab, S, DEEP)
        # warm-up: until each side gets the other's messages (the companion's DDS reader and
        # writer of a topic have matched), then the load
        end = time.monotonic() + 15
        i = 0
        while (not texts(a, "warm") or not texts(b, "warm")) and time.monotonic() < end:
            a.publish(1, ser(string_msg("warm %d" % i), S))
            b.publish(1, ser(string_msg("warm %d" % i), S))
            i += 1
            time.sleep(0.05)
        assert texts(a, "warm") and texts(b, "warm"), "the crossing never carried a message\n" \
            + gw.text()[-3000:]
        start = time.monotonic()
        for k in range(N):
            delay = start + k * RATE_S - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            a.publish(1, ser(string_msg("cross %d" % k), S))
            b.publish(1, ser(string_msg("cross %d" % k), S))
        load_s = time.monotonic() - start
        assert a.wait(lambda: len(texts(a, "cross")) >= N and len(texts(b, "cross")) >= N, 20), \
            "delivered a %d, b %d of %d\n%s" % (len(texts(a, "cross")), len(texts(b, "cross")),
                                                N, gw.text()[-3000:])
        got = (texts(a, "cross"), texts(b, "cross"))
        errors = (a.error_codes(), b.error_codes())
        a.close()
        b.close()
        gw.wait_line(r"client 0 .*closed", 5)
        gw.wait_line(r"client 1 .*closed", 5)
        gw.stop(signal.SIGINT)
        m = gw.wait_line(r"heap at stop: (\d+) bytes used, (\d+) free", 5)
        counters = literal_eval(gw.wait_line(r"stopped; counters: (\{.*\})$", 5).group(1))
        link = literal_eval(gw.wait_line(r"link counters: (\{.*\})$", 5).group(1))
        out = gw.text()
    finally:
        for c in (a, b):
            if c is not None:
                c.close()
        bridge.close()
    return {"heap": heap, "used": used, "free": free, "stop_free": int(m.group(2)),
            "stop_used": int(m.group(1)), "got": got, "errors": errors, "counters": counters,
            "link": link, "out": out, "load_s": load_s, "seconds": time.monotonic() - t0}


@pytest.fixture(scope="module")
def loads(dp: Any, tmp_path_factory: Any) -> Dict[bool, Outcome]:
    """Both legs at once (each 10 s of real-time load; the gateways are separate processes).
    (dp: the e2e session's DDS set-up, loopback only, as every chain test here)"""
    return side_by_side({k: functools.partial(run_load, k, tmp_path_factory.mktemp("heap64"))
                         for k in (False, True)})


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_a_crossing_load_in_the_64_bit_board_heap(loads: Dict[bool, Outcome], keyed: bool) -> None:
    r = loads[keyed].get()
    out, c = r["out"], r["counters"]
    line = re.search(r"heap after start-up: .*", out)
    print("64-bit, heap %s (%s): %s; at stop %d used, %d free (%+d); load %.1f s, %.1f s in all"
          % (r["heap"], "keyed" if keyed else "plain", line.group(0) if line else "?",
             r["stop_used"], r["stop_free"], r["stop_free"] - r["free"], r["load_s"],
             r["seconds"]))
    assert "MemoryError" not in out and "unexpected error" not in out, out[-3000:]
    assert "not enough heap" not in out, out[-3000:]
    assert r["free"] >= FREE[keyed], "free after start-up %d < %d under %s:\n%s" % (
        r["free"], FREE[keyed], r["heap"], out[-3000:])
    want = ["cross %d" % k for k in range(N)]
    assert r["got"][0] == want and r["got"][1] == want, (len(r["got"][0]), len(r["got"][1]))
    assert r["errors"] == ([], [])
    assert c["publish_in"] >= 2 * N and c["message_out"] >= 2 * N, c
    for k in ("dropped_no_ros", "dropped_queue", "evicted", "errors_sent", "closed_slow"):
        assert c[k] == 0, (k, c)
    for k in ("drop_rel_full", "drop_down", "too_large", "auth", "down"):
        assert r["link"][k] == 0, (k, r["link"])
    assert r["stop_free"] >= r["free"] - mp_unix.HEAP_CI_DRIFT64, (r["free"], r["stop_free"])
