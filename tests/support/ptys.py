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
