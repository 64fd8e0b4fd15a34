"""Free loopback ports for the tests that start real servers and processes on this machine.

A port found free is only free until someone binds it: a test hands it to a child process, which
binds it a moment later. Ports the kernel hands out for port 0 (the ephemeral range, 32768-60999)
could be taken in between by any socket on the machine, and two workers of `make test` asking at
once would share them. So the ports come from above that range, each pytest process (each
xdist worker) stepping through a share of its own, and skipping the ports of DDS domains
(7400 + 250 x id + 0..99, tests/support/domains.py), and each is checked by binding it.
"""

import itertools
import socket
from typing import Iterator, List

from tests.support.domains import this_worker

_FIRST, _END = 61000, 65536


def _mine() -> Iterator[int]:
    index, workers, run = this_worker()
    ports: List[int] = [p for p in range(_FIRST, _END) if (p - 7400) % 250 >= 100][index::workers]
    start = (run * 97) % len(ports)
    return itertools.cycle(ports[start:] + ports[:start])


_PORTS = _mine()


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that nothing is bound to right now (TCP by default, or SOCK_DGRAM)."""
    for _ in range(4096):
        port = next(_PORTS)
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise OSError("no free loopback port in %d-%d" % (_FIRST, _END - 1))
