"""Ctrl-C at any moment of start-up (issue 22 item 6): the gateway (`python ubrb_min.py`) and the
companion (`python -m ros_side`) stop quietly - no traceback - with the documented status: 130
while they start, 0 once they serve (SIGINT is then their clean stop), as README.md's contract
says.

SIGINT goes at fixed points of the first 0.3 s (the companion's start-up is longer: later points
too). What stays out of the programs' reach, and is told apart here rather than retried: before
CPython has installed its SIGINT handler the process dies of the signal (status -SIGINT, which a
shell reports as 130, nothing printed), and between that and the script's first line (CPython
importing `site`, then parsing the whole script - tens of milliseconds for the 3,300-line core,
more without cached bytecode) CPython reports the KeyboardInterrupt itself, with a traceback in
which no line of this repository has run yet (a frame of ours is at most at "line 0", the module
not started). CPython may also print that KeyboardInterrupt and go on running the program
(lost_by_cpython): the test then presses Ctrl-C once more, as a user would, and the program must
stop by the contract. Every other sample - at least three, the later points - is the programs'
own handling."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import List, Tuple

from tests.cli.helpers import COMPANION, DOMAIN, GATEWAY
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, child_env

GATEWAY_DELAYS = (0, 0.02, 0.05, 0.1, 0.15, 0.25, 0.3, 0.5, 1.0)
COMPANION_DELAYS = GATEWAY_DELAYS + (1.5, 2.0)


def _sigint_default() -> None:
    # a test run started in the background of a non-interactive shell inherits SIGINT ignored,
    # and CPython keeps an ignored SIGINT ignored: give the child the default, as a terminal does
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def lost_by_cpython(text: str) -> bool:
    """CPython printed a KeyboardInterrupt with no frame of ours in it and went on (the program
    is still running). Seen: "Failed checking if argv[0] is an import path entry" (its check of
    the script's directory, before any line of ours; it runs the script anyway) and "Exception
    ignored in" (importlib's module-lock weakref callback, while `site` or the programs' first
    imports load: ros_side's launcher keeps such an interrupt from its first line, the gateway's
    once ubrb_host is in, since a board would pay for every line of the core's launcher). The
    programs print no KeyboardInterrupt of their own."""
    return "KeyboardInterrupt" in text and before_the_first_line(text)


def interrupted(argv: List[str], delay: float) -> Tuple[int, str, bool]:
    """(status, output, lost): `lost` when CPython lost the first SIGINT before the program's
    first line (lost_by_cpython); a second one went then, as a user would press Ctrl-C again."""
    p = subprocess.Popen(argv, cwd=ROOT, env=child_env(DOMAIN), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_sigint_default)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    lost = False
    try:
        out, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired as e:
        so_far = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
        lost = lost_by_cpython(so_far)
        if lost:
            p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=30 if lost else 20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError("SIGINT %.2f s after start did not stop %s:\n%s"
                                 % (delay, argv, out + err))
    return p.returncode, out + err, lost


def ours(path: str) -> bool:
    """A file of this repository (not of the venv that may live inside it)."""
    return path.startswith(ROOT + os.sep) and not path.startswith(sys.prefix + os.sep)


def before_the_first_line(text: str) -> bool:
    """A traceback CPython printed before any line of this repository ran: every frame of a file
    of ours is at line 0 (a module whose first line had not run)."""
    frames = re.findall(r'File "([^"]+)", line (-?\d+)', text)
    return bool(frames) and all(not ours(path) or int(line) <= 0 for path, line in frames)


def check(argv: List[str], delays: Tuple[float, ...], serving: str) -> None:
    handled = 0
    for delay in delays:
        status, text, lost = interrupted(argv, delay)
        where = "SIGINT %.2f s after start: status %d\n%s" % (delay, status, text)
        if lost:  # the second Ctrl-C then stops it by the contract, with no traceback of its own
            assert before_the_first_line(text) and status in (0, 130), where
            assert (status == 0) == (serving in text), where
            continue
        if text.strip() == "KeyboardInterrupt":
            # CPython's own report with no frame at all (status 1: seen at 0.02 s, while `site`
            # loaded); nothing of ours prints a bare KeyboardInterrupt
            assert status in (-signal.SIGINT, 1), where
            continue
        if "Traceback" in text:
            # CPython's own report (status -SIGINT; 1 when it came while `site` was imported)
            assert before_the_first_line(text), where
            assert status in (-signal.SIGINT, 1), where
            continue
        assert status in (0, 130, -signal.SIGINT), where
        if status == -signal.SIGINT:  # before CPython's handler: killed by the signal, silently
            assert text == "", where
            continue
        handled += 1
        # 0 exactly when it was serving (its stop handler installed), 130 while it started
        assert (status == 0) == (serving in text), where
    # not vacuous: on a loaded machine the early points may all come before the script runs,
    # the later ones (0.3 s and more) reach it
    assert handled >= 3, "only %d of %d samples reached the program" % (handled, len(delays))


def test_ctrl_c_during_the_gateways_start_up_is_quiet() -> None:
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    check(GATEWAY + ["--listen", "127.0.0.1:0", "--link", link], GATEWAY_DELAYS, "listening on")


def test_ctrl_c_during_the_companions_start_up_is_quiet() -> None:
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    check(COMPANION + ["--link", link, "--backend", "dds"], COMPANION_DELAYS, "companion on link")


# Two ways a Ctrl-C reached the programs disguised, found by the test above (1 run in ~15), each
# made deterministic here, in a process of its own (signal handlers, sys.unraisablehook):
PROBE = """
import sys, weakref
sys.path[:0] = [%r, %r]
import ubrb_host
from ubrb_host import cli

def set_name_interrupted(argv):
    # CPython 3.11 wraps a KeyboardInterrupt raised in __set_name__ (a class being made while a
    # library is imported) in a RuntimeError
    class D:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt
    class C:
        d = D()
print("set_name", cli.run_program("probe", set_name_interrupted))

def stray(argv):
    # a KeyboardInterrupt in a weakref callback is 'Exception ignored' and lost; kept, it is
    # raised when the program puts its SIGINT handler in place
    class A:
        pass
    a = A()
    def cb(ref):
        raise KeyboardInterrupt
    r = weakref.ref(a, cb)
    del a
    cli.stop_on_signals(lambda *_: None)
    return 0
ubrb_host.catch_stray_interrupts()
print("stray", cli.run_program("probe", stray))
"""


def test_a_ctrl_c_cpython_disguised_or_swallowed_is_still_130() -> None:
    r = subprocess.run([sys.executable, "-c", PROBE % (os.path.join(ROOT, "ports", "cpython"),
                                                        ROOT)],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["set_name", "130", "stray", "130"], r.stdout + r.stderr
    assert r.stderr == "", r.stderr  # no 'Exception ignored', no traceback


def test_a_stop_signal_inside_event_wait_still_sets_the_event() -> None:
    # The client's commands, the demo and the ROS observer stop on a threading.Event that SIGINT
    # and SIGTERM set. A handler runs in the main thread between two bytecodes, and the main
    # thread spends its waits inside Event.wait(), which holds the event's lock for a few of
    # them: a handler calling event.set() there waits for that lock forever (a likely cause of
    # `ubrb_client sim` not exiting within 5 s of SIGTERM once in ten runs of the suite). Here
    # the handler runs with the lock held, as it would at that moment.
    import threading

    from ubrb_host import cli as host_cli
    ev = threading.Event()
    handler = host_cli.set_on_signal(ev)
    with ev._cond:                 # type: ignore[attr-defined]  # (Event.wait holds it so)
        t0 = time.monotonic()
        handler(signal.SIGTERM, None)      # `lambda *_: ev.set()` never returned from here
        assert time.monotonic() - t0 < 1.0
    assert ev.wait(5), "the event was never set"
