"""Shared pytest set-up for the whole suite.

- Puts the repository root on sys.path (``import ubrb_min``, ``import ros_side``,
  ``import ports...``, and the helpers every test directory shares: ``tests.support``) and
  tests/core (helpers of the core's tests, shared with the MicroPython leg, e.g.
  ``import scripted``).
- tests/core/test_*.py also run under real MicroPython (tests/mp/run.mjs). A module-level set
  ``MICROPYTHON_ONLY = {"test_x", ...}`` marks tests that only make sense there (e.g. gc.mem_alloc()
  allocation checks); they are skipped here with a reason. ``CPYTHON_ONLY`` works the other way
  round and is honoured by run.mjs. A name in either set that is not a test function of the module
  is a usage error (so a typo cannot silently disable a check).
- A per-test time limit without a plugin: each phase (setup, call, teardown) of a test gets
  ``ubrb_test_timeout`` seconds (pyproject.toml; env UBRB_TEST_TIMEOUT overrides; 0 disables;
  ``@pytest.mark.time_limit(seconds)`` for one test). On expiry the stacks of all threads are
  dumped to stderr and the test fails with TestTimeout; if the test does not return to Python
  within 30 s more, the whole run is ended (faulthandler) rather than hanging CI.
- ``make test`` runs the suite in two passes: first every test not marked ``serial`` with
  pytest-xdist (``-n TEST_JOBS --dist loadfile``: most tests wait on processes and sockets, so a
  2-core machine runs four at once), then the ``serial`` ones alone, one at a time. A module
  whose assertions are bounds on time measured in real time (a p99 latency, a rate, a loop lag)
  says ``pytestmark = pytest.mark.serial`` and why, so that other tests cannot make it fail.
  Plain ``pytest tests`` runs everything in one process, as before.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import types
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE_TESTS = ROOT / "tests" / "core"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(CORE_TESTS) not in sys.path:
    sys.path.append(str(CORE_TESTS))

# Companions the tests start keep their latched samples under $XDG_STATE_HOME
# (ros_side/latched.py): a directory of this run, never the user's home.
_STATE_DIR = tempfile.mkdtemp(prefix="ubrb-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_DIR
os.environ.pop("STATE_DIRECTORY", None)     # systemd's, which would come first

MICROPYTHON_ONLY_REASON = "MicroPython-only test (run under MicroPython by tests/mp/run.mjs)"
HARD_KILL_GRACE_S = 30


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "ubrb_test_timeout",
        "seconds allowed for each phase of a test (0: no limit); env UBRB_TEST_TIMEOUT overrides",
        default="300",
    )


# A duplicate of the real stderr, for the hard-kill dump: while a test runs, fd 2 is pytest's
# capture file, which is lost when faulthandler ends the process.
_real_stderr_fd: int | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _real_stderr_fd
    config.addinivalue_line(
        "markers", "time_limit(seconds): time limit for this test's phases (0: none)"
    )
    config.addinivalue_line(
        "markers", "serial: bounds on real time; make test runs it alone, after the rest"
    )
    if _real_stderr_fd is None:
        try:
            _real_stderr_fd = os.dup(2)  # capture is suspended during pytest_configure
        except OSError:
            _real_stderr_fd = None


def pytest_unconfigure(config: pytest.Config) -> None:
    global _real_stderr_fd
    shutil.rmtree(_STATE_DIR, ignore_errors=True)
    if _real_stderr_fd is not None:
        os.close(_real_stderr_fd)
        _real_stderr_fd = None


def _names(mod: types.ModuleType, attr: str) -> set[str]:
    value = getattr(mod, attr, None)
    if value is None:
        return set()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise pytest.UsageError(f"{mod.__file__}: {attr} must be a set of test names")
    return set(value)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    checked: set[str] = set()
    for item in items:
        mod = getattr(item, "module", None)
        if mod is None:
            continue
        mp_only = _names(mod, "MICROPYTHON_ONLY")
        if mod.__name__ not in checked:
            checked.add(mod.__name__)
            for attr in ("MICROPYTHON_ONLY", "CPYTHON_ONLY"):
                for name in sorted(_names(mod, attr)):
                    if not (name.startswith("test_") and callable(getattr(mod, name, None))):
                        raise pytest.UsageError(
                            f"{mod.__file__}: {attr} names {name!r}, which is not a test "
                            "function of that module"
                        )
        if getattr(item, "originalname", item.name) in mp_only:
            item.add_marker(pytest.mark.skip(reason=MICROPYTHON_ONLY_REASON))


class TestTimeout(Exception):
    """A test phase ran past its time limit."""

    __test__ = False  # not a test class, despite the name


def _limit_for(item: pytest.Item) -> float:
    marker = item.get_closest_marker("time_limit")
    if marker is not None and marker.args:
        return float(marker.args[0])
    env = os.environ.get("UBRB_TEST_TIMEOUT")
    if env:
        return float(env)
    return float(item.config.getini("ubrb_test_timeout"))


def _timed(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    limit = _limit_for(item)
    usable = (
        limit > 0
        and hasattr(signal, "SIGALRM")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        return (yield)

    def on_alarm(signum: int, frame: types.FrameType | None) -> None:
        if threading.active_count() > 1:  # the main thread's stack is in the traceback anyway
            sys.stderr.write(f"\n*** {item.nodeid}: {phase} timed out; all thread stacks:\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(all_threads=True)
        raise TestTimeout(f"{phase} of {item.nodeid} exceeded the {limit:g} s time limit")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    if _real_stderr_fd is not None:
        faulthandler.dump_traceback_later(
            limit + HARD_KILL_GRACE_S, exit=True, file=_real_stderr_fd
        )
    else:
        faulthandler.dump_traceback_later(limit + HARD_KILL_GRACE_S, exit=True)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _timed(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _timed(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _timed(item, "teardown"))
