# The app layer over the link, both ends on one virtual wire: the gateway's LinkRosPort under a
# recording GatewaySink, the companion's LinkCompanionEnd over a recording RosPort. Shared by
# tests/core/test_link_app.py and test_link_records.py; MicroPython-compatible like the rest of
# tests/core.
import ubrb_min as L
from ros_side.link_end import LinkCompanionEnd
from link_rig import Pair


class FakeGateway:
    """GatewaySink: records calls; on ros_up re-sends every live registration (as Gateway does)."""

    def __init__(self):
        self.port = None
        self.calls = []
        self.pubs = {}   # slot -> (topic, type, qos)
        self.subs = {}

    def ros_up(self, distro, max_message):
        self.calls.append(("up", distro, max_message))
        for s in sorted(self.pubs):
            t = self.pubs[s]
            self.port.advertise(s, t[0], t[1], t[2])
        for s in sorted(self.subs):
            t = self.subs[s]
            self.port.subscribe(s, t[0], t[1], t[2])

    def ros_down(self):
        self.calls.append(("down",))

    def ros_session_lost(self, message):
        self.calls.append(("lost", message))

    def ros_result(self, kind, slot, code, message):
        self.calls.append(("result", kind, slot, code))

    def ros_error(self, kind, slot, code, message):
        self.calls.append(("error", kind, slot, code))

    def ros_message(self, slot, buf, off, n):
        self.calls.append(("message", slot, bytes(buf[off:off + n])))

    def ros_sub_count(self, slot, count):
        self.calls.append(("count", slot, count))

    def take(self, kind=None):
        c = [x for x in self.calls if kind is None or x[0] == kind]
        self.calls = [x for x in self.calls if not (kind is None or x[0] == kind)]
        return c


class FakeCompanion:
    """RosPort: records calls; answers registrations through its sink (the link end)."""

    def __init__(self, distro="humble"):
        self.distro = distro
        self.sink = None
        self.calls = []
        self.live = {}
        self.stats = None

    def advertise(self, slot, topic, type, qos):
        self.calls.append(("advertise", slot, topic))
        if topic == "bad topic":
            self.sink.ros_result("pub", slot, "invalid_topic", "bad")
            return
        self.live[("p", slot)] = topic
        self.sink.ros_result("pub", slot, None, "")

    def unadvertise(self, slot):
        self.calls.append(("unadvertise", slot))
        self.live.pop(("p", slot), None)

    def subscribe(self, slot, topic, type, qos):
        self.calls.append(("subscribe", slot, topic))
        self.live[("s", slot)] = topic
        self.sink.ros_result("sub", slot, None, "")

    def unsubscribe(self, slot):
        self.calls.append(("unsubscribe", slot))
        self.live.pop(("s", slot), None)

    def publish(self, slot, buf, off, n, reliable):
        self.calls.append(("publish", slot, bytes(buf[off:off + n]), reliable))

    def reset(self):
        self.calls.append(("reset",))
        self.live = {}

    def gateway_stats(self, d):
        self.stats = d


def app_pair(**kw):
    """(wire, gateway port, gateway sink, companion port, companion end), not yet run."""
    gs = L.LinkSession(None, 101, True, **kw)
    cs = L.LinkSession(None, 202, False, **kw)
    port = L.LinkRosPort(gs)
    gw = FakeGateway()
    gw.port = port
    port.sink = gw
    comp = FakeCompanion()
    end = LinkCompanionEnd(cs, comp)
    comp.sink = end
    p = Pair(gs, cs)
    return p, port, gw, comp, end
