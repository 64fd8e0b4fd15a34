"""Issue 20, item 2: a graceful stop (SIGTERM) of either end drains what it holds, through the
real processes (``python ubrb_min.py`` + a UDP link through tools/impair.UdpImpairProxy with
40 ms of delay each way, so that ~80 reliable records of a 1,000 msg/s stream are in flight at
any time + ``python -m ros_side --backend dds``; bench/chainkit.py's Chain).

- The gateway, stopped mid-stream, stops taking data from its clients and serves the link until
  the companion has acknowledged (handed to ROS) every PUBLISH it took: an independent DDS reader
  gets exactly the gateway's ``publish_in``. Before: it exited at once and the ~80 in flight
  were gone.
- The companion, stopped while a burst from ROS waits for the link (ROS -> client), takes no
  more from DDS and serves the link until the gateway has acknowledged every message it had
  taken: the client gets all of them. Before: those in the link's ring (11) only.

Both drains end at ubrb_host.loop.STOP_DRAIN_S (3 s), when the link is down, or at a second
signal; what is left then is logged as dropped."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict

import pytest

from tests.e2e.helpers import E2E_DOMAIN, E2E_XML

os.environ["UBRB_BENCH_XML"] = E2E_XML
os.environ["UBRB_BENCH_DOMAIN"] = str(E2E_DOMAIN)
from tests.support import loopback_ports  # noqa: E402
from bench import chainkit as K  # noqa: E402
K.use_ports(loopback_ports.free_port)  # ports from this worker's share, not the kernel's
from bench import link_field as LF  # noqa: E402
from tools.impair import UdpImpairProxy  # noqa: E402

DELAY = (0.04, 0.04)


@pytest.fixture(autouse=True)
def session_participant(dp: Any) -> None:
    K.use_participant(dp)


def delayed_chain(max_message: int) -> Any:
    box: Dict[str, Any] = {}

    def via(comp_port: int) -> int:
        box["proxy"] = UdpImpairProxy(("127.0.0.1", comp_port), 1, delay=DELAY)
        return box["proxy"].port

    chain = K.Chain(companion_args=("--max-message", str(max_message)), udp_via=via)
    return chain, box["proxy"]


def distinct(got: Any) -> set:
    return {LF.field_tag(d)[0] for _, d in got}


def test_gateway_sigterm_delivers_every_publish_it_took() -> None:
    chain, proxy = delayed_chain(65536)
    topic = "/stop/gw"
    reader = LF.dds_reader(topic)
    w = None
    try:
        w = K.Proc([sys.executable, os.path.join(K.ROOT, "bench", "link_field.py"), "writer",
                    "--port", str(chain.port), "--topic", topic, "--rate", "1000",
                    "--seconds", "4", "--late", "30"])
        w.wait_line(r"^ready", 30.0)
        assert K.wait_for(lambda: K.matched(reader) >= 1, 30.0)
        col = K.Collector(reader)
        os.kill(w.pid, signal.SIGUSR1)
        time.sleep(1.5)
        assert col.count() > 500, "the stream did not start"
        chain.gw.proc.send_signal(signal.SIGTERM)
        assert chain.gw.proc.wait(10) == 0
        gw_out = chain.gw.output()
        took = K.last_counters(gw_out, "gateway")["publish_in"]
        K.wait_for(lambda: len(distinct(col.got)) >= took, 5.0)
        got = distinct(col.stop())
        assert len(got) == took and got == set(range(took)), (len(got), took)
        assert "drained: the companion acknowledged every record" in gw_out, gw_out[-3000:]
    finally:
        if w is not None:
            w.stop()
        reader.__del__()
        chain.close()
        proxy.close()


def test_companion_sigterm_delivers_every_message_it_took_from_ros() -> None:
    # --max-message 4096: the companion's link ring (4 of its largest messages) holds 11 of
    # these 1 KiB messages, ~140 msg/s over the 80 ms round trip, so a burst of 200 from ROS
    # waits at the companion (ring, hand-over queue) when it is told to stop
    chain, proxy = delayed_chain(4096)
    topic = "/stop/comp"
    writer = K.dds_writer(topic)
    c = None
    try:
        c = K.RawClient(chain.port, "stop")
        c.subscribe(1, topic, {"reliability": "reliable", "depth": 1000})
        assert K.wait_for(lambda: K.matched(writer) >= 1, 30.0)
        assert c.sync()
        for i in range(200):
            K.write_raw(writer, LF.field_cdr(i, 0, LF.SIZE))
        assert K.wait_for(lambda: len(c.messages.get(1, [])) >= 10, 10.0)
        chain.comp.proc.send_signal(signal.SIGTERM)
        assert chain.comp.proc.wait(10) == 0
        out = chain.comp.output()
        counts = K.last_counters(out, "companion")
        K.wait_for(lambda: len(c.messages.get(1, [])) >= 200, 5.0)
        got = [LF.field_tag(d)[0] for _, d in c.messages.get(1, [])]
        # the companion had taken all 200 from DDS before it was told to stop (a burst on
        # loopback): every one reaches the client, in order; before, the 11 in the link's ring
        # did and the rest went with the process
        assert got == list(range(200)), (len(got), counts)
        assert counts.get("sub_msgs") == 200 and not counts.get("release_drops"), counts
        assert "drained: the gateway acknowledged every record" in out, out[-3000:]
    finally:
        if c is not None:
            c.close()
        writer.__del__()
        chain.close()
        proxy.close()
