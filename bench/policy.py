"""Throttle accuracy and the companion's history budget, through real processes.

`python ubrb_min.py --link udp://...` and `python -m ros_side --link udp://...` (dds backend, DDS
on loopback: bench/chainkit.py's Chain), one UBRB client on TCP, one DDS writer in this process.

Prints, in one run:
  * throttle: a ~1 kHz DDS stream on four topics, three of them throttled (10, 50, 100 Hz), one
    not: the rate each reaches the client at, beside its limit and the input rate, and whether the
    burst's last message arrived;
  * history budget: the issue's case (a client advertises transient_local depth 100000 and
    publishes 64 KiB messages) against a companion with --max-history-bytes 100M (the writer holds
    100 MiB, the rest is refused), and the same against one whose budget is out of the way
    (1024G): companion RSS before and after. The
    publishing is capped (--mib, default 256) so the control does not take the machine's memory
    (the issue let it run to 3 GB).

Usage: .venv/bin/python bench/policy.py [--seconds S] [--mib N]
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))

from bench import chainkit as K  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

RATES = {"/bench/t10": 10, "/bench/t50": 50, "/bench/t100": 100, "/bench/all": 0}
BIG = 64 * 1024
QOS_200 = {"reliability": "reliable", "durability": "volatile", "depth": 200}


def text_of(item: tuple) -> bytes:
    """The String data of one of RawClient.messages' (arrival time, CDR) items."""
    return K.string_of(item[1])


def bench_throttle(seconds: float) -> None:
    args: List[str] = []
    for topic, hz in RATES.items():
        if hz:
            args += ["--throttle", "%s=%d" % (topic, hz)]
    chain = K.Chain(gateway_args=tuple(args))
    c = K.RawClient(chain.port, "bench")
    try:
        writers: Dict[str, Any] = {}
        for k, topic in enumerate(RATES):
            c.subscribe(k + 1, topic, QOS_200)
            writers[topic] = K.dds_writer(topic, depth=200)
        K.wait_for(lambda: all(K.matched(w) for w in writers.values()), 10)

        def write_all(i: int) -> None:
            for w in writers.values():
                K.write_raw(w, K.string_cdr(b"%d" % i))

        def last_is(i: int) -> bool:
            return all(c.messages.get(k + 1) and text_of(c.messages[k + 1][-1]) == b"%d" % i
                       for k in range(len(RATES)))

        n = 0
        t0 = last_sync = time.monotonic()
        while time.monotonic() - t0 < seconds:
            write_all(n)
            n += 1
            time.sleep(0.001)
            if time.monotonic() - last_sync >= 2.0:   # the gateway's 10 s idle timer
                last_sync = time.monotonic()
                c.sync(10)
        elapsed = time.monotonic() - t0
        K.wait_for(lambda: last_is(n - 1), 10)
        # a marker behind the burst: whatever the throttle still held has arrived before it
        write_all(n)
        K.wait_for(lambda: last_is(n), 10)
        print("throttle: %d messages per topic in %.2f s (input %.0f Hz)" % (n, elapsed, n / elapsed))
        for k, (topic, hz) in enumerate(RATES.items()):
            got = c.messages.get(k + 1, [])[:-1]     # without the marker
            last = text_of(got[-1]) == b"%d" % (n - 1) if got else False
            share = ("%5.1f%% of the limit" % (100.0 * len(got) / elapsed / hz) if hz
                     else "%5.1f%% of the input" % (100.0 * len(got) / n))
            print("  %-12s %s: %5d delivered = %6.1f Hz (%s), last message %s"
                  % (topic, "limit %3d Hz" % hz if hz else "unthrottled ", len(got),
                     len(got) / elapsed, share, "delivered" if last else "MISSING"))
    finally:
        c.close()
        chain.close()


def bench_history(mib: int, budget: str) -> Optional[tuple]:
    # --latched-state none: the restart copy of latched samples (up to 64 MiB) is not measured here
    chain = K.Chain(companion_args=("--max-history-bytes", budget, "--latched-state", "none"))
    c = K.RawClient(chain.port, "hoarder")
    try:
        assert chain.comp is not None
        pid = chain.comp.pid
        before = K.rss_kib(pid) * 1024
        c.advertise(1, "/bench/hoard",
                    {"reliability": "reliable", "durability": "transient_local", "depth": 100000})
        c.sync(10)
        body = b"\x00\x01\x00\x00" + struct.pack("<I", BIG - 8) + b"x" * (BIG - 9) + b"\0"
        count = mib * 16
        t0 = time.monotonic()
        for _batch in range(0, count, 50):
            for _ in range(50):
                c.publish(1, body)
            c.sync(30)
            time.sleep(0.02)
        time.sleep(1.0)  # the companion's queue drains into its writer's history
        after = K.rss_kib(pid) * 1024
        refused = [e for e in c.errors if e["code"] == "resource_exhausted"]
        print("  --max-history-bytes %-4s: %s; companion RSS %.0f MiB -> %.0f MiB after %d x "
              "64 KiB PUBLISH (%.1f s)" % (budget, "messages past the budget refused "
                                           "(resource_exhausted)" if refused else "all held",
                                           before / 2**20, after / 2**20, count,
                                           time.monotonic() - t0))
        return before, after
    finally:
        c.close()
        chain.close()


def main() -> None:
    ap = host_cli.script_parser("bench/policy.py", __doc__ or "")
    ap.add_argument("--seconds", type=host_cli.duration, default=3.0)
    ap.add_argument("--mib", type=host_cli.positive_int, default=256)
    a = ap.parse_args()
    bench_throttle(a.seconds)
    print("history budget: transient_local depth 100000, 64 KiB messages (the issue's case)")
    bench_history(a.mib, "100M")
    bench_history(a.mib, "1024G")


if __name__ == "__main__":
    main()
