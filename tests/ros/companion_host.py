"""The companion (``ros_side.companion.Companion``) with one backend, in its own process, driven by
JSON lines on stdin (the tests' ``Host`` class). Runs under any Python that can run the backend:

    .venv-ros/bin/python companion_host.py rclpy    the rclpy backend on the real Kilted rclpy
    .venv/bin/python companion_host.py dds          the dds backend (cyclonedds + rosbags)
    ... companion_host.py auto                      what ``--backend auto`` picks (and why)

Requests (answered by ``{"re": seq}``): ``advertise``/``subscribe`` {slot, topic, type, qos},
``unadvertise``/``unsubscribe`` {slot}, ``publish`` {slot, data: HEX, reliable}, ``quit``.
``matched`` {slot} -> {"count": N}: publishers the subscription of that slot has matched (test
probe: DDS discovery is not symmetric in time, so a test that publishes once waits until both
ends have matched). ``acked`` {slot, within} -> {"acked": bool}: the publisher of that slot waited
until every matched reliable reader acknowledged all its samples (test probe, see
``test_one_mib_image_both_ways``). ``guids`` {pub, sub} -> {"pub": HEX, "sub": HEX}: the DDS GUIDs
of the writer of pub slot ``pub`` and the reader of sub slot ``sub`` (dds backend). Events: every GatewaySink call as ``{"ev": "result"|"error"|"message"|"count"|"up", ...}``.
The loop polls the companion every 10 ms and whenever its wake pipe is readable.

Streams (what a gateway feeding the companion does, generated in this loop so that the test
measures the companion and not the pipe): ``stream`` {slot, period_ms, size} publishes a
``std_msgs/msg/String`` ``"<slot>:<n>:xxx…"`` of ``size`` bytes of text on that pub slot every
``period_ms`` from this loop (``period_ms`` 0 stops it); ``lag`` {reset} -> {"publish_ms": the
longest ``Companion.publish`` call, "lag_ms": the longest a due stream message waited for the
loop, "sent": {slot: n}, "pub_errors": n} since the last reset.
"""

import logging
import os
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ros_side.backends import make_backend  # noqa: E402
from ros_side.companion import Companion  # noqa: E402
from jsonlines import Requests, out  # noqa: E402  (beside this script)


class JsonSink:
    def ros_up(self, distro, max_message):
        out({"ev": "up", "distro": distro, "max": max_message})

    def ros_down(self):
        out({"ev": "down"})

    def ros_result(self, kind, slot, code, message):
        out({"ev": "result", "kind": kind, "slot": slot, "code": code, "message": message})

    def ros_error(self, kind, slot, code, message):
        out({"ev": "error", "kind": kind, "slot": slot, "code": code, "message": message})

    def ros_message(self, slot, buf, off, n):
        out({"ev": "message", "slot": slot, "data": bytes(memoryview(buf)[off:off + n]).hex()})

    def ros_sub_count(self, slot, count):
        out({"ev": "count", "slot": slot, "count": count})


def matched(comp, slot):
    handle = comp._sub_slots[slot].handle
    if hasattr(handle, "reader"):                       # dds backend
        return handle.reader.get_subscription_matched_status().current_count
    return handle.sub.get_publisher_count()             # rclpy backend (Jazzy and later)


def acked(comp, slot, timeout):
    handle = comp._pub_slots[slot].handle
    if hasattr(handle, "writer"):                       # dds backend
        from cyclonedds.util import duration
        return bool(handle.writer.wait_for_acks(duration(seconds=timeout)))
    from rclpy.duration import Duration                 # rclpy backend
    return handle.pub.wait_for_all_acked(Duration(seconds=timeout))


def now_ms():
    return int(time.monotonic() * 1000)


def string_cdr(text):
    """std_msgs/msg/String, little-endian CDR with its encapsulation header."""
    raw = text.encode()
    return b"\x00\x01\x00\x00" + struct.pack("<I", len(raw) + 1) + raw + b"\x00"


class Streams:
    """Timed publishes from the loop, and how long the loop kept them waiting."""

    def __init__(self, comp):
        self.comp = comp
        self.streams = {}   # slot -> [period_s, size, next due, n]
        self.reset()

    def reset(self):
        self.publish_s = self.lag_s = self.poll_s = 0.0
        self.errors0 = self.comp.stats["pub_errors"]
        self.sent = {}

    def start(self, slot, period_ms, size):
        if period_ms <= 0:
            self.streams.pop(slot, None)
        else:
            self.streams[slot] = [period_ms / 1000.0, size, time.monotonic(), 0]

    def timeout(self, longest):
        if not self.streams:
            return longest
        due = min(s[2] for s in self.streams.values())
        return max(0.0, min(longest, due - time.monotonic()))

    def run(self):
        for slot, st in list(self.streams.items()):
            period, size, due, n = st
            now = time.monotonic()
            if now < due:
                continue
            self.lag_s = max(self.lag_s, now - due)
            head = "%d:%d:" % (slot, n)
            data = string_cdr(head + "x" * max(0, size - len(head)))
            t0 = time.monotonic()
            self.comp.publish(slot, data, 0, len(data), True)
            self.publish_s = max(self.publish_s, time.monotonic() - t0)
            self.sent[slot] = self.sent.get(slot, 0) + 1
            st[3] = n + 1
            st[2] = max(due + period, time.monotonic() - period)  # no burst to catch up

    def report(self):
        return {"publish_ms": round(self.publish_s * 1000, 2), "lag_ms": round(self.lag_s * 1000, 2),
                "poll_ms": round(self.poll_s * 1000, 2),
                "sent": self.sent, "pub_errors": self.comp.stats["pub_errors"] - self.errors0}


def main():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    backend = make_backend(sys.argv[1], distro=os.environ.get("ROS_DISTRO") or None)
    comp = Companion(backend, JsonSink(), max_message=8 * 1024 * 1024, diagnostics_period_ms=0)
    comp.start()
    out({"ev": "ready", "backend": backend.name, "distro": comp.distro, "pid": os.getpid()})
    requests = Requests()
    streams = Streams(comp)
    try:
        while True:
            reqs, _ = requests.poll(streams.timeout(0.01), (comp.wake_fd(),))
            if reqs is None:
                return
            for req in reqs:
                op = req["op"]
                if op == "quit":
                    out({"re": req["seq"]})
                    return
                if op in ("advertise", "subscribe"):
                    getattr(comp, op)(req["slot"], req["topic"], req["type"], req["qos"])
                elif op in ("unadvertise", "unsubscribe"):
                    getattr(comp, op)(req["slot"])
                elif op == "matched":
                    out({"re": req["seq"], "count": matched(comp, req["slot"])})
                    continue
                elif op == "acked":
                    out({"re": req["seq"], "acked": acked(comp, req["slot"], req["within"])})
                    continue
                elif op == "guids":
                    out({"re": req["seq"],
                         "pub": comp._pub_slots[req["pub"]].handle.writer.guid.bytes.hex(),
                         "sub": comp._sub_slots[req["sub"]].handle.reader.guid.bytes.hex()})
                    continue
                elif op == "stream":
                    streams.start(req["slot"], req["period_ms"], req.get("size", 64))
                elif op == "lag":
                    out(dict(streams.report(), re=req["seq"]))
                    if req.get("reset"):
                        streams.reset()
                    continue
                elif op == "publish":
                    data = bytes.fromhex(req["data"])
                    comp.publish(req["slot"], data, 0, len(data), req.get("reliable", True))
                out({"re": req["seq"]})
            streams.run()
            t0 = time.monotonic()
            comp.poll(now_ms())
            streams.poll_s = max(streams.poll_s, time.monotonic() - t0)
    finally:
        comp.close()


if __name__ == "__main__":
    main()
