"""Round trips at 100 Hz (issue 21's table), four paths in one run, each echoed by a real rclpy
node (ROS 2 Kilted, Fast DDS, the .venv-ros interpreter) that republishes /ubrb_bench/ping on
/ubrb_bench/pong:

1. rclpy echo, no bridge: an rclpy pinger node (its own process) -> the echo;
2. dds direct: ``ubrb_client bench`` -> ``python -m ros_side --backend dds --listen`` -> echo;
3. dds via gateway+UDP: ``ubrb_client bench`` -> ``python ubrb_min.py`` -> UDP link ->
   ``python -m ros_side --backend dds`` -> echo;
4. rclpy via gateway+UDP: the same with ``--backend rclpy`` (run by the .venv-ros python).

Every row sends ``--count`` reliable messages at ``--rate`` Hz: ``ubrb_client bench``'s payload
(std_msgs/UInt8MultiArray, ``--size`` data bytes starting with the sequence number and the send
time; 64 bytes make 80 bytes of CDR, a 64-character std_msgs/String 73), the round trip timed
by the sender's clock. Printed per row: p50/p90/p99/max in ms, losses, the 1-minute load average
when the row ended, and issue 21's figures (p50 / p99) beside them.
The rate matters: at 100 Hz every process sleeps between messages and wakes for each one
(on a 2-core VM that alone adds ~0.5 ms to the bare rclpy p50; compare ``--rate 1000``).

DDS stays on this machine, in a free domain: Fast DDS by tests/ros/fastdds_loopback.xml as its
default profile (ROS_AUTOMATIC_DISCOVERY_RANGE unset: with LOCALHOST rmw_fastrtps opens sockets
on other interfaces), Cyclone by the loopback XML of shared/design/ROS-NOTES.md.

    .venv/bin/python bench/round_trip.py [--count 1000] [--rate 100] [--size 64] [--domain N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "ports", "cpython")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ubrb_host import cli as host_cli  # noqa: E402

ROS_PYTHON = os.path.join(ROOT, ".venv-ros", "bin", "python")
FASTDDS_XML = os.path.join(ROOT, "tests", "ros", "fastdds_loopback.xml")
PROG = "bench/round_trip.py"
# issue 21, "Round trips at 100 Hz (64 B)": p50 / p99 ms before this bench existed
BEFORE = {"rclpy echo, no bridge": (0.59, 5.0), "dds direct": (0.95, 6.4),
          "dds via gateway+UDP": (1.36, 18.7), "rclpy via gateway+UDP": (1.37, 11.5)}


# -- the rclpy nodes (run by the .venv-ros python) -------------------------------------------------
def _node(name: str) -> Any:
    """An rclpy node, the reliable QoS of both topics and ubrb_client bench's message class."""
    import importlib

    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from ubrb_client.bench import BENCH_TYPE
    rclpy.init()
    node = rclpy.create_node(name)
    pkg, _, cls = BENCH_TYPE.split("/")
    # deep, as ubrb_client bench's pong subscription and tools/ros_observer.py's echo: no sample
    # of a late spin is overwritten in our own queue
    return (node, QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE),
            getattr(importlib.import_module(pkg + ".msg"), cls))


def _spin(node: Any, step: Callable[[], Optional[float]]) -> None:
    """Spin ``node`` until ``step()`` says None; else it says how long to wait for work (the
    pinger's next send). rclpy's own SIGINT/SIGTERM handler ends it too."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    try:
        while rclpy.ok():
            wait = step()
            if wait is None:
                return
            ex.spin_once(timeout_sec=max(0.0, wait))
    except (KeyboardInterrupt, ExternalShutdownException):
        pass


def _echo_main(a: argparse.Namespace) -> int:
    from ubrb_client.bench import PING_TOPIC, PONG_TOPIC
    node, qos, msg_cls = _node("round_trip_echo")
    pub = node.create_publisher(msg_cls, PONG_TOPIC, qos)
    node.create_subscription(msg_cls, PING_TOPIC, pub.publish, qos, raw=True)
    print("echo ready", flush=True)
    _spin(node, lambda: 1.0)
    return 0


def _ping_main(a: argparse.Namespace) -> int:
    """ubrb_client bench's loop (warm-up probes until one comes back, then COUNT at RATE, then
    up to 5 s for late replies) on an rclpy node; prints "result: {json}", round trips in ms."""
    from ubrb_client.bench import PING_TOPIC, PONG_TOPIC, PROBE, make_payload, parse_payload
    node, qos, msg_cls = _node("round_trip_ping")
    rtt: List[float] = []
    probed: List[float] = []

    def on_pong(data: bytes) -> None:
        now = time.perf_counter_ns()
        seq, t0 = parse_payload(data)
        (probed if seq & PROBE else rtt).append((now - t0) / 1e6)
    pub = node.create_publisher(msg_cls, PING_TOPIC, qos)
    node.create_subscription(msg_cls, PONG_TOPIC, on_pong, qos, raw=True)
    clock = time.perf_counter
    st = {"next": clock(), "seq": 0, "end": clock() + 20.0}

    def warm() -> Optional[float]:
        if probed:
            return None
        if clock() > st["end"]:
            raise host_cli.Fatal("no echo on %s within 20 s" % PONG_TOPIC)
        if clock() >= st["next"]:
            pub.publish(make_payload(PROBE | int(st["seq"]), a.size))
            st["seq"] += 1
            st["next"] += 0.1
        return st["next"] - clock()
    _spin(node, warm)
    period, pad = 1.0 / a.rate, bytes(max(0, a.size - 16))
    st.update(next=clock() + 0.1, seq=0)   # 0.1 s: in-flight probes drain, as in ubrb_client

    def send() -> Optional[float]:
        if st["seq"] < a.count:
            if clock() >= st["next"]:
                pub.publish(make_payload(int(st["seq"]), a.size, pad=pad))
                st["seq"] += 1
                st["next"] += period
                st["end"] = clock() + 5.0
            return st["next"] - clock()
        return 0.05 if len(rtt) < a.count and clock() < st["end"] else None
    _spin(node, send)
    print("result: " + json.dumps({"sent": st["seq"], "rtt_ms": rtt}), flush=True)
    return 0


def hz(text: str) -> float:
    r = host_cli.duration(text)
    if r <= 0:
        raise argparse.ArgumentTypeError("the rate must be above 0 Hz, got %s" % text)
    return r


# -- the bench (this venv) ---------------------------------------------------------------------
def ros_env(domain: int) -> Dict[str, str]:
    from ros_side.backends.dds import LOOPBACK_XML
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), CYCLONEDDS_URI=LOOPBACK_XML,
               FASTDDS_DEFAULT_PROFILES_FILE=FASTDDS_XML, PYTHONUNBUFFERED="1")
    for name in ("ROS_LOCALHOST_ONLY", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION"):
        env.pop(name, None)
    return env


def stats(rtt: List[float], sent: int) -> Dict[str, float]:
    from ubrb_client.bench import percentile
    v = sorted(rtt)
    return {"p50": percentile(v, 0.5), "p90": percentile(v, 0.9), "p99": percentile(v, 0.99),
            "max": v[-1] if v else float("nan"), "lost": sent - len(v)}


def client_bench(port: int, a: argparse.Namespace, env: Dict[str, str]) -> Dict[str, float]:
    r = subprocess.run([sys.executable, "-m", "ubrb_client", "bench", "--server", str(port),
                        "--count", str(a.count), "--size", str(a.size), "--rate", str(a.rate),
                        "--wait", "20", "--json"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=a.count / a.rate + 120)
    if r.returncode != 0:
        raise RuntimeError("ubrb_client bench: " + (r.stderr.strip().splitlines() or ["?"])[-1])
    j = json.loads(r.stdout.strip().splitlines()[-1])
    return {"p50": j["rtt_p50_ms"], "p90": j["rtt_p90_ms"], "p99": j["rtt_p99_ms"],
            "max": j["rtt_max_ms"], "lost": j["lost"]}


def run_row(name: str, a: argparse.Namespace, env: Dict[str, str]) -> Dict[str, float]:
    from bench import chainkit as K
    me = os.path.abspath(__file__)
    procs: List[Any] = []
    chain: Optional[Any] = None
    try:
        echo = K.Proc([ROS_PYTHON, me, "rclpy-echo"], env)
        procs.append(echo)
        echo.wait_line(r"echo ready", 30.0)
        if name == "rclpy echo, no bridge":
            ping = K.Proc([ROS_PYTHON, me, "rclpy-ping", "--count", str(a.count),
                           "--rate", str(a.rate), "--size", str(a.size)], env)
            procs.append(ping)
            got = json.loads(ping.wait_line(r"^result: (.*)", a.count / a.rate + 60).group(1))
            return stats(got["rtt_ms"], got["sent"])
        if name == "dds direct":
            comp = K.Proc([sys.executable, "-m", "ros_side", "--backend", "dds", "--domain",
                           str(a.domain), "--listen", "127.0.0.1:0"], env)
            procs.append(comp)
            port = int(comp.wait_line(r"UBRB bridge on [\d.]+:(\d+)", 30.0).group(1))
        else:
            backend = name.split()[0]
            chain = K.Chain(backend=backend, env=env, domain=a.domain,
                            python=ROS_PYTHON if backend == "rclpy" else sys.executable)
            port = chain.port
        return client_bench(port, a, env)
    finally:
        if chain is not None:
            chain.close()
        for p in reversed(procs):
            p.stop()


def main_bench(a: argparse.Namespace) -> int:
    if not os.path.exists(ROS_PYTHON):
        raise host_cli.Fatal("no %s: run `make venv-ros`" % ROS_PYTHON)
    from bench import chainkit  # noqa: F401  (sets a tagged CYCLONEDDS_URI: replaced below)
    from tools import demo
    demo.obs.use_loopback(force=True)        # the domain probe sees untagged participants
    if a.domain is None:
        a.domain = host_cli.env_domain()
    if a.domain is None:
        a.domain = demo.pick_domain()
    env = ros_env(a.domain)
    print("round trips: %d x %d B (std_msgs/UInt8MultiArray data) at %g Hz, reliable, echoed by "
          "an rclpy node (Kilted, Fast DDS), DDS domain %d on loopback; load average %s"
          % (a.count, a.size, a.rate, a.domain, " ".join("%.2f" % x for x in os.getloadavg())),
          flush=True)
    print("%-24s %7s %7s %7s %7s %5s %6s   %s" % ("ms", "p50", "p90", "p99", "max", "lost",
                                                  "load1", "issue 21: p50 / p99"), flush=True)
    failed = 0
    for name, (b50, b99) in BEFORE.items():
        try:
            s = run_row(name, a, env)
            cells = "%7.2f %7.2f %7.2f %7.2f %5d" % (s["p50"], s["p90"], s["p99"], s["max"],
                                                    s["lost"])
            failed += s["lost"] > 0
        except (RuntimeError, subprocess.TimeoutExpired, host_cli.Fatal) as e:
            cells = "%-37s" % ("failed: " + str(e).splitlines()[0])[:37]
            failed += 1
        print("%-24s %s %6.2f   %.2f / %.1f" % (name, cells, os.getloadavg()[0], b50, b99),
              flush=True)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = host_cli.script_parser(PROG, __doc__ or "")
    p.add_argument("-n", "--count", type=host_cli.positive_int, default=1000,
                   help="round trips per row (default %(default)s)")
    p.add_argument("-r", "--rate", type=hz, default=100.0,
                   help="Hz (default %(default)s)")
    p.add_argument("-s", "--size", type=host_cli.positive_int, default=64,
                   help="payload data bytes, 16 or more (default %(default)s)")
    p.add_argument("--domain", type=host_cli.domain_id, default=None, metavar="N",
                   help="DDS domain 0-232 (default: ROS_DOMAIN_ID if set, else a random one no "
                        "participant here uses)")
    p.set_defaults(func=main_bench)
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("rclpy-echo", help="(a row's echo, under .venv-ros) republish ping on pong"
                   ).set_defaults(func=_echo_main)
    ping = sub.add_parser("rclpy-ping", help="(row 1's pinger, under .venv-ros)")
    for flag, kind in (("--count", host_cli.positive_int), ("--rate", hz),
                       ("--size", host_cli.positive_int)):
        ping.add_argument(flag, type=kind, required=True)
    ping.set_defaults(func=_ping_main)
    return p


def run(argv: Optional[List[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    return int(a.func(a))


def main(argv: Optional[List[str]] = None) -> int:
    return host_cli.run_program(PROG, run, argv)


if __name__ == "__main__":
    sys.exit(main())
