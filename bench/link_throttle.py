"""--throttle before the link, on a real 115200 line, through the real processes (issue 13).

The gateway (``python ubrb_min.py``) and the companion (``python -m ros_side --backend dds``) are
joined by chainkit's PacedLine (baud/10 bytes per second each way). An independent cyclonedds
writer publishes a ROS topic at 1 kHz (best effort, std_msgs/String of SIZE bytes of CDR, a
sequence number inside), one UBRB client subscribes to it. Measured over the writing window:
bytes per second on the line companion -> gateway (all link frames), the messages the client gets
per second, and whether the last one is the newest written. Run twice: with
``--throttle /bench/thr=HZ`` and, as the in-run comparison, without.

    .venv/bin/python bench/link_throttle.py [--baud 115200] [--hz 50] [--size 64] [--seconds 5]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import chainkit as K  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

TOPIC = "/bench/thr"
QOS_BE = {"reliability": "best_effort", "durability": "volatile", "depth": 1}


def run(baud: int, throttle_hz: int, size: int, seconds: float) -> Dict[str, Any]:
    flags = ("--throttle", "%s=%d" % (TOPIC, throttle_hz)) if throttle_hz else ()
    chain = K.Chain(baud, gateway_args=flags)
    c = None
    try:
        assert chain.line is not None
        c = K.RawClient(chain.port, "thr")
        c.subscribe(1, TOPIC, QOS_BE)
        c.sync()
        w = K.dds_writer(TOPIC, reliable=False, depth=1)
        if not K.wait_for(lambda: K.matched(w) >= 1, 20.0):
            raise RuntimeError("the companion's reader never matched the writer")
        time.sleep(0.5)
        n = int(seconds * 1000)
        b0, t0 = chain.line.moved[1], time.monotonic()
        for i in range(n):
            ahead = t0 + i / 1000.0 - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            K.write_raw(w, K.tagged_cdr(0, i, size))
        t1, b1 = time.monotonic(), chain.line.moved[1]
        time.sleep(0.5)                                  # the last period's message, the line
        got = [K.tag_of(cdr)[1] for _, cdr in c.messages.get(1, [])]
        return {"line_Bps": (b1 - b0) / (t1 - t0), "client_hz": len(got) / (t1 - t0),
                "newest": bool(got) and got[-1] == n - 1, "written": n,
                "summary": chain.line.sniff[1].summary()}
    finally:
        if c is not None:
            c.close()
        chain.close()


def main() -> int:
    ap = host_cli.script_parser("bench/link_throttle.py", __doc__ or "")
    ap.add_argument("--baud", type=host_cli.positive_int, default=115200)
    ap.add_argument("--hz", type=host_cli.positive_int, default=50)
    ap.add_argument("--size", type=host_cli.positive_int, default=64, help="CDR bytes per message")
    ap.add_argument("--seconds", type=host_cli.duration, default=5.0)
    a = ap.parse_args()
    line = a.baud / 10.0
    print("line %d baud (%.0f B/s each way), a 1 kHz topic of %d-byte messages for %g s"
          % (a.baud, line, a.size, a.seconds))
    for hz in (a.hz, 0):
        r = run(a.baud, hz, a.size, a.seconds)
        print("  %-22s line companion->gateway %6.0f B/s (%3.0f%% of the line), client %6.1f "
              "msg/s, newest delivered: %s"
              % ("--throttle %s=%d" % (TOPIC, hz) if hz else "no throttle", r["line_Bps"],
                 100 * r["line_Bps"] / line, r["client_hz"], r["newest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
