"""The argument layer and logging of the CPython programs (gateway and companion).

One table of limits (ubrb_min.LIMITS) gives every program its --max-clients ... flags; the link
flags and --log-level are spelled once here too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Dict, Optional

import ubrb_min as core

log = logging.getLogger("ubrb.gateway")

LOG_LEVELS = ["debug", "info", "warning", "error"]


def parse_hostport(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = default_host, text
    host = host.strip("[]") or default_host
    try:
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}") from None


def add_link_arguments(group: argparse._ActionsContainer, default: Optional[str],
                       link_help: str) -> None:
    """--link URL (grammar: ubrb_min.parse_link_url), --baud, --link-mtu."""
    group.add_argument("--link", default=default, metavar="URL", help=link_help)
    group.add_argument("--baud", type=int, default=115200,
                       help="serial baud rate (default 115200)")
    group.add_argument("--link-mtu", type=int, default=core.LINK_DEFAULT_MTU, metavar="BYTES",
                       help=f"largest UDP datagram on the link (default {core.LINK_DEFAULT_MTU})")
    group.add_argument("--link-key", default=None, metavar="FILE",
                       help="the link's shared secret (the same file on both ends; `make link-key` "
                            "writes one): the handshake proves it and every frame carries a MAC, "
                            "so nobody without it can join, inject or replay")
    group.add_argument("--insecure-link", action="store_true",
                       help="allow a UDP link on a non-loopback address without --link-key "
                            "(anyone who can reach the port can then talk to the other end)")


def read_link_key(path: str) -> bytes:
    """The key in a --link-key file (hex, >= 32 digits, whitespace ignored; ubrb_min.parse_link_key);
    a file that group or others may read gets a warning. ValueError (one line) otherwise."""
    import os
    import stat

    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(4096)
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ValueError(f"cannot read link key {path}: {e.strerror or e}") from None
    try:
        key: bytes = core.parse_link_key(text)
    except ValueError as e:
        raise ValueError(f"link key {path}: {e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("link key %s can be read by group or others (mode %03o): chmod 600 %s",
                    path, stat.S_IMODE(mode), path)
    return key


def link_key(args: argparse.Namespace) -> Optional[bytes]:
    """The key --link-key names (None without one), after the rule that an unkeyed UDP link stays
    on loopback unless --insecure-link says otherwise (which is logged). ValueError (one line)."""
    if args.link_key:
        return read_link_key(args.link_key)
    if core.link_needs_key(args.link):
        if not getattr(args, "insecure_link", False):
            raise ValueError(f"{args.link} is not a loopback address: give --link-key FILE "
                             "(make link-key writes one; the same file on both ends), or "
                             "--insecure-link to run it unauthenticated")
        log.warning("link %s has no key (--insecure-link): anyone who can reach it can join the "
                    "link, inject into ROS and reach UE clients", args.link)
    return None


def add_limit_arguments(group: argparse._ActionsContainer, default_profile: str) -> None:
    """--profile and one flag per limit of ubrb_min.LIMITS (None: the profile's value)."""
    group.add_argument(
        "--profile",
        default=default_profile,
        choices=sorted(core.PROFILES),
        help=f"static limits to start from (default {default_profile})",
    )
    for key, text in core.LIMITS:
        group.add_argument(
            "--" + key.replace("_", "-"), type=int, default=None, metavar="N", help=text
        )


def add_log_argument(group: argparse._ActionsContainer) -> None:
    group.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                       help="logging threshold (default info)")


def profiles_help() -> str:
    lines = ["profiles (every limit can be overridden by its own flag):"]
    for name, p in core.PROFILES.items():
        vals = ", ".join(f"{k}={p[k]}" for k in core.PROFILE_KEYS)
        lines.append(f"  {name}: {vals}")
    return "\n".join(lines)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def load_profile(args: argparse.Namespace, prog: str) -> Optional[Dict[str, int]]:
    """The profile the flags ask for; None (after saying why on stderr) if the limits do not fit
    together. Log its budget with log_budget once the link (if any) is sized."""
    try:
        overrides = {k: getattr(args, k) for k in core.PROFILE_KEYS}
        profile: Dict[str, int] = core.make_profile(args.profile, overrides)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    return profile


def log_budget(name: str, profile: Dict[str, int], link: Optional[Dict[str, int]] = None) -> None:
    """The worst-case memory budget, link buffers included (`link`: ubrb_min.link_sizes)."""
    for line in core.format_budget(name, profile, link).splitlines():
        log.info(line)


def make_logger() -> Callable[[str, str], None]:
    """The core's log callable(level, message), onto the logging module."""
    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}

    def emit(level: str, msg: str) -> None:
        log.log(levels.get(level, logging.INFO), msg)

    return emit
