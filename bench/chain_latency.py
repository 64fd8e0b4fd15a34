"""Round-trip latency through the whole chain: a small std_msgs/String PUBLISH from a UBRB
client -> gateway -> link -> companion -> DDS, where an echo (an independent cyclonedds
participant in this process) republishes it -> companion -> link -> gateway -> the client's
subscription. Percentiles p50/p90/p99/max of the round trip:

- over the UDP link at 1 kHz (``--udp-rate``);
- over a 115200-baud paced pty line (two pty pairs joined by a proxy moving baud/10 bytes/s each
  way) at 20 Hz (``--serial-rate``), printed beside the line's own transmission time for the
  same bytes (the data frame each way, and what the line really carried per ping).

Issue 12's goal: serial p99 <= 2x p50 (Micro XRCE-DDS reports 8.81 ms round trips on UART 115200).

    .venv/bin/python bench/chain_latency.py [--udp-count 2000] [--serial-count 300] [--baud 115200]
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

LINK_FRAME_OVERHEAD = 12      # docs/LINK.md: sync 2, len 2, ctl 1, hck 1, seq 1, ack 1, CRC-32 4
RECORD_HEADER = 3             # type 1, slot varint 1, length varint 1 (messages < 128 B)


class Echo:
    """Republishes every sample of ``ping`` on ``pong`` unchanged, woken by a DDS WaitSet."""

    def __init__(self, ping: str, pong: str) -> None:
        from cyclonedds.core import InstanceState, ReadCondition, SampleState, ViewState, WaitSet
        self.reader = K.dds_reader(ping, depth=1000)
        self.writer = K.dds_writer(pong, depth=1000)
        self.ws = WaitSet(K.participant())
        self.rc = ReadCondition(self.reader, SampleState.Any | ViewState.Any | InstanceState.Any)
        self.ws.attach(self.rc)
        self._stop = False
        self.n = 0
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        from cyclonedds.util import duration
        while not self._stop:
            self.ws.wait(duration(milliseconds=50))
            for d in K.take_raw(self.reader):
                K.write_raw(self.writer, d)
                self.n += 1

    def close(self) -> None:
        self._stop = True
        self.t.join(5)
        self.ws.detach(self.rc)
        self.writer.__del__()
        self.reader.__del__()


def ping_run(chain: K.Chain, tag: str, count: int, rate: float) -> Dict[str, Any]:
    ping, pong = "/bench/%s/ping" % tag, "/bench/%s/pong" % tag
    echo = Echo(ping, pong)
    c = K.RawClient(chain.port, "lat-" + tag)
    try:
        c.subscribe(2, pong, K.QOS_R)
        c.advertise(1, ping, K.QOS_R)
        c.sync()
        if not K.wait_for(lambda: K.matched(echo.reader) >= 1 and K.matched(echo.writer) >= 1,
                          20.0):
            raise RuntimeError("the companion never matched the echo")
        # warm up until a ping comes back (discovery of the echo's writer by the companion)
        end = time.monotonic() + 20
        while not c.messages.get(2) and time.monotonic() < end:
            c.publish(1, K.string_cdr(b"warm"))
            time.sleep(0.1)
        time.sleep(0.3)
        c.messages.clear()
        sent: Dict[int, float] = {}
        line0 = list(chain.line.moved) if chain.line else [0, 0]
        if chain.line:
            for sn in chain.line.sniff:
                sn.reset()
        period = 1.0 / rate
        t_next = time.monotonic()
        for i in range(count):
            now = time.monotonic()
            if t_next > now:
                time.sleep(t_next - now)
            sent[i] = time.monotonic()
            c.publish(1, K.string_cdr(b"p%06d" % i))
            t_next += period
        K.wait_for(lambda: len(c.messages.get(2, [])) >= count, 5.0)
        line1 = list(chain.line.moved) if chain.line else [0, 0]
        rtt: List[float] = []
        late: List[int] = []
        for t, cdr in c.messages.get(2, []):
            s = K.string_of(cdr)
            if s.startswith(b"p"):
                i = int(s[1:])
                r = (t - sent[i]) * 1000.0
                rtt.append(r)
                if r > 20:
                    late.append(i)
        res: Dict[str, Any] = K.percentiles(rtt)
        res["n"] = len(rtt)
        res["lost"] = count - len(rtt)
        res["late_idx"] = late[:12]
        res["line_bytes"] = [line1[0] - line0[0], line1[1] - line0[1]]
        res["cdr"] = len(K.string_cdr(b"p%06d" % 0))
        if chain.line:
            t0 = sent[0]
            res["census"] = [sn.summary() for sn in chain.line.sniff]
            res["big"] = [(round(t - t0, 3), L, k) for t, L, k in chain.line.sniff[0].big_at]
            res["late_at"] = [round(sent[i] - t0, 3) for i in late]
        return res
    finally:
        c.close()
        echo.close()


def fmt(r: Dict[str, Any]) -> str:
    return "p50 %6.2f  p90 %6.2f  p99 %6.2f  max %7.2f ms  (n %d, lost %d)" % (
        r["p50"], r["p90"], r["p99"], r["max"], r["n"], r["lost"])


def main(argv: Optional[List[str]] = None) -> int:
    ap = host_cli.script_parser("bench/chain_latency.py", __doc__ or "")
    ap.add_argument("--udp-count", type=host_cli.positive_int, default=2000)
    ap.add_argument("--udp-rate", type=float, default=1000.0, help="pings/s over UDP")
    ap.add_argument("--serial-count", type=host_cli.positive_int, default=300)
    ap.add_argument("--serial-rate", type=float, default=20.0, help="pings/s over serial")
    ap.add_argument("--baud", type=host_cli.positive_int, default=115200)
    ap.add_argument("--skip-udp", action="store_true")
    a = ap.parse_args(argv)

    print("round trip of a small std_msgs/String: client -> gateway -> link -> companion -> "
          "DDS echo -> back (DDS domain %d, loopback only)" % K.DOMAIN)
    if not a.skip_udp:
        ch = K.Chain()
        try:
            r = ping_run(ch, "udp", a.udp_count, a.udp_rate)
        finally:
            ch.close()
        print("  UDP link, %4.0f Hz          %s" % (a.udp_rate, fmt(r)))
        print("    line transmission: n/a (loopback UDP)")
    ch = K.Chain(baud=a.baud)
    try:
        r = ping_run(ch, "ser", a.serial_count, a.serial_rate)
    finally:
        out = ch.close()
    print("  serial %d, %4.0f Hz    %s" % (a.baud, a.serial_rate, fmt(r)))
    frame = LINK_FRAME_OVERHEAD + RECORD_HEADER + r["cdr"]
    one_way = frame * 10.0 / a.baud * 1000.0
    per_ping = (r["line_bytes"][0] + r["line_bytes"][1]) / max(1, a.serial_count)
    print("    line transmission of the same bytes: %d B data frame each way = %.2f ms one way, "
          "%.2f ms round trip; the line carried %.1f B per ping (both ways, acks and "
          "heartbeats included) = %.2f ms of line time"
          % (frame, one_way, 2 * one_way, per_ping, per_ping * 10.0 / a.baud * 1000.0))
    print("    p99/p50 = %.1f (goal <= 2); pings above 20 ms (first 12): %s"
          % (r["p99"] / r["p50"], r["late_idx"]))
    print("    line census gateway->companion: %s" % r["census"][0])
    print("    line census companion->gateway: %s" % r["census"][1])
    print("    frames >= 512 B gateway->companion (s after first ping, bytes, kind), first 6: %s"
          % r["big"][:6])
    print("    send times of the pings above 20 ms (s), first 6: %s" % r["late_at"][:6])
    lc = K.last_counters(out)
    if lc:
        print("    gateway link counters: " + ", ".join(
            "%s=%s" % (k, lc[k]) for k in ("tx_frames", "rx_frames", "retx", "timeouts",
                                          "fast_retx", "dup", "ooo", "srtt_ms", "rto_ms")
            if k in lc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
