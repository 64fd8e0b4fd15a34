# ubrb_policy.py - the gateway's policy while it serves: who may connect (--allow-clients),
# which topics clients may register (--allow-topics, --deny-topics), and how often a topic
# reaches them (--throttle). Imported only when a policy is given (ubrb_setup parses the flags);
# a gateway without one never loads it.
#
# The checks run per connection or per registration, never per message; the per-message part is
# Throttle, allocation-free. No fnmatch or ipaddress: MicroPython has neither.
from ubrb_min import copy_into


def glob_match(pat, s):
    """fnmatch-style match of the whole string: '*' is any run of characters ('/' included),
    '?' any one character, everything else literal. Iterative with one backtrack point, so
    O(len(pat) * len(s)) at worst and no recursion."""
    p = i = 0
    star = -1
    mark = 0
    np = len(pat)
    ns = len(s)
    while i < ns:
        if p < np and (pat[p] == "?" or pat[p] == s[i]):
            p += 1
            i += 1
        elif p < np and pat[p] == "*":
            star = p
            mark = i
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            i = mark
        else:
            return False
    while p < np and pat[p] == "*":
        p += 1
    return p == np


def _parse_ip4(text):
    parts = text.split(".")
    if len(parts) != 4:
        return None
    out = bytearray(4)
    for k in range(4):
        d = parts[k]
        if not d or len(d) > 3 or not d.isdigit() or int(d) > 255:
            return None
        out[k] = int(d)
    return bytes(out)


def parse_ip(text):
    """An IPv4 or IPv6 address as 4 or 16 bytes, or None. A zone ('%eth0') is ignored."""
    if ":" not in text:
        return _parse_ip4(text)
    k = text.find("%")
    if k >= 0:
        text = text[:k]
    tail = b""
    last = text.rfind(":")
    if "." in text[last + 1:]:  # ::ffff:1.2.3.4
        tail = _parse_ip4(text[last + 1:])
        if tail is None:
            return None
        text = text[:last + 1] + "0:0"
    halves = text.split("::")
    if len(halves) > 2:
        return None
    groups = []
    for h in halves:
        g = []
        if h:
            for x in h.split(":"):
                if not x or len(x) > 4:
                    return None
                try:
                    g.append(int(x, 16))
                except ValueError:
                    return None
        groups.append(g)
    if len(halves) == 2:
        fill = 8 - len(groups[0]) - len(groups[1])
        if fill < 1:
            return None
        words = groups[0] + [0] * fill + groups[1]
    else:
        words = groups[0]
    if len(words) != 8:
        return None
    out = bytearray(16)
    for k in range(8):
        out[2 * k] = words[k] >> 8
        out[2 * k + 1] = words[k] & 0xFF
    if tail:
        for k in range(4):
            out[12 + k] = tail[k]
    return bytes(out)


_V4_MAPPED = b"\x00" * 10 + b"\xff\xff"


def peer_address(peer):
    """The peer's address as 4 or 16 bytes, from what accept() returned: a (host, port, ...)
    tuple (CPython, most MicroPython ports) or a raw sockaddr (the MicroPython unix port:
    family u16 in host order, then AF_INET port+4 bytes or AF_INET6 port+flow+16 bytes)."""
    if isinstance(peer, tuple):
        return parse_ip(peer[0]) if peer and isinstance(peer[0], str) else None
    if isinstance(peer, (bytes, bytearray)) and len(peer) >= 8:
        fam = peer[0] | (peer[1] << 8)
        if fam == 2 or peer[1] == 2:  # AF_INET (either byte order)
            return bytes(peer[4:8])
        if len(peer) >= 24:  # AF_INET6 (10 on Linux, other values elsewhere)
            return bytes(peer[8:24])
    return None


def cidr_match(nets, addr):
    """Is `addr` (4 or 16 bytes) in one of `nets`? An IPv4-mapped IPv6 peer matches IPv4 nets."""
    if addr is None:
        return False
    if len(addr) == 16 and addr[:12] == _V4_MAPPED:
        v4 = addr[12:]
    else:
        v4 = None
    for net, n in nets:
        a = addr
        if len(net) != len(a):
            if v4 is None or len(net) != 4:
                continue
            a = v4
        full = n >> 3
        if a[:full] != net[:full]:
            continue
        rest = n & 7
        if rest:
            mask = (0xFF << (8 - rest)) & 0xFF
            if (a[full] ^ net[full]) & mask:
                continue
        return True
    return False


class Policy:
    """Allow-lists and throttle rules, as ubrb_setup.policy_from_options parsed them from the
    flags; the checks the Gateway makes per connection and per registration."""

    def __init__(self, allow_clients=None, allow_topics=None, deny_topics=None, throttle=None):
        self.allow_clients = allow_clients or []  # [(address bytes, prefix)]; [] = everyone
        self.allow_topics = allow_topics or []  # globs; [] = every topic
        self.deny_topics = deny_topics or []
        self.throttle = throttle or []  # [(glob, period_ms)]

    def install(self, gw, new_buffer=bytearray):
        """Make Gateway `gw` serve under this policy (before it serves). The throttle's holding
        buffers (profile max_throttled x max_payload) are allocated here, once."""
        gw.policy = self
        if self.throttle:
            p = gw.p
            gw.throttle = Throttle(p["max_topics"], p["max_throttled"], p["max_payload"],
                                   new_buffer, self)

    def client_allowed(self, peer):
        return not self.allow_clients or cidr_match(self.allow_clients, peer_address(peer))

    def topic_refusal(self, topic):
        """None if clients may register `topic`, else the ERROR topic_denied message."""
        if (self.deny_topics or self.allow_topics) and topic[:1] != "/":
            # the companion resolves a relative or private name (odom, ~/x) under its own
            # namespace: checked here against absolute globs, `secret` would slip past /secret
            return "%s is not absolute: with --allow-topics/--deny-topics give the full name" % (
                topic)
        for g in self.deny_topics:
            if glob_match(g, topic):
                return "%s is denied by --deny-topics %s" % (topic, g)
        if self.allow_topics:
            for g in self.allow_topics:
                if glob_match(g, topic):
                    return None
            return "%s is not in --allow-topics" % topic
        return None

    def throttle_period(self, topic):
        """Milliseconds between MESSAGEs on `topic` (first matching rule), 0 = not throttled."""
        for g, ms in self.throttle:
            if glob_match(g, topic):
                return ms
        return 0


class Throttle:
    """Per subscription slot rate limit, newest wins, for Gateway.ros_message.

    A throttled slot owns one of `max_throttled` holding buffers (max_payload bytes each,
    allocated here once). Time is cut into periods of `period` ms per slot: the first message
    of a period goes out at once; later ones overwrite the holding buffer; when the period ends
    the held (newest) one goes out (Gateway.tick -> due()). Over a busy stream that is exactly
    one MESSAGE per period, and the last message of a burst is never lost, only delayed.
    """

    def __init__(self, max_topics, max_throttled, max_payload, new_buffer=bytearray, policy=None):
        self.policy = policy  # its throttle_period(topic) gives each new slot's period
        self.period = [0] * max_topics  # ms per sub slot; 0 = not throttled
        self.nxt = [0] * max_topics  # when the slot's current period ends
        self.pool_of = [-1] * max_topics  # holding buffer of the slot, -1 none
        self.slot = [-1] * max_throttled  # slot of each holding buffer, -1 free
        self.held = [-1] * max_throttled  # bytes held, -1 none
        self.buf = [new_buffer(max_payload) for _ in range(max_throttled)]
        self.passing = False  # the next admit() is a held message on its way out
        self.out_n = 0
        self.superseded = 0  # messages overwritten by a newer one within their period
        self.unheld = 0  # slots left unthrottled: every holding buffer was in use

    def bind(self, slot, period, now, refs):
        """A new subscription slot: throttle it at `period` ms (0: not). `refs` are the sub
        slots' reference counts: buffers of freed slots are reclaimed here. False when no
        holding buffer is free (the slot then goes unthrottled)."""
        i = self.pool_of[slot]
        if i >= 0:  # a freed slot reused: its old state goes
            self.slot[i] = -1
            self.held[i] = -1
            self.pool_of[slot] = -1
        self.period[slot] = 0
        if period <= 0:
            return True
        free = -1
        for k in range(len(self.slot)):
            s = self.slot[k]
            if s >= 0 and not refs[s]:
                self.slot[k] = -1
                self.held[k] = -1
                self.pool_of[s] = -1
                self.period[s] = 0
                s = -1
            if s < 0 and free < 0:
                free = k
        if free < 0:
            self.unheld += 1
            return False
        self.slot[free] = slot
        self.held[free] = -1
        self.pool_of[slot] = free
        self.period[slot] = period
        self.nxt[slot] = now
        return True

    def bind_topic(self, gw, slot, topic):
        """A subscription slot of Gateway `gw` is new: throttle it as the policy says."""
        if not self.bind(slot, self.policy.throttle_period(topic), gw.now, gw.subs.refs):
            gw._log("warning", "%s not throttled: all %d holding buffers in use "
                    "(--max-throttled)" % (topic, len(self.slot)))

    def release(self, gw, now):
        """Throttled messages whose period ended go out now (the newest of each period), through
        Gateway `gw`'s fan-out."""
        i = self.due(now)
        while i >= 0:
            gw.ros_message(self.slot[i], self.buf[i], 0, self.out_n)
            self.passing = False  # in case the slot was gone and ros_message returned early
            i = self.due(now)

    def admit(self, slot, buf, off, n, now):
        """True: fan this message out now. False: it is held (newest wins) until due()."""
        if self.passing:
            self.passing = False
            return True
        per = self.period[slot]
        if per == 0:
            return True
        i = self.pool_of[slot]
        if now - self.nxt[slot] >= 0:
            if self.held[i] >= 0:  # an older held one is superseded by this newer one
                self.held[i] = -1
                self.superseded += 1
            self._advance(slot, now)
            return True
        if n > len(self.buf[i]):
            return True  # cannot hold it: never lose it
        if self.held[i] >= 0:
            self.superseded += 1
        copy_into(self.buf[i], 0, buf, off, n)
        self.held[i] = n
        return False

    def _advance(self, slot, now):
        # Keep the cadence (one message per period on average) unless the stream paused.
        t = self.nxt[slot] + self.period[slot]
        if now - t >= 0:
            t = now + self.period[slot]
        self.nxt[slot] = t

    def due(self, now):
        """A holding buffer whose period ended, or -1. Its message (out_n bytes of buf[i], for
        slot[i]) must be fanned out now: the next admit() lets it through."""
        for i in range(len(self.slot)):
            if self.held[i] >= 0 and now - self.nxt[self.slot[i]] >= 0:
                self.out_n = self.held[i]
                self.held[i] = -1
                self._advance(self.slot[i], now)
                self.passing = True
                return i
        return -1

    def deadline(self, now):
        """Milliseconds until due() has work (1000 when nothing is held)."""
        t = 1000
        for i in range(len(self.slot)):
            if self.held[i] >= 0:
                t = min(t, self.nxt[self.slot[i]] - now)
        return max(0, t)

    def rebase(self, d):
        for s in range(len(self.nxt)):
            self.nxt[s] -= d
