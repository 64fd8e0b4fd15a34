"""make latency: round-trip latency through the whole chain, in one command that cleans up.

    ubrb_client bench ──TCP──▶ ubrb_min.py ══UDP link══▶ ros_side --backend dds ──DDS──▶ echo
                      ◀──────────── /ubrb_bench/pong ◀────────────────────────────── (republish)

Starts the gateway, the companion and the ROS-side echo (tools/ros_observer.py echo) on
127.0.0.1 (DDS on loopback, in domain --domain, else ROS_DOMAIN_ID, else a free one), runs
`ubrb_client bench` against them, prints its result, then stops all three (SIGINT, then SIGKILL after 5 s). The children's logs go to a
temp directory that is removed after a clean run and kept (and named) when something failed.
Exit 0 when the bench got its replies, 1 otherwise, 2 for a usage mistake.

    python tools/latency.py [--count N] [--size B] [--rate HZ] [--qos reliable|best_effort]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "ports", "cpython")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ubrb_host import cli as host_cli  # noqa: E402

HOST = "127.0.0.1"
START_S = 30.0   # per child: long on a shared machine, reached only when something is wrong


def build_parser() -> argparse.ArgumentParser:
    p = host_cli.script_parser("tools/latency.py", __doc__ or "")
    p.add_argument("-n", "--count", type=host_cli.positive_int, default=2000,
                   help="messages (default %(default)s)")
    p.add_argument("-s", "--size", type=host_cli.positive_int, default=64,
                   help="payload bytes, 16 or more (default %(default)s)")
    p.add_argument("-r", "--rate", type=host_cli.duration, default=1000.0,
                   help="Hz; 0 = as fast as possible (default %(default)s)")
    p.add_argument("--qos", choices=("reliable", "best_effort"), default="reliable",
                   help="reliability of ping and pong (default reliable)")
    p.add_argument("--domain", type=host_cli.domain_id, default=None, metavar="N",
                   help="DDS domain 0-232 (default: ROS_DOMAIN_ID if set, else a random one no "
                        "participant here uses)")
    p.add_argument("--json", action="store_true", help="the result as one JSON line")
    return p


def run(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    host_cli.setup_logging(host_cli.log_level_of(args))
    if args.domain is None:  # as the demo does: ROS_DOMAIN_ID (checked like --domain), else random
        args.domain = host_cli.env_domain()
    from tools import demo  # the demo's child handling, ports and domain choice

    if demo.OBSERVER_MISSING is not None:
        raise demo.OBSERVER_MISSING  # the one-line "pip install '.[dds]'"
    demo.obs.use_loopback(force=True)  # our probe participant too, before it exists
    gw_port, link_port, _ = demo.choose_ports("0")
    domain = args.domain if args.domain is not None else demo.pick_domain()
    env = dict(os.environ)
    env["CYCLONEDDS_URI"] = demo.obs.LOOPBACK_XML  # every participant stays on loopback
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("ROS_DOMAIN_ID", None)
    log_dir = tempfile.mkdtemp(prefix="ubrb-latency-")
    py = sys.executable
    link = "udp://%s:%d" % (HOST, link_port)
    children: List[demo.Child] = []
    code = 1
    try:
        print("starting gateway, companion (dds, domain %d) and the ROS-side echo ..." % domain,
              file=sys.stderr, flush=True)
        for name, argv_, ready in (
            ("gateway", [py, "ubrb_min.py", "--listen", "%s:%d" % (HOST, gw_port),
                         "--link", link], "listening on"),
            ("companion", [py, "-m", "ros_side", "--link", link, "--backend", "dds",
                           "--domain", str(domain)], "companion on link"),
            ("echo", [py, "tools/ros_observer.py", "echo", "--domain", str(domain), "-q"],
             "echo: /ubrb_bench/ping -> /ubrb_bench/pong"),
        ):
            c = demo.Child(name, argv_, os.path.join(log_dir, name + ".log"), env)
            children.append(c)
            end = time.monotonic() + START_S
            while ready not in c.log_text():
                if not c.alive() or time.monotonic() > end:
                    raise host_cli.Fatal("%s did not start: %s" % (name, " | ".join(c.tail(3))))
                time.sleep(0.05)
        bench = [py, "-m", "ubrb_client", "bench", "--server", "%s:%d" % (HOST, gw_port),
                 "--count", str(args.count), "--size", str(args.size), "--rate", str(args.rate),
                 "--qos", args.qos, "--wait", "20"] + (["--json"] if args.json else [])
        code = subprocess.call(bench, cwd=ROOT, env=env)
    finally:
        for c in reversed(children):
            c.stop()
        if code == 0:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print("logs kept in %s" % log_dir, file=sys.stderr)
    return code


def main(argv: Optional[List[str]] = None) -> int:
    return host_cli.run_program("tools/latency.py", run, argv)


if __name__ == "__main__":
    sys.exit(main())
