"""The argument layer and logging of the CPython programs (gateway and companion).

One table of limits (ubrb_min.LIMITS) gives every program its --max-clients ... flags; the link
flags and --log-level are spelled once here too.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

import ubrb_min as core
import ubrb_policy
import ubrb_setup

log = logging.getLogger("ubrb.gateway")

LOG_LEVELS = ["debug", "info", "warning", "error"]


def parse_hostport(text: str, allow_zero: bool = True) -> tuple[str, int]:
    """HOST:PORT -> (host, port) by the one grammar of every address option
    (ubrb_setup.parse_hostport): a PORT alone, or :PORT, is 127.0.0.1:PORT."""
    try:
        host, port = ubrb_setup.parse_hostport(text, allow_zero)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return host, port


def format_hostport(host: str, port: int) -> str:
    """(host, port) as the text a person reads and the parsers read back: [v6]:PORT for IPv6."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def add_link_arguments(group: argparse._ActionsContainer, default: Optional[str],
                       link_help: str) -> None:
    """--link URL (grammar: ubrb_min.parse_link_url), --baud, --link-mtu."""
    group.add_argument("--link", default=default, type=link_url, metavar="URL", help=link_help)
    group.add_argument("--baud", type=positive_int, default=115200,
                       help="serial baud rate (default 115200)")
    group.add_argument("--link-mtu", type=link_mtu, default=ubrb_setup.LINK_DEFAULT_MTU,
                       metavar="BYTES",
                       help=f"largest UDP datagram on the link, {ubrb_setup.LINK_MTU_MIN}-"
                            f"{ubrb_setup.LINK_MTU_MAX} (default {ubrb_setup.LINK_DEFAULT_MTU})")
    group.add_argument("--link-key", default=None, metavar="FILE",
                       help="the link's shared secret (the same file on both ends; `make link-key` "
                            "writes one): the handshake proves it and every frame carries a MAC, "
                            "so nobody without it can join, inject or replay")
    group.add_argument("--insecure-link", action="store_true",
                       help="allow a UDP link on a non-loopback address without --link-key "
                            "(anyone who can reach the port can then talk to the other end)")


def read_link_key(path: str, logger: Optional[logging.Logger] = None) -> bytes:
    """The key in a --link-key file (hex, >= 32 digits, whitespace ignored; ubrb_setup.parse_link_key);
    a file that group or others may read gets a warning on `logger` (default the gateway's).
    ValueError (one line) otherwise."""
    import os
    import stat

    try:
        with open(path, "rb") as f:
            data = f.read(4096)
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ValueError(f"cannot read link key {path}: {e.strerror or e}") from None
    try:
        key: bytes = ubrb_setup.parse_link_key(data)
    except ValueError as e:
        raise ValueError(f"link key {path}: {e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        (logger or log).warning("link key %s can be read by group or others (mode %03o): "
                                "chmod 600 %s", path, stat.S_IMODE(mode), path)
    return key


def link_key(args: argparse.Namespace, logger: Optional[logging.Logger] = None) -> Optional[bytes]:
    """The key --link-key names (None without one), after the rule that an unkeyed UDP link stays
    on loopback unless --insecure-link says otherwise (which is logged on `logger`, default the
    gateway's: the companion passes its own). A key file that does not do, or a missing key, is a
    usage mistake: Fatal with exit status 2."""
    if args.link_key:
        try:
            return read_link_key(args.link_key, logger)
        except ValueError as e:
            raise Fatal(str(e), EXIT_USAGE) from None
    if ubrb_setup.link_needs_key(args.link):
        if not getattr(args, "insecure_link", False):
            raise Fatal(f"{args.link} is not a loopback address: give --link-key FILE "
                             "(make link-key writes one; the same file on both ends), or "
                             "--insecure-link to run it unauthenticated", EXIT_USAGE)
        (logger or log).warning("link %s has no key (--insecure-link): anyone who can reach it "
                                "can join the link, inject into ROS and reach UE clients", args.link)
    return None


def add_limit_arguments(group: argparse._ActionsContainer, default_profile: str) -> None:
    """--profile and one flag per limit of ubrb_min.LIMITS (None: the profile's value)."""
    group.add_argument(
        "--profile",
        default=default_profile,
        choices=sorted(ubrb_setup.PROFILES),
        help=f"static limits to start from (default {default_profile})",
    )
    for key, text in ubrb_setup.LIMITS:
        group.add_argument(
            "--" + key.replace("_", "-"), type=int, default=None, metavar="N", help=text
        )


def add_policy_arguments(group: argparse._ActionsContainer) -> None:
    """One flag per ubrb_min.POLICY_OPTIONS entry (allow-lists, throttle), the same help text on
    both ports; --throttle may be repeated."""
    for key, metavar, text in ubrb_setup.POLICY_OPTIONS:
        flag = "--" + key.replace("_", "-")
        if key == "throttle":
            group.add_argument(flag, action="append", default=None, metavar=metavar, help=text)
        else:
            group.add_argument(flag, default=None, metavar=metavar, help=text)


def load_policy(args: argparse.Namespace,
                prog: str) -> Tuple[bool, Optional[ubrb_policy.Policy]]:
    """(True, the Policy the flags ask for, or None when they ask for none); (False, None), after
    one line on stderr, when one does not parse."""
    try:
        return True, ubrb_setup.policy_from_options({k: getattr(args, k, None)
                                                     for k, _, _ in ubrb_setup.POLICY_OPTIONS})
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return False, None


def add_log_argument(group: argparse._ActionsContainer, default: Optional[str] = "info",
                     default_level: str = "info") -> None:
    group.add_argument("--log-level", default=default, choices=LOG_LEVELS,
                       help=f"logging threshold (default {default or default_level}; debug also "
                            "shows the traceback of an unexpected failure)")


def profiles_help() -> str:
    lines = ["profiles (every limit can be overridden by its own flag):"]
    for name, p in ubrb_setup.PROFILES.items():
        vals = ", ".join(f"{k}={p[k]}" for k in ubrb_setup.PROFILE_KEYS)
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
        overrides = {k: getattr(args, k) for k in ubrb_setup.PROFILE_KEYS}
        profile: Dict[str, int] = ubrb_setup.make_profile(args.profile, overrides)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    return profile


def machine_memory() -> Optional[int]:
    """This machine's physical RAM in bytes (sysconf, else /proc/meminfo's MemTotal); None
    where neither says."""
    try:
        n = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if n > 0:
            return n
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_budget(args: argparse.Namespace, profile: Dict[str, int],
                 link: Optional[Tuple[bool, int]], ram: Optional[int] = None) -> None:
    """Fatal (usage, exit 2) naming the flag that made it big when the worst-case memory budget
    (ubrb_setup.memory_budget, the figure logged at start-up; `link`: (datagram, mtu) of the
    link, None without one) is more than this machine's physical RAM (`ram`, default
    machine_memory()). The rule: the whole worst case must fit in RAM. Buffers of 1 MiB and more
    are mapped lazily (ubrb_host.loop.mapped_buffer), so a budget within RAM costs only what the
    traffic touches; one beyond it is a bound the machine cannot keep - with every client at its
    limits the gateway would swap or be killed - and, far enough beyond, start-up itself runs
    out of memory or mappings. Swap is not counted."""
    ram = machine_memory() if ram is None else ram
    z = None if link is None else ubrb_setup.link_sizes(profile["max_payload"], link[0], link[1])
    total = ubrb_setup.memory_budget(profile, z)["total"]
    if ram is None or total <= ram:
        return
    fix = ubrb_setup.budget_culprit(args.profile,
                                    {k: getattr(args, k, None) for k in ubrb_setup.PROFILE_KEYS},
                                    link)
    raise Fatal(f"{fix}: the worst-case memory budget, {ubrb_setup.human_bytes(total)}, is more "
                f"than this machine's RAM ({ubrb_setup.human_bytes(ram)}): lower it (--help "
                "lists the limits)", EXIT_USAGE)


def log_budget(name: str, profile: Dict[str, int], link: Optional[Dict[str, int]] = None) -> None:
    """The worst-case memory budget, link buffers included (`link`: ubrb_min.link_sizes)."""
    for line in ubrb_setup.format_budget(name, profile, link).splitlines():
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


# ---------------------------------------------------------------------------------------------
# The command-line contract every CPython program of the project keeps (gateway, companion,
# client, demo, benches): values are checked while parsing, a mistake is one line on stderr
# naming the fix, exit 2 for a usage mistake and 1 for a runtime failure, a traceback only with
# --log-level debug; --version, -v/-q and --log-level everywhere.
# ---------------------------------------------------------------------------------------------
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, what a shell reports for a process it killed)
EXIT_HELP = ("exit status: 0 done, 1 failed at run time (one line says why), 2 usage mistake "
             "(one line says which), 130 interrupted by Ctrl-C (a gateway or companion that "
             "already serves stops cleanly, with 0); --log-level debug adds the traceback of an "
             "unexpected failure")
DDS_DOMAIN_MAX = 232  # the largest DDS domain id the RTPS port mapping allows

# A missing optional dependency (the top-level module name) -> what installs it.
MISSING_FIXES = {
    "cyclonedds": "the dds backend needs it: pip install '.[dds]' (from the repository root; "
                  "with ROS 2 installed, source it for the rclpy backend instead)",
    "rosbags": "ROS message definitions need it: pip install '.[dds]' (companion) or "
               "pip install '.[client]' (client)",
    "serial": "serial links need pyserial: pip install '.[serial]'",
    "rclpy": "the rclpy backend needs ROS 2: source /opt/ros/<distro>/setup.bash first, or use "
             "--backend dds (pip install '.[dds]')",
    "yaml": "the client needs PyYAML: pip install '.[client]'",
    "numpy": "the client needs numpy: pip install '.[client]'",
}


class Fatal(Exception):
    """An expected failure: `message` is the one line a person reads, `code` the exit status."""

    def __init__(self, message: str, code: int = EXIT_RUNTIME) -> None:
        Exception.__init__(self, message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse with the one-line mistake: `prog: message (--help lists the options)`, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (--help lists the options)\n")


def port_number(text: str, allow_zero: bool = False) -> int:
    """A TCP/UDP port, 1-65535 (0 too when it means 'any free port')."""
    try:
        port = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"port must be a number, got {text!r}") from None
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be {low}-65535, got {port}")
    return port


def resolve_host(host: str) -> None:
    """Raise ArgumentTypeError("cannot resolve host ...") unless `host` has an address."""
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        raise argparse.ArgumentTypeError(
            f"cannot resolve host {host!r} (check the spelling, or give an IP address)"
        ) from None


def check_hostport(text: str, allow_zero: bool = False) -> tuple[str, int]:
    """HOST:PORT (or PORT: 127.0.0.1) -> (host, port): port in range, host resolvable."""
    host, port = parse_hostport(text, allow_zero)
    resolve_host(host)
    return host, port


# Said in --help of every address option (the grammar is ubrb_setup.parse_hostport's) and of
# every --link (ubrb_setup.parse_link_url's).
HOSTPORT_HELP = "a PORT alone (or :PORT) is 127.0.0.1:PORT, this machine only"
LINK_DEFAULT_PORT = ubrb_setup.parse_link_url("udp://" + ubrb_setup.LOCALHOST)[2]  # 8269
LINK_PORT_HELP = (f"udp://HOST alone is port {LINK_DEFAULT_PORT}, udp://PORT is "
                  "udp://127.0.0.1:PORT")


def listen_address(text: str) -> str:
    """--listen HOST:PORT (0 = any free port; PORT alone = 127.0.0.1:PORT), checked; kept as
    the HOST:PORT text it means, for parse_hostport and the log."""
    return format_hostport(*check_hostport(text, allow_zero=True))


def server_address(text: str) -> str:
    """A server to connect to, HOST:PORT (1-65535, resolvable; PORT alone = 127.0.0.1:PORT);
    kept as the HOST:PORT text it means, which the messages show."""
    return format_hostport(*check_hostport(text))


# uart:ID is the grammar's name for a board's UART (MicroPython); a CPython program has none, and
# the grammar would hand it over as a device named ID (a file "1" in the working directory).
UART_ON_CPYTHON = ("uart:ID names a board UART (MicroPython); on CPython give serial:/dev/ttyXXX "
                   "or a pyserial URL (e.g. serial:socket://HOST:PORT)")


def link_url(text: str) -> str:
    """--link URL through the core's one grammar (ubrb_min.parse_link_url); a UDP host must
    resolve; uart:ID (a board's UART) is refused. Kept as text: the transports parse it again."""
    if text.startswith("uart:"):
        raise argparse.ArgumentTypeError(f"{text!r}: {UART_ON_CPYTHON}")
    try:
        kind, where, _ = ubrb_setup.parse_link_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if kind == "udp":
        resolve_host(where)
    return text


def link_mtu(text: str) -> int:
    """--link-mtu BYTES: ubrb_setup.LINK_MTU_MIN-LINK_MTU_MAX (ubrb_setup.check_link_mtu)."""
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes, got {text!r}") from None
    try:
        return int(ubrb_setup.check_link_mtu(n))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def domain_id(text: str) -> int:
    """A DDS domain id, 0-232."""
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"DDS domain must be a number 0-{DDS_DOMAIN_MAX}, "
                                         f"got {text!r}") from None
    if not 0 <= n <= DDS_DOMAIN_MAX:
        raise argparse.ArgumentTypeError(f"DDS domain must be 0-{DDS_DOMAIN_MAX}, got {n}")
    return n


def env_domain(env: Optional[Dict[str, str]] = None) -> Optional[int]:
    """ROS_DOMAIN_ID, checked like --domain (None when unset or empty); Fatal(usage) if bad."""
    text = (os.environ if env is None else env).get("ROS_DOMAIN_ID", "").strip()
    if not text:
        return None
    try:
        return domain_id(text)
    except argparse.ArgumentTypeError as e:
        raise Fatal(f"ROS_DOMAIN_ID={text}: {e} (fix the variable or pass --domain)",
                    EXIT_USAGE) from None


# The ROS 2 distros whose message definitions the rosbags typestore carries (the dds backend and
# the client encode with them); listed here so the gateway host, which has no rosbags, and the
# argument check need no import.
ROS_DISTROS = ("foxy", "galactic", "humble", "iron", "jazzy", "kilted")


def ros_distro(text: str) -> str:
    name = str(text).strip().lower()
    if name.startswith("ros2_"):
        name = name[len("ros2_"):]
    if name not in ROS_DISTROS:
        raise argparse.ArgumentTypeError(
            f"no message definitions for ROS 2 distro {text!r} (have: {', '.join(ROS_DISTROS)})"
        )
    return name


def env_distro(default: str = "humble", env: Optional[Dict[str, str]] = None) -> str:
    """ROS_DISTRO if set (checked), else `default`; Fatal(usage) naming the variable if bad."""
    text = (os.environ if env is None else env).get("ROS_DISTRO", "").strip()
    if not text:
        return default
    try:
        return ros_distro(text)
    except argparse.ArgumentTypeError as e:
        raise Fatal(f"ROS_DISTRO={text}: {e}; pass --ros-distro with one of them",
                    EXIT_USAGE) from None


def duration(text: str) -> float:
    """Seconds, >= 0."""
    try:
        s = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not s >= 0 or s == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be 0 or more, got {text}")
    return s


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def add_program_arguments(parser: argparse.ArgumentParser, version: str,
                          default_level: str = "info") -> None:
    """--version, and the log threshold three ways: --log-level, -v (one step more: -vv two),
    -q (one step less). `log_level_of(args)` turns them into one level."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    if parser.add_help:  # a shared parent's text would repeat in every subcommand
        parser.epilog = (parser.epilog + "\n\n" if parser.epilog else "") + EXIT_HELP
    g = parser.add_argument_group("output")
    add_log_argument(g, default=None, default_level=default_level)
    i = LOG_LEVELS.index(default_level)
    more = ", ".join("-%s %s" % ("v" * (k + 1), lvl)
                     for k, lvl in enumerate(reversed(LOG_LEVELS[:i])))
    less = ", ".join("-%s %s" % ("q" * (k + 1), lvl)
                     for k, lvl in enumerate(LOG_LEVELS[i + 1:]))
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help=f"more log output ({more or 'already debug'})")
    g.add_argument("-q", "--quiet", action="count", default=0,
                   help=f"less log output ({less or 'already errors only'})")
    parser.set_defaults(default_log_level=default_level)


def log_level_of(args: argparse.Namespace) -> str:
    """--log-level if given, else the program's default moved by -v/-q."""
    if getattr(args, "log_level", None):
        return str(args.log_level)
    default = getattr(args, "default_log_level", "info")
    i = LOG_LEVELS.index(default) - getattr(args, "verbose", 0) + getattr(args, "quiet", 0)
    return LOG_LEVELS[max(0, min(len(LOG_LEVELS) - 1, i))]


def os_problem(e: BaseException) -> str:
    """An OSError in words, without its errno number; other errors as their text."""
    import errno

    if isinstance(e, OSError) and e.errno is not None:
        words = {errno.EADDRINUSE: "address already in use (another program has this port; "
                                   "pick another, or stop it)",
                 errno.EADDRNOTAVAIL: "this machine has no such address",
                 errno.EACCES: "permission denied (ports below 1024 need root)"}
        return words.get(e.errno, (e.strerror or str(e)).lower())
    return str(e)


def missing_dependency(e: ImportError) -> Optional[str]:
    """The one line for an optional dependency that is not installed (None: not one of ours)."""
    name = (e.name or "").split(".")[0]
    fix = MISSING_FIXES.get(name)
    if fix is None:
        return None
    return f"{name} is not installed: {fix}"


def run_program(prog: str, main: Callable[[Optional[List[str]]], int],
                argv: Optional[List[str]] = None) -> int:
    """Call main(argv) and turn every expected failure into one line and its exit code; with
    --log-level debug (or -vv) an unexpected one keeps its traceback. Ctrl-C (KeyboardInterrupt)
    before the program has put its own SIGINT handler in place - while it starts - is a quiet
    EXIT_INTERRUPTED, also while one of those lines is being printed, or when CPython wrapped it
    in another exception (interrupted)."""
    try:
        try:
            return main(argv)
        except Fatal as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return e.code
        except ImportError as e:
            if interrupted(e):
                return EXIT_INTERRUPTED
            line = missing_dependency(e)
            if line is None or _debugging():
                raise
            print(f"{prog}: {line}", file=sys.stderr)
            return EXIT_RUNTIME
        except Exception as e:
            if interrupted(e):  # a Ctrl-C CPython wrapped in another exception
                return EXIT_INTERRUPTED
            if _debugging():
                raise
            print(f"{prog}: {type(e).__name__}: {e} (--log-level debug shows where)",
                  file=sys.stderr)
            return EXIT_RUNTIME
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def interrupted(e: BaseException) -> bool:
    """True when `e` is a Ctrl-C in disguise: a KeyboardInterrupt among its causes. CPython 3.11
    wraps one raised while a class is made (__set_name__, e.g. while a library is imported) in a
    RuntimeError."""
    seen = 0
    cause: Optional[BaseException] = e
    while cause is not None and seen < 16:
        if isinstance(cause, KeyboardInterrupt):
            return True
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return False


def _debugging() -> bool:
    return logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def format_counters(groups: Dict[str, Dict[str, int]]) -> str:
    """Shutdown counters as a short aligned table: the non-zero ones of each group, by name;
    '(all zero)' when nothing happened."""
    rows = [(f"{g}.{k}" if g else k, v) for g, d in groups.items() for k, v in sorted(d.items())
            if isinstance(v, (int, float)) and v]
    if not rows:
        return "counters: all zero"
    width = max(len(k) for k, _ in rows)
    lines = ["counters (non-zero):"]
    lines += [f"  {k:<{width}}  {v:>10}" for k, v in rows]
    return "\n".join(lines)


def log_counters(groups: Dict[str, Dict[str, int]],
                 logger: Optional[logging.Logger] = None) -> None:
    for line in format_counters(groups).splitlines():
        (logger or log).info(line)


def stop_on_signals(stop: Callable[..., Any]) -> None:
    """SIGINT (Ctrl-C) and SIGTERM call `stop` from now on: the program serves, and stops cleanly.
    A Ctrl-C that came earlier but was lost in a callback (ubrb_host.catch_stray_interrupts) is
    raised now, as the KeyboardInterrupt it was: still start-up, exit 130."""
    import ubrb_host

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if ubrb_host.stray_interrupt:
        raise KeyboardInterrupt


def set_on_signal(event: threading.Event) -> Callable[..., None]:
    """A signal handler that sets `event`. Not `event.set` itself: a handler runs in the main
    thread between two bytecodes, which may be inside `event.wait()` holding the event's lock
    (a plain Lock), and `set()` would then wait for that lock forever: the program hangs on
    Ctrl-C (a likely cause of `ubrb_client sim` not stopping within 5 s of SIGTERM once in ten
    test runs). A short-lived thread takes the lock once the main thread lets go of it."""
    def handler(*_: Any) -> None:
        threading.Thread(target=event.set, name="signal", daemon=True).start()
    return handler


class CountersOnSignal:
    """SIGUSR1 (`kill -USR1 PID`): the counters table of a running program, now, in the form the
    program logs at exit. The handler only sets a flag; the program's loop calls check(), so
    nothing is logged from inside a signal handler."""

    def __init__(self, groups: Callable[[], Dict[str, Dict[str, int]]],
                 logger: Optional[logging.Logger] = None) -> None:
        self.groups = groups
        self.logger = logger
        self.wanted = False
        if hasattr(signal, "SIGUSR1"):
            signal.signal(signal.SIGUSR1, self._want)

    def _want(self, *_: Any) -> None:
        self.wanted = True

    def check(self) -> None:
        if self.wanted:
            self.wanted = False
            log_counters(self.groups(), self.logger)


def script_parser(prog: str, doc: str) -> Parser:
    """The parser of a bench or tool script: its docstring as --help (figures are printed only
    when it runs), --version and the log flags of every program."""
    p = Parser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_program_arguments(p, core.VERSION)
    return p
