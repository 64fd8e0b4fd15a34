# A scripted, in-process ROS side and a test client for the gateway core.
# Runs under CPython (pytest) and MicroPython (tests/mp/run.mjs) alike: no pytest, no typing.
# Frames and QoS presets come from tests/support (also MicroPython-compatible).
import json

import ubrb_min as U
import ubrb_setup
from tests.support.ubrb_frames import parse_frames


class ScriptedRos:
    """RosPort stand-in: records registrations; copies published bytes into its own buffer."""

    def __init__(self, max_message=4096, distro="humble"):
        self.sink = None
        self.calls = []
        self.distro = distro
        self.max = max_message
        self.last = bytearray(max_message)  # last published message, copied (no allocation)
        self.last_len = 0
        self.last_slot = -1
        self.published = 0
        self.record = True  # False in allocation tests: a list append allocates

    def up(self):
        self.sink.ros_up(self.distro, self.max)

    def advertise(self, slot, topic, type_, qos):
        self.calls.append(("advertise", slot, topic, type_, qos["reliability"]))

    def unadvertise(self, slot):
        self.calls.append(("unadvertise", slot))

    def subscribe(self, slot, topic, type_, qos):
        self.calls.append(("subscribe", slot, topic, type_, qos["reliability"]))

    def unsubscribe(self, slot):
        self.calls.append(("unsubscribe", slot))

    def publish(self, slot, buf, off, n, reliable):
        U.copy_into(self.last, 0, buf, off, n)
        self.last_len = n
        self.last_slot = slot
        self.published += 1
        if self.record:
            self.calls.append(("publish", slot, bytes(self.last[:n]), reliable))

    def max_message(self):
        return self.max

    def names(self):
        return [c[0] for c in self.calls]

    def take(self):
        c = self.calls
        self.calls = []
        return c


def profile(**over):
    p = {
        "max_clients": 3,
        "max_pubs": 4,
        "max_subs": 4,
        "max_topics": 6,
        "max_payload": 4096,
        "max_control": 512,
        "queue_bytes": 16384,
        "control_reserve": 1024,
    }
    for k in over:
        p[k] = over[k]
    return ubrb_setup.make_profile("mcu", p)


def gateway(ros_up=True, **over):
    ros = ScriptedRos()
    gw = U.Gateway(profile(**over), ros=ros)
    if ros_up:
        ros.up()
    return gw, ros


class Client:
    """One simulated TCP client of a Gateway: bytes in through the decoder, frames out of the queue."""

    def __init__(self, gw, now=0):
        self.gw = gw
        self.ci = gw.accept(now)
        assert self.ci >= 0

    @property
    def session(self):
        return self.gw.clients[self.ci]

    def send(self, data, now=0):
        """Feed bytes the way a socket would: as much as fits, then let the gateway consume."""
        d = self.session.decoder
        o = 0
        while o < len(data):
            n = min(len(data) - o, d.space())
            U.copy_into(d.buf, d.fill, data, o, n)
            self.gw.received(self.ci, n, now)
            while self.gw.backlog(self.ci):  # what a port does on its next loop turns
                self.gw.received(self.ci, 0, now)
            o += n
            if self.gw.wants_close(self.ci):
                break

    def frames(self, limit=None):
        """Everything queued for this client (up to `limit` bytes), as (op, payload) pairs."""
        q = self.session.queue
        left = q.pending() if limit is None else min(limit, q.pending())
        data = b""
        while left > 0:
            n = min(q.peek(), left)
            data += bytes(q.buf[q.out : q.out + n])
            q.sent(n)
            left -= n
        return parse_frames(data)

    def json_frames(self, op):
        return [json.loads(p) for o, p in self.frames() if o == op]

    def errors(self):
        return [(e["code"], e["id"]) for e in self.json_frames(U.OP_ERROR)]

    def closing(self):
        return self.gw.wants_close(self.ci)

    def close(self):
        self.gw.closed(self.ci, "test")
