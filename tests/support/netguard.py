"""Proving that a program's addresses stay on this machine, two ways.

- ``guarded_env(log)``: the environment of a child Python process (any of the project's programs,
  started as a user starts it) with the audit hook of ``loopback_guard/sitecustomize.py``: every
  connect(), sendto() and bind() the process makes is written to ``log`` and any that is not on
  loopback is refused before a packet leaves. ``guard_records(log)`` reads it back. Needs nothing
  but CPython (3.8+), so it always runs.
- ``in_lo_namespace(argv)``: the command run in a new network namespace that has only ``lo``
  (``unshare -rn``: no root needed where unprivileged user namespaces are allowed; the loopback
  brought up from Python, no ``ip`` tool needed). ``lo_namespace_unavailable()`` says why it
  cannot run here, for a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Dict, List, NamedTuple, Optional

GUARD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loopback_guard")


class Record(NamedTuple):
    pid: int
    kind: str      # connect, sendto, bind
    host: str
    port: int
    ok: bool       # on loopback (or a wildcard bind); False: refused


def guarded_env(log: str, env: Dict[str, str]) -> Dict[str, str]:
    """``env`` plus the loopback guard, recording into the file ``log``."""
    e = dict(env)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (GUARD_DIR, e.get("PYTHONPATH", "")) if p)
    e["UBRB_NETGUARD_LOG"] = log
    return e


def guard_records(log: str) -> List[Record]:
    if not os.path.exists(log):
        return []
    out = []
    with open(log) as f:
        for line in f:
            pid, kind, host, port, verdict = line.split()
            out.append(Record(int(pid), kind, host, int(port), verdict == "ok"))
    return out


# Bring `lo` up in the new namespace (SIOCGIFFLAGS / SIOCSIFFLAGS |= IFF_UP), then become argv.
_LO_UP = """\
import fcntl, os, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
s.close()
os.execvp(sys.argv[1], sys.argv[1:])
"""


def in_lo_namespace(argv: List[str]) -> List[str]:
    """``argv`` as a command that runs it in a network namespace of its own with only ``lo``."""
    return ["unshare", "-rn", sys.executable, "-c", _LO_UP, *argv]


def lo_namespace_unavailable() -> Optional[str]:
    """None when ``in_lo_namespace`` works here, else why not (the reason of a skip)."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine (util-linux) to make a network namespace"
    try:
        r = subprocess.run(in_lo_namespace([sys.executable, "-c", "pass"]), capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare -rn cannot run: {e}"
    if r.returncode != 0:
        return ("unshare -rn is not allowed here (unprivileged user namespaces off?): "
                + (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
    return None
