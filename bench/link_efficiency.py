"""Link efficiency: payload bytes as a share of wire bytes (docs/LINK.md, "Efficiency").

Two sans-IO LinkSessions joined in memory; a producer keeps the sender's queue non-empty
(steady-state streaming, as behind a fast client), and every byte put on the wire is counted.
"forward" counts the data direction only (what limits throughput on a full-duplex UART);
"both" adds the acknowledgements and heartbeats flowing back. "lone" is one message on an
idle link: one frame of its own.

    .venv/bin/python bench/link_efficiency.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ports", "cpython"))

import ubrb_min as L  # noqa: E402
import ubrb_setup  # noqa: E402
from ubrb_host.cli import script_parser  # noqa: E402


class Sink:
    def __init__(self) -> None:
        self.n = 0
        self.bytes = 0

    def link_up(self, fresh: bool) -> None:
        pass

    def link_down(self) -> None:
        pass

    def link_message(self, t: int, slot: int, buf: object, off: int, n: int, rel: bool) -> None:
        self.n += 1
        self.bytes += n


def pair(datagram: bool, frame: int) -> tuple[L.LinkSession, L.LinkSession, Sink]:
    sink = Sink()
    kw = dict(datagram=datagram, max_frame=frame, max_message=65536, window=16,
              rel_bytes=1 << 20, be_bytes=1 << 19)
    a = L.LinkSession(Sink(), 1, True, **kw)
    b = L.LinkSession(sink, 2, False, **kw)
    now = 0
    while not (a.is_up() and b.is_up()):
        for x, y in ((a, b), (b, a)):
            n = x.poll_tx(now)
            if n:
                y.feed(bytes(x.tx_buf[:n]), 0, n, now)
        now += 1
    return a, b, sink


def stream(datagram: bool, frame: int, size: int, count: int, reliable: bool,
           lone: bool = False) -> tuple[float, float, float]:
    a, b, sink = pair(datagram, frame)
    msg = bytes(size)
    fwd = back = 0
    now = 1000
    queued = 0
    while sink.n < count:
        # keep ~4 frames' worth queued: steady state behind a faster producer
        if lone:
            if queued == sink.n and queued < count:
                a.send(L.LK_T_PUB, 1, msg, 0, size, reliable)
                queued += 1
        else:
            while queued < count and (a.reliable.rel_queued if reliable else a.beq.n) < 4 * frame:
                # best effort: one slot per message (a slot keeps only its newest)
                a.send(L.LK_T_PUB, queued % 200, msg, 0, size, reliable)
                queued += 1
        for _ in range(4):
            n = a.poll_tx(now)
            if not n:
                break
            fwd += n
            b.feed(a.tx_buf, 0, n, now)
        n = b.poll_tx(now)
        if n:
            back += n
            a.feed(b.tx_buf, 0, n, now)
        now += 1
    payload = sink.bytes
    return 100.0 * payload / fwd, 100.0 * payload / (fwd + back), (fwd - payload) / count


def main() -> None:
    script_parser("bench/link_efficiency.py", __doc__ or "").parse_args()
    rows = []
    for name, dg, frame in (("serial", False, ubrb_setup.LINK_SERIAL_FRAME), ("serial 1K", False, 1024),
                            ("serial 2K", False, 2048), ("udp", True, ubrb_setup.LINK_DEFAULT_MTU)):
        for size in (64, 1024):
            for rel in (True, False):
                f, both, ovh = stream(dg, frame, size, 3000 if size == 64 else 600, rel)
                rows.append((name, frame, size, "reliable" if rel else "best-effort",
                             f, both, ovh))
            lf, lb, lo = stream(dg, frame, size, 50, True, lone=True)
            rows.append((name, frame, size, "lone (reliable)", lf, lb, lo))
    print(f"{'link':10} {'frame':>5} {'msg':>5} {'class':16} {'forward %':>9} "
          f"{'both %':>7} {'overhead B/msg':>14}")
    for r in rows:
        print(f"{r[0]:10} {r[1]:5d} {r[2]:5d} {r[3]:16} {r[4]:9.2f} {r[5]:7.2f} {r[6]:14.2f}")
    # The same figure for the alternatives, from their fixed per-message framing cost:
    # rosserial 8 bytes (sync, length, checksums, topic id), Micro XRCE-DDS 19 bytes (serial
    # framing + session, submessage and data headers), one message per frame in both.
    print("\nreference, one message per frame (forward %):")
    for ref, ovh in (("rosserial", 8), ("Micro XRCE-DDS", 19)):
        print(f"  {ref:15} " + "  ".join(
            f"{size:5d} B: {100.0 * size / (size + ovh):6.2f}" for size in (64, 1024)))


if __name__ == "__main__":
    main()
