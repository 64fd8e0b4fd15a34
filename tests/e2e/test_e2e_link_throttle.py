"""--throttle spares the link, through real processes: `python ubrb_min.py` (the gateway) and
`python -m ros_side` (the companion) joined by a serial link on two ptys with a real line rate
(tools.ptyline.PtyLine at the line's baud), a plain cyclonedds writer publishing sensor_msgs/Imu at
1 kHz, a UBRB client subscribed to it.

The gateway's SUB link record carries the throttle period (docs/LINK.md, "period_ms"), so the
companion holds the topic to 50 Hz before the link: the bytes crossing the line companion ->
gateway are ~50 Hz worth of IMU messages, not the line's full rate. The in-run comparison is
the same chain without --throttle, where the 1 kHz stream fills the line.

460800 baud: one Imu is 330 bytes on the wire, so 50 Hz of it (~17 kB/s) does not fit the
11.5 kB/s of a 115200 line at all; at 460800 (46 kB/s) it fits with room to spare, and the
unthrottled 1 kHz (330 kB/s) still overruns the line seven times.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import Any, Dict, List

import pytest

from tests.e2e.helpers import E2E_DOMAIN, Client, companion_argv, e2e_proc
from tests.support.procs import ROOT, Proc
from tools.ptyline import PtyLine
from tests.support.qos import QOS_BE

HERE = os.path.dirname(os.path.abspath(__file__))
BAUD = 460800
HZ = 50
COUNT = 3000                   # 3 s at 1 kHz


# `make test` runs this module after the rest, not beside other tests (tests/conftest.py,
# "serial"): a rate measured over a paced serial line.
pytestmark = pytest.mark.serial


def chain(*gateway_flags: str) -> Dict[str, Any]:
    """One run of the whole chain; what crossed the line and what the client got."""
    cable = PtyLine(BAUD)
    procs: List[Proc] = []
    c = None
    try:
        comp = e2e_proc(companion_argv(cable.url("comp"), "--baud", str(BAUD)))
        procs.append(comp)
        comp.wait_line(r"companion on link", 30)
        gw = Proc([sys.executable, os.path.join(ROOT, "ubrb_min.py"), "--listen", "127.0.0.1:0",
                   "--link", cable.url("gw"), "--baud", str(BAUD), *gateway_flags])
        procs.append(gw)
        port = int(gw.wait_line(r"listening on [\d.]+:(\d+)", 10).group(1))
        gw.wait_line(r"ROS side up", 15)
        c = Client(port, "imu")
        c.subscribe(1, "/imu", "sensor_msgs/msg/Imu", QOS_BE)
        c.sync()
        w = e2e_proc([sys.executable, "-m", "tests.support.dds_writer", str(E2E_DOMAIN),
                      "/imu", "1000", str(COUNT), "imu"])
        procs.append(w)
        size = int(w.wait_line(r"writing (\d+) bytes", 30).group(1))
        t0, b0 = time.monotonic(), cable.moved[1]
        m = float(w.wait_line(r"sent \d+ in ([\d.]+) s", 30).group(1))
        t1, b1 = time.monotonic(), cable.moved[1]
        # the newest message of the last period arrives within a period (plus the line)
        c.wait(lambda: any(struct.unpack_from("<i", x, 4)[0] == COUNT - 1
                           for x in c.messages[1][-3:]), 2.0)
        with c.cv:
            stamps = [struct.unpack_from("<i", x, 4)[0] for x in c.messages[1]]
        return {"size": size, "line_bps": (b1 - b0) / (t1 - t0), "write_s": m,
                "client_hz": len(stamps) / m, "stamps": stamps}
    finally:
        if c is not None:
            c.close()
        for p in reversed(procs):
            p.stop()
        cable.close()


def test_throttle_holds_a_1khz_imu_to_50hz_before_the_serial_link() -> None:
    thr = chain("--throttle", "/imu=%d" % HZ)
    full = chain()
    rate = BAUD / 10.0
    print("\nline companion -> gateway at %d baud (%.0f B/s), 1 kHz Imu of %d bytes for %.2f s:"
          % (BAUD, rate, thr["size"], thr["write_s"]))
    print("  --throttle /imu=%d: %.0f B/s on the line, client %.1f msg/s, last stamp %d"
          % (HZ, thr["line_bps"], thr["client_hz"], thr["stamps"][-1]))
    print("  no throttle:       %.0f B/s on the line, client %.1f msg/s, last stamp %d"
          % (full["line_bps"], full["client_hz"], full["stamps"][-1]))
    # ~50 Hz worth of messages (each with ~20 bytes of link framing), not the line's capacity
    assert thr["line_bps"] < 1.3 * HZ * (thr["size"] + 24), thr["line_bps"]
    assert full["line_bps"] > 0.8 * rate                    # unthrottled, the stream fills the line
    assert full["line_bps"] > 2 * thr["line_bps"]
    # the client gets ~50 Hz, in order, ending with the newest message
    assert 0.8 * HZ <= thr["client_hz"] <= 1.1 * HZ, thr["client_hz"]
    assert thr["stamps"] == sorted(set(thr["stamps"]))
    assert thr["stamps"][-1] == COUNT - 1
