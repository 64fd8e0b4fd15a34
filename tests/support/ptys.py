"""Pseudo-terminal pairs standing in for serial devices (real ptys, real termios)."""

from __future__ import annotations

import os
import tempfile
import tty


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
    ``url("gw")``, the companion ``url("comp")``; whoever joins the two masters (a relay, a noisy
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


class PacedPtyCable(PtyCable):
    """A serial cable with a line rate: a thread joins the two masters and moves at most
    baud/10 bytes per second each way, whatever the ends do (a pty pair alone has no rate).
    ``moved[0]`` counts the bytes delivered gateway -> companion, ``moved[1]`` companion ->
    gateway. Unused credit does not pile up beyond 2 ms of line time, as a UART cannot send
    bytes before it has them."""

    def __init__(self, baud: int, prefix: str = "ubrb-paced-") -> None:
        import threading

        super().__init__(prefix)
        self.rate = baud / 10.0
        self.moved = [0, 0]
        self._stop = False
        self.t = threading.Thread(target=self._run, daemon=True, name="paced-pty")
        self.t.start()

    def _run(self) -> None:
        import select
        import time

        src = [self.a.master, self.b.master]
        pend = [bytearray(), bytearray()]
        credit = [0.0, 0.0]
        last = time.monotonic()
        while not self._stop:
            rl = [src[d] for d in (0, 1) if len(pend[d]) < 65536]
            r, _, _ = select.select(rl, [], [], 0.001 if (pend[0] or pend[1]) else 0.05)
            now = time.monotonic()
            for d in (0, 1):
                cap = self.rate * (0.02 if pend[d] else 0.002)  # a late tick catches up
                credit[d] = min(credit[d] + (now - last) * self.rate, cap)
            last = now
            for d in (0, 1):
                if src[d] in r:
                    try:
                        pend[d] += os.read(src[d], 65536)
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:          # EIO while no one has the slave open
                        time.sleep(0.01)
                k = min(int(credit[d]), len(pend[d]))
                if k <= 0:
                    continue
                try:
                    k = os.write(src[1 - d], pend[d][:k])
                except OSError:
                    k = 0
                credit[d] -= k
                self.moved[d] += k
                del pend[d][:k]

    def close(self) -> None:
        self._stop = True
        self.t.join(5)
        super().close()
