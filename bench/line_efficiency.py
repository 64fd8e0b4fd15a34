"""Link efficiency on a real line, through the real processes.

The gateway (``python ubrb_min.py``) and the companion (``python -m ros_side --backend dds``) are
joined by two pty pairs and a proxy that moves baud/10 bytes per second each way (8N1, 115200 by
default) and counts the bytes gateway -> companion. One UBRB client offers ~2x the line rate of
std_msgs/String messages (64 B and 1 KiB of CDR; best-effort and reliable); an independent
cyclonedds reader counts the CDR bytes delivered. After a warm-up, over a steady-state window:

    payload share = CDR bytes delivered at the reader / bytes on the wire gateway -> companion
    goodput       = CDR bytes delivered per second / (baud / 10)

Beside it, at the same sizes, the share a line would have with the fixed per-message overhead of
rosserial (8 B) and of Micro XRCE-DDS on a serial transport (19 B; breakdown in XRCE_OVERHEAD),
one message per frame. Issue 12's goal: >= 0.92 at 64 B and >= 0.97 at 1 KiB, both classes,
goodput >= 0.90. (bench/link_efficiency.py measures the link codec in memory, not a line.)

    .venv/bin/python bench/line_efficiency.py [--baud 115200] [--warmup 3] [--window 15]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import chainkit as K  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

ROSSERIAL_OVERHEAD = 8
# Micro XRCE-DDS over its serial transport, one WRITE_DATA per message, as assumed here:
# framing 7 B (begin flag 0x7E, source and remote address 1+1, length 2, CRC-16 2), message
# header 4 B (session id, stream id, sequence number 2; a session id < 128 adds a 4-byte client
# key: 8 B), submessage header 4 B (id, flags, length 2), WRITE_DATA's BaseObjectRequest 4 B
# (request id 2, object id 2). Not counted: HDLC byte stuffing (~2 bytes in 256 of random data),
# the reliable stream's HEARTBEAT/ACKNACK, and alignment padding; XRCE carries the XCDR body
# without the 4-byte encapsulation header ROS CDR has, which is counted here as payload.
XRCE_OVERHEAD = 7 + 4 + 4 + 4


def measure(chain: K.Chain, tag: str, size: int, qos: dict, offer: float, warmup: float,
            window: float) -> Dict[str, Any]:
    assert chain.line is not None
    topic = "/bench/eff/%s" % tag
    reliable = qos["reliability"] == "reliable"
    reader = K.dds_reader(topic, reliable=reliable)
    c = K.RawClient(chain.port, "eff-" + tag)
    stop = [False]
    try:
        c.advertise(1, topic, qos)
        c.sync()
        if not K.wait_for(lambda: K.matched(reader) >= 1, 20.0):
            raise RuntimeError("the companion's writer never matched the reader (ERRORs: %s)" % c.errors)
        time.sleep(0.3)
        col = K.Collector(reader)
        rate = offer * chain.line.rate / size        # messages per second offered

        def offerer() -> None:
            t_next = time.monotonic()
            i = 0
            while not stop[0]:
                now = time.monotonic()
                if t_next > now:
                    time.sleep(min(t_next - now, 0.01))
                    continue
                c.publish(1, K.tagged_cdr(0, i, size))
                i += 1
                t_next += 1.0 / rate
        th = threading.Thread(target=offerer, daemon=True)
        th.start()
        time.sleep(warmup)
        for sn in chain.line.sniff:
            sn.reset()
        n0, w0, t0 = col.bytes, chain.line.moved[0], time.monotonic()
        back0 = chain.line.moved[1]
        time.sleep(window)
        n1, w1, t1 = col.bytes, chain.line.moved[0], time.monotonic()
        back1 = chain.line.moved[1]
        census = chain.line.sniff[0].summary()
        stop[0] = True
        th.join(5)
        col.stop()
        payload, wire = n1 - n0, w1 - w0
        return {"share": payload / wire if wire else 0.0,
                "goodput": payload / (t1 - t0) / chain.line.rate,
                "wire_use": wire / (t1 - t0) / chain.line.rate,
                "back_per_s": (back1 - back0) / (t1 - t0),
                "errors": sorted({e.get("code", "?") for e in c.errors}),
                "census": census}
    finally:
        stop[0] = True
        c.close()
        reader.__del__()


def main(argv: Optional[List[str]] = None) -> int:
    ap = host_cli.script_parser("bench/line_efficiency.py", __doc__ or "")
    ap.add_argument("--baud", type=host_cli.positive_int, default=115200)
    ap.add_argument("--offer", type=float, default=2.0, help="offered load / line rate (2)")
    ap.add_argument("--warmup", type=host_cli.duration, default=3.0,
                    help="seconds before the window")
    ap.add_argument("--window", type=host_cli.duration, default=15.0,
                    help="steady-state window, s")
    ap.add_argument("--sizes", default="64,1024", help="CDR bytes per message")
    ap.add_argument("--be-depths", default="1,10",
                    help="KEEP_LAST depths of the best-effort rows (1,10): the link keeps that "
                         "many newest records per topic while the line is busy")
    ap.add_argument("--census", action="store_true",
                    help="also print the frames seen on the line gateway -> companion")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    classes = [("best-effort d%d" % d, dict(K.QOS_BE, depth=d)) for d in
               (int(x) for x in a.be_depths.split(","))] + [("reliable", K.QOS_R)]

    print("line efficiency, %d baud paced pty, client offers %.1fx the line rate, window %.0f s "
          "after %.0f s (DDS domain %d, loopback only)"
          % (a.baud, a.offer, a.window, a.warmup, K.DOMAIN))
    print("  %-6s %-16s %8s %8s %9s   %9s %9s" % ("size", "class", "share", "goodput",
                                                  "line use", "rosserial", "XRCE-DDS"))
    for size in sizes:
        for cls, qos in classes:
            chain = K.Chain(baud=a.baud)      # a fresh chain: nothing queued from the last row
            try:
                r = measure(chain, "s%d_%s%d" % (size, cls[0], qos["depth"]), size, qos,
                            a.offer, a.warmup, a.window)
            finally:
                chain.close()
            print("  %-6d %-16s %8.3f %8.3f %9.3f   %9.3f %9.3f%s"
                  % (size, cls, r["share"], r["goodput"], r["wire_use"],
                     size / (size + ROSSERIAL_OVERHEAD), size / (size + XRCE_OVERHEAD),
                     ("  ERROR frames: " + ",".join(r["errors"])) if r["errors"] else ""))
            if a.census:
                print("         line gateway->companion: %s; companion->gateway %.0f B/s"
                      % (r["census"], r["back_per_s"]))
    print("  rosserial: %d B/msg; Micro XRCE-DDS serial: %d B/msg (7 framing + 4 message header "
          "+ 4 submessage header + 4 WRITE_DATA request; 8-byte message header with a client "
          "key: %d B), one message per frame" % (ROSSERIAL_OVERHEAD, XRCE_OVERHEAD,
                                                 XRCE_OVERHEAD + 4))
    print("  goal (issue 12): share >= 0.92 at 64 B, >= 0.97 at 1 KiB, goodput >= 0.90; "
          "best-effort at depth 1 sends only the newest message, one per frame when the line "
          "is busy: 64 B ceiling 64/79 = 0.81 (docs/LINK.md, Efficiency)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
