# The rig of the MicroPython port's tests (tests/core/test_mp_port.py, test_contained.py): a
# gateway built by the port's own start() on the thin fakes of socket, time and machine
# (tests/core/mp_fakes.py, on sys.path under pytest and tests/mp/run.mjs alike), plus the
# companion's link end. MicroPython-compatible: run.mjs copies tests/support/ too.
import mp_fakes as F
from tests.support.ubrb_frames import parse_frames

G, LK = F.load_port()
ML = F.load_loop()


COMPANION = ("10.0.0.2", 8269)
PORT = 8268


class Rig:
    """A gateway built by the port's own start() on the fakes, plus the companion's link end."""

    def __init__(self, link="udp://10.0.0.2:8269", ticks=0, companion=True, comp_key=None,
                 **opts):
        self.net = F.Net()
        self.time = F.FakeTime(ticks)
        self.machine = F.FakeMachine()
        self.network = F.FakeNetwork(self.time)
        self.io = ML.IO(self.net.socket, F.select_module(), self.time, self.machine, self.network,
                       None)
        self.logged = []
        self.comp = (F.UdpCompanion(self.net, COMPANION, key=comp_key)
                     if companion and link.startswith("udp") else None)
        o = G.defaults()
        o["listen"] = "0.0.0.0:%d" % PORT
        o["link"] = link
        o["insecure_link"] = 1  # the fake network's 10.0.0.2 is no loopback
        for k in opts:
            o[k] = opts[k]
        self.opts = o
        log = ML.Log("debug", self._log)
        self.loop, self.gw, self.ros, self.drv = G.start(o, self.io, log)
        self.loop.poll_ms = 0  # the clock is fake: never wait in poll()
        if link.startswith("uart"):
            self.comp = F.UartCompanion(self.machine.uarts[int(link.split(":")[1])], key=comp_key)

    def _log(self, level, msg):
        self.logged.append((level, msg))

    def now(self):
        return self.loop.clock.now

    def step(self, ms=10):
        self.time.advance(ms)
        self.loop.step()
        if self.comp is not None:
            self.comp.pump(self.now())

    def run(self, ms, dt=10):
        for _ in range(ms // dt):
            self.step(dt)

    def up(self):
        for _ in range(300):
            if self.gw.ros_ready:
                return
            self.step()
        raise AssertionError("link did not come up")

    def connect(self, cap=8192):
        c = self.net.connect(PORT, cap)
        self.step()
        return c

    def server_conn(self, client):
        return client.peer


def frames(client):
    return parse_frames(client.take())
