"""``python -m ros_side`` / ``ros2 run ros_side ros_side``: the companion node.

Link mode (default): holds the companion's end of the link to a gateway::

    python -m ros_side --link udp://0.0.0.0:8269 --link-key link.key   # off loopback: keyed
    python -m ros_side --link serial:/dev/ttyACM0 --baud 921600

Direct mode: runs the gateway core in-process and serves UBRB clients itself, no link::

    python -m ros_side --listen 0.0.0.0:8268
"""

# (no `from __future__ import ...`: that is an import too, run before the guard below)
import sys


def _use_source_tree() -> None:
    """Running from a checkout (not installed): the core (ubrb_min.py) is at the repository root
    and the shared CPython runtime (ubrb_host) in ports/cpython/. Installed, both are top-level
    modules already and nothing is added."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runtime = os.path.join(root, "ports", "cpython")
    if not os.path.isdir(os.path.join(runtime, "ubrb_host")):
        return  # installed
    for path in (runtime, root):
        if path not in sys.path:
            sys.path.insert(0, path)


# `python -m ros_side` runs this file as `__main__`, and this copy only hands over: the program is
# the same file imported as ros_side.__main__ (which skips this block), inside the Ctrl-C guard,
# as ubrb_min.py's launcher does it. A Ctrl-C while the program's imports and definitions run (a
# good part of a second) or before run_program's own handling is a quiet exit 130, as later in
# start-up; the console script (ros_side.main) guards the same way.
if __name__ == "__main__":
    # a Ctrl-C that lands in a weakref callback (importlib's, while ubrb_host loads) is reported
    # "Exception ignored" and lost: kept here until ubrb_host's own keeper is in place
    _lost: list = []
    _unraisable = sys.unraisablehook

    def _keep(u: "sys.UnraisableHookArgs") -> None:
        if isinstance(u.exc_value, KeyboardInterrupt):
            _lost.append(1)
        else:
            _unraisable(u)
    sys.unraisablehook = _keep
    try:
        _use_source_tree()
        import ubrb_host

        ubrb_host.catch_stray_interrupts()  # a Ctrl-C CPython cannot raise: kept for later
        if _lost:
            raise KeyboardInterrupt
        from ros_side.__main__ import main as _main

        sys.exit(_main())
    except KeyboardInterrupt:
        sys.exit(130)

_use_source_tree()

import argparse  # noqa: E402
import logging  # noqa: E402
import selectors  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, List, Optional  # noqa: E402

import ubrb_min as core  # noqa: E402
import ubrb_setup  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402
from ubrb_host import link as host_link  # noqa: E402
from ubrb_host.loop import STOP_DRAIN_S, GatewayServer, contained, mapped_buffer  # noqa: E402

from . import latched  # noqa: E402
from .cli import (_size, add_arguments, link_peer, make_companion,  # noqa: E402
                  ros_params_as_flags, strip_ros_args)
from .link_end import LinkCompanionEnd  # noqa: E402

log = logging.getLogger("ros_side")

DEFAULT_LINK = "udp://127.0.0.1:8269"  # other addresses: --link-key (or --insecure-link)
STATS_PERIOD_MS = 1000
# link input handled per loop turn, at most (then the companion's poll, timers and output get
# their turn): a client churning registrations fills every frame with records (issue 20)
LINK_INPUT_BUDGET_MS = 10


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def program_name() -> str:
    """How the user started it: `python -m ros_side`, or `ros_side` (console script, ros2 run)."""
    import os

    arg0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m ros_side" if arg0 in ("", "__main__.py", "-m", "-c") else arg0


def build_parser() -> argparse.ArgumentParser:
    p = host_cli.Parser(
        prog=program_name(),
        description=(
            "UBRB companion node: owns the ROS 2 publishers and subscriptions for a UBRB gateway, "
            "reached over a UDP or serial link (--link), or serves UBRB clients itself (--listen)."
        ),
    )
    m = p.add_argument_group("mode")
    host_cli.add_link_arguments(
        m,
        None,
        f"udp://HOST:PORT to bind ({host_cli.LINK_PORT_HELP}), or serial:PATH (any pyserial "
        f"URL); default {DEFAULT_LINK}",
    )
    m.add_argument(
        "--max-message",
        type=host_cli.positive_int,
        default=None,
        metavar="BYTES",
        help="link mode: largest message this end accepts (default and cap: just under 8 MiB); "
        "the gateway's own limit applies too, whichever is smaller",
    )
    m.add_argument(
        "--release-after",
        type=host_cli.duration,
        default=30.0,
        metavar="S",
        help="link mode: release every ROS entity of a gateway whose link has been down this "
        "long (default 30 s); a shorter outage keeps them, a resumed session restores them",
    )
    m.add_argument(
        "--latched-state",
        default=None,
        metavar="FILE",
        help="link mode: where the companion keeps the transient_local samples it publishes, "
        "so that a restarted companion publishes them again when the gateway hands its "
        "registrations over (default ros_side-<link>.latched in $STATE_DIRECTORY, else "
        "$XDG_STATE_HOME/ubrb, else ~/.local/state/ubrb; 'none': keep nothing)",
    )
    m.add_argument(
        "--latched-max-bytes",
        type=_size,
        default=latched.DEFAULT_MAX_BYTES,
        metavar="N",
        help="link mode: at most this many bytes of latched samples in --latched-state "
        "(each topic its last depth samples; past it the oldest go; suffixes K, M, G; "
        "default 64M)",
    )
    m.add_argument(
        "--listen",
        default=None,
        type=host_cli.listen_address,
        metavar="HOST:PORT",
        help="direct mode: serve UBRB clients on this TCP address, no gateway host (port 0: "
        f"a free one; {host_cli.HOSTPORT_HELP}; 0.0.0.0:PORT: every interface)",
    )
    host_cli.add_limit_arguments(p.add_argument_group("direct mode limits"), "pc")
    host_cli.add_policy_arguments(p.add_argument_group("direct mode allow-lists and throttle"))
    add_arguments(p)
    host_cli.add_program_arguments(p, f"{core.VERSION} (UBRB v1)")
    return p


class LoopLag:
    """How long the loop was kept from serving: per iteration, the time it took beyond the wait it
    asked select for (handling link input, the companion's poll, timers, output, and a select
    that came back late). ``lag_max_ms``: the worst over the last stats period; ``lag_peak_ms``:
    since start; ``stalls_100ms``: iterations over 100 ms; ``cpu_peak_ms``: the most CPU time
    the loop's thread spent in one iteration (a lag far above it is the process waiting for a
    CPU, a machine too busy, not the companion's own work)."""

    def __init__(self) -> None:
        self.period = self.peak = self.cpu_peak = 0.0
        self.stalls = 0

    def iteration(self, start: float, woke: float, timeout: float, cpu: float) -> None:
        """``start``/``woke``: perf_counter() before and after select(``timeout`` s); ``cpu``:
        thread_time() when it woke."""
        lag = (time.perf_counter() - start - min(woke - start, timeout)) * 1000.0
        self.cpu_peak = max(self.cpu_peak, (time.thread_time() - cpu) * 1000.0)
        if lag > self.period:
            self.period = lag
            self.peak = max(self.peak, lag)
        if lag > 100.0:
            self.stalls += 1

    def counters(self, new_period: bool = False) -> dict:
        d = {"lag_max_ms": int(self.period), "lag_peak_ms": int(self.peak),
             "stalls_100ms": self.stalls, "cpu_peak_ms": int(self.cpu_peak)}
        if new_period:
            self.period = 0.0
        return d


class CompanionPump:
    """Lets a selectors loop drive the companion: its wake pipe, and a poll on every tick."""

    def __init__(self, companion: Any) -> None:
        self.companion = companion

    def fileno(self) -> int:
        return int(self.companion.wake_fd())

    def on_readable(self, now: int) -> None:
        self.companion.poll(now)

    def tick(self, now: int) -> None:
        self.companion.poll(now)

    def flush(self, now: int) -> None:
        pass

    def close(self) -> None:
        self.companion.close()


def declare_parameters(companion: Any, args: argparse.Namespace) -> None:
    """rclpy backend: the flags in effect become the node's parameters (they mirror each other)."""
    declare = getattr(companion.backend, "declare_parameters", None)
    if declare is not None:
        # A repeatable flag (--throttle, --msg-path) is one comma-separated string parameter.
        declare({k: ",".join(map(str, v)) if isinstance(v, list) else v
                 for k, v in vars(args).items() if v is not None and v != []})


def run_direct(args: argparse.Namespace) -> int:
    profile = host_cli.load_profile(args, program_name())
    if profile is None:
        return 2
    ok, policy = host_cli.load_policy(args, "ros_side")
    if not ok:
        return 2
    host_cli.log_budget(args.profile, profile)
    companion = make_companion(args, None, profile["max_payload"])
    try:  # a failure, or Ctrl-C (KeyboardInterrupt: exit 130), before it serves closes the backend
        declare_parameters(companion, args)
        gw = core.Gateway(profile, ros=companion, log=host_cli.make_logger(),
                          new_buffer=mapped_buffer)
        if policy is not None:
            ubrb_setup.apply_policy(gw, policy, new_buffer=mapped_buffer)
        try:
            server = GatewayServer(gw, host_cli.parse_hostport(args.listen),
                                   link=CompanionPump(companion))
        except OSError as e:
            raise host_cli.Fatal(f"cannot listen on {args.listen}: {host_cli.os_problem(e)}")
        host_cli.stop_on_signals(server.stop)
        companion.hardware_id = "tcp://%s:%d" % tuple(server.address[:2])  # port 0: the real one
    except BaseException:
        companion.close()
        raise
    on_usr1 = host_cli.CountersOnSignal(lambda: {"gateway": gw.counters()}, log)
    companion.start()  # tells the gateway core the ROS side is up (distro, max message)
    log.info(
        "direct mode: UBRB bridge on %s:%d, backend %s (%s)",
        server.address[0],
        server.address[1],
        type(companion.backend).__name__,
        companion.distro,
    )
    last_stats = 0

    def until() -> bool:
        nonlocal last_stats
        now = now_ms()
        on_usr1.check()
        if now - last_stats >= STATS_PERIOD_MS:
            last_stats = now
            companion.gateway_stats(gw.counters())
        return False

    server.serve(until)
    log.info("stopped")
    host_cli.log_counters({"gateway": gw.counters()}, log)
    return 0


def run_link(args: argparse.Namespace) -> int:
    max_message = min(args.max_message or core.LINK_MAX_MESSAGE, core.LINK_MAX_MESSAGE)
    # the key file is part of the command line: checked (one line, exit 2) before a backend starts
    link_secret = host_cli.link_key(args, log)
    store = None
    if args.latched_state != "none":
        store = latched.LatchedStore(args.latched_state or latched.default_path(args.link),
                                     args.latched_max_bytes)
    companion = make_companion(args, None, max_message, latched=store)
    running = [True]
    hurry = [False]   # a second stop signal: no drain

    def stop(*_: Any) -> None:
        hurry[0] = not running[0]
        running[0] = False

    try:  # a failure, or Ctrl-C (KeyboardInterrupt: exit 130), before it serves closes the backend
        declare_parameters(companion, args)
        try:
            if ubrb_setup.parse_link_url(args.link)[0] == "none":
                raise ValueError("the companion needs a link (udp://HOST:PORT or serial:PATH)")
            session, driver = host_link.open_link(
                args.link, False, max_message, baud=args.baud, mtu=args.link_mtu,
                key=link_secret,
            )
            end = LinkCompanionEnd(session, companion, log=host_cli.make_logger("ros_side"))
        except (OSError, RuntimeError, ValueError) as e:
            raise host_cli.Fatal(f"cannot open link {args.link}: {host_cli.os_problem(e)}")
        companion.sink = end
        companion.hardware_id = link_peer(driver, args.link)  # /diagnostics: the gateway's address
        host_cli.stop_on_signals(stop)
    except BaseException:
        companion.close()
        raise
    lag = LoopLag()
    on_usr1 = host_cli.CountersOnSignal(
        lambda: {"link": driver.counters(), "loop": lag.counters()}, log)
    sel = selectors.DefaultSelector()
    sel.register(companion.wake_fd(), selectors.EVENT_READ, "companion")
    link_fd = -1
    watch = host_link.LinkWatch(
        driver, args.link, "gateway", now_ms(),
        "; its publishers and subscriptions are kept for %g s" % args.release_after)
    log.info(
        "companion on link %s, backend %s (%s)",
        args.link,
        type(companion.backend).__name__,
        companion.distro,
    )
    last_stats = 0
    try:
        while running[0]:
            fd = driver.fileno()
            if fd != link_fd:  # a serial device may come back under a new descriptor
                if link_fd >= 0:
                    sel.unregister(link_fd)
                if fd >= 0:
                    sel.register(fd, selectors.EVENT_READ, "link")
                link_fd = fd
            wait = driver.wait_ms(now_ms())  # wake when the next frame may go
            timeout = min(0.02, wait / 1000.0) if wait else 0.02
            timeout = min(timeout, end.deadline(now_ms()) / 1000.0)  # a throttled message due
            start = time.perf_counter()
            ready = sel.select(timeout)
            woke = time.perf_counter()
            cpu = time.thread_time()
            for key, _ in ready:
                now = now_ms()
                if key.data == "link":
                    contained("handling link input", driver.on_readable, now,
                              LINK_INPUT_BUDGET_MS)
                else:
                    contained("companion poll", companion.poll, now)
            now = now_ms()
            contained("companion poll", companion.poll, now)
            contained("link timers", driver.tick, now)
            contained("throttled messages", end.tick, now)
            if end.owed:
                contained("answers owed", end.retry_answers)
            contained("link output", driver.flush, now)
            watch.check(now)
            on_usr1.check()
            if now - last_stats >= STATS_PERIOD_MS:
                last_stats = now
                companion.set_stats("link", driver.counters())
                companion.set_stats("loop", lag.counters(new_period=True))
            if end.expire(now, int(args.release_after * 1000)):
                log.warning(
                    "link down for %.0f s: released every publisher and subscription of the "
                    "gateway (they come back if it does); %d reliable message(s) from ROS that "
                    "waited for it dropped (counted release_drops; its clients get ERROR "
                    "link_congested if it comes back)",
                    args.release_after, end.last_drops,
                )
            lag.iteration(start, woke, max(timeout, 0.0), cpu)
        drain_link(driver, session, companion, end, sel, lambda: hurry[0])
    finally:
        driver.close()
        companion.close()
        sel.close()
    log.info("stopped")
    ours = dict(companion.stats)  # what it wrote to ROS and dropped, its latched re-publish
    if companion.latched is not None:
        ours.update(companion.latched.counters())
    host_cli.log_counters({"link": driver.counters(), "loop": lag.counters(),
                           "companion": ours}, log)
    return 0


def drain_link(driver: Any, session: Any, companion: Any, end: Any, sel: Any,
               hurry: Callable[[], bool], limit_s: float = STOP_DRAIN_S) -> bool:
    """A graceful stop (SIGINT, SIGTERM): serve the link until the gateway has acknowledged
    every reliable record in its ring and the reliable ROS messages waiting for link room are
    handed on, for at most `limit_s` or until a second signal. True when nothing was left."""
    def left() -> int:
        return session.reliable.rel_queued + companion.waiting()

    companion.stop_taking()

    if not left() or not session.is_up():
        if left():
            log.warning("stopping with the link down: %d bytes of reliable data for the gateway "
                        "and %d ROS messages waiting for it dropped", session.reliable.rel_queued,
                        companion.waiting())
        return not left()
    log.info("stopping: %d bytes of reliable data not yet acknowledged by the gateway, %d ROS "
             "messages waiting for link room; draining for up to %g s (a second signal stops "
             "at once)", session.reliable.rel_queued, companion.waiting(), limit_s)
    t_end = time.monotonic() + limit_s
    while not hurry() and time.monotonic() < t_end and left() and session.is_up():
        for key, _ in sel.select(0.01):
            if key.data == "link":
                contained("handling link input", driver.on_readable, now_ms())
        now = now_ms()
        contained("companion poll", companion.poll, now)
        contained("link timers", driver.tick, now)
        contained("throttled messages", end.tick, now)
        contained("link output", driver.flush, now)
    if left():
        log.warning("stopped before the gateway acknowledged everything: %d bytes of reliable "
                    "data in the link's ring and %d ROS messages waiting for it dropped%s",
                    session.reliable.rel_queued, companion.waiting(),
                    " (a second signal)" if hurry() else " (the link is down)"
                    if not session.is_up() else " after %g s" % limit_s)
        return False
    log.info("drained: the gateway acknowledged every record the companion had for it")
    return True


def main(argv: Optional[List[str]] = None) -> int:
    """The companion program: one line and exit 2 for a usage mistake (a bad flag or ROS_*
    variable), 1 for a runtime failure (missing dependency, link or port unavailable)."""
    return host_cli.run_program(program_name(), run, argv)


def run(argv: Optional[List[str]] = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    argv = ros_params_as_flags(raw) + strip_ros_args(raw)
    parser = build_parser()
    args = parser.parse_args(argv)
    host_cli.setup_logging(host_cli.log_level_of(args))
    if args.listen and args.link:
        parser.error("choose --link (companion) or --listen (direct mode), not both")
    # The ROS_* variables are checked like the flags they stand in for, before any backend starts.
    if args.domain is None:
        args.domain = host_cli.env_domain()
    if args.ros_distro is None:
        args.ros_distro = host_cli.env_distro()
    if args.listen:
        return run_direct(args)
    args.link = args.link or DEFAULT_LINK
    return run_link(args)

