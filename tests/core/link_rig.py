# The link rigs of tests/core (MicroPython-compatible, imported by bare name): sessions, a
# deterministic RNG, a recording handler, and two wires on a virtual clock - Pair (frames cross
# at once, through an optional mangle) and Line (each frame takes its own delay, so frames
# overtake each other, and may be lost or duplicated).
import ubrb_min as L
from tests.support.clock import VirtualClock


class Rng:
    """Deterministic LCG (MicroPython has no seedable random everywhere)."""

    def __init__(self, seed):
        self.s = seed & 0x3FFFFFFF

    def next(self, n):
        self.s = (self.s * 1103515 + 12345) & 0x3FFFFFFF
        return (self.s >> 8) % n


class Rec:
    """Link handler recording what the session delivers."""

    def __init__(self):
        self.ups = []
        self.downs = 0
        self.msgs = []

    def link_up(self, fresh):
        self.ups.append(fresh)

    def link_down(self):
        self.downs += 1

    def link_message(self, t, slot, buf, off, n, reliable):
        self.msgs.append((t, slot, bytes(buf[off:off + n]), reliable))


def sess(gateway, epoch, **kw):
    return L.LinkSession(Rec(), epoch, gateway, **kw)


class Pair(VirtualClock):
    """Two sessions joined by an in-memory wire; `mangle(data, direction)` may corrupt,
    drop, split or reorder what crosses it (it returns a list of chunks)."""

    def __init__(self, a, b, mangle=None, now=1000):
        self.a = a
        self.b = b
        self.mangle = mangle
        VirtualClock.__init__(self, now)
        self.held = [[], []]        # for reordering in datagram tests
        self.wire = [0, 0]          # bytes put on the wire per direction

    def step(self, dt=1, budget=64):
        now = self.now
        for d in (0, 1):
            x, y = (self.a, self.b) if d == 0 else (self.b, self.a)
            x.tick(now)
            for _ in range(budget):
                n = x.poll_tx(now)
                if n == 0:
                    break
                self.wire[d] += n
                data = bytes(x.tx_buf[:n])
                chunks = self.mangle(data, d) if self.mangle else [data]
                for c in chunks:
                    if len(c):
                        y.feed(c, 0, len(c), now)
        self.now = now + dt

    def up(self):
        assert self.run(2000, until=lambda: self.a.is_up() and self.b.is_up())


def rel_payload(i, size):
    b = bytearray(size)
    for k in range(size):
        b[k] = (i + k * 7) & 0xFF
    if size >= 2:
        b[0] = i & 0xFF
        b[1] = (i >> 8) & 0xFF
    return bytes(b)


class Line(VirtualClock):
    """Two sessions joined by a datagram line on which each frame is lost with probability
    `loss` %, duplicated with `dup` %, and otherwise arrives after `delay` + up to `jitter`
    ms (a frame delayed more than the next one is overtaken: reordering). `down` makes the
    line drop everything (an outage) while it is true."""

    def __init__(self, a, b, seed, loss=0, dup=0, delay=1, jitter=0, now=1000):
        VirtualClock.__init__(self, now)
        self.a = a
        self.b = b
        self.rng = Rng(seed)
        self.loss = loss
        self.dup = dup
        self.delay = delay
        self.jitter = jitter
        self.down = False
        self.queue = [[], []]  # per direction: [arrival time, frame]
        self.frames = [0, 0]  # frames put on the line per direction
        self.lost = [0, 0]

    def step(self, dt=1, budget=64):
        now = self.now
        for d in (0, 1):
            x, y = (self.a, self.b) if d == 0 else (self.b, self.a)
            q = self.queue[d]
            due = [e for e in q if e[0] <= now]
            if due:
                self.queue[d] = [e for e in q if e[0] > now]
                due.sort(key=lambda e: e[0])
                for e in due:
                    y.feed(e[1], 0, len(e[1]), now)
            x.tick(now)
            for _ in range(budget):
                n = x.poll_tx(now)
                if n == 0:
                    break
                self.frames[d] += 1
                data = bytes(x.tx_buf[:n])
                if self.down or self.rng.next(100) < self.loss:
                    self.lost[d] += 1
                    continue
                t = now + self.delay + (self.rng.next(self.jitter + 1) if self.jitter else 0)
                self.queue[d].append([t, data])
                if self.rng.next(100) < self.dup:
                    self.queue[d].append([t + 1, data])
        self.now = now + dt

    def up(self):
        assert self.run(2000, until=lambda: self.a.is_up() and self.b.is_up())




class StallingLine(VirtualClock):
    """Two sessions joined by a serial line: each direction a FIFO of bytes that moves
    `per_ms` bytes a millisecond, into which a sender writes only while fewer than `buf` bytes
    wait (the OS's and the adapter's buffers). Every `every` ms on average the line stalls
    for `length` / 2 ... `length` ms (a USB adapter, a busy host): nothing moves, then it goes on
    at its pace, what waited arriving late but in order. `noise(data, 0)`, if given, may flip
    bits of what the gateway (a) sends (test_link_noisy.Noise)."""

    def __init__(self, a, b, seed, per_ms=92, buf=8192, every=2000, length=500, noise=None,
                 now=1000):
        VirtualClock.__init__(self, now)
        self.noise = noise
        self.a = a
        self.b = b
        self.per_ms = per_ms
        self.buf = buf
        self.every = every
        self.length = length
        self.rng = Rng(seed)
        self.q = [b"", b""]
        self.next_stall = -1     # stalls start with start_stalling()
        self.stall_end = -1
        self.stalls = 0

    def start_stalling(self):
        self.next_stall = self.now + self.every

    def step(self, dt=1):
        now = self.now
        if self.stall_end < 0 and 0 <= self.next_stall <= now:
            self.stall_end = now + self.length // 2 + self.rng.next(self.length // 2 + 1)
            self.stalls += 1
        elif 0 <= self.stall_end <= now:
            self.stall_end = -1
            self.next_stall = now + self.every // 2 + self.rng.next(self.every)
        for d in (0, 1):
            x, y = (self.a, self.b) if d == 0 else (self.b, self.a)
            q = self.q[d]
            if self.stall_end < 0 and q:
                k = self.per_ms * dt
                c, q = q[:k], q[k:]
                if d == 0 and self.noise is not None:
                    c = self.noise(c, 0)[0]
                y.feed(c, 0, len(c), now)
            x.tick(now)
            while len(q) < self.buf:
                n = x.poll_tx(now)
                if n == 0:
                    break
                q += bytes(x.tx_buf[:n])
            self.q[d] = q
        self.now = now + dt

    def up(self):
        assert self.run(3000, until=lambda: self.a.is_up() and self.b.is_up())
