"""Real processes on this machine: their environment (DDS on loopback), their output collected
line by line in the background, and polling with a deadline."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, step: float = 0.005,
             poll: Optional[Callable[[], Any]] = None) -> Any:
    """Poll ``cond`` (calling ``poll()`` first each round) until it returns something true or
    the deadline passes; its last value."""
    end = time.monotonic() + timeout
    while True:
        if poll is not None:
            poll()
        v = cond()
        if v or time.monotonic() >= end:
            return v
        time.sleep(step)


def child_env(domain: Optional[int] = None, dds_config: Optional[str] = None,
              unset: Iterable[str] = ()) -> Dict[str, str]:
    """This process's environment for a child: DDS on loopback (``dds_config``, default the
    loopback configuration) in ``domain`` (None: the child picks, e.g. from --domain), unbuffered
    output, and ``unset`` removed."""
    from tests.support.dds import DISCOVERY_OVERRIDES, LOOPBACK_XML

    env = dict(os.environ)
    env["CYCLONEDDS_URI"] = dds_config or LOOPBACK_XML   # never leave the machine
    if domain is None:
        env.pop("ROS_DOMAIN_ID", None)
    else:
        env["ROS_DOMAIN_ID"] = str(domain)
    for name in (*DISCOVERY_OVERRIDES, *unset):
        env.pop(name, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """A subprocess (by default in the repository, with ``child_env()``) whose output is
    collected line by line in the background: ``text()`` is stdout and stderr in the order the
    lines were read, ``stdout()`` stdout alone (for output a test parses)."""

    def __init__(self, argv: List[str], env: Optional[Dict[str, str]] = None,
                 cwd: str = ROOT) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env if env is not None else child_env(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: List[str] = []   # stdout and stderr
        self.out: List[str] = []     # stdout only
        self.cv = threading.Condition()
        self.threads = [threading.Thread(target=self._read, args=(f, own), daemon=True)
                        for f, own in ((self.proc.stdout, self.out), (self.proc.stderr, None))]
        for t in self.threads:
            t.start()

    def _read(self, f: Any, own: Optional[List[str]]) -> None:
        for line in f:
            with self.cv:
                self.lines.append(line)
                if own is not None:
                    own.append(line)
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def _join(self) -> None:
        for t in self.threads:
            t.join(5)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        with self.cv:
            return "".join(self.lines)

    def stdout(self) -> str:
        with self.cv:
            return "".join(self.out)

    def wait_line(self, pattern: str, timeout: float = 15.0) -> "re.Match[str]":
        """The first match of ``pattern`` (``^``/``$`` match at line ends) in the output; fails
        with the output if it does not appear in time or the process ends without it."""
        rx = re.compile(pattern, re.M)
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                m = rx.search("".join(self.lines))
                if m:
                    return m
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None
                                 and not any(t.is_alive() for t in self.threads)):
                    raise AssertionError("%r not seen within %g s in the output of %s:\n%s"
                                         % (pattern, timeout, " ".join(self.argv),
                                            "".join(self.lines)))
                self.cv.wait(min(left, 0.05))

    def wait(self, timeout: float) -> int:
        """The exit code; fails with the output if the process is still running after
        ``timeout`` seconds."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s still running after %g s:\n%s"
                                 % (" ".join(self.argv), timeout, self.text())) from None
        self._join()
        return rc

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up (its DDS entities stay in discovery
        until their lease expires, its link end just stops answering)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._join()

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        """``sig`` (SIGTERM), then SIGKILL after 5 s. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._join()
        return self.proc.returncode
