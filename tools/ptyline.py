"""A serial line on a host with no serial ports: two real pty pairs joined by a relay thread.

    gateway <-> slave A | master A <-relay-> master B | slave B <-> companion

Each end opens its slave through a stable symlink (``url("gw")``, ``url("comp")``), so a
restarted process, or an 'unplugged' and re-plugged adapter, finds the same path. With a baud
rate the relay moves at most baud/10 bytes per second each way (8N1), whatever the ends do: a pty
pair alone has no rate, and a link that paces itself must be measured against a line that
does. Tests and benches share this one relay; it imports nothing from either and sets no
environment."""

from __future__ import annotations

import os
import select
import tempfile
import threading
import time
import tty
from typing import Callable, List, Optional

# The relay's tick while bytes wait on a paced line: short against a 1 KiB frame at 115200 baud
# (89 ms), long enough not to busy a core.
TICK_S = 0.0005
# A late tick (a loaded machine) may catch up on at most this much line time while bytes wait;
# idle, a line earns no more than one tick (a UART cannot send bytes before it has them).
CATCH_UP_S = 0.02
PENDING_CAP = 1 << 20  # bytes held per direction before the relay stops reading that side


class Pty:
    """A pty pair whose slave is reachable by a stable symlink (so it can be 'replugged')."""

    def __init__(self, link_path: str) -> None:
        self.link_path = link_path
        self.master = -1
        self.slave = -1
        self.plug()

    def plug(self) -> None:
        m, s = os.openpty()
        tty.setraw(m)
        tty.setraw(s)
        os.set_blocking(m, False)
        tmp = self.link_path + ".new"
        os.symlink(os.ttyname(s), tmp)
        os.replace(tmp, self.link_path)
        self.master, self.slave = m, s

    def unplug(self) -> None:
        # closing both sides makes the driver's read return EOF, like a vanished USB device
        for fd in (self.master, self.slave):
            if fd >= 0:
                os.close(fd)
        self.master = self.slave = -1
        os.unlink(self.link_path)

    def close(self) -> None:
        if self.master >= 0:
            self.unplug()


class PtyCable:
    """Two ptys in a temporary directory, one per end of a serial link: the gateway opens
    ``url("gw")``, the companion ``url("comp")``; whoever joins the two masters (PtyLine, a noisy
    proxy) plays the cable. ``close`` removes both and the directory."""

    def __init__(self, prefix: str) -> None:
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.a = Pty(os.path.join(self.dir, "gw"))
        self.b = Pty(os.path.join(self.dir, "comp"))

    def url(self, which: str) -> str:
        return "serial:" + (self.a.link_path if which == "gw" else self.b.link_path)

    def close(self) -> None:
        self.a.close()
        self.b.close()
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


# observe(direction, data, monotonic_s): the bytes just delivered; direction 0 is gateway -> companion
Observer = Callable[[int, bytes, float], None]


class PtyLine(PtyCable):
    """A PtyCable with a relay thread. ``baud`` None: bytes move as fast as the ptys take them
    (the link drivers pace themselves); a number: the relay is the line's rate. ``moved[0]``
    counts the bytes delivered gateway -> companion, ``moved[1]`` the other way;
    ``blackhole = True`` reads and drops everything (a cut cable); ``stalled = True`` moves nothing
    until it is False again (an adapter or a host that stalls); ``observe`` sees every delivered
    chunk (a frame sniffer); ``unplug("gw")`` / ``plug("gw")`` pull and re-plug one end's adapter
    (done by the relay thread, which alone selects on the masters); a subclass may corrupt what
    crosses by overriding ``impair``."""

    def __init__(self, baud: Optional[int] = None, prefix: str = "ubrb-line-",
                 observe: Optional[Observer] = None) -> None:
        super().__init__(prefix)
        self.rate = baud / 10.0 if baud else 0.0
        self.moved = [0, 0]
        self.blackhole = False
        self.stalled = False  # True: nothing moves (bytes wait in the line, then go on in order)
        self.observe = observe
        self._stop_r, self._stop_w = os.pipe()
        self._calls: List[Callable[[], None]] = []
        self._calls_lock = threading.Lock()
        self.t = threading.Thread(target=self._run, daemon=True, name="pty-line")
        self.t.start()

    def impair(self, d: int, data: bytes) -> bytes:
        """What the line makes of ``data`` read from end ``d`` (0: the gateway's): unchanged."""
        return data

    def _in_relay(self, fn: Callable[[], None]) -> None:
        # Run fn in the relay thread between two selects and wait for it: closing a master the
        # relay is selecting on could hand its descriptor number to another file meanwhile.
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()
        with self._calls_lock:
            self._calls.append(call)
        os.write(self._stop_w, b"c")
        if not done.wait(5):
            raise RuntimeError("the pty relay did not answer")

    def unplug(self, which: str) -> None:
        """The adapter of end ``which`` ("gw" or "comp") vanishes: its program reads EOF/EIO,
        and what the line held to or from it is gone."""
        self._in_relay((self.a if which == "gw" else self.b).unplug)

    def plug(self, which: str) -> None:
        """A new adapter at the same path (the program reopens it)."""
        self._in_relay((self.a if which == "gw" else self.b).plug)

    def _credit(self, credit: List[float], pend: List[bytearray], elapsed: float) -> None:
        for d in (0, 1):
            cap = self.rate * (CATCH_UP_S if pend[d] else TICK_S)
            credit[d] = min(credit[d] + elapsed * self.rate, max(cap, 1.0))

    def _run(self) -> None:
        pend = [bytearray(), bytearray()]  # [d]: read from src[d], for src[1 - d]
        credit = [0.0, 0.0]
        paced = self.rate > 0
        last = time.monotonic()
        while True:
            src = [self.a.master, self.b.master]   # -1 while that end is unplugged
            for d in (0, 1):
                if src[d] < 0 or src[1 - d] < 0:
                    pend[d].clear()                # in flight to or from a vanished adapter
            rl = [self._stop_r] + [src[d] for d in (0, 1)
                                   if src[d] >= 0 and len(pend[d]) < PENDING_CAP]
            busy = bool(pend[0] or pend[1])
            if paced:
                wl: List[int] = []
                wait = TICK_S if busy else 0.05
            else:
                wl = [src[1 - d] for d in (0, 1) if pend[d]]
                wait = 0.5
            r, _, _ = select.select(rl, wl, [], wait)
            if self._stop_r in r:
                if b"x" in os.read(self._stop_r, 64):
                    return
                with self._calls_lock:
                    calls, self._calls = self._calls, []
                for call in calls:
                    call()
                continue
            now = time.monotonic()
            if paced:
                self._credit(credit, pend, now - last)
            last = now
            for d in (0, 1):
                if src[d] in r:
                    try:
                        data = os.read(src[d], 65536)
                    except (BlockingIOError, InterruptedError):
                        data = b""
                    except OSError:  # EIO while no one has the slave open
                        time.sleep(0.01)
                        data = b""
                    if data and not self.blackhole:
                        pend[d] += self.impair(d, data)
            for d in (0, 1):
                k = min(int(credit[d]), len(pend[d])) if paced else len(pend[d])
                if k <= 0 or self.stalled:
                    continue
                try:
                    k = os.write(src[1 - d], pend[d][:k])
                except OSError:  # full (BlockingIOError) or no one at the other end
                    k = 0
                if k and self.observe is not None:
                    self.observe(d, bytes(pend[d][:k]), now)
                del pend[d][:k]
                if paced:
                    credit[d] -= k
                self.moved[d] += k

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self.t.join(5)
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        super().close()
