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
"""

import logging
import os
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


def main():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    backend = make_backend(sys.argv[1], distro=os.environ.get("ROS_DISTRO") or None)
    comp = Companion(backend, JsonSink(), max_message=8 * 1024 * 1024, diagnostics_period_ms=0)
    comp.start()
    out({"ev": "ready", "backend": backend.name, "distro": comp.distro, "pid": os.getpid()})
    requests = Requests()
    try:
        while True:
            reqs, _ = requests.poll(0.01, (comp.wake_fd(),))
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
                elif op == "publish":
                    data = bytes.fromhex(req["data"])
                    comp.publish(req["slot"], data, 0, len(data), req.get("reliable", True))
                out({"re": req["seq"]})
            comp.poll(now_ms())
    finally:
        comp.close()


if __name__ == "__main__":
    main()
