"""CPU per message of the chain's Python, stage by stage, in one process (CPython, no sockets).

Reliable PUBLISH frames of --size CDR bytes go the way bench/chain_throughput.py sends them, with
the sockets and the DDS write left out: into the gateway's decoder and Gateway.received ->
LinkRosPort -> LinkSession.send (stage "gateway"), LinkSession.poll_tx builds the UDP frames
("framing"), the companion's LinkSession.feed parses them -> LinkCompanionEnd -> Companion.publish
-> a backend whose publish does nothing ("companion"), and its acknowledgements go back
("acks"). Window and frame size as a CPython end on UDP has them (32 frames of --mtu bytes).
Beside it, in the same run: what one Python call that copies the same bytes costs.

Use it to see where a change to ubrb_min.py, ros_side/link_end.py or ros_side/companion.py moves
the per-message CPU; the whole chain is bench/chain_throughput.py.

    .venv/bin/python bench/link_path.py [--count 200000] [--size 1024] [--mtu 1400]
"""

from __future__ import annotations

import os
import sys
import time
import timeit
from typing import Any, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ubrb_min as U  # noqa: E402
import ubrb_setup
from bench import relay_paths as RP  # noqa: E402
from ros_side.companion import Companion  # noqa: E402
from ros_side.link_end import LinkCompanionEnd  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402


class IdleBackend:
    """The dds backend's shape; publish keeps nothing (the DDS write is what any writer pays)."""

    distro = "kilted"
    node_name = "ros_side"  # (not a handle: the companion reads it as its node name)

    def publish(self, handle: Any, data: bytes) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # create_publisher etc.: a handle
        return lambda *a, **kw: object()


def shuttle(a: U.LinkSession, b: U.LinkSession, now: int) -> None:
    n = a.poll_tx(now)
    while n:
        b.feed(a.tx_buf, 0, n, now)
        n = a.poll_tx(now)


def main() -> None:
    ap = host_cli.script_parser("bench/link_path.py", __doc__ or "")
    ap.add_argument("--count", type=host_cli.positive_int, default=200000)
    ap.add_argument("--size", type=host_cli.positive_int, default=1024)
    ap.add_argument("--mtu", type=host_cli.positive_int, default=ubrb_setup.LINK_DEFAULT_MTU)
    a = ap.parse_args()
    g = ubrb_setup.new_link_session(None, 11, True, True, 65536, a.mtu)
    c = ubrb_setup.new_link_session(None, 22, False, True, 65536, a.mtu)
    g.window = c.window = 32
    gw = U.Gateway(ubrb_setup.make_profile("pc", {}), ros=U.LinkRosPort(g))
    comp = Companion(IdleBackend())
    comp.sink = LinkCompanionEnd(c, comp)
    now = 1
    hello = U.encode_json_frame(U.OP_HELLO, {"protocol": 1, "client": "bench"})
    for _ in range(20):                  # link up, then the ADVERTISE reaches the companion
        shuttle(g, c, now)
        shuttle(c, g, now)
        now += 5
        if g.is_up() and c.is_up() and not gw.active_clients():
            ci = RP.connect(gw, hello + RP.request(U.OP_ADVERTISE, 1, "/t"))
    frame = RP.publish_frame(a.size)
    fl = len(frame)
    dec = gw.clients[ci].decoder
    t = [0.0, 0.0, 0.0, 0.0]
    pc = time.perf_counter
    sent = comp.stats["pub_msgs"]
    i = 0
    while i < a.count:
        t0 = pc()
        k = 0                            # one socket read's worth: up to 32 frames
        while i < a.count and k < 32 and dec.space() >= (k + 1) * fl:
            U.copy_into(dec.buf, dec.fill + k * fl, frame, 0, fl)
            k += 1
            i += 1
        gw.received(ci, k * fl, now)
        t1 = pc()
        frames: List[bytes] = []
        n = g.poll_tx(now)
        while n:
            frames.append(bytes(g.tx_mv[:n]))
            n = g.poll_tx(now)
        t2 = pc()
        for f in frames:
            c.feed(f, 0, len(f), now)
        t3 = pc()
        shuttle(c, g, now)
        t4 = pc()
        for j, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            t[j] += d
    got = comp.stats["pub_msgs"] - sent
    if got != a.count:
        raise SystemExit("delivered %d of %d: the bench is broken" % (got, a.count))
    us = [x / a.count * 1e6 for x in t]
    buf = bytearray(a.size)
    copy = min(timeit.repeat(lambda: bytes(memoryview(buf)[0:a.size]), number=100000,
                             repeat=5)) / 100000 * 1e6
    print("link path, reliable %d B, MTU %d, %d messages (%.2f frames per message), CPU per "
          "message:" % (a.size, a.mtu, a.count, g.stat_counts[U._LKC_TX_FRAMES] / a.count))
    for name, v in zip(("gateway (PUBLISH -> link record)", "framing (poll_tx)",
                        "companion (frame -> Companion.publish)", "acks"), us):
        print("  %-40s %5.2f us" % (name, v))
    print("  %-40s %5.2f us" % ("total", sum(us)))
    print("  %-40s %5.2f us" % ("(one Python call copying %d B)" % a.size, copy))


if __name__ == "__main__":
    main()
