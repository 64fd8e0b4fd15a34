# The MicroPython port of the gateway (ESP32 / Pico W): TCP server for UBRB clients + the link.
#
# `micropython ubrb_min.py ...` lands here (the core's launcher); on a board, main.py calls
# `gateway.main([...flags...])` or `gateway.main({...options...})` (see README.md next to this
# file). Everything protocol-shaped lives in ubrb_min (sans-IO); this module moves bytes and keeps
# time. The counterpart of ports/cpython/gateway.py + ubrb_host.loop, with MicroPython APIs:
#
#   * one select.poll() for the listener, the clients and the link; events are read with ipoll()
#     (allocation-free, callee-owned tuples) and handled after the iteration, so the poll set is
#     never modified while it is being iterated;
#   * readinto() straight into each session's decoder buffer: at decoder.fill == 0 (the usual
#     case: every frame of the last read was whole) into decoder.buf itself, which allocates
#     nothing; otherwise into a slice of a memoryview made once per session (MicroPython's
#     readinto(buf, n) writes at the start of buf, and a memoryview slice is one 16-byte heap
#     object on 32-bit ports: one per read that continues a partial frame, measured in
#     tests/core/test_mp_port.py);
#   * write(buf, off, n) straight from each send queue (a stream method of every MicroPython
#     socket: no slice, no allocation);
#   * time.ticks_ms()/ticks_diff() turned into a non-wrapping millisecond clock for the core.
#
# The I/O modules (socket, select, time, machine, network, config) are looked up in an `IO`
# object, built from the real modules by default; tests pass fakes (tests/core/mp_fakes.py).
import sys
import gc

import ubrb_min as core
from ports.micropython import link as mlink

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
ACCEPT_GRACE_MS = 2000  # at start-up, how long clients may wait for the link before being served
POLL_MS = 50  # longest poll() wait: the core's and the link's timers need tick() this often
STATS_MS = 1000  # gateway counters to the companion (its /diagnostics); 0: never
MAX_READS = 4  # reads per client per wake-up, so one busy client cannot starve the others
MAX_WRITES = 4
WIFI_TIMEOUT_S = 20
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class IO:
    """The modules the port talks to the world through; None where the port has none."""

    def __init__(self, socket=None, select=None, time=None, machine=None, network=None,
                 config=None):
        self.socket = socket
        self.select = select
        self.time = time
        self.machine = machine
        self.network = network
        self.config = config  # a module/object with WIFI_SSID, WIFI_PASSWORD, GATEWAY (optional)


def default_io():
    try:
        import config  # type: ignore  # optional config.py on the board
    except ImportError:
        config = None
    return IO(_socket, _select, _time, _machine, _network, config)


# The clock is moved back by REBASE_STEP whenever it reaches REBASE_AT: times stay below 2**30.
REBASE_AT = 1 << 29
REBASE_STEP = 1 << 28


class Clock:
    """time.ticks_ms() wraps (at 2**30 ms on most ports, ~12.4 days); the core wants an int of
    milliseconds that never goes back. Starts at 0; GatewayLoop.rebase keeps it below 2**30 so
    it stays a small int (no heap). Must be read at least every 2**29 ms (ticks_diff's range)."""

    def __init__(self, time_mod):
        self.t = time_mod
        self.last = time_mod.ticks_ms()
        self.now = 0

    def ms(self):
        t = self.t.ticks_ms()
        d = self.t.ticks_diff(t, self.last)
        if d > 0:
            self.now += d
            self.last = t
        return self.now


class Log:
    """print()-based logger with a threshold; also the core's log callable(level, message)."""

    def __init__(self, level="info", out=None):
        self.threshold = LEVELS.get(level, 20)
        self.out = out

    def __call__(self, level, msg):
        if LEVELS.get(level, 20) >= self.threshold:
            if self.out is not None:
                self.out(level, msg)
            else:
                print("%s %s" % (level.upper(), msg))


def parse_hostport(text, default_host="0.0.0.0"):
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = default_host, text
    try:
        return host or default_host, int(port)
    except ValueError:
        raise ValueError("expected HOST:PORT, got %r" % text)


class GatewayLoop:
    """The poll loop: a listening socket, client sockets, and optionally a link driver."""

    def __init__(self, gw, listen, link=None, ros=None, io=None, clock=None, log=None,
                 accept_grace_ms=ACCEPT_GRACE_MS, stats_ms=STATS_MS, backlog=2):
        self.gw = gw
        self.link = link  # LinkDriver or None
        self.ros = ros  # LinkRosPort (send_stats) or None
        self.io = io if io is not None else default_io()
        self.log = log if log is not None else Log()
        sk = self.io.socket
        sel = self.io.select
        self.POLLIN = sel.POLLIN
        self.POLLOUT = sel.POLLOUT
        self.POLLBAD = sel.POLLHUP | sel.POLLERR
        self.clock = clock if clock is not None else Clock(self.io.time)
        self.poll = sel.poll()
        self._ipoll = getattr(self.poll, "ipoll", None) or self.poll.poll  # bound once
        addr = sk.getaddrinfo(listen[0], listen[1])[0][-1]
        ls = sk.socket(sk.AF_INET, sk.SOCK_STREAM)
        ls.setsockopt(sk.SOL_SOCKET, sk.SO_REUSEADDR, 1)
        ls.bind(addr)
        ls.listen(backlog)
        ls.setblocking(False)
        self.lsock = ls
        self.listen_addr = listen
        self.nodelay = getattr(sk, "TCP_NODELAY", None)
        self.ipproto_tcp = getattr(sk, "IPPROTO_TCP", 6)
        n = len(gw.clients)
        self.socks = [None] * n
        self.mask = [0] * n
        # One memoryview per session, made now: readinto(mv[fill:], n) when a frame is partial.
        self.mvs = [memoryview(c.decoder.buf) for c in gw.clients]
        # Events collected during ipoll(), handled after it: who (0 listener, 1 link, 2+ci) and what.
        self.ev_who = [0] * (n + 2)
        self.ev_bits = [0] * (n + 2)
        self.running = True
        now = self.clock.ms()
        self.accepting = False
        self.accept_at = now + (accept_grace_ms if link is not None else 0)
        self.stats_ms = stats_ms
        self.stats_at = now + stats_ms
        self.poll_ms = POLL_MS  # longest wait in poll(); tests on a fake clock set 0
        self.link_stream = None
        if link is not None and link.stream is not None:
            try:
                self.poll.register(link.stream, self.POLLIN)
                self.link_stream = link.stream
            except (OSError, TypeError, ValueError):
                link.polled = True  # no poll support on this object: read it every step
        elif link is not None:
            link.polled = True

    # -- the loop ---------------------------------------------------------------------------
    def stop(self):
        self.running = False

    def serve(self, until=None):
        """Run until stop(), until() returns True, or Ctrl-C (KeyboardInterrupt); then close."""
        try:
            while self.running and not (until is not None and until()):
                self.step()
        except KeyboardInterrupt:
            self.log("info", "interrupted")
        finally:
            self.close()

    def step(self):
        gw = self.gw
        link = self.link
        now = self.clock.ms()
        if now >= REBASE_AT:
            now = self.rebase(REBASE_STEP)
        if not self.accepting and (gw.ros_ready or now - self.accept_at >= 0):
            self.accepting = True
            self.poll.register(self.lsock, self.POLLIN)
        timeout = gw.next_deadline(now)
        if timeout > self.poll_ms:
            timeout = self.poll_ms
        if link is not None and (link.wants_write() or link.polled):
            timeout = 5 if timeout > 5 else timeout
        k = 0
        socks = self.socks
        n = len(socks)
        for ev in self._ipoll(timeout):
            obj = ev[0]
            if obj is self.lsock:
                who = 0
            elif obj is self.link_stream:
                who = 1
            else:
                who = -1
                for i in range(n):
                    if socks[i] is obj:
                        who = i + 2
                        break
                if who < 0:
                    continue
            if k < len(self.ev_who):
                self.ev_who[k] = who
                self.ev_bits[k] = ev[1]
                k += 1
        now = self.clock.ms()
        for j in range(k):
            who = self.ev_who[j]
            bits = self.ev_bits[j]
            if who == 0:
                self._accept(now)
            elif who == 1:
                link.on_readable(now)
            else:
                ci = who - 2
                if bits & (self.POLLIN | self.POLLBAD):
                    self._read(ci, now)
                if bits & self.POLLBAD and socks[ci] is not None:
                    self._drop(ci, "connection lost (poll: hang-up or error)")
                if bits & self.POLLOUT and socks[ci] is not None:
                    self._write(ci)
        if link is not None and link.polled:
            link.on_readable(now)
        now = self.clock.ms()
        gw.tick(now)
        if link is not None:
            link.tick(now)
            if self.stats_ms and now - self.stats_at >= 0:
                self.stats_at = now + self.stats_ms
                self._send_stats()
            link.flush(now)
        for ci in range(n):
            if socks[ci] is None:
                continue
            if gw.close_overdue(ci, now):
                self._drop(ci, "closing: last frames not read")
                continue
            if gw.clients[ci].queue.pending():
                self._write(ci)
            if socks[ci] is not None:
                self._sync(ci)

    def rebase(self, d):
        """Move the clock and every stored time `d` ms back, so times stay small ints (ints
        >= 2**30 are heap objects on 32-bit boards). Returns the new now."""
        self.clock.now -= d
        self.accept_at -= d
        self.stats_at -= d
        self.gw.rebase(d)
        if self.ros is not None:
            self.ros.rebase(d)  # the link session's times too
        if self.link is not None:
            self.link.rebase(d)
        return self.clock.now

    # -- clients ----------------------------------------------------------------------------
    def _accept(self, now):
        for _ in range(4):
            try:
                r = self.lsock.accept()
            except OSError:  # EAGAIN: nobody waiting
                return
            s = r[0]
            s.setblocking(False)
            if self.nodelay is not None:
                try:
                    s.setsockopt(self.ipproto_tcp, self.nodelay, 1)
                except OSError:
                    pass
            ci = self.gw.accept(now, r[1])  # the core logs who came and who was refused
            if ci >= 0:
                self.socks[ci] = s
                self.mask[ci] = self.POLLIN
                self.poll.register(s, self.POLLIN)
            else:
                self._refuse(s)

    def _refuse(self, s):
        try:  # best effort: the ERROR too_many_clients, then the close
            s.write(self.gw.reject_frame())
        except OSError:
            pass
        s.close()

    def _read(self, ci, now):
        s = self.socks[ci]
        gw = self.gw
        dec = gw.clients[ci].decoder
        for _ in range(MAX_READS):
            space = dec.space()
            if space == 0:
                return
            try:
                if dec.fill == 0:
                    n = s.readinto(dec.buf, space)  # no allocation
                else:
                    n = s.readinto(self.mvs[ci][dec.fill:], space)  # one memoryview slice
            except OSError as e:
                self._drop(ci, "read error: %s" % e)
                return
            if n is None:  # EAGAIN
                return
            if n == 0:
                gw.received(ci, 0, now)
                self._drop(ci, "closed by client")
                return
            gw.received(ci, n, now)
            if gw.wants_close(ci) or n < space:
                return

    def _write(self, ci):
        s = self.socks[ci]
        q = self.gw.clients[ci].queue
        for _ in range(MAX_WRITES):
            n = q.pending()
            if n == 0:
                break
            try:
                k = s.write(q.buf, q.head, n)
            except OSError as e:
                self._drop(ci, "write error: %s" % e)
                return
            if not k:  # None: EAGAIN
                break
            q.sent(k)
            if k < n:
                break
        if self.gw.flushed_close(ci):
            self._drop(ci, self.gw.clients[ci].close_reason)

    def _sync(self, ci):
        want = self.gw.interest(ci)
        m = (self.POLLIN if want & core.WANT_READ else 0) | (
            self.POLLOUT if want & core.WANT_WRITE else 0)
        if m != self.mask[ci]:
            self.mask[ci] = m
            self.poll.modify(self.socks[ci], m)

    def _drop(self, ci, reason):
        s = self.socks[ci]
        if s is None:
            return
        self.socks[ci] = None
        self.mask[ci] = 0
        try:
            self.poll.unregister(s)
        except (OSError, KeyError, ValueError):
            pass
        try:
            s.close()
        except OSError:
            pass
        self.gw.closed(ci, reason)

    def _send_stats(self):
        ros = self.ros
        if ros is None or not ros.s.is_up():
            return
        stats = self.gw.counters()
        lc = self.link.counters()
        for k in lc:
            stats["link_" + k] = lc[k]
        ros.send_stats(stats)

    def close(self):
        for ci in range(len(self.socks)):
            self._drop(ci, "gateway shutting down")
        if self.accepting:
            try:
                self.poll.unregister(self.lsock)
            except (OSError, KeyError, ValueError):
                pass
            self.accepting = False
        try:
            self.lsock.close()
        except OSError:
            pass
        if self.link is not None:
            if self.link_stream is not None:
                try:
                    self.poll.unregister(self.link_stream)
                except (OSError, KeyError, ValueError):
                    pass
                self.link_stream = None
            self.link.close()
        self.running = False


# ---------------------------------------------------------------------------------------------
# Options: the CPython port's flag names, without argparse (MicroPython has none)
# ---------------------------------------------------------------------------------------------
# name -> (kind, default, help); kind "s" string, "i" int. Flags are --name-with-dashes; dict
# keys (main({...}) and config.GATEWAY) are the names with underscores.
OPTIONS = (
    ("listen", "s", DEFAULT_LISTEN, "TCP address for UBRB clients"),
    ("link", "s", "none", "udp://HOST:PORT (the companion), uart:ID, or none"),
    ("baud", "i", 115200, "UART baud rate; writes are paced to baud/10 bytes/s"),
    ("tx", "i", None, "UART TX pin (default: the board's pin for that UART)"),
    ("rx", "i", None, "UART RX pin"),
    ("link_mtu", "i", core.LINK_DEFAULT_MTU, "largest UDP datagram on the link"),
    ("profile", "s", "mcu", "static limits to start from: " + ", ".join(sorted(core.PROFILES))),
) + tuple([(key, "i", None, text) for key, text in core.LIMITS]) + (
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
    for name in sorted(core.PROFILES):
        p = core.PROFILES[name]
        lines.append("  %s: %s" % (name, ", ".join("%s=%d" % (k, p[k]) for k in core.PROFILE_KEYS)))
    return "\n".join(lines)


def _convert(name, kind, value):
    if value is None or kind == "s":
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("--%s expects an integer, got %r" % (name.replace("_", "-"), value))


def defaults():
    d = {}
    for o in OPTIONS:
        d[o[0]] = o[2]
    return d


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
        if not eq:
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
    for k in core.PROFILE_KEYS:
        over[k] = opts[k]
    return core.make_profile(opts["profile"], over)


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


def start(opts, io=None, log=None):
    """Build (GatewayLoop, Gateway, LinkRosPort or None, LinkDriver or None) from options."""
    io = io if io is not None else default_io()
    log = log if log is not None else Log(opts["log_level"])
    profile = profile_from(opts)
    kind = core.parse_link_url(opts["link"])[0]  # ValueError here, before Wi-Fi, if malformed
    sizes = None
    if kind != "none":
        sizes = core.link_sizes(profile["max_payload"], kind == "udp", opts["link_mtu"])
    gc.collect()
    for line in core.format_budget(opts["profile"], profile, sizes).splitlines():
        log("info", line)
    ssid = opts["wifi_ssid"]
    pw = opts["wifi_password"]
    if ssid is None and io.config is not None:
        ssid = getattr(io.config, "WIFI_SSID", None)
        pw = getattr(io.config, "WIFI_PASSWORD", pw)
    if ssid:
        wifi_up(io, ssid, pw, opts["wifi_timeout"], log)
    ros, drv = mlink.open_gateway_link(
        io, opts["link"], baud=opts["baud"], mtu=opts["link_mtu"],
        max_message=profile["max_payload"], tx=opts["tx"], rx=opts["rx"],
        max_slots=profile["max_topics"],
    )
    if drv is None:
        log("warning", "no --link: running without a ROS side (PUBLISH frames are dropped)")
    gw = core.Gateway(profile, ros=ros, log=log)
    loop = GatewayLoop(gw, parse_hostport(opts["listen"]), link=drv, ros=ros, io=io, log=log,
                       stats_ms=opts["stats_ms"])
    gc.collect()
    try:
        log("info", "  heap after start-up: %d bytes used, %d free" % (gc.mem_alloc(), gc.mem_free()))
    except AttributeError:
        pass
    log("info", "UBRB gateway %s listening on %s:%d, link %s"
        % (core.VERSION, loop.listen_addr[0], loop.listen_addr[1], opts["link"]))
    return loop, gw, ros, drv


def main(argv=None, io=None):
    """Run the gateway. argv: a list of flags (as sys.argv[1:]) or a dict of options."""
    io = io if io is not None else default_io()
    try:
        opts = options(argv, io)
    except ValueError as e:
        print("ubrb_min.py: %s" % e, file=sys.stderr)
        return 2
    if opts is None:
        print(usage())
        return 0
    log = Log(opts["log_level"])
    try:
        loop, gw, ros, drv = start(opts, io, log)
    except ValueError as e:
        print("ubrb_min.py: %s" % e, file=sys.stderr)
        return 2
    except OSError as e:
        print("ubrb_min.py: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while waiting for Wi-Fi
        return 130
    loop.serve()  # Ctrl-C (KeyboardInterrupt) ends it; the sockets and the link are closed
    log("info", "stopped; counters: %s" % gw.counters())
    if drv is not None:
        log("info", "link counters: %s" % drv.counters())
    return 0
