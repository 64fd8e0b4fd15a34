"""Command line: ``python -m ubrb_client {pub,echo,hz,bench,sim} ...`` (see docs/CLIENT.md)."""
from __future__ import annotations

import argparse
import itertools
import logging
import math
import signal
import sys
import threading
import time

import yaml

from . import bench as B
from . import msgs as M
from .client import DEFAULT_HOST, DEFAULT_PORT, Client, parse_server
from .protocol import DEFAULT_MAX_QUEUED_BYTES, QoS


def _qos(args, default_reliability: str) -> QoS:
    return QoS(args.qos or default_reliability, args.durability, args.depth)


def _client(args, name: str) -> Client:
    host, port = parse_server(args.server)
    return Client(host, port, name=args.name or name, reconnect_interval=args.reconnect_interval,
                  max_queued_bytes=args.max_queued_bytes, distro=args.distro)


def _add_qos(p, default: str):
    p.add_argument("--qos", choices=("reliable", "best_effort"), default=None,
                   help=f"reliability (default {default})")
    p.add_argument("--durability", choices=("volatile", "transient_local"), default="volatile")
    p.add_argument("--depth", type=int, default=10, help="history depth (KEEP_LAST)")


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
                signal.signal(sig, lambda *_: self.event.set())
            except ValueError:       # not the main thread (tests)
                pass


# ------------------------------------------------------------------------------------- pub
def cmd_pub(args) -> int:
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
    c = _client(args, "ubrb_pub")
    pub = c.advertise(args.topic, typename, _qos(args, "reliable"))
    c.start()
    try:
        if not c.wait_connected(args.wait):
            print(f"pub: could not connect to {args.server} within {args.wait:g} s", file=sys.stderr)
            return 1
        once = not args.rate
        count = args.count if args.count else (1 if once else 0)
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
        if not c.sync(args.wait):
            print("pub: warning: could not confirm delivery to the bridge", file=sys.stderr)
            return 1
        return 0
    finally:
        c.close()


# ------------------------------------------------------------------------------------ echo
def cmd_echo(args) -> int:
    store = M.get_store(args.distro)
    typename = M.check_type(store, args.type)
    stop = _Stop()
    n = [0]
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

    c = _client(args, "ubrb_echo")
    c.subscribe(args.topic, typename, on_msg, _qos(args, "best_effort"))
    c.start()
    try:
        stop.event.wait(args.duration)
        return 0 if not args.count or n[0] >= args.count else 1
    finally:
        c.close()


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

    c = _client(args, "ubrb_hz")
    c.subscribe(args.topic, typename, on_msg, _qos(args, "best_effort"), raw=True)
    c.start()
    t_end = time.monotonic() + args.duration if args.duration else None
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

    try:
        while not stop.event.is_set():
            timeout = 1.0 if t_end is None else max(0.0, min(1.0, t_end - time.monotonic()))
            if stop.event.wait(timeout):
                break
            report()
            if t_end is not None and time.monotonic() >= t_end:
                break
        if args.count and total[0] >= args.count:
            report()
        return 0
    finally:
        c.close()


# ----------------------------------------------------------------------------------- bench
def cmd_bench(args) -> int:
    c = _client(args, "ubrb_bench")
    c.start()
    try:
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
        robot.run(duration=args.duration, stop=stop.event)
    finally:
        c.close()
    return 0


# ------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}",
                        help="bridge address HOST:PORT (default %(default)s)")
    common.add_argument("--name", default=None, help="client name sent in HELLO")
    common.add_argument("--distro", default=M.DEFAULT_DISTRO,
                        help="ROS 2 distro of the message definitions (default %(default)s)")
    common.add_argument("--reconnect-interval", type=float, default=2.0, metavar="S")
    common.add_argument("--max-queued-bytes", type=int, default=DEFAULT_MAX_QUEUED_BYTES)
    common.add_argument("-v", "--verbose", action="count", default=0,
                        help="-v: info log, -vv: debug log")

    ap = argparse.ArgumentParser(prog="python -m ubrb_client",
                                 description="UBRB v1 client (a stand-in for the Unreal uBotROS plugin)")
    sp = ap.add_subparsers(dest="cmd", required=True)

    p = sp.add_parser("pub", parents=[common], help="publish a message")
    p.add_argument("topic")
    p.add_argument("type", help="e.g. std_msgs/msg/String (std_msgs/String also accepted)")
    p.add_argument("data", nargs="?", default="{}", help="YAML or JSON mapping of fields")
    p.add_argument("-r", "--rate", type=float, default=0.0, help="Hz; 0 = once (default)")
    p.add_argument("-n", "--count", type=int, default=0, help="stop after N messages")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--wait", type=float, default=10.0, metavar="S",
                   help="max seconds to wait for the connection / final flush")
    _add_qos(p, "reliable")
    p.set_defaults(func=cmd_pub)

    p = sp.add_parser("echo", parents=[common], help="print messages as YAML")
    p.add_argument("topic")
    p.add_argument("type")
    p.add_argument("-n", "--count", type=int, default=0, help="exit after N messages")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="exit after S seconds")
    p.add_argument("--no-arr", action="store_true", help="do not print array contents")
    _add_qos(p, "best_effort")
    p.set_defaults(func=cmd_echo)

    p = sp.add_parser("hz", parents=[common], help="print the publishing rate")
    p.add_argument("topic")
    p.add_argument("type")
    p.add_argument("-w", "--window", type=int, default=10000)
    p.add_argument("-n", "--count", type=int, default=0, help="exit after N messages")
    p.add_argument("--duration", type=float, default=None, metavar="S")
    _add_qos(p, "best_effort")
    p.set_defaults(func=cmd_hz)

    p = sp.add_parser("bench", parents=[common], help="throughput and round-trip latency")
    p.add_argument("-n", "--count", type=int, default=1000)
    p.add_argument("-s", "--size", type=int, default=64, help="payload bytes (min 16)")
    p.add_argument("-r", "--rate", type=float, default=1000.0, help="Hz; 0 = as fast as possible")
    p.add_argument("--qos", choices=("reliable", "best_effort"), default="reliable")
    p.add_argument("--loopback", action="store_true",
                   help="publish and subscribe the same topic (works with any bridge)")
    p.add_argument("--topic", default=None, help=f"default {B.PING_TOPIC} ({B.LOOP_TOPIC} with --loopback)")
    p.add_argument("--pong-topic", default=None, help=f"default {B.PONG_TOPIC}")
    p.add_argument("--timeout", type=float, default=5.0, help="wait for late replies (s)")
    p.add_argument("--wait", type=float, default=15.0, help="connection + warm-up timeout (s)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.set_defaults(func=cmd_bench)

    p = sp.add_parser("sim", parents=[common], help="a simulated robot like the Unreal plugin's")
    p.add_argument("--duration", type=float, default=None, metavar="S")
    p.add_argument("--cmd-timeout", type=float, default=0.5)
    p.add_argument("--max-linear", type=float, default=2.0)
    p.add_argument("--max-angular", type=float, default=3.0)
    p.add_argument("--beams", type=int, default=360)
    p.add_argument("--namespace", default="", help="prefix for every topic, e.g. /robot1")
    p.set_defaults(func=cmd_sim)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except (KeyError, ValueError, TypeError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
