# The MicroPython port of the gateway (ESP32 / Pico W): the program - options, Wi-Fi, start-up.
#
# `micropython ubrb_min.py ...` lands in main() here (the core's launcher block); on a board,
# main.py calls `gateway.main([...flags...])` or `gateway.main({...options...})` (see README.md
# next to this file). The counterpart of ports/cpython/gateway.py; the loop is loop.py, the link
# link.py, as ubrb_host.loop and ubrb_host.link are on CPython.
import ubrb_setup as setup
from ports.micropython.loop import IO, Log, STATS_MS

try:
    import socket as _socket
except ImportError:  # the WebAssembly build used by the tests has none
    _socket = None  # type: ignore[assignment]
try:
    import select as _select
except ImportError:
    _select = None  # type: ignore[assignment]
try:
    import time as _time
except ImportError:
    _time = None  # type: ignore[assignment]
try:
    import machine as _machine
except ImportError:
    _machine = None
try:
    import network as _network
except ImportError:
    _network = None

DEFAULT_LISTEN = "0.0.0.0:8268"
WIFI_TIMEOUT_S = 20


# ---------------------------------------------------------------------------------------------
# Options: the CPython port's flag names, without argparse (MicroPython has none)
# ---------------------------------------------------------------------------------------------
# name -> (kind, default, help); kind "s" string, "i" int. Flags are --name-with-dashes; dict
# keys (main({...}) and config.GATEWAY) are the names with underscores.
OPTIONS = (
    ("listen", "s", DEFAULT_LISTEN, "TCP address for UBRB clients (a PORT alone: 127.0.0.1)"),
    ("link", "s", "none", "udp://HOST[:PORT] (the companion; PORT 8269 if left out), uart:ID, "
     "or none"),
    ("baud", "i", 115200, "UART baud rate; writes are paced to baud/10 bytes/s"),
    ("tx", "i", None, "UART TX pin (default: the board's pin for that UART)"),
    ("rx", "i", None, "UART RX pin"),
    ("link_mtu", "i", setup.LINK_DEFAULT_MTU, "largest UDP datagram on the link, %d-%d"
     % (setup.LINK_MTU_MIN, setup.LINK_MTU_MAX)),
    ("link_key", "s", None, "file with the link key (hex; the companion's --link-key file)"),
    ("insecure_link", "b", 0, "allow an unkeyed UDP link to a non-loopback address"),
    ("profile", "s", "mcu", "static limits to start from: " + ", ".join(sorted(setup.PROFILES))),
) + tuple([(key, "i", None, text) for key, text in setup.LIMITS]) + tuple(
    [(key, "s", None, text) for key, _, text in setup.POLICY_OPTIONS]) + (
    ("log_level", "s", "info", "debug, info, warning or error"),
    ("wifi_ssid", "s", None, "join this Wi-Fi network first (default: config.WIFI_SSID)"),
    ("wifi_password", "s", None, "its password (default: config.WIFI_PASSWORD)"),
    ("wifi_timeout", "i", WIFI_TIMEOUT_S, "seconds to wait for Wi-Fi"),
    ("stats_ms", "i", STATS_MS, "gateway counters to the companion every N ms (0: never)"),
)


def usage():
    lines = ["usage: ubrb_min.py [--flag VALUE ...]   (MicroPython port; main({...}) takes a dict)"]
    for o in OPTIONS:
        flag = "--" + o[0].replace("_", "-")
        lines.append("  %-18s %s%s" % (flag, o[3], "" if o[2] is None else " (default %s)" % o[2]))
    lines.append("profiles (every limit can be overridden by its own flag):")
    for name in sorted(setup.PROFILES):
        p = setup.PROFILES[name]
        lines.append("  %s: %s" % (name, ", ".join("%s=%d" % (k, p[k]) for k in setup.PROFILE_KEYS)))
    return "\n".join(lines)


def _convert(name, kind, value):
    if value is None or kind == "s":
        return value
    if kind == "b":  # a switch: --flag alone, or a value (1/0, true/false) in a dict or --flag=V
        return 0 if value in (0, False, "0", "false", "no") else 1
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("--%s expects an integer, got %r" % (name.replace("_", "-"), value))


def defaults():
    d = {}
    for o in OPTIONS:
        d[o[0]] = o[2]
    return d


def _kind(key):
    for o in OPTIONS:
        if o[0] == key:
            return o[1]
    return None


def _set(opts, key, value):
    for o in OPTIONS:
        if o[0] == key:
            opts[key] = _convert(key, o[1], value)
            return True
    return False


def apply_dict(opts, d):
    """Merge a dict of options (underscore names) into opts; ValueError on an unknown key."""
    for key in d:
        if not _set(opts, key.replace("-", "_"), d[key]):
            raise ValueError("unknown option %r" % key)
    return opts


def parse_args(argv, opts=None):
    """Flags -> options dict (None for --help). Accepts --flag VALUE and --flag=VALUE."""
    if opts is None:
        opts = defaults()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            return None
        if not a.startswith("--"):
            raise ValueError("unexpected argument %r" % a)
        name, eq, value = a[2:].partition("=")
        if name.replace("-", "_") not in opts:
            raise ValueError("unknown flag %s (--help lists them)" % ("--" + name))
        if not eq and _kind(name.replace("-", "_")) == "b":
            value = 1
        elif not eq:
            if i + 1 >= len(argv):
                raise ValueError("%s needs a value" % a)
            i += 1
            value = argv[i]
        if not _set(opts, name.replace("-", "_"), value):
            raise ValueError("unknown flag %s (--help lists them)" % ("--" + name))
        i += 1
    return opts


def options(arg, io):
    """defaults <- config.GATEWAY (dict, optional) <- argv list or dict. None for --help."""
    opts = defaults()
    cfg = io.config
    if cfg is not None and isinstance(getattr(cfg, "GATEWAY", None), dict):
        apply_dict(opts, cfg.GATEWAY)
    if isinstance(arg, dict):
        return apply_dict(opts, arg)
    return parse_args(list(arg or ()), opts)


def profile_from(opts):
    over = {}
    for k in setup.PROFILE_KEYS:
        over[k] = opts[k]
    return setup.make_profile(opts["profile"], over)


def wifi_up(io, ssid, password, timeout_s, log):
    """Join `ssid` as a station (STA_IF) unless already connected; returns the WLAN object."""
    net = io.network
    if net is None:
        raise OSError("no network module on this port: cannot join Wi-Fi")
    w = net.WLAN(net.STA_IF)
    w.active(True)
    try:  # power saving sleeps the radio between beacons: +100 ms latency on every packet
        w.config(pm=getattr(w, "PM_NONE", 0))
    except (AttributeError, ValueError, TypeError, OSError):
        pass
    if not w.isconnected():
        log("info", "Wi-Fi: joining %r" % ssid)
        w.connect(ssid, password or "")
        t = io.time
        t0 = t.ticks_ms()
        while not w.isconnected():
            if t.ticks_diff(t.ticks_ms(), t0) > timeout_s * 1000:
                raise OSError("Wi-Fi: not connected to %r within %d s" % (ssid, timeout_s))
            t.sleep_ms(100)
    log("info", "Wi-Fi: connected, address %s" % (w.ifconfig()[0],))
    return w


def link_key(opts, log):
    """The key of --link-key (None without one; an unkeyed link off loopback has passed
    check_options only with --insecure-link, which is logged). ValueError (one line) for a key
    file that cannot be read or is no key."""
    path = opts["link_key"]
    if not path:
        if setup.link_needs_key(opts["link"]):
            log("warning", "link %s has no key (--insecure-link): anyone who can reach it can "
                "join the link, inject into ROS and reach UE clients" % opts["link"])
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except OSError as e:
        raise ValueError("cannot read link key %s: %s" % (path, e))
    try:
        key = setup.parse_link_key(data)
    except ValueError as e:
        raise ValueError("link key %s: %s" % (path, e))
    try:
        import os

        if os.stat(path)[0] & 0o077:  # the unix port; boards report no permission bits
            log("warning", "link key %s can be read by group or others: chmod 600 %s"
                % (path, path))
    except (ImportError, AttributeError, OSError):
        pass
    return key


def default_io():
    try:
        import config  # type: ignore  # optional config.py on the board
    except ImportError:
        config = None
    return IO(_socket, _select, _time, _machine, _network, config)


def uart_id(path):
    """The UART number of serial:ID / uart:ID (ubrb_setup.parse_link_url gives ID as text)."""
    try:
        return int(path)
    except ValueError:
        raise ValueError("serial: on MicroPython needs a UART number, e.g. uart:1 (got %r)" % path)


def check_options(opts):
    """Every check of the options that needs no board (tools/deploy.py runs it on the options it
    writes into config.py): the profile and its limits, the listen address, the link URL (a UART
    by number), --link-mtu, the policy flags, and the rule that an unkeyed UDP link stays on
    loopback unless --insecure-link. ValueError (one line) for the first that does not do.
    Leaves in `opts` what start-up goes on with: listen_addr, link_kind/link_where/link_port,
    policy, sizes (the link session's, or None), budget (worst-case bytes, and as budget_text)
    and budget_fix (the flag that makes it big, for a budget the heap cannot hold). Returns the
    profile."""
    profile = profile_from(opts)
    opts["listen_addr"] = setup.parse_hostport(opts["listen"], True)  # PORT alone: 127.0.0.1
    kind, where, port = setup.parse_link_url(opts["link"], True)  # a board's: uart:ID
    if kind == "serial":
        port = uart_id(where)
    opts["link_kind"] = kind
    opts["link_where"] = where
    opts["link_port"] = port
    try:
        setup.check_link_mtu(opts["link_mtu"])
    except ValueError as e:
        raise ValueError("--link-mtu %s" % e)
    opts["policy"] = setup.policy_from_options(opts)  # allow-lists, throttle (or None)
    if (kind != "none" and not opts["link_key"] and not opts["insecure_link"]
            and setup.link_needs_key(opts["link"])):
        raise ValueError("%s is not a loopback address: give --link-key FILE (the companion's "
                         "key file, copied to the board) or --insecure-link" % opts["link"])
    sizes = None
    link = None
    if kind != "none":
        link = (kind == "udp", opts["link_mtu"])
        sizes = setup.link_sizes(profile["max_payload"], link[0], link[1])
    opts["sizes"] = sizes
    opts["budget"] = setup.memory_budget(profile, sizes)["total"]
    opts["budget_text"] = setup.human_bytes(opts["budget"])
    over = {}
    for k in setup.PROFILE_KEYS:
        over[k] = opts[k]
    opts["budget_fix"] = setup.budget_culprit(opts["profile"], over, link)
    return profile


def prepare(opts, io, log):
    """The first half of start-up: everything decided before a buffer is allocated -
    check_options (ValueError here, before Wi-Fi, for a mistake; a budget beyond the whole heap
    too), the link key read, the budget printed, Wi-Fi up. Leaves in `opts` what build.py needs
    (check_options' and key). Returns (profile, link sizes or None, budget bytes)."""
    profile = check_options(opts)
    try:  # a budget no heap of this board holds, said before Wi-Fi (build.py checks what is free)
        import gc

        heap = gc.mem_free() + gc.mem_alloc()
    except (ImportError, AttributeError):  # CPython (the tests' fakes): no heap figures
        heap = None
    if heap is not None and opts["budget"] > heap:
        raise ValueError("%s: the worst-case memory budget, %s, is more than this board's whole "
                         "heap (%d bytes): lower it (--help lists the limits)"
                         % (opts["budget_fix"], opts["budget_text"], heap))
    if opts["policy"] is not None:
        for line in setup.describe_policy(opts["policy"]):
            log("info", "policy: " + line)
    opts["key"] = link_key(opts, log) if opts["link_kind"] != "none" else None
    sizes = opts["sizes"]
    budget = opts["budget"]
    for line in setup.format_budget(opts["profile"], profile, sizes).splitlines():
        log("info", line)
    ssid = opts["wifi_ssid"]
    pw = opts["wifi_password"]
    if ssid is None and io.config is not None:
        ssid = getattr(io.config, "WIFI_SSID", None)
        pw = getattr(io.config, "WIFI_PASSWORD", pw)
    if ssid:
        wifi_up(io, ssid, pw, opts["wifi_timeout"], log)
    return profile, sizes, budget


def start(opts, io=None, log=None):
    """Build (GatewayLoop, Gateway, LinkRosPort or None, LinkDriver or None) from options, in one
    go (tests; the board's run.main unloads this module and ubrb_setup in between)."""
    from ports.micropython import build

    io = io if io is not None else default_io()
    log = log if log is not None else Log(opts["log_level"])
    profile = prepare(opts, io, log)[0]
    loop = build.build(opts, profile, io, log)
    return loop, loop.gw, loop.ros, loop.link


def boot(argv=None, io=None):
    """Options and the first half of start-up: (opts, profile, budget, io, log), or the exit
    status when it cannot start (each reason one line on stderr: 2 bad options, 1 network;
    0 after --help)."""
    from ports.micropython.run import fail

    io = io if io is not None else default_io()
    try:
        opts = options(argv, io)
    except ValueError as e:
        return fail(2, e)
    if opts is None:
        print(usage())
        return 0
    log = Log(opts["log_level"])
    try:
        profile, sizes, budget = prepare(opts, io, log)
    except ValueError as e:
        return fail(2, e)
    except OSError as e:
        return fail(1, e)
    except KeyboardInterrupt:  # Ctrl-C while waiting for Wi-Fi
        return 130
    return opts, profile, budget, io, log


def main(argv=None, io=None):
    """Run the gateway (ports/micropython/run.py: start, unload this module, serve). argv: a list
    of flags (as sys.argv[1:]) or a dict of options."""
    from ports.micropython import run

    return run.main(argv, io)
