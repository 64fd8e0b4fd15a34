# ubrb_setup.py - what a gateway runs once, at start-up, and never again while serving.
#
# The profiles and their limits (and the help text of each), the worst-case memory budget, the
# link URL grammar and the link session's sizing, the link key file, and the policy flags'
# parsers. Every port and the companion build their objects with these, then serve with the
# core (ubrb_min.py) alone: a board imports this module, builds, and drops it from sys.modules
# before it serves (ports/micropython/run.py), so the collector frees its code.
#
# MicroPython-portable like the core: no CPython-only syntax or library.
import sys

import ubrb_min as core
from ubrb_min import HDR, LINK_MAX_MESSAGE, LK_RHDR_MAX, const

_KIB = const(1024)
MIB = 1024 * 1024

# ---------------------------------------------------------------------------------------------
# Profiles: every static bound of the gateway. `--profile NAME` picks one, each key has a flag.
# ---------------------------------------------------------------------------------------------
PROFILES = {
    # A Raspberry Pi-class host running CPython: camera frames fit, a handful of UE worlds.
    "pi": {
        "max_clients": 8,
        "max_pubs": 64,  # publisher ids per client
        "max_subs": 64,  # subscription ids per client
        "max_topics": 128,  # shared topic slots, for publishers and again for subscriptions
        "max_payload": 4 * MIB,  # PUBLISH / MESSAGE payload cap
        "max_control": 64 * _KIB,  # payload cap of every other op
        "queue_bytes": 16 * MIB,  # per-client send queue
        "control_reserve": 64 * _KIB,  # part of the queue only control frames may use
        "max_throttled": 8,  # --throttle holding buffers (max_payload each): throttled topics
        "max_clients_per_address": 0,  # 0: half of max_clients (make_profile), before HELLO
        "slow_client_timeout": 5,
        "frame_timeout": 10,
    },
    # An ESP32 / Pico W: a couple of clients, frames of a few KiB.
    "mcu": {
        "max_clients": 2,
        "max_pubs": 8,
        "max_subs": 8,
        "max_topics": 16,
        "max_payload": 2 * _KIB,
        "max_control": 512,
        # two largest MESSAGE frames (one per data ring) and a few more small ones, beside the
        # control reserve: one largest control frame and a PONG / ERROR backlog
        "queue_bytes": 5 * _KIB,
        "control_reserve": 768,
        "max_throttled": 1,
        "max_clients_per_address": 0,
        "slow_client_timeout": 5,
        "frame_timeout": 10,
    },
    # A PC in direct mode (ros_side --listen): the spec's defaults.
    "pc": {
        "max_clients": 16,
        "max_pubs": 256,
        "max_subs": 256,
        "max_topics": 512,
        "max_payload": 64 * MIB,
        "max_control": 1 * MIB,
        "queue_bytes": 160 * MIB,  # two data rings of 79.5 MiB: each holds a largest MESSAGE
        "control_reserve": 1 * MIB,
        "max_throttled": 16,
        "max_clients_per_address": 0,
        "slow_client_timeout": 5,
        "frame_timeout": 10,
    },
}
# Every limit of a profile, with the sentence both ports' --help show for its flag: (key, text)
# pairs, made at import from one string ("key text" per line), so a board keeps one string
# constant instead of twelve (the pairs go with LIMITS once the gateway is built).
LIMITS = tuple([tuple(line.split(" ", 1)) for line in (
    "max_clients UBRB client connections served at once\n"
    "max_pubs publisher ids per client\n"
    "max_subs subscription ids per client\n"
    "max_topics topic slots (each for publishers and again for subscriptions)\n"
    "max_payload largest PUBLISH/MESSAGE payload in bytes\n"
    "max_control largest payload of any other op in bytes\n"
    "queue_bytes send queue per client in bytes\n"
    "control_reserve bytes of each send queue only control frames may use\n"
    "max_throttled subscription topics --throttle can hold a message for at once "
    "(one max-payload buffer each)\n"
    "max_clients_per_address connections one client address may hold before HELLO (0: half "
    "of max_clients; sessions past HELLO count against max_clients only)\n"
    "slow_client_timeout seconds a client's send queue may stay full without it reading a "
    "whole frame before the client is closed\n"
    "frame_timeout seconds a frame may take to arrive once its first byte is in (a "
    "dribbling client is closed)").split("\n")])
PROFILE_KEYS = tuple([k for k, _ in LIMITS])


def make_profile(name, overrides=None):
    """The limits of profile `name` with `overrides` (a dict; None values ignored) applied."""
    if name not in PROFILES:
        raise ValueError("unknown profile %r (have: %s)" % (name, ", ".join(sorted(PROFILES))))
    p = dict(PROFILES[name])
    if overrides:
        for k in overrides:
            if k not in p:
                raise ValueError("unknown limit %r" % k)
            if overrides[k] is not None:
                p[k] = int(overrides[k])
    for k in PROFILE_KEYS:
        if p[k] < (0 if k == "max_clients_per_address" else 1):
            raise ValueError("%s must be at least 1" % k)
    if p["max_clients_per_address"] == 0:  # of connections before HELLO: half, rounded up
        p["max_clients_per_address"] = max(1, (p["max_clients"] + 1) // 2)
    if p["max_control"] < 256:
        raise ValueError("max_control must be at least 256 bytes")
    if p["control_reserve"] < p["max_control"] + HDR:
        # A control frame must always fit in the reserved room, or PONG/ERROR could be lost.
        p["control_reserve"] = p["max_control"] + HDR
    # SendQueue: the control reserve, then a ring for reliable and one for best_effort MESSAGE
    # frames, each half of the rest and each able to hold one largest MESSAGE.
    need = 2 * (HDR + 4 + p["max_payload"]) + p["control_reserve"]
    if p["queue_bytes"] < need:
        raise ValueError(
            "queue_bytes (%d) must hold two largest MESSAGEs plus the control reserve (%d)"
            % (p["queue_bytes"], need)
        )
    return p


def memory_budget(p, link=None):
    """Worst-case bytes the gateway core holds for profile `p`, by part; `link` is the
    link_sizes() of the gateway's link session, or None when it runs without one."""
    rx = HDR + max(p["max_payload"] + 4, p["max_control"])
    per_client = rx + p["queue_bytes"] + 16 * (p["max_pubs"] + p["max_subs"]) + 8 * p["max_topics"]
    # Slot tables hold topic and type strings; ROS names are at most 255 characters.
    slots = 2 * p["max_topics"] * (2 * 256 + 64)
    link_bytes = link["total"] if link is not None else 0
    throttle = throttle_bytes(p)
    return {
        "per_client": per_client,
        "clients": per_client * p["max_clients"],
        "slots": slots,
        "link": link_bytes,
        "throttle": throttle,
        "total": per_client * p["max_clients"] + slots + link_bytes + throttle,
    }


def throttle_bytes(p):
    """The --throttle holding buffers (allocated when a throttle rule is given)."""
    return p.get("max_throttled", 0) * p["max_payload"]


def format_budget(name, p, link=None):
    b = memory_budget(p, link)
    lines = ["profile %s: worst-case memory budget %s" % (name, human_bytes(b["total"]))]
    lines.append(
        "  %d clients x %s (rx frame %s + send queue %s + id tables)"
        % (
            p["max_clients"],
            human_bytes(b["per_client"]),
            human_bytes(HDR + 4 + p["max_payload"]),
            human_bytes(p["queue_bytes"]),
        )
    )
    lines.append(
        "  %d publisher + %d subscription topic slots: %s"
        % (p["max_topics"], p["max_topics"], human_bytes(b["slots"]))
    )
    lines.append(
        "  limits: %d pub ids + %d sub ids per client, payload %s, control %s"
        % (p["max_pubs"], p["max_subs"], human_bytes(p["max_payload"]), human_bytes(p["max_control"]))
    )
    if b["throttle"]:
        lines.append("  throttle holding buffers: %d x %s" % (p["max_throttled"],
                                                          human_bytes(p["max_payload"])))
    if link is not None:
        lines.append(
            "  link session buffers: %s (messages up to %s, frames of %d bytes)"
            % (human_bytes(link["total"]), human_bytes(link["max_message"]), link["max_frame"])
        )
    return "\n".join(lines)


def budget_culprit(name, overrides, link=None):
    """The flag that makes the worst-case budget of profile `name` with `overrides` (the limit
    flags given, {key: value or None}) big, as the text a person reads: of the limits given, the
    one whose profile value lowers the budget most ('--max-clients 100000'); '--profile NAME' when
    none of them does. `link`: (datagram, mtu) of the gateway's link, or None without one."""
    def total(over):
        p = make_profile(name, over)
        z = None if link is None else link_sizes(p["max_payload"], link[0], link[1])
        return memory_budget(p, z)["total"]

    best = total(overrides)
    fix = "--profile " + name
    for k in overrides:
        if overrides[k] is None:
            continue
        o = dict(overrides)
        o[k] = None
        try:
            t = total(o)
        except ValueError:  # the other limits given do not fit the profile's value of this one
            continue
        if t < best:
            best = t
            fix = "--%s %s" % (k.replace("_", "-"), overrides[k])
    return fix


def human_bytes(n):
    if n >= 1024 * MIB:
        return "%.1f GiB" % (n / (1024 * MIB))
    if n >= MIB:
        return "%.1f MiB" % (n / MIB)
    if n >= _KIB:
        return "%.1f KiB" % (n / _KIB)
    return "%d B" % n


# ---------------------------------------------------------------------------------------------
# Policy flags (--allow-clients, --allow-topics, --deny-topics, --throttle), parsed. The checks
# that run while serving are ubrb_policy's, imported only when a policy is given.
# ---------------------------------------------------------------------------------------------
# Every policy option: key, metavar, the sentence both ports' --help show (one "key metavar
# text" line each, split at import, as LIMITS). Flags are --key-with-dashes; `throttle` may be
# given more than once (and each takes a comma list).
POLICY_OPTIONS = tuple([tuple(line.split(" ", 2)) for line in (
    "allow_clients CIDR[,CIDR...] "
    "only TCP peers in these IPv4/IPv6 networks may connect (e.g. 127.0.0.0/8,::1); others "
    "are closed at accept and counted (clients_refused_address); default: everyone\n"
    "allow_topics GLOB[,GLOB...] "
    "topics clients may ADVERTISE/SUBSCRIBE ('*' any characters, '/' included; '?' one); "
    "others get ERROR topic_denied; default: every topic\n"
    "deny_topics GLOB[,GLOB...] "
    "topics refused with ERROR topic_denied even when --allow-topics matches\n"
    "throttle GLOB=HZ "
    "at most HZ MESSAGE frames per second to clients on topics matching GLOB, newest wins "
    "within each period, the last one delivered at the period's end (repeatable)").split("\n")])


def split_list(text):
    """'a, b,,c' -> ['a', 'b', 'c']; a list (a repeated flag) is joined first."""
    if isinstance(text, (list, tuple)):
        text = ",".join(text)
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(part)
    return out


def parse_globs(text):
    globs = split_list(text)
    if not globs:
        raise ValueError("expected GLOB[,GLOB...], got %r" % (text,))
    return globs


def parse_cidrs(text):
    """'10.0.0.0/8, ::1' -> [(address bytes, prefix length)]; ValueError names the bad entry."""
    from ubrb_policy import parse_ip

    nets = []
    for part in split_list(text):
        k = part.find("/")
        addr = part if k < 0 else part[:k]
        bits = "" if k < 0 else part[k + 1:]
        ip = parse_ip(addr.strip())
        if ip is None:
            raise ValueError("%r is not an IPv4 or IPv6 address" % part)
        if bits:
            if not bits.strip().isdigit() or int(bits) > 8 * len(ip):
                raise ValueError("%r: prefix length must be 0..%d" % (part, 8 * len(ip)))
            n = int(bits)
        else:
            n = 8 * len(ip)
        nets.append((ip, n))
    if not nets:
        raise ValueError("expected CIDR[,CIDR...], got %r" % (text,))
    return nets


def parse_throttle(items):
    """['/imu/*=50', '/scan=10,/odom=20'] -> [(glob, period_ms)], first match wins."""
    rules = []
    for part in split_list(items):
        k = part.rfind("=")
        sep = k > 0
        glob = part[:k].strip() if sep else ""
        hz = part[k + 1:] if sep else ""
        try:
            f = float(hz)
        except ValueError:
            f = 0.0
        if not sep or not glob or not f > 0 or f > 1000:
            raise ValueError("--throttle expects GLOB=HZ with 0 < HZ <= 1000, got %r" % part)
        rules.append((glob, max(1, int(1000 / f + 0.5))))
    return rules


def policy_from_options(opts):
    """The ubrb_policy.Policy of the policy flags in `opts` ({key: text or None}, the keys of
    POLICY_OPTIONS), or None when none is given. ValueError with a line for a person."""
    def get(k):
        v = opts.get(k)
        return v if v else None
    v = get("allow_clients")
    clients = parse_cidrs(v) if v is not None else None
    v = get("allow_topics")
    allow = parse_globs(v) if v is not None else None
    v = get("deny_topics")
    deny = parse_globs(v) if v is not None else None
    v = get("throttle")
    thr = parse_throttle(v) if v is not None else None
    if not (clients or allow or deny or thr):
        return None
    from ubrb_policy import Policy

    return Policy(clients, allow, deny, thr)


def describe_policy(policy):
    """What `policy` does, a line per rule (the gateway logs them at start-up)."""
    lines = []
    if policy.allow_clients:
        lines.append("clients allowed from %d network(s)" % len(policy.allow_clients))
    if policy.allow_topics:
        lines.append("topics allowed: %s" % ", ".join(policy.allow_topics))
    if policy.deny_topics:
        lines.append("topics denied: %s" % ", ".join(policy.deny_topics))
    for g, ms in policy.throttle:
        lines.append("throttle %s: one MESSAGE per %d ms" % (g, ms))
    return lines


def apply_policy(gw, policy, new_buffer=bytearray):
    """Give Gateway `gw` a Policy (allow-lists, throttle rules) before it serves, and log what it
    does (the CPython gateway and direct mode; a board logs and installs in two halves)."""
    for line in describe_policy(policy):
        gw._log("info", "policy: " + line)
    policy.install(gw, new_buffer)


# ---------------------------------------------------------------------------------------------
# The link: its key file, its URL grammar, the sizes of its session (one for every port)
# ---------------------------------------------------------------------------------------------
def parse_link_key(data):
    """The link key in a key file's bytes (or text): hex digits, whitespace anywhere ignored, at
    least 32 (16 bytes). ValueError with a sentence for a person saying what the file holds
    instead: nothing, binary data (raw key bytes), other text (a passphrase), too few or an odd
    number of digits."""
    from binascii import unhexlify

    if isinstance(data, str):
        data = data.encode()
    h = b"".join(data.split())
    fix = "make link-key writes one"
    if not h:
        raise ValueError("the file is empty; a link key is at least 32 hex digits (%s)" % fix)
    for b in h:
        if b < 32 or b > 126:
            raise ValueError("the file holds binary data, not hex text (raw key bytes? write "
                             "them as hex, e.g. with xxd -p; %s)" % fix)
    for b in h:
        if not (48 <= b <= 57 or 97 <= b <= 102 or 65 <= b <= 70):  # 0-9 a-f A-F
            raise ValueError("not hex: the file holds text other than the digits 0-9 a-f (a "
                             "passphrase? a link key is at least 32 hex digits; %s)" % fix)
    if len(h) < 32:
        raise ValueError("too short: %d hex digits (%d bytes); a link key has at least 32 (16 "
                         "bytes; %s)" % (len(h), len(h) // 2, fix))
    if len(h) % 2:
        raise ValueError("an odd number of hex digits (%d): a link key is whole bytes, 2 digits "
                         "each (%s)" % (len(h), fix))
    return unhexlify(h)


def link_needs_key(url):
    """True when `url` is a link over the network to (or, at the companion, on) a non-loopback
    address: UDP, or a serial link through a pyserial network URL (socket://, rfc2217://). Such a
    link must be keyed, or started with --insecure-link (docs/LINK.md). A serial device needs none."""
    kind, host, _ = parse_link_url(url)
    if kind == "serial":
        if not (host.startswith("socket://") or host.startswith("rfc2217://")):
            return False                 # a device, a UART number, loop:// ...
        host = host[host.find("://") + 3:].split("/")[0].rsplit(":", 1)[0].strip("[]")
    elif kind != "udp":
        return False
    return not (host == "localhost" or host == "::1" or host.startswith("127."))


_LINK_DEFAULT_UDP_PORT = const(8269)
LINK_DEFAULT_MTU = const(1400)      # largest UDP datagram: fits an Ethernet/Wi-Fi MTU with IP+UDP headers
LINK_SERIAL_FRAME = const(1088)     # serial frame cap: a 1 KiB message and its headers fit one frame
                             # (95 ms at 115200 baud)
# --link-mtu's range: the smallest frame the core's LinkSession takes (its max_frame check; a
# keyed frame's 24 bytes of header, CRC and MAC leave 40 for records), and the largest UDP
# payload an IPv4 datagram carries (65535 - 20 - 8; a larger frame would fail to send)
LINK_MTU_MIN = const(64)
LINK_MTU_MAX = const(65507)
# Bytes of reliable frames a receiver lets be in flight towards it (window x max_frame): a UDP
# socket's default receive queue (Linux: 212992 B of kernel accounting, ~2x each datagram) holds
# only 12 datagrams of 8 KiB, so 16 frames at --link-mtu 8192 had the kernel drop the tail of
# every window, unseen, and go-back-N resend the same overflowing burst (30k -> 500 msg/s).
LINK_WINDOW_BYTES = const(64 * 1024)
LINK_HOLD_STREAM = const(64)  # frames a CPython serial end keeps past a gap (the frame table's)


def check_link_mtu(n):
    """`n` if it is a --link-mtu every port and the companion can run with; ValueError, with
    the range, otherwise."""
    if not isinstance(n, int) or not LINK_MTU_MIN <= n <= LINK_MTU_MAX:
        raise ValueError("must be %d-%d bytes (the largest UDP datagram on the link), got %s"
                         % (LINK_MTU_MIN, LINK_MTU_MAX, n))
    return n


_MICROPYTHON = sys.implementation.name == "micropython"


def parse_link_url(url, board=_MICROPYTHON):
    """The link grammar of every port and of the companion:

      udp://HOST[:PORT]   ('udp', HOST, PORT); PORT left out (no ':') is 8269, the link's
                          default; HOST may be [v6]; udp://PORT and udp://:PORT are 127.0.0.1
                          (a number alone is a port, never a host: see parse_hostport)
      serial:PATH         ('serial', PATH, 0); PATH is a device or pyserial URL on CPython and a
      uart:ID             UART number on MicroPython (uart:ID is the same as serial:ID; the
                          CPython programs refuse uart:, ubrb_host.cli.link_url)
      none (or empty)     ('none', '', 0): no link, no ROS side

    ValueError, with a sentence for a person, for anything else (an empty port after ':' too).
    Its serial examples are a board's (uart:ID) with `board`, else CPython's (a device or pyserial
    URL); the default is this runtime's, and a board's start-up checks pass True (tools/deploy.py
    runs them on CPython)."""
    if url is None or url == "" or url == "none":
        return "none", "", 0
    if url.startswith("udp://"):
        host, port, sep = _host_port(url[6:].rstrip("/"), url)
        if not host:
            raise ValueError("udp:// needs a host, e.g. udp://192.0.2.10:%d"
                             % _LINK_DEFAULT_UDP_PORT)
        if not port:
            if sep:
                raise ValueError("%r has an empty port: give udp://HOST:PORT, or leave out the "
                                 "':' for the default port %d" % (url, _LINK_DEFAULT_UDP_PORT))
            return "udp", host, _LINK_DEFAULT_UDP_PORT
        try:
            n = int(port)
        except ValueError:
            raise ValueError("bad port %r in %r: expected a number 1-65535" % (port, url))
        if not 1 <= n <= 65535:
            raise ValueError("port %d in %r is out of range: expected 1-65535" % (n, url))
        return "udp", host, n
    for prefix in ("serial:", "uart:"):
        if url.startswith(prefix):
            path = url[len(prefix):]
            if not path:
                raise ValueError("%s needs %s" % (prefix, "a UART number, e.g. uart:1" if board
                                                  else "a device or pyserial URL, e.g. "
                                                  "serial:/dev/ttyACM0"))
            return "serial", path, 0
    raise ValueError("unknown link %r: use udp://HOST:PORT or %s (or none)"
                     % (url, "uart:ID" if board else "serial:PATH"))


# An address without a host is this machine's, never the network's: 0.0.0.0 (every interface)
# only when it is written.
LOCALHOST = "127.0.0.1"


def _host_port(text, what):
    """(host, port text, whether a ':' was given) of HOST:PORT, [V6]:PORT, HOST, [V6], PORT or
    :PORT. A number alone is a port (8268 is not the host 0.0.32.76) and a left-out host is
    LOCALHOST."""
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and rest[0] != ":"):
            raise ValueError("expected [IPv6]:PORT, got %r" % what)
        return host or LOCALHOST, rest[1:], rest != ""
    host, sep, port = text.rpartition(":")
    if sep:
        return host or LOCALHOST, port, True
    if text.isdigit():
        return LOCALHOST, text, True
    return text, "", False


def parse_hostport(text, allow_zero=False):
    """HOST:PORT -> (host, port), the grammar of every address option of every program (a
    gateway's --listen, the client's --server): PORT alone or :PORT is 127.0.0.1:PORT, this
    machine only (0.0.0.0:PORT listens on every interface); HOST may be [v6]; port 1-65535, 0
    too with allow_zero (any free port). ValueError with a sentence for a person otherwise."""
    host, port, _ = _host_port(str(text).strip(), text)
    if not port:
        raise ValueError("expected HOST:PORT, got %r" % (text,))
    if not port.isdigit():
        raise ValueError("port must be a number, got %r" % (port,))
    n = int(port)
    low = 0 if allow_zero else 1
    if not low <= n <= 65535:
        raise ValueError("port must be %d-65535, got %d" % (low, n))
    return host, n


def link_sizes(max_message, datagram, mtu=LINK_DEFAULT_MTU, board=_MICROPYTHON):
    """The buffers of one link session, for either end and every port: a dict with max_message,
    max_frame, window, rel_bytes (reliable send ring), be_bytes (best-effort ring) and total
    (every buffer the session allocates). Rings follow the largest message, so a small profile
    (mcu) gets small rings, a big one room for a few messages in flight."""
    mm = min(max_message, LINK_MAX_MESSAGE)
    frame = mtu if datagram else LINK_SERIAL_FRAME
    # UDP on a LAN sustains a wider window; a serial line or a board's small rx queues do not.
    # Big frames take fewer: a window must fit the receive queue (LINK_WINDOW_BYTES).
    window = 16 if datagram and mm > 4 * _KIB else 8
    if window * frame > LINK_WINDOW_BYTES:
        window = LINK_WINDOW_BYTES // frame if frame < LINK_WINDOW_BYTES else 1
    # Reliable ring: up to four largest messages in flight (at most 256 KiB); for messages of
    # 2 KiB and less two, beside the 1/4 control reserve; on a board one (its heap is the
    # limit: a largest message still fits beside the reserve, LinkSession.max_send).
    # Best-effort ring: two largest records (at most 128 KiB); on a board one.
    if board and mm <= 2 * _KIB:
        rel = max(2 * _KIB, (4 * (mm + LK_RHDR_MAX) + 2) // 3)
        be = max(2 * _KIB, mm + 6 + LK_RHDR_MAX)
    else:
        if mm > 2 * _KIB:
            rel = max(2 * mm, min(4 * mm, 256 * _KIB))
        else:
            rel = max(4 * _KIB, (8 * (mm + LK_RHDR_MAX) + 2) // 3)
        be = max(4 * _KIB, mm + 6 + LK_RHDR_MAX, min(2 * mm + 64, 128 * _KIB))
    # Frames received past a gap are kept (selective repeat) for a whole window. Not in a
    # board's budget: a window of 1400-byte frames is more heap than a stock ESP32 has, so a
    # board keeps them only where its heap has room once the budget is allocated
    # (ports/micropython/build.py); else the sender goes back over what it did not keep (its NAK).
    # On a stream link (serial) the frames get smaller on a noisy line and more of them fly
    # (ubrb_stream.Stream.frames): keep a whole table of them.
    hold = 0 if board else (window if datagram else LINK_HOLD_STREAM)
    # The frame table (frames in flight at most): a board's ring holds only a few frames' worth
    # on UDP (4 of 1400 bytes at the mcu profile: 8 entries); on a noisy serial line its frames
    # get small and more of them fly (32); a PC's window is up to 64 frames (udp_window).
    frames = (8 if datagram else 32) if board else 64
    total = (frame + (0 if datagram else 2 * frame) + 2 * (mm + LK_RHDR_MAX) + rel + be
             + hold * frame + 8 * frames)
    return {"max_message": mm, "max_frame": frame, "window": window, "rel_bytes": rel,
            "be_bytes": be, "hold": hold, "frames": frames, "total": total}


def new_link_session(handler, epoch, gateway, datagram, max_message, mtu=LINK_DEFAULT_MTU,
                     max_slots=256, key=None, nonce=None, window=0):
    """A LinkSession sized by link_sizes(): how every port and the companion make one. `key`:
    the link key (bytes) or None; `nonce`: the port's random source for new epochs; `window`:
    the receive window, if not link_sizes' (the CPython UDP end announces a wider one)."""
    z = link_sizes(max_message, datagram, mtu)
    w = window or z["window"]
    return core.LinkSession(handler, epoch, gateway, datagram, z["max_frame"], z["max_message"],
                            w, z["rel_bytes"], z["be_bytes"], max_slots, key, nonce,
                            max(w, z["hold"]) if z["hold"] else 0, z["frames"])
