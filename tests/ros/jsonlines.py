"""The JSON-line plumbing of the test drivers that run in their own processes (``ros_peer.py``,
``companion_host.py``; driven by tests/support/ros_procs.py): requests arrive one JSON object a
line on stdin, answers and events leave the same way on stdout. Standard library only, since the
drivers run under the Kilted venv's Python too."""

import json
import os
import select
import sys


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Requests:
    """Whole request lines from stdin, without blocking longer than asked."""

    def __init__(self):
        self.fd = sys.stdin.fileno()
        self.buf = b""

    def poll(self, timeout, extra=()):
        """(requests complete now, the `extra` fds that are readable); requests is None once
        stdin is closed (the test ended)."""
        r, _, _ = select.select([self.fd, *extra], [], [], timeout)
        reqs = []
        if self.fd in r:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None, r
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                reqs.append(json.loads(line))
        return reqs, r
