"""What a link frame costs the kernel on UDP, sent and received one by one or in batches.

The CPython link transport (ports/cpython/ubrb_host/link.py, UdpTransport) sends the frames of
one flush in one sendmsg with UDP segmentation (UDP_SEGMENT) and reads same-size frames several
at a time (UDP_GRO). This prints, in one run on 127.0.0.1, the CPU time per 1400-byte datagram
(sender and receiver in this process, so both sides' kernel work counts) for the four
combinations: one sendto per datagram or one sendmsg per batch, and a receiver without or with
GRO. Every datagram is checked to arrive, each exactly one frame.

Usage: .venv/bin/python bench/udp_batching.py [--count N] [--batch 16] [--size 1400]
"""

from __future__ import annotations

import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ubrb_host import cli as host_cli  # noqa: E402

UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO = getattr(socket, "UDP_GRO", 104)


def run(gso: bool, gro: bool, count: int, size: int, per: int) -> str:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    try:
        if gro:
            rx.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
        addr = rx.getsockname()
        buf = bytearray(size * per)
        mv = memoryview(buf)
        seg = [(socket.IPPROTO_UDP, UDP_SEGMENT, size.to_bytes(2, sys.byteorder))]
        rbuf = bytearray(65536)
        got = reads = 0
        t0 = time.process_time()
        for _ in range(count // per):
            if gso:
                tx.sendmsg([buf], seg, 0, addr)
            else:
                for k in range(per):
                    tx.sendto(mv[k * size:(k + 1) * size], addr)
            while True:
                try:
                    n, anc, _, _ = rx.recvmsg_into([rbuf], socket.CMSG_SPACE(4))
                except BlockingIOError:
                    break
                reads += 1
                step = n
                for level, kind, data in anc:
                    if level == socket.IPPROTO_UDP and kind == UDP_GRO:
                        step = int.from_bytes(data[:4], sys.byteorder)
                if step != size or n % size:
                    return "datagrams of %d bytes arrived, not %d" % (step, size)
                got += n // step
        dt = time.process_time() - t0
    except OSError as e:
        return "not available here: %s" % e
    finally:
        rx.close()
        tx.close()
    sent = count // per * per
    if got != sent:
        return "%d of %d datagrams arrived" % (got, sent)
    return "%5.2f us CPU per datagram, %d reads for %d datagrams" % (dt / sent * 1e6, reads, sent)


def main() -> int:
    ap = host_cli.script_parser("bench/udp_batching.py", __doc__ or "")
    ap.add_argument("--count", type=host_cli.positive_int, default=32000)
    ap.add_argument("--batch", type=host_cli.positive_int, default=16,
                    help="datagrams per batch (<= 64)")
    ap.add_argument("--size", type=host_cli.positive_int, default=1400)
    a = ap.parse_args()
    print("UDP on 127.0.0.1, %d-byte datagrams in batches of %d" % (a.size, a.batch))
    for gso in (False, True):
        for gro in (False, True):
            print("  %-28s %-16s %s" % ("sendmsg + UDP_SEGMENT" if gso else "one sendto each",
                                        "receiver GRO" if gro else "receiver plain",
                                        run(gso, gro, a.count, a.size, a.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
