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


# Control characters (and Unicode line breaks) a message may carry from a client or the peer,
# escaped so that one record is always one line: nobody can forge a log line.
_ESCAPES = {c: "\\x%02x" % c for c in list(range(32)) + [0x7F, 0x85] if c != 9}
_ESCAPES.update({10: "\\n", 13: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


class OneLineFormatter(logging.Formatter):
    """The message of every record on one line, whatever it carries (a traceback, logged at
    debug level only, still follows on its own lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_ESCAPES)
        return super().formatMessage(record)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()))
    fmt = OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for h in logging.getLogger().handlers:
        h.setFormatter(fmt)


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


def make_logger(name: Optional[str] = None) -> Callable[[str, str], None]:
    """The core's log callable(level, message), onto the logging module (logger `name`, default
    the gateway's)."""
    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR}
    to = logging.getLogger(name) if name else log

    def emit(level: str, msg: str) -> None:
        to.log(levels.get(level, logging.INFO), "%s", msg)

    return emit
