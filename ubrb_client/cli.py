"""Command line: ``python -m ubrb_client {pub,echo,hz,bench,sim} ...`` (see docs/CLIENT.md).

Keeps the contract of every program of the project (ubrb_host.cli): values checked while parsing,
one line on stderr for a mistake, exit 2 for a usage mistake and 1 when a command did not do what
was asked, --version/-v/-q/--log-level. The message definitions (rosbags, numpy) and PyYAML are
imported by the commands that need them, so --help works without them.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any


def _runtime_on_path() -> None:
    """From a checkout the shared CPython runtime (ubrb_host: the argument layer) is in
    ports/cpython/; installed (pip install '.[client]') it is a top-level package already."""
    runtime = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "ports", "cpython")
    if os.path.isdir(os.path.join(runtime, "ubrb_host")) and runtime not in sys.path:
        sys.path.insert(0, runtime)


_runtime_on_path()

from ubrb_host import cli as host_cli  # noqa: E402

from . import __version__  # noqa: E402
from . import bench as B  # noqa: E402
from .client import DEFAULT_HOST, DEFAULT_PORT, Client, parse_server  # noqa: E402
from .protocol import DEFAULT_MAX_QUEUED_BYTES, QoS  # noqa: E402

PROG = "python -m ubrb_client"
DEFAULT_DISTRO = "humble"  # ubrb_client.msgs.DEFAULT_DISTRO, without importing rosbags for --help
# ERROR codes that end a registration: the command cannot do what was asked.
REFUSALS = ("unknown_type", "invalid_topic", "type_conflict", "qos_conflict", "id_in_use",
            "too_many_topics", "too_many_ids", "invalid_qos", "message_too_large")
WAIT_SAY_S = 1.0      # a wait longer than this says what it waits for
VERDICT_S = 1.0       # how long pub waits for the ROS side's answer to its ADVERTISE
ROS_CHECK_S = 1.0     # echo / hz ask the bridge this often whether its ROS side is there


def _msgs() -> Any:
    from . import msgs

    return msgs


def _yaml() -> Any:
    import yaml

    return yaml


def _qos(args, default_reliability: str) -> QoS:
    return QoS(args.qos or default_reliability, args.durability, args.depth)


def _client(args, name: str, on_error=None, watch_ros: bool = False) -> Client:
    host, port = parse_server(args.server)
    return Client(host, port, name=args.name or name, reconnect_interval=args.reconnect_interval,
                  max_queued_bytes=args.max_queued_bytes, distro=args.distro, on_error=on_error,
                  hello_interval=ROS_CHECK_S if watch_ros else None)


def _reason(c: Client) -> str:
    r = c.proto.last_disconnect_reason or "no answer yet"
    for code, words in (("ECONNREFUSED", "connection refused: nothing listens there"),
                        ("ETIMEDOUT", "timed out"), ("EHOSTUNREACH", "no route to host"),
                        ("ENETUNREACH", "network unreachable")):
        if code in r:
            if c.port == host_cli.LINK_DEFAULT_PORT:
                words += (f" ({c.port} is the default port of the link between a gateway and "
                          f"its companion; the gateway serves clients on {DEFAULT_PORT})")
            return words
    return r


class _RosWatch:
    """echo / hz: one line on stderr when the bridge has no ROS side (nothing can arrive), and
    one when it has it again. The client re-sends HELLO every ROS_CHECK_S; each HELLO_ACK says."""

    def __init__(self, c: Client, args, cmd: str) -> None:
        self.c, self.args, self.cmd = c, args, cmd
        self.up: bool | None = None   # None: no HELLO_ACK seen yet

    def check(self) -> bool:
        """Look at the last HELLO_ACK; True when the ROS side has just come back."""
        info = self.c.server_info
        if info is None:              # between connections: nothing new
            return False
        up = not _no_ros_side(info or {})
        was, self.up = self.up, up
        if up == was:
            return False
        where = f"the bridge at {self.args.server}"
        if not up:
            print(f"{self.cmd}: {where} has no ROS side{' any more' if was else ''} (its "
                  f"companion is not connected): waiting for it; nothing arrives on "
                  f"{self.args.topic} until then", file=sys.stderr, flush=True)
        elif was is False:
            print(f"{self.cmd}: {where} has a ROS side now (ROS {info.get('ros_distro')}): "
                  f"subscribed to {self.args.topic}", file=sys.stderr, flush=True)
            return True
        return False


def _connect(c: Client, args, cmd: str, timeout: float | None, stop=None) -> bool:
    """Wait for the bridge (and its HELLO_ACK), saying on stderr what it waits for once the wait
    passes a second (and again when the reason changes). False at the deadline or on stop."""
    end = None if timeout is None else time.monotonic() + timeout
    said = None
    step = WAIT_SAY_S
    while True:
        left = step if end is None else min(step, max(0.0, end - time.monotonic()))
        if c.wait_connected(left, ack=True):
            if said is not None:
                print(f"{cmd}: connected to {args.server}", file=sys.stderr, flush=True)
            return True
        if stop is not None and stop.is_set():
            return False
        if end is not None and time.monotonic() >= end:
            return False
        why = _reason(c)
        if why != said:
            said = why
            print(f"{cmd}: waiting for the bridge at {args.server} ({why}; retrying every "
                  f"{args.reconnect_interval:g} s)", file=sys.stderr, flush=True)
        step = 0.25


def _refusal(c: Client, id_: int) -> Any:
    for e in c.errors:
        if e.id == id_ and e.code in REFUSALS:
            return e
    return None


def _add_qos(p, default: str):
    p.add_argument("--qos", choices=("reliable", "best_effort"), default=None,
                   help=f"reliability (default {default})")
    p.add_argument("--durability", choices=("volatile", "transient_local"), default="volatile",
                   help="transient_local: late subscribers get the last messages (default "
                        "volatile)")
    p.add_argument("--depth", type=host_cli.positive_int, default=10,
                   help="history depth (KEEP_LAST, default 10)")


def _strip_arrays(d):
    if isinstance(d, dict):
        return {k: _strip_arrays(v) for k, v in d.items()}
    if isinstance(d, list):
        if d and not isinstance(d[0], (dict, list)):
            return f"<sequence of length {len(d)}>"
        return [_strip_arrays(x) for x in d]
    return d


class _Stop:
    """Ctrl-C / SIGTERM sets an event instead of raising in the middle of I/O."""

    def __init__(self):
        self.event = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, host_cli.set_on_signal(self.event))
            except ValueError:       # not the main thread (tests)
                pass


# ------------------------------------------------------------------------------------- pub
def _no_ros_side(info: dict) -> str:
    """Why the bridge of this HELLO_ACK has no ROS side behind it, or "" when it has one.

    ``ros_ready`` says so (false: its companion is not connected); ``ros_distro`` is only what
    the ROS side reported about itself, so "unknown" there means no ROS side only for a gateway
    that does not send ``ros_ready``."""
    ready = info.get("ros_ready")
    if ready is not None:
        return "" if ready else "has no ROS side (its companion is not connected)"
    if info.get("ros_distro") in (None, "unknown"):
        return ("reports no ROS side (ros_distro \"unknown\"; its companion is not connected, or "
                "it does not say its distro)")
    return ""


def cmd_pub(args) -> int:
    M = _msgs()
    yaml = _yaml()
    store = M.get_store(args.distro)
    typename = M.check_type(store, args.type)
    fields = yaml.safe_load(args.data) if args.data else {}
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        print(f"pub: DATA must be a YAML/JSON mapping of fields, got {fields!r}", file=sys.stderr)
        return 2
    msg = M.from_dict(store, typename, fields)
    cdr = M.encode(store, msg, typename)
    stop = _Stop()
    # watch_ros: HELLO again every ROS_CHECK_S, so a bridge whose ROS side is not there yet (a
    # gateway just started: it answers at once, its link comes up within seconds) is asked again
    c = _client(args, "ubrb_pub", watch_ros=True)
    pub = c.advertise(args.topic, typename, _qos(args, "reliable"))
    c.start()
    try:
        t0 = time.monotonic()
        if not _connect(c, args, "pub", args.wait, stop.event):
            if stop.event.is_set():
                return 130
            print(f"pub: could not connect to {args.server} within {args.wait:g} s: {_reason(c)}",
                  file=sys.stderr)
            return 1
        absent = _no_ros_side(c.server_info or {})
        said = False
        while absent and not stop.event.is_set() and time.monotonic() < t0 + args.wait:
            if not said and time.monotonic() - t0 >= WAIT_SAY_S:
                said = True
                print(f"pub: the bridge at {args.server} {absent}: waiting for it (--wait "
                      f"{args.wait:g} s)", file=sys.stderr, flush=True)
            stop.event.wait(0.05)
            absent = _no_ros_side(c.server_info or {})
        if stop.event.is_set():
            return 130
        if absent:
            print(f"pub: the bridge at {args.server} {absent}: nothing was published",
                  file=sys.stderr)
            return 1
        # --wait-matching N (ros2 topic pub -w): publish once the bridge counts N subscribers,
        # so a subscriber it has not discovered yet does not miss a one-shot message
        while args.wait_matching and (pub.subscriber_count or 0) < args.wait_matching:
            e = _refusal(c, pub.id)
            if e is not None:
                print(f"pub: the bridge refused {args.topic}: {e.code}: {e.message}",
                      file=sys.stderr)
                return 1
            if stop.event.is_set():
                return 130
            if time.monotonic() >= t0 + args.wait:
                print(f"pub: the bridge counted {pub.subscriber_count or 0} subscriber(s) of "
                      f"{args.topic} within {args.wait:g} s, not the {args.wait_matching} of "
                      f"--wait-matching: nothing was published", file=sys.stderr)
                return 1
            stop.event.wait(0.02)
        once = not args.rate
        count = args.count if args.count else (1 if once else 0)
        epoch = c.proto.epoch   # what goes out from here on must be answered on this connection
        period = 1.0 / args.rate if args.rate else 0.0
        n = 0
        next_t = time.monotonic()
        while not stop.event.is_set():
            n += 1
            # Once mode publishes even if the bridge already reported 0 subscribers.
            ok = pub.publish(cdr, force=once)
            if not args.quiet:
                state = "" if ok else (" (skipped: no subscribers)" if not pub.wants_data()
                                       else " (dropped)")
                print(f"publishing #{n}: {typename} {M.to_dict(msg) if n == 1 else ''}{state}",
                      flush=True)
            if count and n >= count:
                break
            if not period:
                continue
            next_t += period
            stop.event.wait(max(0.0, next_t - time.monotonic()))
        # Flushed: the bridge answered a PING sent after the last PUBLISH.
        if not c.sync(args.wait) or c.proto.epoch != epoch:
            # (a connection that ended meanwhile may have taken PUBLISHes the bridge never read)
            why = _reason(c) if c.proto.epoch == epoch else "reconnected while publishing"
            print(f"pub: could not confirm delivery to the bridge at {args.server} ({why})",
                  file=sys.stderr)
            return 1
        # The ROS side answers the ADVERTISE on its own time: a subscriber count means it
        # created the publisher, an ERROR that it refused it (and dropped what was published).
        end = time.monotonic() + min(VERDICT_S, args.wait)
        while time.monotonic() < end and pub.subscriber_count is None \
                and _refusal(c, pub.id) is None:
            time.sleep(0.02)
        e = _refusal(c, pub.id)
        if e is not None:
            print(f"pub: the bridge refused {args.topic}: {e.code}: {e.message}",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        c.close()


# ------------------------------------------------------------------------------------ echo
def cmd_echo(args) -> int:
    M = _msgs()
    yaml = _yaml()
    store = M.get_store(args.distro)
    typename = M.check_type(store, args.type)
    stop = _Stop()
    n = [0]
    sub_id = [-1]
    lock = threading.Lock()

    def on_msg(msg):
        with lock:
            if args.count and n[0] >= args.count:
                return
            n[0] += 1
            d = M.to_dict(msg)
            if args.no_arr:
                d = _strip_arrays(d)
            sys.stdout.write(yaml.safe_dump(d, sort_keys=False, default_flow_style=False,
                                            width=120) + "---\n")
            sys.stdout.flush()
            if args.count and n[0] >= args.count:
                stop.event.set()

    c = _client(args, "ubrb_echo", on_error=lambda e: _stop_on_refusal(e, sub_id, stop),
                watch_ros=True)
    sub = c.subscribe(args.topic, typename, on_msg, _qos(args, "best_effort"))
    sub_id[0] = sub.id
    c.start()
    try:
        return _listen(c, args, "echo", stop, sub.id, lambda: n[0])
    finally:
        c.close()


def _stop_on_refusal(e, sub_id: list, stop: _Stop) -> None:
    if e.id == sub_id[0] and e.code in REFUSALS:
        stop.event.set()


def _listen(c: Client, args, cmd: str, stop: _Stop, sub_id: int, count) -> int:
    """echo / hz: connect (saying what it waits for), then wait for --count messages or
    --duration, saying so once a second has passed without any. Exit 1 when the subscription
    was refused or --count was not reached."""
    end = None if args.duration is None else time.monotonic() + args.duration
    if not _connect(c, args, cmd, args.duration, stop.event):
        if stop.event.is_set() and _refusal(c, sub_id) is None:
            return 130 if not args.duration else 1
        if _refusal(c, sub_id) is None:
            print(f"{cmd}: could not connect to {args.server} within {args.duration:g} s: "
                  f"{_reason(c)}", file=sys.stderr)
            return 1
    said = False
    first = time.monotonic() + WAIT_SAY_S
    ros = _RosWatch(c, args, cmd)
    ros.check()
    while not stop.event.is_set():
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            break
        stop.event.wait(0.1 if left is None else min(0.1, left))
        if ros.check():               # back: the first message may take its time again
            first = time.monotonic() + WAIT_SAY_S
        if not said and count() == 0 and ros.up and time.monotonic() >= first \
                and not stop.event.is_set():
            said = True
            print(f"{cmd}: subscribed to {args.topic}; waiting for its first message",
                  file=sys.stderr, flush=True)
    e = _refusal(c, sub_id)
    if e is not None:
        print(f"{cmd}: the bridge refused {args.topic}: {e.code}: {e.message}", file=sys.stderr)
        return 1
    if args.count and count() < args.count:
        print(f"{cmd}: {count()} of {args.count} messages on {args.topic}", file=sys.stderr)
        return 1
    return 0


# -------------------------------------------------------------------------------------- hz
def hz_stats(times: list) -> tuple[float, float, float, float, int] | None:
    """(rate, min, max, std dev, window) of arrival times like ros2 topic hz."""
    if len(times) < 2:
        return None
    d = [b - a for a, b in itertools.pairwise(times)]
    mean = sum(d) / len(d)
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / len(d))
    return (1.0 / mean if mean > 0 else math.inf), min(d), max(d), std, len(d)


def cmd_hz(args) -> int:
    M = _msgs()
    store = M.get_store(args.distro)
    typename = M.check_type(store, args.type)
    stop = _Stop()
    lock = threading.Lock()
    times: list[float] = []
    total = [0]

    def on_msg(_data):
        with lock:
            times.append(time.monotonic())
            if len(times) > args.window + 1:
                del times[0]
            total[0] += 1
            if args.count and total[0] >= args.count:
                stop.event.set()

    sub_id = [-1]
    c = _client(args, "ubrb_hz", on_error=lambda e: _stop_on_refusal(e, sub_id, stop),
                watch_ros=True)
    sub = c.subscribe(args.topic, typename, on_msg, _qos(args, "best_effort"), raw=True)
    sub_id[0] = sub.id
    c.start()
    t_end = time.monotonic() + args.duration if args.duration else None
    if not _connect(c, args, "hz", args.duration, stop.event):
        c.close()
        if stop.event.is_set() and _refusal(c, sub.id) is None:
            return 130 if not args.duration else 1
        if _refusal(c, sub.id) is None:
            print(f"hz: could not connect to {args.server} within {args.duration:g} s: "
                  f"{_reason(c)}", file=sys.stderr)
            return 1
    last_print = [-1]

    def report():
        with lock:
            st = hz_stats(times)
            if st is None or total[0] == last_print[0]:
                print("no new messages", flush=True)
                return
            last_print[0] = total[0]
        rate, mn, mx, sd, win = st
        print(f"average rate: {rate:.3f}\n\tmin: {mn:.3f}s max: {mx:.3f}s std dev: {sd:.5f}s "
              f"window: {win + 1}", flush=True)

    ros = _RosWatch(c, args, "hz")
    ros.check()
    try:
        while not stop.event.is_set():
            timeout = 1.0 if t_end is None else max(0.0, min(1.0, t_end - time.monotonic()))
            if stop.event.wait(timeout):
                break
            ros.check()
            report()
            if t_end is not None and time.monotonic() >= t_end:
                break
        if args.count and total[0] >= args.count:
            report()
        e = _refusal(c, sub.id)
        if e is not None:
            print(f"hz: the bridge refused {args.topic}: {e.code}: {e.message}", file=sys.stderr)
            return 1
        if args.count and total[0] < args.count:
            print(f"hz: {total[0]} of {args.count} messages on {args.topic}", file=sys.stderr)
            return 1
        return 0
    finally:
        c.close()


# ----------------------------------------------------------------------------------- bench
def cmd_bench(args) -> int:
    c = _client(args, "ubrb_bench")
    c.start()
    try:
        if not _connect(c, args, "bench", args.wait):
            print(f"bench: could not connect to {args.server} within {args.wait:g} s: "
                  f"{_reason(c)}", file=sys.stderr)
            return 1
        res = B.run_bench(c, count=args.count, size=args.size, rate=args.rate,
                          qos=args.qos or "reliable", loopback=args.loopback, topic=args.topic,
                          pong_topic=args.pong_topic, timeout=args.timeout,
                          warmup_timeout=args.wait,
                          out=(lambda s: print(s, file=sys.stderr)))
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    finally:
        c.close()
    print(B.to_json(res) if args.json else B.format_result(res))
    return 0 if res["received"] else 1


# ------------------------------------------------------------------------------------- sim
def cmd_sim(args) -> int:
    from .sim import SimRobot
    stop = _Stop()
    c = _client(args, "ubrb_sim")
    robot = SimRobot(c, cmd_timeout=args.cmd_timeout, max_linear=args.max_linear,
                     max_angular=args.max_angular, beams=args.beams, namespace=args.namespace,
                     out=lambda s: print(s, flush=True))
    c.start()
    print(f"[sim] robot on {args.server}: /clock /tf /tf_static /odom /imu /scan, "
          f"listening on /cmd_vel (Ctrl-C to stop)", flush=True)
    try:
        if not _connect(c, args, "sim", args.duration, stop.event):
            return 0 if stop.event.is_set() else 1
        robot.run(duration=args.duration, stop=stop.event)
    finally:
        c.close()
    return 0


# ------------------------------------------------------------------------------------ main
def _rate(text: str) -> float:
    """Hz, 0 or more (0: once / as fast as possible)."""
    try:
        return host_cli.duration(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"rate must be 0 or more Hz, got {text!r}") from None


def _count(text: str) -> int:
    """A message count, 0 or more (0: no limit)."""
    return 0 if str(text).strip() == "0" else host_cli.positive_int(text)


def _size(text: str) -> int:
    n = host_cli.positive_int(text)
    if n < 16:
        raise argparse.ArgumentTypeError(f"payload must be at least 16 bytes, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    common = host_cli.Parser(add_help=False)
    common.add_argument("--server", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                        type=host_cli.server_address, metavar="HOST:PORT",
                        help="bridge address (default %(default)s; "
                             f"{host_cli.HOSTPORT_HELP})")
    common.add_argument("--name", default=None, help="client name sent in HELLO")
    common.add_argument("--distro", default=DEFAULT_DISTRO, type=host_cli.ros_distro,
                        help="ROS 2 distro of the message definitions (default %(default)s)")
    common.add_argument("--reconnect-interval", type=host_cli.duration, default=2.0, metavar="S",
                        help="seconds between connection attempts (default %(default)s)")
    common.add_argument("--max-queued-bytes", type=host_cli.positive_int,
                        default=DEFAULT_MAX_QUEUED_BYTES, metavar="BYTES",
                        help="reliable messages held while disconnected (default %(default)s)")
    host_cli.add_program_arguments(common, __version__, default_level="warning")

    ap = host_cli.Parser(prog=PROG,
                         description="UBRB v1 client (a stand-in for the Unreal uBotROS plugin)")
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sp = ap.add_subparsers(dest="cmd", required=True, metavar="{pub,echo,hz,bench,sim}")

    p = sp.add_parser("pub", parents=[common], help="publish a message")
    p.add_argument("topic")
    p.add_argument("type", help="e.g. std_msgs/msg/String (std_msgs/String also accepted)")
    p.add_argument("data", nargs="?", default="{}", help="YAML or JSON mapping of fields")
    p.add_argument("-r", "--rate", type=_rate, default=0.0, help="Hz; 0 = once (default)")
    p.add_argument("-n", "--count", type=_count, default=0, help="stop after N messages")
    p.add_argument("--wait", type=host_cli.duration, default=10.0, metavar="S",
                   help="max seconds to wait for the connection and the bridge's ROS side / "
                        "the final flush (default 10)")
    p.add_argument("-w", "--wait-matching", type=_count, default=0, metavar="N",
                   help="publish only once the bridge counts N subscribers (within --wait; "
                        "as ros2 topic pub -w; default 0: at once)")
    _add_qos(p, "reliable")
    p.set_defaults(func=cmd_pub)

    p = sp.add_parser("echo", parents=[common], help="print messages as YAML")
    p.add_argument("topic")
    p.add_argument("type")
    p.add_argument("-n", "--count", type=_count, default=0,
                   help="exit after N messages (exit 1 if fewer arrived)")
    p.add_argument("--duration", type=host_cli.duration, default=None, metavar="S",
                   help="exit after S seconds")
    p.add_argument("--no-arr", action="store_true", help="do not print array contents")
    _add_qos(p, "best_effort")
    p.set_defaults(func=cmd_echo)

    p = sp.add_parser("hz", parents=[common], help="print the publishing rate")
    p.add_argument("topic")
    p.add_argument("type")
    p.add_argument("-w", "--window", type=host_cli.positive_int, default=10000,
                   help="arrivals the statistics cover (default %(default)s)")
    p.add_argument("-n", "--count", type=_count, default=0,
                   help="exit after N messages (exit 1 if fewer arrived)")
    p.add_argument("--duration", type=host_cli.duration, default=None, metavar="S",
                   help="exit after S seconds")
    _add_qos(p, "best_effort")
    p.set_defaults(func=cmd_hz)

    p = sp.add_parser("bench", parents=[common], help="throughput and round-trip latency")
    p.add_argument("-n", "--count", type=host_cli.positive_int, default=1000,
                   help="messages to send (default %(default)s)")
    p.add_argument("-s", "--size", type=_size, default=64, help="payload bytes (min 16)")
    p.add_argument("-r", "--rate", type=_rate, default=1000.0,
                   help="Hz; 0 = as fast as possible")
    p.add_argument("--qos", choices=("reliable", "best_effort"), default="reliable",
                   help="reliability (default reliable)")
    p.add_argument("--loopback", action="store_true",
                   help="publish and subscribe the same topic (works with any bridge)")
    p.add_argument("--topic", default=None, help=f"default {B.PING_TOPIC} ({B.LOOP_TOPIC} with --loopback)")
    p.add_argument("--pong-topic", default=None, help=f"default {B.PONG_TOPIC}")
    p.add_argument("--timeout", type=host_cli.duration, default=5.0, metavar="S",
                   help="wait for late replies (default 5 s)")
    p.add_argument("--wait", type=host_cli.duration, default=15.0, metavar="S",
                   help="connection + warm-up timeout (default 15 s)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.set_defaults(func=cmd_bench)

    p = sp.add_parser("sim", parents=[common], help="a simulated robot like the Unreal plugin's")
    p.add_argument("--duration", type=host_cli.duration, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--cmd-timeout", type=host_cli.duration, default=0.5, metavar="S",
                   help="stop the robot this long after the last /cmd_vel (default 0.5)")
    p.add_argument("--max-linear", type=host_cli.duration, default=2.0, metavar="M/S",
                   help="speed limit (default 2.0)")
    p.add_argument("--max-angular", type=host_cli.duration, default=3.0, metavar="RAD/S",
                   help="turn rate limit (default 3.0)")
    p.add_argument("--beams", type=host_cli.positive_int, default=360,
                   help="laser beams per scan (default 360)")
    p.add_argument("--namespace", default="", help="prefix for every topic, e.g. /robot1")
    p.set_defaults(func=cmd_sim)
    for sub in [ap, *sp.choices.values()]:
        sub.epilog = host_cli.EXIT_HELP
    return ap


def main(argv=None) -> int:
    return host_cli.run_program(PROG, _run, argv)


def _run(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, host_cli.log_level_of(args).upper()),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except (KeyError, ValueError, TypeError) as exc:
        # KeyError's text is repr()'d: print its argument, not its quotes
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise host_cli.Fatal(f"{args.cmd}: {text}", host_cli.EXIT_USAGE) from None
    except Exception as exc:
        if type(exc).__name__.endswith("YAMLError") or type(exc).__module__.startswith("yaml"):
            raise host_cli.Fatal(f"{args.cmd}: DATA is not YAML/JSON: "
                                 f"{' '.join(str(exc).split())}", host_cli.EXIT_USAGE) from None
        raise
