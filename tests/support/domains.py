"""The DDS domain ids the tests use: one per kind of test, per pytest process.

A test's DDS traffic stays on loopback (tests/support/dds.py), but two pytest processes running at
once on one machine - two suites, or the workers of one suite (pytest-xdist, `make test`) - would
still see each other's samples on a shared domain. So every process takes its own ids: a worker
of an xdist run takes the ids of its index within its run's block (the run: its controller's pid),
a plain pytest process a block of its own (its pid).

The ids come from the ranges whose RTPS ports (7400 + 250 x id + ...) lie outside Linux's
ephemeral port range (32768-60999), so no socket a test binds to port 0 can hold a port DDS needs:
1..101 and 215..232 (Cyclone and Fast DDS accept 0..232; 0 is every ROS machine's default).
An environment variable named by the caller overrides its id (e.g. UBRB_E2E_DOMAIN=230).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

POOL = tuple(range(1, 102)) + tuple(range(215, 233))
# the kinds of test that need a domain of their own; the demo's tests start four demos at once
KINDS = ("ros", "e2e", "cli", "chain", "demo0", "demo1", "demo2", "demo3")


def this_worker() -> Tuple[int, int, int]:
    """(index, workers, run) of this pytest process: its xdist worker index and the run's worker
    count, and a number of its run (the controller's pid); a plain pytest process is (0, 1, pid).
    What this module and tests/support/loopback_ports.py share out by."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        return int(worker[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), os.getppid()
    return 0, 1, os.getpid()


def test_domain(kind: str, env: Optional[str] = None) -> int:
    """The domain id of `kind` (one of KINDS) for this process; `env` names an override."""
    if env and os.environ.get(env):
        return int(os.environ[env])
    index, workers, run = this_worker()
    per_run = len(KINDS) * workers
    blocks = max(1, len(POOL) // per_run)
    return POOL[((run % blocks) * per_run + index * len(KINDS) + KINDS.index(kind)) % len(POOL)]


test_domain.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test to collect
