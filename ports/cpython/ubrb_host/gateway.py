"""The CPython port of the gateway: `python ubrb_min.py --listen 127.0.0.1:8268 --link udp://...`
(`python -m ubrb_min` and the `ubrb-gateway` command once installed).

Everything protocol-shaped lives in ubrb_min (sans-IO); the loop, transports, argument layer and
logging are the shared CPython runtime, ubrb_host. What is left here is the gateway's program:
its flags, its end of the link (ubrb_min.LinkRosPort) and its statistics to the companion.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Dict, List, Optional

import ubrb_min as core
import ubrb_setup
from ubrb_host import cli
from ubrb_host import link as host_link
from ubrb_host.loop import GatewayServer, mapped_buffer, now_ms

log = logging.getLogger("ubrb.gateway")

DEFAULT_LISTEN = "0.0.0.0:8268"
DEFAULT_LINK = "udp://127.0.0.1:8269"
STATS_PERIOD_MS = 1000  # gateway counters to the companion (its /diagnostics)


def build_parser() -> argparse.ArgumentParser:
    ap = cli.Parser(
        prog="ubrb_min.py",
        description=(
            "UBRB v1 gateway: serves Unreal Engine uBotROS clients over TCP and relays their "
            "topics to the ROS 2 companion (python -m ros_side) over a UDP or serial link."
        ),
        epilog=cli.profiles_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        type=cli.listen_address,
        metavar="HOST:PORT",
        help=f"TCP address for UBRB clients; port 0 picks a free one; {cli.HOSTPORT_HELP} "
        f"(0.0.0.0:PORT: every interface; default {DEFAULT_LISTEN})",
    )
    cli.add_link_arguments(
        ap,
        DEFAULT_LINK,
        "the link to the companion: udp://HOST:PORT (the companion's address; "
        f"{cli.LINK_PORT_HELP}) or serial:PATH (PATH may be any pyserial URL, e.g. "
        f"socket://host:port); 'none' runs without a ROS side (default {DEFAULT_LINK})",
    )
    cli.add_limit_arguments(ap, "pi")
    cli.add_policy_arguments(ap.add_argument_group("who and what (allow-lists, throttle)"))
    cli.add_program_arguments(ap, f"{core.VERSION} (UBRB v1)")
    return ap


def open_link(args: argparse.Namespace,
              profile: Dict[str, int]) -> tuple[Optional[core.LinkRosPort], Any]:
    """(RosPort, driver) for --link; (None, None) for 'none'."""
    if ubrb_setup.parse_link_url(args.link)[0] == "none":
        return None, None
    session, driver = host_link.open_link(
        args.link, True, profile["max_payload"], baud=args.baud, mtu=args.link_mtu,
        max_slots=profile["max_topics"], key=cli.link_key(args),
    )
    return core.LinkRosPort(session), driver


def main(argv: Optional[List[str]] = None) -> int:
    """The gateway program: one line and exit 2 for a usage mistake, 1 for a runtime failure."""
    return cli.run_program("ubrb_min.py", run, argv)


def run(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging(cli.log_level_of(args))
    profile = cli.load_profile(args, "ubrb_min.py")
    if profile is None:
        return 2
    ok, policy = cli.load_policy(args, "ubrb_min.py")
    if not ok:
        return 2
    kind = ubrb_setup.parse_link_url(args.link)[0]
    cli.check_budget(args, profile, None if kind == "none" else (kind == "udp", args.link_mtu))
    try:
        ros, link = open_link(args, profile)
    except (OSError, RuntimeError, ValueError) as e:
        raise cli.Fatal(f"cannot open link {args.link}: {cli.os_problem(e)}")
    sizes = None
    if link is not None:
        sizes = ubrb_setup.link_sizes(profile["max_payload"], link.t.datagram, args.link_mtu)
    cli.log_budget(args.profile, profile, sizes)
    gw = core.Gateway(profile, ros=ros, log=cli.make_logger(), new_buffer=mapped_buffer)
    if policy is not None:
        ubrb_setup.apply_policy(gw, policy, new_buffer=mapped_buffer)
    try:
        server = GatewayServer(gw, cli.parse_hostport(args.listen), link=link)
    except OSError as e:
        raise cli.Fatal(f"cannot listen on {args.listen}: {cli.os_problem(e)}")
    cli.stop_on_signals(server.stop)

    def counters() -> Dict[str, Dict[str, int]]:
        return {"gateway": gw.counters(), "link": link.counters() if link is not None else {}}

    on_usr1 = cli.CountersOnSignal(counters)  # kill -USR1: the table now, while serving
    log.info(
        "UBRB gateway %s listening on %s:%d, link %s",
        core.VERSION,
        server.address[0],
        server.address[1],
        args.link,
    )
    last_stats = [0]
    watch = None
    if link is not None:
        watch = host_link.LinkWatch(link, args.link, "companion", now_ms(),
                                    "; clients stay connected, their topics wait for it")

    def report_stats() -> bool:
        # The companion publishes these on /diagnostics with its own and the link's counters.
        now = now_ms()
        if watch is not None:
            watch.check(now)
        on_usr1.check()
        if ros is not None and now - last_stats[0] >= STATS_PERIOD_MS:
            last_stats[0] = now
            ros.send_stats(gw.counters(), link.counters())  # the link's as link_<name>
        return False

    server.serve(report_stats)
    log.info("stopped")
    cli.log_counters(counters())
    return 0
