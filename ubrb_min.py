# ubrb_min.py - the UBRB v1 gateway core: sans-IO, statically bounded, MicroPython-portable.
#
# One file on purpose: copy it to a Raspberry Pi and run `python ubrb_min.py`, or copy it to an
# ESP32 / Pico W next to ports/micropython/. No sockets, clocks or threads live here: the ports
# feed bytes and time in and take bytes out (see docs/DESIGN.md for the seams).
#
# Hot-path rules (why the code looks the way it does):
#   * no allocation per relayed PUBLISH or MESSAGE: bytes travel as (buf, off, n) triples because
#     slicing a memoryview allocates on MicroPython; ints are built byte by byte because values
#     >= 2**30 are heap objects on 32-bit MicroPython; no tuples, kwargs, closures or exceptions;
#   * every buffer and table is allocated in a constructor from the profile and never grows.
import sys
import json
import struct

# ---------------------------------------------------------------------------------------------
# Launcher: `python ubrb_min.py ...` / `micropython ubrb_min.py ...` start the gateway port of the
# runtime they find themselves on. This is the core's only reference to ports/.
#
# Why at the top, not at the end: run as a script, this file is the module `__main__`; the port
# does `import ubrb_min`, which loads this same file once more under its own name, and that copy
# (where __name__ == "ubrb_min") skips this block and defines the core. Placed here, the block
# hands over to the port and exits before the `__main__` copy defines anything, so the core exists
# once, as `ubrb_min`, on both runtimes - no sys.modules aliasing (MicroPython does not even
# register `__main__` in sys.modules), no second set of classes or buffers.
# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":  # the only block the `ubrb_min` copy skips

    def _launch():
        try:
            if sys.implementation.name == "micropython":
                from ports.micropython.gateway import main
            else:
                import os

                # the shared CPython runtime (ubrb_host) is in ports/cpython/ in the source tree
                here = os.path.dirname(os.path.abspath(__file__))
                sys.path.insert(1, os.path.join(here, "ports", "cpython"))
                from ports.cpython.gateway import main  # type: ignore[assignment]
        except ImportError as e:
            print("ubrb_min.py: no gateway port next to this file (%s): run it from the source "
                  "tree, or use `python -m ros_side --listen` for the in-process gateway" % e,
                  file=sys.stderr)
            sys.exit(2)
        sys.exit(main(sys.argv[1:]))

    _launch()


try:  # binascii.crc32 is C code on CPython and on every MicroPython port we target
    from binascii import crc32 as _lk_crc32
except ImportError:  # pragma: no cover - slow bitwise fallback, same results
    def _lk_crc32(data, crc=0):  # type: ignore[misc]
        crc = ~crc & 0xFFFFFFFF
        for c in data:
            crc ^= c
            for _ in range(8):
                crc = (crc >> 1) ^ (0xEDB88320 & -(crc & 1))
        return ~crc & 0xFFFFFFFF


VERSION = "0.1.0"
SERVER_NAME = "ubrb_min/" + VERSION
PROTOCOL = 1
IS_MICROPYTHON = sys.implementation.name == "micropython"

# ---------------------------------------------------------------------------------------------
# UBRB v1 wire constants
# ---------------------------------------------------------------------------------------------
HDR = 12
MAGIC = b"UBRB"
OP_HELLO = 1
OP_HELLO_ACK = 2
OP_ADVERTISE = 3
OP_UNADVERTISE = 4
OP_PUBLISH = 5
OP_SUBSCRIBE = 6
OP_UNSUBSCRIBE = 7
OP_MESSAGE = 8
OP_SUB_COUNT = 9
OP_PING = 10
OP_PONG = 11
OP_ERROR = 12

# Ops a client may send; anything else is treated like a malformed header ([decided] in the spec).
CLIENT_OPS = (0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0)  # indexed by op

HELLO_TIMEOUT_MS = 5000
IDLE_TIMEOUT_MS = 10000
SUB_COUNT_INTERVAL_MS = 500
ERROR_REPEAT_MS = 1000  # unknown_id / message_too_large: at most once per id per second
CLOSE_FLUSH_MS = 2000  # a closing client that does not read its last frames is cut off after this

# Decoder results
NEED_MORE = 0
MALFORMED = -1

# Session states
S_FREE = 0
S_OPEN = 1  # accepted, no HELLO yet
S_READY = 2  # HELLO received
S_CLOSING = 3  # flush what is queued, then the port closes the socket

WANT_READ = 1  # Gateway.interest(ci): what a port waits for on a client socket
WANT_WRITE = 2

RELIABILITIES = ("reliable", "best_effort")
DURABILITIES = ("volatile", "transient_local")

KIB = 1024
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
        "max_control": 64 * KIB,  # payload cap of every other op
        "queue_bytes": 16 * MIB,  # per-client send queue
        "control_reserve": 64 * KIB,  # part of the queue only control frames may use
    },
    # An ESP32 / Pico W: a couple of clients, frames of a few KiB.
    "mcu": {
        "max_clients": 2,
        "max_pubs": 8,
        "max_subs": 8,
        "max_topics": 16,
        "max_payload": 2 * KIB,
        "max_control": 512,
        "queue_bytes": 6 * KIB,
        "control_reserve": 1 * KIB,
    },
    # A PC in direct mode (ros_side --listen): the spec's defaults.
    "pc": {
        "max_clients": 16,
        "max_pubs": 256,
        "max_subs": 256,
        "max_topics": 512,
        "max_payload": 64 * MIB,
        "max_control": 1 * MIB,
        "queue_bytes": 128 * MIB,
        "control_reserve": 1 * MIB,
    },
}
# Every limit of a profile, with the sentence both ports' --help show for its flag.
LIMITS = (
    ("max_clients", "UBRB client connections served at once"),
    ("max_pubs", "publisher ids per client"),
    ("max_subs", "subscription ids per client"),
    ("max_topics", "topic slots (each for publishers and again for subscriptions)"),
    ("max_payload", "largest PUBLISH/MESSAGE payload in bytes"),
    ("max_control", "largest payload of any other op in bytes"),
    ("queue_bytes", "send queue per client in bytes"),
    ("control_reserve", "bytes of each send queue only control frames may use"),
)
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
        if p[k] < 1:
            raise ValueError("%s must be at least 1" % k)
    if p["max_control"] < 256:
        raise ValueError("max_control must be at least 256 bytes")
    if p["control_reserve"] < p["max_control"] + HDR:
        # A control frame must always fit in the reserved room, or PONG/ERROR could be lost.
        p["control_reserve"] = p["max_control"] + HDR
    need = HDR + 4 + p["max_payload"] + p["control_reserve"]
    if p["queue_bytes"] < need:
        raise ValueError(
            "queue_bytes (%d) must hold one largest MESSAGE plus the control reserve (%d)"
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
    return {
        "per_client": per_client,
        "clients": per_client * p["max_clients"],
        "slots": slots,
        "link": link_bytes,
        "total": per_client * p["max_clients"] + slots + link_bytes,
    }


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
    if link is not None:
        lines.append(
            "  link session buffers: %s (messages up to %s, frames of %d bytes)"
            % (human_bytes(link["total"]), human_bytes(link["max_message"]), link["max_frame"])
        )
    return "\n".join(lines)


def human_bytes(n):
    if n >= MIB:
        return "%.1f MiB" % (n / MIB)
    if n >= KIB:
        return "%.1f KiB" % (n / KIB)
    return "%d B" % n


# ---------------------------------------------------------------------------------------------
# Byte helpers (allocation-free on both runtimes)
# ---------------------------------------------------------------------------------------------
def get_u32(b, o):
    # Caller guarantees the value is < 2**30 where it matters (lengths are capped far below).
    return b[o] | (b[o + 1] << 8) | (b[o + 2] << 16) | (b[o + 3] << 24)


def put_u32(b, o, v):
    b[o] = v & 0xFF
    b[o + 1] = (v >> 8) & 0xFF
    b[o + 2] = (v >> 16) & 0xFF
    b[o + 3] = (v >> 24) & 0xFF


def put_header(b, o, op, n):
    b[o] = 0x55  # U
    b[o + 1] = 0x42  # B
    b[o + 2] = 0x52  # R
    b[o + 3] = 0x42  # B
    b[o + 4] = PROTOCOL
    b[o + 5] = op
    b[o + 6] = 0
    b[o + 7] = 0
    put_u32(b, o + 8, n)


if IS_MICROPYTHON:

    def copy_into(dst, doff, src, soff, n):
        # A memoryview slice is a heap object on MicroPython; a counted loop is not. Payloads on
        # MCU-class gateways are a few KiB, so this stays cheap there.
        if dst is src and doff > soff:  # overlapping move up: copy from the end
            i = n - 1
            while i >= 0:
                dst[doff + i] = src[soff + i]
                i -= 1
        else:
            for i in range(n):
                dst[doff + i] = src[soff + i]

else:

    def copy_into(dst, doff, src, soff, n):
        memoryview(dst)[doff : doff + n] = memoryview(src)[soff : soff + n]


def move_down(buf, dst, src, n):
    """memmove within one buffer (dst < src): memoryview slice assignment is memmove on both."""
    if n > 0:
        mv = memoryview(buf)
        mv[dst : dst + n] = mv[src : src + n]


DECODER_SHORT = 2048  # a partial frame this short is moved to the decoder's front (_compact)


def encode_frame(op, payload):
    """A whole frame as bytes (control frames, tests, clients)."""
    b = bytearray(HDR + len(payload))
    put_header(b, 0, op, len(payload))
    b[HDR:] = payload
    return bytes(b)


def encode_json_frame(op, obj):
    return encode_frame(op, json.dumps(obj).encode())


# ---------------------------------------------------------------------------------------------
# Frame decoder: bytes in, whole frames out, into one preallocated buffer
# ---------------------------------------------------------------------------------------------
class FrameDecoder:
    """Reassembles UBRB frames from a byte stream split at arbitrary points.

    The port writes received bytes into `buf[fill:]` (at most `space()` bytes) and calls
    `commit(n)`; `next()` then yields frames one at a time. The header is checked as soon as its 12
    bytes are in, before any payload is waited for.
    """

    def __init__(self, max_bulk, max_control, bulk_op, allowed_ops, new_buffer=bytearray):
        self.max_bulk = max_bulk
        self.max_control = max_control
        self.bulk_op = bulk_op
        self.allowed = allowed_ops
        self.cap = HDR + max(max_bulk, max_control)
        self.buf = new_buffer(self.cap)
        self.fill = 0  # bytes held
        self.pos = 0  # start of the first frame not yet returned
        self.skip = 0  # length of the frame returned by the last next(), released on the next call
        self.op = 0  # the frame returned by next(): op, payload offset and length
        self.poff = 0
        self.plen = 0
        self.error = ""

    def space(self):
        return self.cap - self.fill

    def commit(self, n):
        self.fill += n

    def feed(self, data):
        """Copy `data` in (tests and ports without readinto); returns how much fitted."""
        n = min(len(data), self.space())
        copy_into(self.buf, self.fill, data, 0, n)
        self.fill += n
        return n

    def reset(self):
        self.fill = self.pos = self.skip = 0
        self.error = ""

    def hold(self):
        """Give back the frame next() just returned: it stays in the buffer, the next call
        returns it again (a reliable PUBLISH waiting for link room; see Gateway.received)."""
        self.skip = 0

    def next(self):
        """The op of the next whole frame (payload at buf[poff:poff+plen]), NEED_MORE or MALFORMED."""
        if self.skip:
            self.pos += self.skip
            self.skip = 0
        b = self.buf
        p = self.pos
        avail = self.fill - p
        if avail < HDR:
            self._compact(HDR)
            return NEED_MORE
        if b[p] != 0x55 or b[p + 1] != 0x42 or b[p + 2] != 0x52 or b[p + 3] != 0x42:
            self.error = "bad magic"
            return MALFORMED
        if b[p + 4] != PROTOCOL:
            self.error = "unsupported frame version %d" % b[p + 4]
            return MALFORMED
        op = b[p + 5]
        if op >= len(self.allowed) or not self.allowed[op]:
            self.error = "op %d not accepted here" % op
            return MALFORMED
        if b[p + 11] >= 0x40:  # length >= 2**30: far above any cap; keep ints small
            self.error = "payload length too large"
            return MALFORMED
        n = get_u32(b, p + 8)
        cap = self.max_bulk if op == self.bulk_op else self.max_control
        if n > cap:
            self.error = "payload of %d bytes exceeds the %d-byte limit for op %d" % (n, cap, op)
            return MALFORMED
        if avail < HDR + n:
            self._compact(HDR + n)
            return NEED_MORE
        self.op = op
        self.poff = p + HDR
        self.plen = n
        self.skip = HDR + n
        return op

    def _compact(self, frame_len):
        # Move the partial frame to the front when it cannot complete where it is, or when it is
        # short (a cheap copy): the buffer is then reused from its start, so a client streaming
        # small frames touches only the front of a big (mapped) buffer, not all of it over time;
        # a large frame arriving in many reads is still moved at most once.
        p = self.pos
        if p == self.fill:
            self.pos = self.fill = 0
        elif p + frame_len > self.cap or (p > 0 and self.fill - p <= DECODER_SHORT):
            move_down(self.buf, 0, p, self.fill - p)
            self.fill -= p
            self.pos = 0


# ---------------------------------------------------------------------------------------------
# Per-client send queue: byte-bounded, control frames have reserved room, best-effort first out
# ---------------------------------------------------------------------------------------------
class SendQueue:
    """Frames waiting for one client's socket, in order, in one preallocated buffer.

    Pending bytes are buf[head:tail]; the port sends from there and calls `sent(n)`. Data frames
    may use `cap - reserve` bytes, control frames all of it. When a frame does not fit, queued
    best_effort MESSAGE frames are evicted, oldest first, before anything else is refused;
    `owner.evictable(sub_id)` says which MESSAGE frames are best_effort.
    """

    def __init__(self, cap, reserve, owner, new_buffer=bytearray):
        self.cap = cap
        self.reserve = reserve
        self.owner = owner
        self.buf = new_buffer(cap)
        self.head = 0  # first unsent byte
        self.tail = 0  # end of queued bytes
        self.walk = 0  # first frame boundary >= head: frames from here on are wholly unsent
        self.evicted = 0  # best_effort MESSAGE frames evicted
        self.refused = 0  # frames that found no room at all

    def pending(self):
        return self.tail - self.head

    def clear(self):
        self.head = self.tail = self.walk = 0

    def sent(self, n):
        self.head += n
        if self.head == self.tail:
            self.head = self.tail = self.walk = 0
            return
        b = self.buf
        while self.walk < self.head:
            self.walk += HDR + get_u32(b, self.walk + 8)

    def push_message(self, op, sid, src, off, n):
        """Queue a MESSAGE-like frame: header, u32 id, then src[off:off+n]. False if refused."""
        size = HDR + 4 + n
        if not self._room(size, False):
            return False
        b = self.buf
        t = self.tail
        put_header(b, t, op, 4 + n)
        put_u32(b, t + HDR, sid)
        copy_into(b, t + HDR + 4, src, off, n)
        self.tail = t + size
        return True

    def push_control(self, op, payload):
        """Queue a control frame (HELLO_ACK, PONG, ERROR, SUB_COUNT). False if refused."""
        n = len(payload)
        if not self._room(HDR + n, True):
            return False
        b = self.buf
        t = self.tail
        put_header(b, t, op, n)
        copy_into(b, t + HDR, payload, 0, n)
        self.tail = t + HDR + n
        return True

    def _room(self, size, control):
        limit = self.cap if control else self.cap - self.reserve
        if self.tail - self.head + size > limit:
            self._evict(self.tail - self.head + size - limit)
            if self.tail - self.head + size > limit:
                self.refused += 1
                return False
        if self.tail + size > self.cap:
            # Linear buffer: slide the pending bytes to the front (cheap when the client keeps up).
            h = self.head
            move_down(self.buf, 0, h, self.tail - h)
            self.tail -= h
            self.walk -= h
            self.head = 0
        return True

    def _evict(self, need):
        """Drop best_effort MESSAGE frames, oldest first, until `need` bytes are free (one pass)."""
        b = self.buf
        end = self.tail
        # Dry run first: evicting frames that still would not make room loses data for nothing.
        r = self.walk
        freed = 0
        while r < end and freed < need:
            flen = HDR + get_u32(b, r + 8)
            if b[r + 5] == OP_MESSAGE and self.owner.evictable(get_u32(b, r + HDR)):
                freed += flen
            r += flen
        if freed < need:
            return
        r = w = self.walk  # read and write positions over the wholly unsent frames
        freed = 0
        while r < end and freed < need:
            flen = HDR + get_u32(b, r + 8)
            if b[r + 5] == OP_MESSAGE and self.owner.evictable(get_u32(b, r + HDR)):
                freed += flen
                self.evicted += 1
            else:
                if w != r:
                    move_down(b, w, r, flen)
                w += flen
            r += flen
        if w != r:
            move_down(b, w, r, end - r)
        self.tail = end - (r - w)


# ---------------------------------------------------------------------------------------------
# Registration tables: topic slots shared by all clients
# ---------------------------------------------------------------------------------------------
class SlotTable:
    """One slot per topic for one kind of registration ("pub" or "sub"), reference-counted."""

    def __init__(self, kind, size):
        self.kind = kind
        self.size = size
        self.topic = [None] * size  # type: list
        self.type = [None] * size  # type: list
        self.qos = [None] * size  # type: list
        self.reliable = bytearray(size)
        self.refs = [0] * size
        self.count = [-1] * size  # subscriber count of a pub slot; -1 = not reported yet
        # Freed while the ROS side was unreachable: its release is still owed to the ROS side.
        self.stale = bytearray(size)
        self.next_free = 0  # round-robin allocation: a freed slot is reused as late as possible

    def find(self, topic):
        for i in range(self.size):
            if self.refs[i] and self.topic[i] == topic:
                return i
        return -1

    def allocate(self, topic, type_, qos):
        for k in range(self.size):
            i = (self.next_free + k) % self.size
            if not self.refs[i]:
                self.next_free = (i + 1) % self.size
                self.topic[i] = topic
                self.type[i] = type_
                self.qos[i] = qos
                self.reliable[i] = 1 if qos["reliability"] == "reliable" else 0
                self.refs[i] = 1
                self.count[i] = -1
                return i
        return -1

    def release(self, i):
        """Drop one reference; True when that was the last one and the slot is free again."""
        self.refs[i] -= 1
        if self.refs[i] == 0:
            self.free(i)
            return True
        return False

    def free(self, i):
        self.refs[i] = 0
        self.topic[i] = self.type[i] = self.qos[i] = None
        self.count[i] = -1

    def used(self):
        n = 0
        for i in range(self.size):
            if self.refs[i]:
                n += 1
        return n


PUB = 0  # registration kinds, as Registry methods take them
SUB = 1


class Refused(Exception):
    """A registration the gateway refuses itself: the code and message of the client's ERROR."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def next_held(ids, slots, slot, i):
    """The sweep behind Registry.next_on: the first index >= i of a live id (>= 0) whose slot is
    `slot`, or -1. A plain function so the relay path (Gateway.ros_message) calls it directly."""
    n = len(ids)
    while i < n:
        if ids[i] >= 0 and slots[i] == slot:
            return i
        i += 1
    return -1


class Registry:
    """Who holds which topic: one SlotTable per kind (`pubs`, `subs`) and every client's id tables.

    It owns the registration rules (ids unique per client, the per-client and topic-slot limits,
    one type per topic across both kinds, one QoS per slot) and is the only code that changes a
    reference count. The Gateway decides what the ROS side and the clients are told.

    Iterating the ids a client holds on one slot (the sweep every fan-out needs) is
    `i = next_on(c, kind, slot, 0)` ... `i = next_on(c, kind, slot, i + 1)` until -1: no
    iterator object, so it stays allocation-free on the relay path.
    """

    def __init__(self, max_topics):
        self.pubs = SlotTable("pub", max_topics)
        self.subs = SlotTable("sub", max_topics)

    def table(self, kind):
        return self.pubs if kind == PUB else self.subs

    def find(self, c, kind, id_):
        """Index of client c's live `kind` id `id_`, or -1."""
        return c.find_pub(id_) if kind == PUB else c.find_sub(id_)

    def id_at(self, c, kind, i):
        return c.pub_id[i] if kind == PUB else c.sub_id[i]

    def slot_at(self, c, kind, i):
        return c.pub_slot[i] if kind == PUB else c.sub_slot[i]

    def next_on(self, c, kind, slot, i):
        """The first index >= i of a live `kind` id of client c on `slot`, or -1."""
        if kind == PUB:
            return next_held(c.pub_id, c.pub_slot, slot, i)
        return next_held(c.sub_id, c.sub_slot, slot, i)

    def register(self, c, kind, id_, topic, type_, qos):
        """Give client c's new `kind` id `id_` a slot for `topic`; returns the slot. Raises
        Refused. The slot is new (the ROS side must be told) when holders(kind, slot) == 1."""
        table = self.table(kind)
        ids = c.pub_id if kind == PUB else c.sub_id
        free = -1
        for i in range(len(ids)):
            if ids[i] == id_:
                raise Refused("duplicate_id", "%s id %d is already live" % (table.kind, id_))
            if free < 0 and ids[i] < 0:
                free = i
        if free < 0:
            raise Refused("resource_exhausted", "at most %d %s ids per client (--max-%ss)"
                          % (len(ids), table.kind, table.kind))
        # Conflicts the gateway can decide: a topic it already holds, in either table.
        for other in (self.pubs, self.subs):
            j = other.find(topic)
            if j >= 0 and other.type[j] != type_:
                raise Refused("type_conflict",
                              "%s already carries %s, not %s" % (topic, other.type[j], type_))
        slot = table.find(topic)
        if slot >= 0:
            if table.qos[slot] != qos:
                raise Refused("qos_conflict", "%s is already %s with QoS %s" % (
                    topic, "advertised" if kind == PUB else "subscribed",
                    _qos_text(table.qos[slot])))
            table.refs[slot] += 1
        else:
            slot = table.allocate(topic, type_, qos)
            if slot < 0:
                raise Refused("resource_exhausted", "all %d %s topic slots are in use "
                              "(--max-topics)" % (table.size, table.kind))
        ids[free] = id_
        if kind == PUB:
            c.pub_slot[free] = slot
        else:
            c.sub_slot[free] = slot
            c.sub_reliable[free] = table.reliable[slot]
            c.sub_refs[slot] += 1
        return slot

    def release(self, c, kind, i):
        """End entry i of client c's `kind` ids. Returns its slot if that was the slot's last
        holder (the slot is free again), else -1."""
        if kind == PUB:
            c.pub_id[i] = -1
            slot = c.pub_slot[i]
        else:
            c.sub_id[i] = -1
            slot = c.sub_slot[i]
            c.sub_refs[slot] -= 1
        return slot if self.table(kind).release(slot) else -1

    def holders(self, kind, slot):
        """How many ids, over all clients, hold `slot` (0: free)."""
        return self.table(kind).refs[slot]

    def holds(self, kind, slot):
        """Is `slot` a valid, held slot? (Slots named by the ROS side are checked with this.)"""
        t = self.table(kind)
        return 0 <= slot < t.size and t.refs[slot] > 0


# ---------------------------------------------------------------------------------------------
# One client connection
# ---------------------------------------------------------------------------------------------
class ClientSession:
    """Protocol state of one TCP connection: decoder, send queue, id tables, timers."""

    def __init__(self, index, p, new_buffer=bytearray):
        self.index = index
        self.state = S_FREE
        self.decoder = FrameDecoder(p["max_payload"] + 4, p["max_control"], OP_PUBLISH, CLIENT_OPS,
                                    new_buffer)
        self.queue = SendQueue(p["queue_bytes"], p["control_reserve"], self, new_buffer)
        self.max_pubs = p["max_pubs"]
        self.max_subs = p["max_subs"]
        self.pub_id = [-1] * p["max_pubs"]  # publisher id, -1 = free entry
        self.pub_slot = [0] * p["max_pubs"]
        self.sub_id = [-1] * p["max_subs"]
        self.sub_slot = [0] * p["max_subs"]
        self.sub_reliable = bytearray(p["max_subs"])
        self.sub_refs = bytearray(p["max_topics"])  # how many of my sub ids sit on each sub slot
        self.name = ""
        self.accepted_ms = 0
        self.last_rx_ms = 0
        self.counts_dirty = False
        self.counts_sent_ms = -SUB_COUNT_INTERVAL_MS
        self.close_reason = ""
        self.close_ms = 0
        # unknown_id / message_too_large repeat suppression: a small ring of (code, id, time).
        self.err_code = [None] * 8  # type: list
        self.err_id = [0] * 8
        self.err_ms = [0] * 8
        self.err_next = 0
        # counters
        self.rx_frames = 0
        self.tx_frames = 0
        self.dropped = 0
        self.blocked = False  # holds a reliable PUBLISH the ROS side cannot take yet: not read

    def open(self, now):
        self.state = S_OPEN
        self.decoder.reset()
        self.queue.clear()
        for i in range(self.max_pubs):
            self.pub_id[i] = -1
        for i in range(self.max_subs):
            self.sub_id[i] = -1
        for i in range(len(self.sub_refs)):
            self.sub_refs[i] = 0
        for i in range(len(self.err_code)):
            self.err_code[i] = None
        self.name = ""
        self.accepted_ms = self.last_rx_ms = now
        self.counts_dirty = False
        self.counts_sent_ms = now - SUB_COUNT_INTERVAL_MS
        self.close_reason = ""
        self.rx_frames = self.tx_frames = self.dropped = 0
        self.blocked = False

    def evictable(self, sid):
        # A MESSAGE whose subscription is gone, or best_effort, may be evicted from the queue.
        j = self.find_sub(sid)
        return j < 0 or not self.sub_reliable[j]

    def find_pub(self, pid):
        ids = self.pub_id
        for i in range(self.max_pubs):
            if ids[i] == pid:
                return i
        return -1

    def find_sub(self, sid):
        ids = self.sub_id
        for i in range(self.max_subs):
            if ids[i] == sid:
                return i
        return -1

    def should_report(self, code, id_, now):
        """Rate limit: False if (code, id) was reported less than ERROR_REPEAT_MS ago."""
        for k in range(len(self.err_code)):
            if self.err_code[k] == code and self.err_id[k] == id_:
                if now - self.err_ms[k] < ERROR_REPEAT_MS:
                    return False
                self.err_ms[k] = now
                return True
        k = self.err_next
        self.err_next = (k + 1) % len(self.err_code)
        self.err_code[k] = code
        self.err_id[k] = id_
        self.err_ms[k] = now
        return True


# ---------------------------------------------------------------------------------------------
# The gateway: sessions, registry and fan-out; the UBRB bridge as seen from Unreal
# ---------------------------------------------------------------------------------------------
class NullRosPort:
    """A ROS side that is never reachable: the gateway keeps registrations until one appears."""

    sink = None

    def advertise(self, slot, topic, type_, qos):
        pass

    def unadvertise(self, slot):
        pass

    def subscribe(self, slot, topic, type_, qos):
        pass

    def unsubscribe(self, slot):
        pass

    def publish(self, slot, buf, off, n, reliable):
        pass

    def max_message(self):
        return 0


class ProtocolError(Exception):
    """A well-formed frame with unusable JSON: ERROR protocol_error, connection kept."""

    def __init__(self, message, id_=None):
        super().__init__(message)
        self.id = id_


class Gateway:
    """The UBRB v1 bridge state machine for all clients. Implements GatewaySink for the ROS side.

    Port contract (see ports/cpython/gateway.py):
      ci = accept(now)            -> client index, or -1: send reject_frame() and close
      decoder = clients[ci].decoder; recv into decoder.buf[decoder.fill:]; received(ci, n, now)
      queue = clients[ci].queue;  send queue.buf[queue.head:queue.tail]; queue.sent(n)
      wants_close(ci)             -> the port closes once the queue is flushed (or at once on error)
      closed(ci, reason)          -> the socket is gone; releases everything the client registered
      tick(now)                   -> timers; call at least every 100 ms
    """

    def __init__(self, profile, ros=None, server=SERVER_NAME, log=None, new_buffer=bytearray):
        # new_buffer(n): where every large buffer (decoders, send queues) comes from, once, here.
        # bytearray by default; the CPython runtime passes one that maps big buffers from
        # anonymous memory, so a 128 MiB queue reserves address space but costs RAM only as far
        # as it is ever filled.
        self.p = profile
        self.server = server
        self.log = log  # callable(level, message) or None
        n = profile["max_clients"]
        self.clients = [ClientSession(i, profile, new_buffer) for i in range(n)]
        self.registry = Registry(profile["max_topics"])
        self.pubs = self.registry.pubs  # the slot tables, for reading: the registry edits them
        self.subs = self.registry.subs
        self.ros = ros if ros is not None else NullRosPort()
        self.ros.sink = self
        self.ros_ready = False
        self.ros_distro = "unknown"
        self.ros_max_message = 0
        self.now = 0
        self.publishing = -1  # client index inside ros.publish(), for errors raised synchronously
        # Backpressure (docs/PROTOCOL.md): ros.room(n) says whether a reliable message of n bytes
        # can be taken now (a link's send budget); a port without it (direct mode: DDS's own
        # write blocks) never makes a client wait. Waiting clients are served in turn.
        self.ros_room = getattr(self.ros, "room", None)
        self.n_blocked = 0  # clients holding a reliable PUBLISH that waits for room
        self.rr = 0  # the next waiting client to get a turn
        self.pass_ci = -1  # the client whose held frame may go now (one frame per turn)
        self.stats = {
            "clients_accepted": 0,
            "clients_rejected": 0,
            "frames_in": 0,
            "frames_out": 0,
            "publish_in": 0,
            "message_out": 0,
            "dropped_no_ros": 0,
            "dropped_queue": 0,
            "evicted": 0,
            "errors_sent": 0,
        }

    # -- logging ---------------------------------------------------------------------------
    def _log(self, level, msg):
        if self.log is not None:
            self.log(level, msg)

    # -- port-facing -------------------------------------------------------------------------
    def accept(self, now, peer=None):
        """A new connection (from `peer`, for the log): its client index, or -1 when every
        session is taken (send reject_frame(), then close it)."""
        self.now = now
        for c in self.clients:
            if c.state == S_FREE:
                c.open(now)
                self.stats["clients_accepted"] += 1
                if peer is not None:
                    self._log("info", "client %d connected from %s" % (c.index, peer))
                return c.index
        self.stats["clients_rejected"] += 1
        if peer is not None:
            self._log("warning", "refusing %s: too many clients" % (peer,))
        return -1

    def reject_frame(self):
        """The bytes to send a connection refused for capacity before closing it."""
        return encode_json_frame(
            OP_ERROR,
            {
                "id": None,
                "code": "too_many_clients",
                "message": "the gateway serves at most %d clients" % self.p["max_clients"],
            },
        )

    def wants_close(self, ci):
        return self.clients[ci].state == S_CLOSING

    def interest(self, ci):
        """What the port waits for on client ci's socket: WANT_READ and/or WANT_WRITE. A closing
        client is not read any more; it is watched for writing until its queue is flushed."""
        c = self.clients[ci]
        if c.state == S_CLOSING or c.blocked:  # blocked: TCP pushes back on the client
            return WANT_WRITE if c.queue.pending() else 0
        return WANT_READ | WANT_WRITE if c.queue.pending() else WANT_READ

    def flushed_close(self, ci):
        """True when client ci is closing and everything queued for it is sent: close it now."""
        c = self.clients[ci]
        return c.state == S_CLOSING and c.queue.pending() == 0

    def close_overdue(self, ci, now):
        """A closing client whose last frames (its ERROR) were not read within 2 s: the port
        closes the socket anyway, so a peer that stopped reading cannot hold its slot."""
        c = self.clients[ci]
        return c.state == S_CLOSING and now - c.close_ms >= CLOSE_FLUSH_MS

    def active_clients(self):
        n = 0
        for c in self.clients:
            if c.state != S_FREE:
                n += 1
        return n

    def received(self, ci, n, now):
        """`n` new bytes are in clients[ci].decoder.buf; handle every whole frame."""
        self.now = now
        c = self.clients[ci]
        d = c.decoder
        d.commit(n)
        if n:
            c.last_rx_ms = now
        while c.state == S_OPEN or c.state == S_READY:
            op = d.next()
            if op == NEED_MORE:
                return
            if op == MALFORMED:
                self._error(c, None, "protocol_error", d.error)
                self._close(c, "malformed frame: " + d.error)
                return
            if op == OP_PUBLISH and self.ros_room is not None and \
                    self._must_wait(c, d.buf, d.poff, d.plen):
                d.hold()  # stays in the decoder; the socket is not read until _resume
                if not c.blocked:
                    c.blocked = True
                    self.n_blocked += 1
                return
            c.rx_frames += 1
            self.stats["frames_in"] += 1
            if op == OP_PUBLISH:
                self._on_publish(c, d.buf, d.poff, d.plen)
            else:
                self._on_control(c, op, d.buf, d.poff, d.plen)

    def closed(self, ci, reason=""):
        c = self.clients[ci]
        if c.state == S_FREE:
            return
        self._log("info", "client %d (%s) closed: %s" % (ci, c.name or "?", reason or c.close_reason))
        for i in range(c.max_pubs):
            if c.pub_id[i] >= 0:
                self._release(c, PUB, i)
        for j in range(c.max_subs):
            if c.sub_id[j] >= 0:
                self._release(c, SUB, j)
        c.queue.clear()
        c.decoder.reset()
        if c.blocked:
            c.blocked = False
            self.n_blocked -= 1
        c.state = S_FREE

    def tick(self, now):
        self.now = now
        if self.n_blocked:
            self._resume(now)
        for c in self.clients:
            if c.state == S_OPEN and now - c.accepted_ms >= HELLO_TIMEOUT_MS:
                self._error(c, None, "hello_required", "no HELLO within 5 s of connecting")
                self._close(c, "no HELLO within 5 s")
            elif (c.state == S_OPEN or c.state == S_READY) and not c.blocked and \
                    now - c.last_rx_ms >= IDLE_TIMEOUT_MS:
                self._close(c, "nothing received for 10 s")
            elif (
                c.state == S_READY
                and c.counts_dirty
                and now - c.counts_sent_ms >= SUB_COUNT_INTERVAL_MS
            ):
                self._send_counts(c, now)

    def rebase(self, d):
        """Move every stored time `d` ms back, for a port whose clock just did the same: on
        32-bit MicroPython ints >= 2**30 are heap objects, so a long-running board's clock is
        kept small (ports/micropython: every 2**28 ms)."""
        self.now -= d
        for c in self.clients:
            c.accepted_ms -= d
            c.last_rx_ms -= d
            c.counts_sent_ms -= d
            c.close_ms -= d
            for k in range(len(c.err_ms)):
                c.err_ms[k] -= d

    def next_deadline(self, now):
        """Milliseconds until tick() has work at the latest (for the port's poll timeout)."""
        t = 1000
        for c in self.clients:
            if c.state == S_OPEN:
                t = min(t, c.accepted_ms + HELLO_TIMEOUT_MS - now)
            if c.state == S_READY and c.counts_dirty:
                t = min(t, c.counts_sent_ms + SUB_COUNT_INTERVAL_MS - now)
        return max(0, t)

    # -- backpressure ----------------------------------------------------------------------------
    def _must_wait(self, c, buf, off, n):
        """True when this PUBLISH is reliable and must wait for room on the ROS side: there is
        none, or other clients are already waiting (they go first: fair shares of the link).
        Anything _on_publish would refuse or drop anyway does not wait."""
        if c.state != S_READY or n < 4 or not self.ros_ready or buf[off + 3] >= 0x40 or \
                n - 4 > self.ros_max_message:
            return False
        i = c.find_pub(get_u32(buf, off))
        if i < 0 or not self.pubs.reliable[c.pub_slot[i]]:
            return False
        if self.pass_ci == c.index:  # its turn (see _resume)
            if self.ros_room(n - 4):
                self.pass_ci = -1
                return False
            return True
        return self.n_blocked > 0 or not self.ros_room(n - 4)

    def _resume(self, now):
        """Hand the room freed on the ROS side to waiting clients, one held frame each in turn,
        until the next in line does not fit (it keeps its turn). A client with nothing more
        held is read again; one that meets its next reliable PUBLISH waits in line again."""
        cl = self.clients
        n = len(cl)
        idle = 0
        while self.n_blocked and idle < n:
            ci = self.rr
            self.rr = ci + 1 if ci + 1 < n else 0
            c = cl[ci]
            if not c.blocked:
                idle += 1
                continue
            idle = 0
            c.blocked = False
            self.n_blocked -= 1
            c.last_rx_ms = now  # it was waiting for us, not idle
            self.pass_ci = ci
            self.received(ci, 0, now)
            passed = self.pass_ci != ci
            self.pass_ci = -1
            if c.blocked and not passed:  # its frame still does not fit: it stays first in line
                self.rr = ci
                return

    # -- frames from a client ------------------------------------------------------------------
    def _on_publish(self, c, buf, off, n):
        if c.state != S_READY:
            self._error(c, None, "hello_required", "PUBLISH before HELLO")
            return
        if n < 4:
            self._error(c, None, "protocol_error", "PUBLISH payload shorter than its 4-byte id")
            return
        if buf[off + 3] >= 0x40:  # ids >= 2**30 are never advertised (see _parse_id)
            i = -1
        else:
            i = c.find_pub(get_u32(buf, off))
        if i < 0:
            c.dropped += 1
            pid = get_u32(buf, off) if buf[off + 3] < 0x40 else -1
            if c.should_report("unknown_id", pid, self.now):
                self._error(c, pid, "unknown_id", "PUBLISH for an id not advertised on this connection")
            return
        self.stats["publish_in"] += 1
        slot = c.pub_slot[i]
        if not self.ros_ready:
            self.stats["dropped_no_ros"] += 1
            c.dropped += 1
            return
        if n - 4 > self.ros_max_message:
            c.dropped += 1
            pid = c.pub_id[i]
            if c.should_report("message_too_large", pid, self.now):
                self._error(
                    c,
                    pid,
                    "message_too_large",
                    "message of %d bytes exceeds the %d bytes the ROS side accepts"
                    % (n - 4, self.ros_max_message),
                )
            return
        self.publishing = c.index
        self.ros.publish(slot, buf, off + 4, n - 4, self.pubs.reliable[slot])
        self.publishing = -1

    def _on_control(self, c, op, buf, off, n):
        if op == OP_PING:
            self._send(c, OP_PONG, b"")
            return
        if op == OP_PONG:
            return
        if op == OP_HELLO:
            self._on_hello(c, buf, off, n)
            return
        if c.state != S_READY:
            self._error(c, None, "hello_required", "op %d before HELLO" % op)
            return
        try:
            msg = self._json(buf, off, n)
            if op == OP_ADVERTISE:
                self._on_register(c, PUB, msg)
            elif op == OP_SUBSCRIBE:
                self._on_register(c, SUB, msg)
            elif op == OP_UNADVERTISE:
                self._on_unregister(c, PUB, msg)
            elif op == OP_UNSUBSCRIBE:
                self._on_unregister(c, SUB, msg)
        except ProtocolError as e:
            self._error(c, e.id, "protocol_error", str(e))

    def _json(self, buf, off, n):
        try:
            obj = json.loads(bytes(memoryview(buf)[off : off + n]))
        except Exception:  # ValueError, UnicodeError: MicroPython and CPython raise different ones
            raise ProtocolError("payload is not valid JSON")
        if not isinstance(obj, dict):
            raise ProtocolError("payload is not a JSON object")
        return obj

    def _on_hello(self, c, buf, off, n):
        try:
            msg = self._json(buf, off, n)
            proto = msg.get("protocol")
            if not isinstance(proto, int) or isinstance(proto, bool):
                raise ProtocolError("HELLO needs an integer 'protocol'")
        except ProtocolError as e:
            self._error(c, None, "protocol_error", str(e))
            return
        if proto != PROTOCOL:
            self._error(
                c, None, "unsupported_protocol", "protocol %d is not supported (this is 1)" % proto
            )
            self._close(c, "unsupported protocol %d" % proto)
            return
        name = msg.get("client")
        c.name = name if isinstance(name, str) else ""
        first = c.state == S_OPEN
        c.state = S_READY
        self._send_json(
            c,
            OP_HELLO_ACK,
            {"protocol": PROTOCOL, "server": self.server, "ros_distro": self.ros_distro},
        )
        if first:
            self._log("info", "client %d says HELLO: %s" % (c.index, c.name))

    def _on_register(self, c, kind, msg):
        id_ = _parse_id(msg)
        topic = msg.get("topic")
        type_ = msg.get("type")
        if not isinstance(topic, str) or not isinstance(type_, str):
            raise ProtocolError("'topic' and 'type' must be strings", id_)
        qos = _parse_qos(msg.get("qos"), id_)
        reg = self.registry
        try:
            slot = reg.register(c, kind, id_, topic, type_, qos)
        except Refused as e:
            self._error(c, id_, e.code, e.message)
            return
        if kind == PUB:
            if self.pubs.count[slot] >= 0:
                c.counts_dirty = True  # a known subscriber count: this id gets it too
        else:
            self._local_subs_changed(topic)
        if reg.holders(kind, slot) == 1 and self.ros_ready:  # a new slot: the ROS side needs it
            if kind == PUB:
                self.ros.advertise(slot, topic, type_, qos)
            else:
                self.ros.subscribe(slot, topic, type_, qos)

    def _on_unregister(self, c, kind, msg):
        id_ = _parse_id(msg)
        i = self.registry.find(c, kind, id_)
        if i < 0:
            kind_name = self.registry.table(kind).kind
            self._error(c, id_, "unknown_id",
                        "no live %s id %d on this connection" % (kind_name, id_))
            return
        self._release(c, kind, i)
        if kind == PUB:
            c.counts_dirty = True

    def _release(self, c, kind, i):
        """Client c gives up entry i of its `kind` ids; a slot nobody holds any more is released
        on the ROS side now, or once it is reachable again (`stale`)."""
        reg = self.registry
        topic = reg.table(kind).topic[reg.slot_at(c, kind, i)]
        slot = reg.release(c, kind, i)
        if kind == SUB:
            self._local_subs_changed(topic)
        if slot < 0:
            return
        if not self.ros_ready:
            reg.table(kind).stale[slot] = 1
        elif kind == PUB:
            self.ros.unadvertise(slot)
        else:
            self.ros.unsubscribe(slot)

    def _local_subs_changed(self, topic):
        """Publishers of `topic` see a new count: local subscribers are part of it."""
        slot = self.pubs.find(topic)
        if slot >= 0 and self.pubs.count[slot] >= 0:
            self._mark_counts(slot)

    def _mark_counts(self, slot):
        for c in self.clients:
            if c.state != S_FREE and self.registry.next_on(c, PUB, slot, 0) >= 0:
                c.counts_dirty = True

    # -- output helpers --------------------------------------------------------------------------
    def _send(self, c, op, payload):
        if c.queue.push_control(op, payload):
            c.tx_frames += 1
            self.stats["frames_out"] += 1
        else:
            c.dropped += 1
            self.stats["dropped_queue"] += 1

    def _send_json(self, c, op, obj):
        self._send(c, op, json.dumps(obj).encode())

    def _error(self, c, id_, code, message):
        self.stats["errors_sent"] += 1
        self._log("warning", "client %d: ERROR %s (id %s): %s" % (c.index, code, id_, message))
        self._send_json(c, OP_ERROR, {"id": id_, "code": code, "message": message})

    def _close(self, c, reason):
        c.state = S_CLOSING
        c.close_reason = reason
        c.close_ms = self.now

    def _send_counts(self, c, now):
        counts = {}
        for i in range(c.max_pubs):
            if c.pub_id[i] >= 0:
                slot = c.pub_slot[i]
                n = self.pubs.count[slot]
                if n >= 0:
                    # The companion counts foreign ROS subscribers only; clients of this gateway
                    # subscribed to the same topic listen too, through its one shared reader.
                    j = self.subs.find(self.pubs.topic[slot])
                    if j >= 0:
                        n += self.subs.refs[j]
                    counts[str(c.pub_id[i])] = n
        c.counts_dirty = False
        c.counts_sent_ms = now
        self._send_json(c, OP_SUB_COUNT, {"counts": counts})

    # -- GatewaySink: calls from the ROS side ----------------------------------------------------
    def ros_up(self, distro, max_message):
        self.ros_ready = True
        self.ros_distro = distro or "unknown"
        self.ros_max_message = min(max_message, self.p["max_payload"])
        self._log("info", "ROS side up (%s, messages up to %d bytes)" % (distro, max_message))
        # Releases that happened while it was unreachable first (a resumed link session still
        # holds those entities), then every live registration: a restarted ROS side has nothing.
        for t in (self.pubs, self.subs):
            for slot in range(t.size):
                if t.stale[slot]:
                    t.stale[slot] = 0
                    if t is self.pubs:
                        self.ros.unadvertise(slot)
                    else:
                        self.ros.unsubscribe(slot)
        for t in (self.pubs, self.subs):
            for slot in range(t.size):
                if t.refs[slot]:
                    if t is self.pubs:
                        self.ros.advertise(slot, t.topic[slot], t.type[slot], t.qos[slot])
                    else:
                        self.ros.subscribe(slot, t.topic[slot], t.type[slot], t.qos[slot])

    def ros_down(self):
        if self.ros_ready:
            self._log("warning", "ROS side unreachable; keeping registrations")
        self.ros_ready = False

    def ros_result(self, kind, slot, code, message):
        if code is None:
            return
        k = PUB if kind == "pub" else SUB
        reg = self.registry
        if not reg.holds(k, slot):
            return
        # The ROS side refused the slot: every registration on it ends, with an ERROR to its
        # owner; the last release frees the slot (the ROS side holds nothing: nothing to undo).
        topic = reg.table(k).topic[slot]
        for c in self.clients:
            if c.state == S_FREE:
                continue
            i = reg.next_on(c, k, slot, 0)
            while i >= 0:
                self._error(c, reg.id_at(c, k, i), code, message)
                reg.release(c, k, i)
                i = reg.next_on(c, k, slot, i + 1)
        if k == SUB:
            self._local_subs_changed(topic)

    def ros_error(self, kind, slot, code, message):
        k = PUB if kind == "pub" else SUB
        reg = self.registry
        if not reg.holds(k, slot):
            return
        now = self.now
        for c in self.clients:
            if c.state != S_READY:
                continue
            if k == PUB and self.publishing >= 0 and c.index != self.publishing:
                continue  # a failed publish concerns the client that published
            i = reg.next_on(c, k, slot, 0)
            while i >= 0:
                id_ = reg.id_at(c, k, i)
                if c.should_report(code, id_, now):
                    self._error(c, id_, code, message)
                i = reg.next_on(c, k, slot, i + 1)

    def ros_message(self, slot, buf, off, n):
        if not self.registry.holds(SUB, slot):
            return
        for c in self.clients:
            if c.state != S_READY or not c.sub_refs[slot]:
                continue
            ids = c.sub_id
            left = c.sub_refs[slot]  # this client's ids on the slot: stop after the last one
            j = next_held(ids, c.sub_slot, slot, 0)
            while j >= 0:
                if c.queue.push_message(OP_MESSAGE, ids[j], buf, off, n):
                    c.tx_frames += 1
                    self.stats["message_out"] += 1
                else:
                    c.dropped += 1
                    self.stats["dropped_queue"] += 1
                left -= 1
                j = next_held(ids, c.sub_slot, slot, j + 1) if left > 0 else -1

    def ros_sub_count(self, slot, count):
        if not self.registry.holds(PUB, slot):
            return
        if self.pubs.count[slot] == count:
            return
        self.pubs.count[slot] = count
        self._mark_counts(slot)

    # -- statistics --------------------------------------------------------------------------
    def counters(self):
        s = dict(self.stats)
        s["clients"] = self.active_clients()
        s["pub_topics"] = self.pubs.used()
        s["sub_topics"] = self.subs.used()
        evicted = refused = queued = 0
        for c in self.clients:
            evicted += c.queue.evicted
            refused += c.queue.refused
            queued += c.queue.pending()
        s["evicted"] = evicted
        s["queue_refused"] = refused
        s["queued_bytes"] = queued
        s["ros_ready"] = self.ros_ready
        return s


def _parse_id(msg):
    id_ = msg.get("id")
    if not isinstance(id_, int) or isinstance(id_, bool) or id_ < 0 or id_ >= 0x40000000:
        raise ProtocolError("'id' must be an integer from 0 to 2**30-1", None)
    return id_


def _parse_qos(q, id_):
    """Canonical QoS dict; a missing qos means the ROS 2 default (reliable, volatile, depth 10)."""
    if q is None:
        q = {}
    if not isinstance(q, dict):
        raise ProtocolError("'qos' must be an object", id_)
    rel = q.get("reliability", "reliable")
    dur = q.get("durability", "volatile")
    depth = q.get("depth", 10)
    if rel not in RELIABILITIES:
        raise ProtocolError("qos.reliability must be reliable or best_effort", id_)
    if dur not in DURABILITIES:
        raise ProtocolError("qos.durability must be volatile or transient_local", id_)
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0 or depth > 100000:
        raise ProtocolError("qos.depth must be an integer from 0 to 100000", id_)
    # KEEP_LAST(0) is KEEP_LAST(1) in ROS 2: the same QoS, never a conflict.
    return {"reliability": rel, "durability": dur, "depth": depth if depth > 0 else 1}


def _qos_text(q):
    return "%s/%s/depth %d" % (q["reliability"], q["durability"], q["depth"])


# ---------------------------------------------------------------------------
# Link: gateway <-> companion over serial or UDP (sans-IO).  Layout and
# reasoning: docs/LINK.md.  Self-contained section: it only needs struct,
# sys, json and (optionally) binascii; no sockets, clocks or threads.
# Time `now` is an int of milliseconds; bytes travel as (buf, off, n).
# ---------------------------------------------------------------------------
LK_VERSION = 1
LK_SYNC0 = 0xA5
LK_SYNC1 = 0x4E
_LK_SYNC = b"\xa5\x4e"
LK_HDR = 8          # sync(2) len(2) ctl(1) hck(1) seq(1) ack(1)
LK_OVH = 12         # header + CRC-32
LK_RESIDUE = 0x2144DF1C  # CRC-32 of (frame + its own CRC, LE): a small int on MicroPython
LK_RHDR_MAX = 8     # record header: type(1) slot varint(<=3) len varint(<=4)

# frame kinds (low nibble of ctl)
LK_HELLO = 1
LK_REL = 2
LK_BE = 3
LK_ACK = 4
LK_BEFRAG = 5
LK_NAK = 0x10       # ctl flag: "I miss frame <ack>"

# results of LinkSession.send
LINK_DOWN = 0  # session states: handshaking (HELLOs until the peer answers) or down
LINK_UP = 1

LK_OK = 0
LK_TOO_LARGE = 1
LK_FULL = 2
LK_DOWN = 3

# timers (ms); see docs/LINK.md "Timers"
LK_HELLO_MS = 250
LK_HB_MS = 400
LK_DEAD_MS = 2000
LK_RTO_INIT = 500
LK_RTO_MIN = 40
LK_RTO_MAX = 2000
LK_FRAG_MS = 2000
LK_ACK_REP_MS = 30
LK_STATS_SHARE = 200  # stats take at most 1/200 of a paced line's time (see send_stats)
LK_STATS_MAX_MS = 10000  # ... and wait for an idle link at most this long
LK_STATS_CHUNK = 128  # bytes of counters per stats record on a paced line (11 ms at 115200)
LK_WMAX = 32        # largest window; frame table has 64 entries indexed by seq & 63

# record types of the app layer (LinkRosPort <-> LinkCompanionEnd)
LK_T_ADV = 1
LK_T_UNADV = 2
LK_T_SUB = 3
LK_T_UNSUB = 4
LK_T_PUB = 5
LK_T_MSG = 6
LK_T_RESULT = 7
LK_T_ERROR = 8
LK_T_SUBCOUNT = 9
LK_T_CHELLO = 10
LK_T_STATS = 11
LK_STATS_SLOT = 0xFFFF


def _lk_t8():
    # CRC-8 (poly 0x07) table for the 1-byte header check
    t = bytearray(256)
    for i in range(256):
        c = i
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else (c << 1) & 0xFF
        t[i] = c
    return bytes(t)


_LK_T8 = _lk_t8()


def lk_hck(b0, b1, b2):
    t = _LK_T8
    return t[t[t[0xFF ^ b0] ^ b1] ^ b2]


def _lk_crc(buf, off, n, seed):
    if off == 0 and n == len(buf):
        return _lk_crc32(buf, seed)
    return _lk_crc32(memoryview(buf)[off:off + n], seed)


def _lk_putvar(b, p, v):
    while v >= 0x80:
        b[p] = (v & 0x7F) | 0x80
        v >>= 7
        p += 1
    b[p] = v
    return p + 1


def _lk_ring_put(ring, pos, src, soff, n):
    cap = len(ring)
    k = cap - pos
    if k >= n:
        copy_into(ring, pos, src, soff, n)
    else:
        copy_into(ring, pos, src, soff, k)
        copy_into(ring, 0, src, soff + k, n - k)


def _lk_ring_get(dst, doff, ring, pos, n):
    cap = len(ring)
    k = cap - pos
    if k >= n:
        copy_into(dst, doff, ring, pos, n)
    else:
        copy_into(dst, doff, ring, pos, k)
        copy_into(dst, doff + k, ring, 0, n - k)


# ---- link configuration: one grammar, one sizing, one pacing, for every port ----------------
LINK_DEFAULT_UDP_PORT = 8269
LINK_DEFAULT_MTU = 1400      # largest UDP datagram: fits an Ethernet/Wi-Fi MTU with IP+UDP headers
LINK_SERIAL_FRAME = 1088     # serial frame cap: a 1 KiB message and its headers fit one frame
                             # (95 ms at 115200 baud)
LINK_MAX_MESSAGE = (1 << 23) - 64  # largest message any link session carries (lengths < 2**24)
LINK_PACE_MS = 60            # line time of credit the pacing may bank: a 50 ms loop keeps it busy


def parse_link_url(url):
    """The link grammar of every port and of the companion:

      udp://HOST[:PORT]   ('udp', HOST, PORT); PORT defaults to 8269; HOST may be [v6]
      serial:PATH         ('serial', PATH, 0); PATH is a device or pyserial URL on CPython and a
      uart:ID             UART number on MicroPython (uart:ID is the same as serial:ID)
      none (or empty)     ('none', '', 0): no link, no ROS side

    ValueError, with a sentence for a person, for anything else."""
    if url is None or url == "" or url == "none":
        return "none", "", 0
    if url.startswith("udp://"):
        rest = url[6:].rstrip("/")
        if rest.startswith("["):
            host, _, port = rest[1:].partition("]")
            port = port[1:] if port.startswith(":") else port
        else:
            host, sep, port = rest.rpartition(":")
            if not sep:
                host, port = rest, ""
        if not host:
            raise ValueError("udp:// needs a host, e.g. udp://192.0.2.10:%d"
                             % LINK_DEFAULT_UDP_PORT)
        if not port:
            return "udp", host, LINK_DEFAULT_UDP_PORT
        try:
            return "udp", host, int(port)
        except ValueError:
            raise ValueError("bad port %r in %r" % (port, url))
    for prefix in ("serial:", "uart:"):
        if url.startswith(prefix):
            path = url[len(prefix):]
            if not path:
                raise ValueError("%s needs a device, e.g. serial:/dev/ttyACM0 or uart:1" % prefix)
            return "serial", path, 0
    raise ValueError("unknown link %r: use udp://HOST:PORT or serial:PATH (or none)" % url)


def link_sizes(max_message, datagram, mtu=LINK_DEFAULT_MTU):
    """The buffers of one link session, for either end and every port: a dict with max_message,
    max_frame, window, rel_bytes (reliable send ring), be_bytes (best-effort ring) and total
    (every buffer the session allocates). Rings follow the largest message, so a small profile
    (mcu) gets small rings, a big one room for a few messages in flight."""
    mm = min(max_message, LINK_MAX_MESSAGE)
    frame = mtu if datagram else LINK_SERIAL_FRAME
    # UDP on a LAN sustains a wider window; a serial line or a board's small rx queues do not.
    window = 16 if datagram and mm > 4 * KIB else 8
    rel = max(8 * KIB, 2 * mm, min(4 * mm, 256 * KIB))
    be = max(4 * KIB, mm + 6 + LK_RHDR_MAX, min(2 * mm + 64, 128 * KIB))
    total = frame + (0 if datagram else 2 * frame) + 2 * (mm + LK_RHDR_MAX) + rel + be
    return {"max_message": mm, "max_frame": frame, "window": window, "rel_bytes": rel,
            "be_bytes": be, "total": total}


def new_link_session(handler, epoch, gateway, datagram, max_message, mtu=LINK_DEFAULT_MTU,
                     max_slots=256):
    """A LinkSession sized by link_sizes(): how every port and the companion make one."""
    z = link_sizes(max_message, datagram, mtu)
    return LinkSession(handler, epoch, gateway, datagram, z["max_frame"], z["max_message"],
                       z["window"], z["rel_bytes"], z["be_bytes"], max_slots)


def pace_credit(credit, elapsed_ms, bytes_per_s):
    """Write pacing for a serial line (both ports): the credit, in milli-bytes, after `elapsed_ms`
    more of line time at `bytes_per_s`, capped at LINK_PACE_MS of it. Integers only (floats
    allocate on MicroPython); every value stays < 2**30 for lines up to ~1.7 MB/s."""
    if elapsed_ms > LINK_PACE_MS:
        elapsed_ms = LINK_PACE_MS
    credit += elapsed_ms * bytes_per_s
    cap = LINK_PACE_MS * bytes_per_s
    return credit if credit < cap else cap


class LinkOutput:
    """What a port's link driver writes next, and when: the frame in progress
    (session.tx_buf[off:off + n]) and the serial pacing credit. Both ports' drivers flush with

        out.start(now)
        n = out.next(now)              # bytes to write now; 0: nothing, or pacing says wait
        while n:
            k = transport.write(session.tx_buf, out.off, n)
            if not out.wrote(k):       # partial or refused write: try again on the next flush
                break
            n = out.next(now)

    (bounded by a count), so each keeps only its write call and its error handling."""

    def __init__(self, session, bytes_per_s):
        self.s = session
        session.line_bps = bytes_per_s  # for the session's RTO floor and the stats budget
        self.pace = bytes_per_s  # 0: unpaced (UDP)
        self.credit = 0  # milli-bytes, see pace_credit
        self.last = -1  # time of the last start(), -1 before the first
        self.off = 0
        self.n = 0  # bytes of the current frame not yet written

    def start(self, now):
        if self.pace:
            if self.last >= 0:
                self.credit = pace_credit(self.credit, now - self.last, self.pace)
            self.last = now

    def next(self, now):
        if self.n == 0:
            if self.pace and self.credit <= 0:
                return 0
            n = self.s.poll_tx(now)
            if n == 0:
                return 0
            self.off = 0
            self.n = n
        return self.n

    def wrote(self, k):
        """`k` bytes of the frame went out; True when the frame is done and the next may follow."""
        if k <= 0:
            return False
        self.off += k
        self.n -= k
        if self.pace:
            self.credit -= k * 1000
        return self.n == 0

    def wait_ms(self):
        """How long until the pacing lets the next frame out (0: now); a loop with a frame
        to send sleeps no longer than this, so a paced line does not sit idle."""
        if self.pace and self.credit <= 0:
            return -self.credit // self.pace + 1
        return 0

    def drop(self):
        """The device is gone with a half-written frame: the peer resyncs, we start afresh."""
        self.n = 0

    def rebase(self, d):
        if self.last >= 0:
            self.last -= d


_LK_COUNTERS = (
    "rx_frames", "tx_frames", "rx_bytes", "tx_bytes", "crc_err", "hdr_err", "resync",
    "noise", "retx", "timeouts", "fast_retx", "dup", "ooo", "drop_be", "drop_be_down",
    "drop_rel_full", "drop_down", "too_large", "rel_reset_bytes", "frag_tx", "frag_rx",
    "frag_drop", "up", "down", "new", "hello_tx", "hello_rx", "proto", "stale", "trunc")


class LinkSession:
    """One end of the link.  handler gets link_up(fresh), link_down() and
    link_message(type, slot, buf, off, n, reliable); buf is only valid during
    the call."""

    def __init__(self, handler, epoch, gateway=True, datagram=False,
                 max_frame=1024, max_message=16384, window=8,
                 rel_bytes=65536, be_bytes=32768, max_slots=256):
        if max_frame < 64 or max_frame > 65535:
            raise ValueError("max_frame")
        if max_message >= 1 << 24:
            raise ValueError("max_message")
        self.handler = handler
        # -- who we are, and the peer as its HELLO describes it ------------------------------
        self.epoch = (epoch & 0xFFFFFFFF) or 1  # this incarnation; a new one resets the stream
        self.is_gateway = gateway
        self.datagram = datagram  # UDP: one frame per datagram; serial: a byte stream to resync
        self.max_frame = max_frame
        self.max_message = max_message
        self.window = max(1, min(window, LK_WMAX))
        self.max_slots = max_slots
        self.state = LINK_DOWN
        self.fresh = True  # the next LINK_UP is a new peer (its registrations must be re-sent)
        self.peer_epoch = 0
        self.seed = 0  # CRC seed of this session: both epochs, so stale frames fail the check
        self.peer_max_frame = 0
        self.peer_max_message = 0
        self.peer_window = 1
        # -- time and liveness (ms) ------------------------------------------------------------
        self.now = 0
        self.hello_at = 0
        self.hello_reply = False
        self.last_rx = 0
        self.last_tx = 0
        self.srtt = 0
        self.rttvar = 0
        self.rto = LK_RTO_INIT
        self.line_bps = 0  # paced line rate (bytes/s; LinkOutput sets it), 0: fast or unknown
        # -- framing: one frame out at a time, the stream being resynchronised on input ---------
        self.tx_buf = bytearray(max_frame)
        self.tx_mv = memoryview(self.tx_buf)
        self.rx = bytearray(0 if datagram else 2 * max_frame)  # stream mode only
        self.rx_n = 0
        self.rec_header = bytearray(LK_RHDR_MAX)  # scratch: a record header being written
        # record header being parsed: type, slot, length (varints)
        self.hdr_var = self.hdr_slot = self.hdr_type = self.hdr_len = 0
        # -- reliable class: a ring of wire records, go-back-N over a 64-entry frame table ------
        self.rel = bytearray(rel_bytes)
        self.rel_res = min(4096, rel_bytes // 4)  # reserved for control records
        self.rel_queued = 0
        self.frame_off = [0] * 64  # per sequence number (seq & 63): where its body is in `rel`
        self.frame_len = [0] * 64
        self.frame_sent_at = [0] * 64
        self.frame_retx = bytearray(64)
        self.rec_buf = bytearray(max_message + LK_RHDR_MAX)  # a reliable record being assembled
        # -- best-effort class: newest wins per slot, big records go out in fragments -----------
        self.be = bytearray(be_bytes)  # ring of (6-byte tag + record)
        self.be_tag = bytearray(6)
        self.be_last = [-1] * (max_slots + 1)  # per slot: ring position of its newest record
        # per slot: how many pending records may wait (the topic's KEEP_LAST depth, <= 255;
        # set_depth) and how many do (live, not started)
        self.be_depth = bytearray(b"\x01" * (max_slots + 1))
        self.be_cnt = bytearray(max_slots + 1)
        self.frag_buf = bytearray(max_message + LK_RHDR_MAX)  # a fragmented record reassembled
        # -- counters: plain ints (increments allocate nothing); counters() reports every
        # name of _LK_COUNTERS (as c_<name>): a new counter goes here and there
        self.c_rx_frames = self.c_tx_frames = self.c_rx_bytes = self.c_tx_bytes = 0
        self.c_crc_err = self.c_hdr_err = self.c_resync = self.c_noise = 0
        self.c_retx = self.c_timeouts = self.c_fast_retx = self.c_dup = self.c_ooo = 0
        self.c_drop_be = self.c_drop_be_down = self.c_drop_rel_full = 0
        self.c_drop_down = self.c_too_large = self.c_rel_reset_bytes = 0
        self.c_frag_tx = self.c_frag_rx = self.c_frag_drop = 0
        self.c_up = self.c_down = self.c_new = self.c_hello_tx = self.c_hello_rx = 0
        self.c_proto = self.c_stale = self.c_trunc = 0
        self._reset_stream()

    # ---- state ---------------------------------------------------------
    def _reset_stream(self):
        # a new peer incarnation: nothing of the old stream may leak into it
        self.c_rel_reset_bytes += self.rel_queued
        self.una = self.nxt = self.snd = 0
        self.rel_head = self.rel_queued = self.rel_framed = 0
        self.rel_rx_expected = 0
        self.ack_pending = False
        self.ack_rep = 0
        self.nak_pending = False
        self.nak_for = -1
        self.nak_t = 0
        self.go_back_at = -100000
        self.rec_have = 0
        self.rec_need = 0
        self.rec_header_have = 0
        self.rec_type = self.rec_slot = self.rec_length = 0
        self.skip = 0
        self.frag_active = False
        self.frag_total = self.frag_have = self.frag_seq = self.frag_started_at = 0
        self.be_head = self.be_n = self.be_live = self.be_sent_part = 0
        self.be_seq = 0
        self.be_hi = 255
        self.be_mask = 0
        for i in range(len(self.be_last)):
            self.be_last[i] = -1
            self.be_cnt[i] = 0
        self.turn = 0

    def is_up(self):
        return self.state == LINK_UP

    def max_send(self):
        """Largest message send() accepts in both classes right now."""
        m = self.peer_max_message
        r = len(self.rel) - self.rel_res - LK_RHDR_MAX
        b = len(self.be) - 6 - LK_RHDR_MAX
        if r < m:
            m = r
        if b < m:
            m = b
        return m if m > 0 else 0

    def set_depth(self, slot, depth):
        """Best-effort records of `slot` keep the newest `depth` (its KEEP_LAST depth, capped at
        255) while they wait for the line, instead of only the newest: on a busy line several of
        them share one frame (docs/LINK.md, "Best-effort")."""
        if slot < self.max_slots:
            self.be_depth[slot] = 1 if depth < 1 else (255 if depth > 255 else depth)

    def rel_room(self, n):
        """True when a reliable data record of `n` payload bytes should be queued now: it fits
        the ring (minus the control reserve) and what is queued but not yet framed stays below
        one window of frames. The link then always has its next window ready, and a burst waits
        where it came from (the client's socket, a DDS reader) instead of in the ring, where it
        would delay registrations and results by the whole ring's line time."""
        q = self.rel_queued
        if q + n + LK_RHDR_MAX > len(self.rel) - self.rel_res:
            return False
        return q - self.rel_framed < self.peer_window * self.peer_max_frame

    def counters(self):
        d = {}
        for k in _LK_COUNTERS:
            d[k] = getattr(self, "c_" + k)
        d["is_up"] = self.state
        d["rel_queued"] = self.rel_queued
        d["be_queued"] = self.be_n
        d["srtt_ms"] = self.srtt
        d["rto_ms"] = self.rto
        return d

    # ---- sending -----------------------------------------------------------
    def send(self, t, slot, buf, off, n, reliable, control=False):
        """Queue one message; LK_OK or LK_TOO_LARGE / LK_FULL / LK_DOWN."""
        if self.peer_epoch == 0:
            self.c_drop_down += 1
            return LK_DOWN
        if n > self.max_send():
            self.c_too_large += 1
            return LK_TOO_LARGE
        hb = self.rec_header
        hb[0] = t
        h = _lk_putvar(hb, 1, slot)
        h = _lk_putvar(hb, h, n)
        need = h + n
        if n + h > self.peer_max_frame - LK_OVH:
            self.c_frag_tx += 1
        if reliable:
            cap = len(self.rel)
            lim = cap if control else cap - self.rel_res
            if self.rel_queued + need > lim:
                self.c_drop_rel_full += 1
                return LK_FULL
            pos = self.rel_head + self.rel_queued
            if pos >= cap:
                pos -= cap
            _lk_ring_put(self.rel, pos, hb, 0, h)
            pos += h
            if pos >= cap:
                pos -= cap
            _lk_ring_put(self.rel, pos, buf, off, n)
            self.rel_queued += need
            return LK_OK
        if self.state != LINK_UP:
            self.c_drop_be_down += 1
            return LK_DOWN
        be = self.be
        cap = len(be)
        key = slot if slot < self.max_slots else self.max_slots
        if self.be_cnt[key] >= self.be_depth[key]:  # newest win: the oldest pending one dies
            self._be_kill(key)
        tot = 6 + need
        while cap - self.be_n < tot:      # full: drop the oldest
            if self._be_pop():
                self.c_drop_be += 1
        pos = self.be_head + self.be_n
        if pos >= cap:
            pos -= cap
        self.be_last[key] = pos
        self.be_cnt[key] += 1
        tag = self.be_tag                    # live, key(2), record length(3)
        tag[0] = 1
        tag[1] = key & 0xFF
        tag[2] = key >> 8
        tag[3] = need & 0xFF
        tag[4] = (need >> 8) & 0xFF
        tag[5] = need >> 16
        _lk_ring_put(be, pos, tag, 0, 6)
        p = pos + 6
        if p >= cap:
            p -= cap
        _lk_ring_put(be, p, hb, 0, h)
        p += h
        if p >= cap:
            p -= cap
        _lk_ring_put(be, p, buf, off, n)
        self.be_n += tot
        self.be_live += 1
        return LK_OK

    def _be_kill(self, key):
        # the oldest pending (live, not started) record of `key` is superseded: mark it dead
        be = self.be
        cap = len(be)
        pos = self.be_last[key]
        if self.be_cnt[key] > 1:          # depth > 1: find the oldest from the head
            h = self.be_head
            left = self.be_n
            while left > 0:
                w = 6 + (be[(h + 3) % cap] | (be[(h + 4) % cap] << 8) |
                         (be[(h + 5) % cap] << 16))
                if be[h] and (be[(h + 1) % cap] | (be[(h + 2) % cap] << 8)) == key and \
                        not (h == self.be_head and self.be_sent_part > 0):
                    pos = h
                    break
                h = (h + w) % cap
                left -= w
        be[pos] = 0
        self.be_live -= 1
        self.be_cnt[key] -= 1
        if self.be_last[key] == pos:
            self.be_last[key] = -1
        self.c_drop_be += 1

    def _be_pop(self):
        # drop the head record of the best-effort ring; True if it was live
        be = self.be
        cap = len(be)
        h = self.be_head
        live = be[h]
        key = be[(h + 1) % cap] | (be[(h + 2) % cap] << 8)
        w = be[(h + 3) % cap] | (be[(h + 4) % cap] << 8) | (be[(h + 5) % cap] << 16)
        if self.be_last[key] == h:
            self.be_last[key] = -1
        if live:
            self.be_live -= 1
            if self.be_sent_part == 0:    # not started: it was counted as pending
                self.be_cnt[key] -= 1
        h += 6 + w
        self.be_head = h % cap
        self.be_n -= 6 + w
        self.be_sent_part = 0
        return live

    def _head(self, kind, seq, n_body):
        # fill sync/len/ctl/hck/seq/ack; returns total frame length
        b = self.tx_buf
        L = n_body + LK_OVH
        ctl = kind
        if self.nak_pending and kind != LK_HELLO:
            ctl |= LK_NAK
            self.nak_pending = False
        b[0] = LK_SYNC0
        b[1] = LK_SYNC1
        b[2] = L & 0xFF
        b[3] = L >> 8
        b[4] = ctl
        b[5] = lk_hck(b[2], b[3], ctl)
        b[6] = seq
        b[7] = self.rel_rx_expected
        return L

    def _seal(self, L, seed, now):
        # On MicroPython the slice (16 B) and, 3 times in 4, the CRC value (a big int,
        # 32 B) are the only allocations of a sent frame; pack_into takes the big int
        # as is (c & 0xFF etc. would each allocate another one).
        struct.pack_into("<I", self.tx_buf, L - 4, _lk_crc32(self.tx_mv[0:L - 4], seed))
        self.last_tx = now
        # repeat a fresh ack once if nothing else follows it (a lost pure ACK would otherwise
        # stall the sender until its RTO); any later frame carries the ack and cancels that
        self.ack_rep = now + LK_ACK_REP_MS if self.ack_pending else 0
        self.ack_pending = False
        self.c_tx_frames += 1
        self.c_tx_bytes += L
        return L

    def _hello(self, now):
        b = self.tx_buf
        L = self._head(LK_HELLO, 0, 18)
        b[8] = LK_VERSION
        b[9] = 0 if self.is_gateway else 1
        struct.pack_into("<IIHIBB", b, 10, self.epoch, self.peer_epoch,
                         self.max_frame, self.max_message, self.window,
                         0 if self.state == LINK_UP else 1)
        self.hello_reply = False
        self.hello_at = now + LK_HELLO_MS
        self.c_hello_tx += 1
        return self._seal(L, 0, now)

    def poll_tx(self, now):
        """Build the next frame in tx_buf; returns its length (0: nothing)."""
        self.now = now
        if self.state != LINK_UP:
            if now - self.hello_at >= 0 or self.hello_reply:
                return self._hello(now)
            return 0
        if self.hello_reply:
            return self._hello(now)
        self._timer(now)
        rel = self.snd != self.nxt or (self.rel_queued > self.rel_framed and
                                       ((self.nxt - self.una) & 255) < self.peer_window)
        if rel and (self.turn == 0 or self.be_live == 0):
            self.turn = 1
            return self._rel_frame(now)
        if self.be_live > 0:
            self.turn = 0
            return self._be_frame(now)
        if self.ack_pending or self.nak_pending or now - self.last_tx >= LK_HB_MS or \
                (self.ack_rep and now - self.ack_rep >= 0):
            self.ack_rep = 0
            return self._seal(self._head(LK_ACK, 0, 0), self.seed, now)
        return 0

    def _rel_frame(self, now):
        s = self.snd
        i = s & 63
        if s == self.nxt:                    # new frame: as much as fits
            n = self.rel_queued - self.rel_framed
            m = self.peer_max_frame - LK_OVH
            if n > m:
                n = m
            pos = self.rel_head + self.rel_framed
            cap = len(self.rel)
            if pos >= cap:
                pos -= cap
            self.frame_off[i] = pos
            self.frame_len[i] = n
            self.frame_retx[i] = 0
            self.rel_framed += n
            self.nxt = (s + 1) & 255
        else:                                # go-back-N: same boundaries as before
            self.frame_retx[i] = 1
            self.c_retx += 1
            n = self.frame_len[i]
        L = self._head(LK_REL, s, n)
        _lk_ring_get(self.tx_buf, LK_HDR, self.rel, self.frame_off[i], n)
        self.frame_sent_at[i] = now
        self.snd = (s + 1) & 255
        return self._seal(L, self.seed, now)

    def _be_frame(self, now):
        be = self.be
        cap = len(be)
        tx = self.tx_buf
        m = self.peer_max_frame - LK_OVH
        q = LK_HDR
        kind = LK_BE
        while self.be_n > 0:
            h = self.be_head
            w = be[(h + 3) % cap] | (be[(h + 4) % cap] << 8) | (be[(h + 5) % cap] << 16)
            if not be[h]:
                self._be_pop()
                continue
            if self.be_sent_part > 0 or w > m:
                if q > LK_HDR:
                    break
                if self.be_sent_part == 0:        # started: no longer replaceable
                    key = be[(h + 1) % cap] | (be[(h + 2) % cap] << 8)
                    if self.be_last[key] == h:
                        self.be_last[key] = -1
                    self.be_cnt[key] -= 1
                q = _lk_putvar(tx, q, w)
                q = _lk_putvar(tx, q, self.be_sent_part)
                k = w - self.be_sent_part
                if k > m - (q - LK_HDR):
                    k = m - (q - LK_HDR)
                _lk_ring_get(tx, q, be, (h + 6 + self.be_sent_part) % cap, k)
                q += k
                self.be_sent_part += k
                if self.be_sent_part == w:
                    self._be_pop()
                kind = LK_BEFRAG
                self.c_frag_tx += 1
                break
            if q + w > LK_HDR + m:
                break
            _lk_ring_get(tx, q, be, (h + 6) % cap, w)
            q += w
            self._be_pop()
        if q == LK_HDR:
            return 0
        L = self._head(kind, self.be_seq, q - LK_HDR)
        self.be_seq = (self.be_seq + 1) & 255
        return self._seal(L, self.seed, now)

    # ---- time ----------------------------------------------------------------
    def _timer(self, now):
        # retransmission timeout on the oldest unacked frame -> go back N
        if self.nxt != self.una and self.snd != self.una:
            if now - self.frame_sent_at[self.una & 63] >= self.rto:
                self.snd = self.una
                self.c_timeouts += 1
                self.rto = min(self.rto * 2, LK_RTO_MAX)

    def tick(self, now):
        self.now = now
        if self.state == LINK_UP:
            if now - self.last_rx >= LK_DEAD_MS:
                self.state = LINK_DOWN
                self.c_down += 1
                self.hello_at = now
                self.handler.link_down()
            else:
                self._timer(now)
        if self.frag_active and now - self.frag_started_at >= LK_FRAG_MS:
            self.frag_active = False
            self.c_frag_drop += 1

    def rebase(self, d):
        """Move every stored time `d` ms back (see Gateway.rebase)."""
        self.now -= d
        self.hello_at -= d
        self.last_rx -= d
        self.last_tx -= d
        if self.ack_rep:  # 0 means "no repeat scheduled"
            self.ack_rep -= d
        self.nak_t -= d
        self.go_back_at -= d
        self.frag_started_at -= d
        t = self.frame_sent_at
        for i in range(len(t)):
            t[i] -= d

    # ---- receiving -----------------------------------------------------------
    def feed(self, buf, off, n, now):
        """Bytes arrived (stream: any chunking; datagram: one datagram)."""
        self.now = now
        self.c_rx_bytes += n
        end = off + n
        if self.datagram:
            p = self._parse(buf, off, end)
            if p < end:
                self.c_trunc += 1
                self.c_noise += end - p
            return
        rx = self.rx
        while off < end:
            if self.rx_n == 0:               # fast path: frames straight from buf
                p = self._parse(buf, off, end)
                k = end - p
                copy_into(rx, 0, buf, p, k)    # k < max_frame by construction
                self.rx_n = k
                return
            k = len(rx) - self.rx_n
            if k > end - off:
                k = end - off
            copy_into(rx, self.rx_n, buf, off, k)
            off += k
            self.rx_n += k
            p = self._parse(rx, 0, self.rx_n)
            k = self.rx_n - p
            if p > 0 and k > 0:
                copy_into(rx, 0, rx, p, k)
            self.rx_n = k

    def _parse(self, b, p, end):
        # returns the first byte not consumed (a frame still incomplete)
        while p < end:
            i = b.find(_LK_SYNC, p, end)
            if i < 0:
                k = end - 1 if b[end - 1] == LK_SYNC0 else end
                if k > p:
                    self.c_noise += k - p
                    self.c_resync += 1
                return k
            if i > p:
                self.c_noise += i - p
                self.c_resync += 1
                p = i
            if end - p < 6:
                return p
            L = b[p + 2] | (b[p + 3] << 8)
            ctl = b[p + 4]
            if lk_hck(b[p + 2], b[p + 3], ctl) != b[p + 5] or L < LK_OVH or L > self.max_frame:
                self.c_hdr_err += 1
                p += 1
                continue
            if end - p < L:
                return p
            kind = ctl & 15
            if _lk_crc(b, p, L, 0 if kind == LK_HELLO else self.seed) != LK_RESIDUE:
                self.c_crc_err += 1
                p += 1
                continue
            self._frame(b, p, L, ctl)
            p += L
        return p

    def _frame(self, b, p, L, ctl):
        now = self.now
        kind = ctl & 15
        self.c_rx_frames += 1
        if kind == LK_HELLO:
            self._on_hello(b, p + LK_HDR, L - LK_OVH, now)
            return
        if self.state != LINK_UP:
            self.c_stale += 1
            return
        self.last_rx = now
        self._on_ack(b[p + 7], ctl & LK_NAK, now)
        seq = b[p + 6]
        end = p + L - 4
        if kind == LK_REL:
            d = (seq - self.rel_rx_expected) & 255
            if d == 0:
                self.rel_rx_expected = (self.rel_rx_expected + 1) & 255
                self.ack_pending = True
                self.nak_for = -1
                self._rel_body(b, p + LK_HDR, end)
            elif d < 128:
                self.c_ooo += 1
                if self.nak_for != self.rel_rx_expected or now - self.nak_t >= LK_ACK_REP_MS:
                    self.nak_pending = True
                    self.nak_for = self.rel_rx_expected
                    self.nak_t = now
            else:
                self.c_dup += 1
                self.ack_pending = True
        elif kind == LK_BE or kind == LK_BEFRAG:
            if self._be_dup(seq):
                self.c_dup += 1
            elif kind == LK_BE:
                self._be_body(b, p + LK_HDR, end)
            else:
                self._be_frag(b, p + LK_HDR, end, seq, now)
        elif kind != LK_ACK:
            self.c_proto += 1

    def _be_dup(self, seq):
        # anti-replay window (as in IPsec): best-effort frames are never delivered twice
        # (UDP may duplicate them); bit i of be_mask is seq be_hi-1-i; 24 bits stay small ints
        d = (seq - self.be_hi) & 255
        if d == 0:
            return True
        if d < 128:
            if d > 24:
                self.be_mask = 0
            else:
                m = self.be_mask & ((1 << (24 - d)) - 1)
                self.be_mask = (m << d) | (1 << (d - 1))
            self.be_hi = seq
            return False
        d = (self.be_hi - seq) & 255
        if d > 24:
            return True             # too old to tell: treat as stale
        bit = 1 << (d - 1)
        if self.be_mask & bit:
            return True
        self.be_mask |= bit
        return False

    def _on_hello(self, b, p, n, now):
        if n < 18 or b[p] != LK_VERSION or b[p + 1] == (0 if self.is_gateway else 1):
            self.c_proto += 1       # other version, or two ends of the same role
            return
        pe, ye, pf, pm, pw, need = struct.unpack_from("<IIHIBB", b, p + 2)
        self.c_hello_rx += 1
        if pe != self.peer_epoch:
            # the peer is a new incarnation: the old session is gone for good
            if self.state == LINK_UP:
                self.state = LINK_DOWN
                self.c_down += 1
                self.handler.link_down()
            self._reset_stream()
            self.peer_epoch = pe
            self.fresh = True
            self.c_new += 1
            if self.is_gateway:
                self.seed = (self.epoch * 31 + pe) & 0x3FFFFFFF
            else:
                self.seed = (pe * 31 + self.epoch) & 0x3FFFFFFF
        self.peer_max_frame = min(pf, self.max_frame)
        self.peer_max_message = pm
        self.peer_window = max(1, min(pw, LK_WMAX))
        self.last_rx = now
        if ye != self.epoch:
            if self.state == LINK_UP:
                self.state = LINK_DOWN
                self.c_down += 1
                self.handler.link_down()
            self.hello_reply = True
            return
        if need:
            self.hello_reply = True
        if self.state != LINK_UP:
            self.state = LINK_UP
            self.c_up += 1
            self.snd = self.una        # resume: resend whatever was unacked
            self.nak_for = -1
            fresh = self.fresh
            self.fresh = False
            self.handler.link_up(fresh)

    def _on_ack(self, a, nak, now):
        una = self.una
        k = (a - una) & 255
        inflight = (self.nxt - una) & 255
        if 0 < k <= inflight:
            cap = len(self.rel)
            last = -1
            while una != a:
                i = una & 63
                L = self.frame_len[i]
                h = self.rel_head + L
                if h >= cap:
                    h -= cap
                self.rel_head = h
                self.rel_queued -= L
                self.rel_framed -= L
                last = i if not self.frame_retx[i] else -1
                una = (una + 1) & 255
            if ((self.snd - self.una) & 255) < k:
                self.snd = a
            self.una = a
            if last >= 0:
                self._rtt(now - self.frame_sent_at[last])
            inflight -= k
        if nak and inflight and self.snd != una:
            # the peer saw a gap at `una`: go back now rather than at RTO
            if now - self.go_back_at >= (self.srtt if self.srtt > 10 else 10):
                self.go_back_at = now
                self.snd = una
                self.c_fast_retx += 1

    def _rtt(self, r):
        if self.srtt == 0:
            self.srtt = r if r > 0 else 1
            self.rttvar = r >> 1
        else:
            d = self.srtt - r
            if d < 0:
                d = -d
            self.rttvar = (3 * self.rttvar + d) >> 2
            self.srtt = (7 * self.srtt + r) >> 3
        v = self.rttvar * 4
        if v < 20:
            v = 20
        r = self.srtt + v
        lo = LK_RTO_MIN
        if self.line_bps:
            # an ACK may wait behind a whole frame each way: never time out faster than that
            lo += 2 * self.peer_max_frame * 1000 // self.line_bps
        self.rto = lo if r < lo else (LK_RTO_MAX if r > LK_RTO_MAX else r)

    def _varint(self, b, q, end, max_shift):
        # LEB128 at b[q:end] into self.hdr_var; the offset after it, 0 if incomplete, -1 if too long
        v = 0
        sh = 0
        while True:
            if q >= end:
                return 0
            c = b[q]
            q += 1
            v |= (c & 0x7F) << sh
            if c < 0x80:
                self.hdr_var = v
                return q
            sh += 7
            if sh > max_shift:
                return -1

    def _hdr(self, b, p, end):
        # parse a record header; 0: incomplete, -1: malformed, else its length
        if p >= end:
            return 0
        q = self._varint(b, p + 1, end, 14)
        if q <= 0:
            return q
        self.hdr_slot = self.hdr_var
        q = self._varint(b, q, end, 21)
        if q <= 0:
            return q
        self.hdr_type = b[p]
        self.hdr_len = self.hdr_var
        return q - p

    def _rel_body(self, b, p, end):
        # the reliable channel is a byte stream of records: they may span frames
        while p < end:
            if self.skip > 0:
                k = end - p
                if k > self.skip:
                    k = self.skip
                self.skip -= k
                p += k
                continue
            if self.rec_have == 0:
                h = self._hdr(b, p, end)
                if h > 0:
                    if self.hdr_len > self.max_message:
                        self.c_proto += 1
                        self.skip = h + self.hdr_len
                        continue
                    if p + h + self.hdr_len <= end:   # whole record here: no copy
                        p += h
                        self.handler.link_message(self.hdr_type, self.hdr_slot, b, p,
                                                  self.hdr_len, True)
                        p += self.hdr_len
                        continue
                    self.rec_type = self.hdr_type
                    self.rec_slot = self.hdr_slot
                    self.rec_length = self.hdr_len
                    self.rec_header_have = h
                    self.rec_need = h + self.hdr_len
                elif h < 0:
                    self.c_proto += 1
                    return
                else:
                    self.rec_need = 0
            if self.rec_need == 0:                 # header itself is split
                self.rec_buf[self.rec_have] = b[p]
                self.rec_have += 1
                p += 1
                h = self._hdr(self.rec_buf, 0, self.rec_have)
                if h < 0 or (h == 0 and self.rec_have >= LK_RHDR_MAX):
                    self.c_proto += 1
                    self.rec_have = 0
                    return
                if h > 0:
                    if self.hdr_len > self.max_message:
                        self.c_proto += 1
                        self.rec_have = 0
                        self.skip = self.hdr_len
                        continue
                    self.rec_type = self.hdr_type
                    self.rec_slot = self.hdr_slot
                    self.rec_length = self.hdr_len
                    self.rec_header_have = h
                    self.rec_need = h + self.hdr_len
            else:
                k = self.rec_need - self.rec_have
                if k > end - p:
                    k = end - p
                copy_into(self.rec_buf, self.rec_have, b, p, k)
                self.rec_have += k
                p += k
            if self.rec_need and self.rec_have == self.rec_need:
                self.rec_have = 0
                self.rec_need = 0
                self.c_frag_rx += 1
                self.handler.link_message(self.rec_type, self.rec_slot, self.rec_buf, self.rec_header_have, self.rec_length, True)

    def _be_body(self, b, p, end):
        while p < end:
            h = self._hdr(b, p, end)
            if h <= 0 or p + h + self.hdr_len > end:
                self.c_proto += 1
                return
            p += h
            self.handler.link_message(self.hdr_type, self.hdr_slot, b, p, self.hdr_len, False)
            p += self.hdr_len

    def _be_frag(self, b, p, end, seq, now):
        if self.frag_active and seq == self.frag_seq:
            self.c_dup += 1
            return
        p = self._varint(b, p, end, 21)  # a fragment is whole: incomplete is malformed too
        if p <= 0:
            self.c_proto += 1
            return
        tot = self.hdr_var
        p = self._varint(b, p, end, 21)
        if p <= 0:
            self.c_proto += 1
            return
        o = self.hdr_var
        k = end - p
        if o == 0:
            if self.frag_active:
                self.c_frag_drop += 1
            if tot > len(self.frag_buf):
                self.c_proto += 1
                self.frag_active = False
                return
            self.frag_active = True
            self.frag_total = tot
            self.frag_have = 0
            self.frag_started_at = now
        elif not self.frag_active or o != self.frag_have or tot != self.frag_total or \
                seq != ((self.frag_seq + 1) & 255):
            if self.frag_active:
                self.c_frag_drop += 1    # a fragment was lost: the message is gone
                self.frag_active = False
            return
        if self.frag_have + k > self.frag_total:
            self.c_proto += 1
            self.frag_active = False
            return
        copy_into(self.frag_buf, self.frag_have, b, p, k)
        self.frag_have += k
        self.frag_seq = seq
        self.c_frag_rx += 1
        if self.frag_have == self.frag_total:
            self.frag_active = False
            self._be_body(self.frag_buf, 0, self.frag_total)


# ---- app layer: RosPort / GatewaySink over the link ---------------------------

def link_record_json(buf, off, n):
    """The JSON body of a control record (registrations, results, stats), or None if empty."""
    if n == 0:
        return None
    return json.loads(bytes(buf[off:off + n]).decode())


def link_record_body(obj):
    return json.dumps(obj).encode()


class LinkRosPort:
    """Gateway end: RosPort calls become link records; companion records
    become GatewaySink calls on self.sink."""

    def __init__(self, session):
        self.s = session
        session.handler = self
        self.sink = None
        self.distro = None
        self.ros_is_up = False
        self.link_is_up = False
        self.c_congested = 0
        self.c_too_large = 0
        self._rep = {}            # slot -> last report (ms), rate limit 1/s
        self._stats = {}          # the counters the companion last got (send_stats)
        self.stats_at = -LK_STATS_MAX_MS  # when they went (ms)
        self.stats_gap = 0        # line time budget: no stats before stats_at + stats_gap
        self.stats_from = 0       # where the next record starts among the counters

    def _ctl(self, t, slot, obj):
        b = link_record_body(obj) if obj is not None else b""
        return self.s.send(t, slot, b, 0, len(b), True, True)

    # RosPort
    def advertise(self, slot, topic, type, qos):
        self.s.set_depth(slot, qos.get("depth", 1) if qos else 1)
        self._ctl(LK_T_ADV, slot, {"topic": topic, "type": type, "qos": qos})

    def unadvertise(self, slot):
        self._ctl(LK_T_UNADV, slot, None)

    def subscribe(self, slot, topic, type, qos):
        self._ctl(LK_T_SUB, slot, {"topic": topic, "type": type, "qos": qos})

    def unsubscribe(self, slot):
        self._ctl(LK_T_UNSUB, slot, None)

    def max_message(self):
        return self.s.max_send()

    def room(self, n):
        """Backpressure (Gateway._must_wait): can a reliable message of n bytes go now?"""
        return self.s.rel_room(n)

    def publish(self, slot, buf, off, n, reliable):
        r = self.s.send(LK_T_PUB, slot, buf, off, n, reliable, False)
        if r == LK_OK:
            return
        if r == LK_TOO_LARGE:
            self.c_too_large += 1
            if self.sink is not None:
                self.sink.ros_error("pub", slot, "message_too_large",
                                    "message of %d bytes exceeds the link maximum of %d"
                                    % (n, self.s.max_send()))
        elif reliable:
            # reliable send buffer full (or no session yet): a documented drop
            self.c_congested += 1
            t = self._rep.get(slot)
            now = self.s.now
            if t is None or now - t >= 1000:
                self._rep[slot] = now
                if self.sink is not None:
                    self.sink.ros_error("pub", slot, "link_congested",
                                        "link send buffer full; reliable message dropped")

    def send_stats(self, d):
        """Offer the gateway's counters `d` for the companion's /diagnostics (ports call this
        about once a second). Only the counters that changed since the last record go, only
        when the link has nothing else queued (or has not sent stats for LK_STATS_MAX_MS), and
        on a paced line no more than 1/LK_STATS_SHARE of its time: a stats frame cannot be
        interrupted, and every message behind it waits its whole line time. True when sent."""
        s = self.s
        now = s.now
        if now - self.stats_at < self.stats_gap:
            return False
        if (s.rel_queued or s.be_n) and now - self.stats_at < LK_STATS_MAX_MS:
            return False
        last = self._stats
        ch = {}
        # On a paced line a record carries at most LK_STATS_CHUNK bytes of counters, so a
        # message behind it waits ~10 ms, not a whole frame; the rest follow in later records,
        # resuming where this one stopped so that every counter gets its turn.
        keys = list(d)
        n = len(keys)
        cap = LK_STATS_CHUNK if s.line_bps else 0
        size = 2
        j = 0
        while j < n:
            k = keys[(self.stats_from + j) % n]
            v = d[k]
            j += 1
            if last.get(k) == v:
                continue
            if cap:
                size += len(k) + len(str(v)) + 4
                if size > cap and ch:
                    j -= 1
                    break
            ch[k] = v
        self.stats_from = (self.stats_from + j) % n if n else 0
        if not ch:
            return False
        try:
            b = json.dumps(ch, separators=(",", ":")).encode()
        except TypeError:  # a MicroPython without separators=
            b = link_record_body(ch)
        if s.send(LK_T_STATS, LK_STATS_SLOT, b, 0, len(b), False, False) != LK_OK:
            return False
        last.update(ch)
        self.stats_at = now
        n = len(b) + LK_OVH + LK_RHDR_MAX
        self.stats_gap = n * 1000 * LK_STATS_SHARE // s.line_bps if s.line_bps else 0
        return True

    def rebase(self, d):
        """Move every stored time `d` ms back (see Gateway.rebase); the session's too."""
        self.s.rebase(d)
        for k in self._rep:
            self._rep[k] -= d
        self.stats_at -= d

    def counters(self):
        d = self.s.counters()
        d["pub_congested"] = self.c_congested
        d["pub_too_large"] = self.c_too_large
        return d

    # link handler
    def link_up(self, fresh):
        self.link_is_up = True        # ros_up follows the companion's hello
        if fresh:
            self._stats = {}          # a new companion gets every counter

    def link_down(self):
        self.link_is_up = False
        if self.ros_is_up:
            self.ros_is_up = False
            if self.sink is not None:
                self.sink.ros_down()

    def link_message(self, t, slot, buf, off, n, reliable):
        sink = self.sink
        if t == LK_T_MSG:
            if sink is not None:
                sink.ros_message(slot, buf, off, n)
        elif t == LK_T_SUBCOUNT:
            if sink is not None and n >= 4:
                sink.ros_sub_count(slot, buf[off] | (buf[off + 1] << 8) | (buf[off + 2] << 16))
        elif t == LK_T_CHELLO:
            d = link_record_json(buf, off, n) or {}
            self.distro = d.get("distro")
            self.ros_is_up = True
            if sink is not None:
                sink.ros_up(self.distro, self.max_message())
        elif t == LK_T_RESULT or t == LK_T_ERROR:
            d = link_record_json(buf, off, n) or {}
            if sink is not None:
                f = sink.ros_result if t == LK_T_RESULT else sink.ros_error
                f(d.get("kind"), slot, d.get("code"), d.get("message"))
        else:
            self.s.c_proto += 1
