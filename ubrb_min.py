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

try:  # type hints are for mypy on CPython; MicroPython has no typing module
    from typing import Any, Dict, List, Optional  # noqa: F401
except ImportError:  # pragma: no cover
    pass

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

# Decoder results
NEED_MORE = 0
MALFORMED = -1

# Session states
S_FREE = 0
S_OPEN = 1  # accepted, no HELLO yet
S_READY = 2  # HELLO received
S_CLOSING = 3  # flush what is queued, then the port closes the socket

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
PROFILE_KEYS = (
    "max_clients",
    "max_pubs",
    "max_subs",
    "max_topics",
    "max_payload",
    "max_control",
    "queue_bytes",
    "control_reserve",
)


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


def memory_budget(p):
    """Worst-case bytes the gateway core holds for profile `p`, by part."""
    rx = HDR + max(p["max_payload"] + 4, p["max_control"])
    per_client = rx + p["queue_bytes"] + 16 * (p["max_pubs"] + p["max_subs"]) + 8 * p["max_topics"]
    # Slot tables hold topic and type strings; ROS names are at most 255 characters.
    slots = 2 * p["max_topics"] * (2 * 256 + 64)
    return {
        "per_client": per_client,
        "clients": per_client * p["max_clients"],
        "slots": slots,
        "total": per_client * p["max_clients"] + slots,
    }


def format_budget(name, p):
    b = memory_budget(p)
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
def new_buffer(n):
    """Every large buffer of the core comes from here, once, at start-up. A port may replace it:
    the CPython port maps big ones from anonymous memory, so a 128 MiB queue reserves address
    space at start but costs RAM only as far as it is ever filled."""
    return bytearray(n)


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

    def __init__(self, max_bulk, max_control, bulk_op, allowed_ops):
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
        # Move the partial frame to the front only when it cannot complete where it is, so a large
        # frame arriving in many reads is never moved more than once.
        p = self.pos
        if p == self.fill:
            self.pos = self.fill = 0
        elif p + frame_len > self.cap:
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

    def __init__(self, cap, reserve, owner):
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
        self.topic = [None] * size  # type: List[Optional[str]]
        self.type = [None] * size  # type: List[Optional[str]]
        self.qos = [None] * size  # type: List[Any]
        self.reliable = bytearray(size)
        self.refs = [0] * size
        self.count = [-1] * size  # subscriber count of a pub slot; -1 = not reported yet
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


# ---------------------------------------------------------------------------------------------
# One client connection
# ---------------------------------------------------------------------------------------------
class ClientSession:
    """Protocol state of one TCP connection: decoder, send queue, id tables, timers."""

    def __init__(self, index, p):
        self.index = index
        self.state = S_FREE
        self.decoder = FrameDecoder(p["max_payload"] + 4, p["max_control"], OP_PUBLISH, CLIENT_OPS)
        self.queue = SendQueue(p["queue_bytes"], p["control_reserve"], self)
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
        # unknown_id / message_too_large repeat suppression: a small ring of (code, id, time).
        self.err_code = [None] * 8  # type: List[Optional[str]]
        self.err_id = [0] * 8
        self.err_ms = [0] * 8
        self.err_next = 0
        # counters
        self.rx_frames = 0
        self.tx_frames = 0
        self.dropped = 0

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

    def __init__(self, profile, ros=None, server=SERVER_NAME, log=None):
        self.p = profile
        self.server = server
        self.log = log  # callable(level, message) or None
        self.clients = [ClientSession(i, profile) for i in range(profile["max_clients"])]
        self.pubs = SlotTable("pub", profile["max_topics"])
        self.subs = SlotTable("sub", profile["max_topics"])
        self.ros = ros if ros is not None else NullRosPort()
        self.ros.sink = self
        self.ros_ready = False
        self.ros_distro = "unknown"
        self.ros_max_message = 0
        self.now = 0
        self.publishing = -1  # client index inside ros.publish(), for errors raised synchronously
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
    def accept(self, now):
        self.now = now
        for c in self.clients:
            if c.state == S_FREE:
                c.open(now)
                self.stats["clients_accepted"] += 1
                return c.index
        self.stats["clients_rejected"] += 1
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
                c.pub_id[i] = -1
                self._release_pub(c.pub_slot[i])
        for j in range(c.max_subs):
            if c.sub_id[j] >= 0:
                c.sub_id[j] = -1
                self._release_sub(c, c.sub_slot[j])
        c.queue.clear()
        c.decoder.reset()
        c.state = S_FREE

    def tick(self, now):
        self.now = now
        for c in self.clients:
            if c.state == S_OPEN and now - c.accepted_ms >= HELLO_TIMEOUT_MS:
                self._error(c, None, "hello_required", "no HELLO within 5 s of connecting")
                self._close(c, "no HELLO within 5 s")
            elif (c.state == S_OPEN or c.state == S_READY) and now - c.last_rx_ms >= IDLE_TIMEOUT_MS:
                self._close(c, "nothing received for 10 s")
            elif (
                c.state == S_READY
                and c.counts_dirty
                and now - c.counts_sent_ms >= SUB_COUNT_INTERVAL_MS
            ):
                self._send_counts(c, now)

    def next_deadline(self, now):
        """Milliseconds until tick() has work at the latest (for the port's poll timeout)."""
        t = 1000
        for c in self.clients:
            if c.state == S_OPEN:
                t = min(t, c.accepted_ms + HELLO_TIMEOUT_MS - now)
            if c.state == S_READY and c.counts_dirty:
                t = min(t, c.counts_sent_ms + SUB_COUNT_INTERVAL_MS - now)
        return max(0, t)

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
                self._on_register(c, self.pubs, msg)
            elif op == OP_SUBSCRIBE:
                self._on_register(c, self.subs, msg)
            elif op == OP_UNADVERTISE:
                self._on_unregister(c, self.pubs, msg)
            elif op == OP_UNSUBSCRIBE:
                self._on_unregister(c, self.subs, msg)
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

    def _on_register(self, c, table, msg):
        id_ = _parse_id(msg)
        topic = msg.get("topic")
        type_ = msg.get("type")
        if not isinstance(topic, str) or not isinstance(type_, str):
            raise ProtocolError("'topic' and 'type' must be strings", id_)
        qos = _parse_qos(msg.get("qos"), id_)
        pub = table is self.pubs
        ids = c.pub_id if pub else c.sub_id
        size = c.max_pubs if pub else c.max_subs
        free = -1
        for i in range(size):
            if ids[i] == id_:
                self._error(c, id_, "duplicate_id", "%s id %d is already live" % (table.kind, id_))
                return
            if free < 0 and ids[i] < 0:
                free = i
        if free < 0:
            self._error(
                c,
                id_,
                "resource_exhausted",
                "at most %d %s ids per client (--max-%ss)" % (size, table.kind, table.kind),
            )
            return
        # Conflicts the gateway can decide: a topic it already holds, in either table.
        for other in (self.pubs, self.subs):
            j = other.find(topic)
            if j >= 0 and other.type[j] != type_:
                self._error(
                    c,
                    id_,
                    "type_conflict",
                    "%s already carries %s, not %s" % (topic, other.type[j], type_),
                )
                return
        slot = table.find(topic)
        if slot >= 0:
            if table.qos[slot] != qos:
                self._error(
                    c,
                    id_,
                    "qos_conflict",
                    "%s is already %sed with QoS %s" % (topic, table.kind, _qos_text(table.qos[slot])),
                )
                return
            table.refs[slot] += 1
            created = False
        else:
            slot = table.allocate(topic, type_, qos)
            if slot < 0:
                self._error(
                    c,
                    id_,
                    "resource_exhausted",
                    "all %d %s topic slots are in use (--max-topics)" % (table.size, table.kind),
                )
                return
            created = True
        ids[free] = id_
        if pub:
            c.pub_slot[free] = slot
            if table.count[slot] >= 0:
                c.counts_dirty = True
        else:
            c.sub_slot[free] = slot
            c.sub_reliable[free] = table.reliable[slot]
            c.sub_refs[slot] += 1
            self._local_subs_changed(topic)
        if created and self.ros_ready:
            if pub:
                self.ros.advertise(slot, topic, type_, qos)
            else:
                self.ros.subscribe(slot, topic, type_, qos)

    def _on_unregister(self, c, table, msg):
        id_ = _parse_id(msg)
        pub = table is self.pubs
        i = c.find_pub(id_) if pub else c.find_sub(id_)
        if i < 0:
            self._error(c, id_, "unknown_id", "no live %s id %d on this connection" % (table.kind, id_))
            return
        if pub:
            c.pub_id[i] = -1
            self._release_pub(c.pub_slot[i])
            c.counts_dirty = True
        else:
            c.sub_id[i] = -1
            self._release_sub(c, c.sub_slot[i])

    def _release_pub(self, slot):
        if self.pubs.release(slot) and self.ros_ready:
            self.ros.unadvertise(slot)

    def _local_subs_changed(self, topic):
        """Publishers of `topic` see a new count: local subscribers are part of it."""
        slot = self.pubs.find(topic)
        if slot >= 0 and self.pubs.count[slot] >= 0:
            self._mark_counts(slot)

    def _mark_counts(self, slot):
        for c in self.clients:
            if c.state == S_FREE:
                continue
            for i in range(c.max_pubs):
                if c.pub_id[i] >= 0 and c.pub_slot[i] == slot:
                    c.counts_dirty = True
                    break

    def _release_sub(self, c, slot):
        c.sub_refs[slot] -= 1
        self._local_subs_changed(self.subs.topic[slot])
        if self.subs.release(slot) and self.ros_ready:
            self.ros.unsubscribe(slot)

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
        # Hand every live registration over: the ROS side starts from nothing after a restart.
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
        table = self.pubs if kind == "pub" else self.subs
        if not (0 <= slot < table.size) or not table.refs[slot]:
            return
        # The ROS side refused the slot: every registration on it ends, with an ERROR to its owner.
        for c in self.clients:
            if c.state == S_FREE:
                continue
            if kind == "pub":
                for i in range(c.max_pubs):
                    if c.pub_id[i] >= 0 and c.pub_slot[i] == slot:
                        self._error(c, c.pub_id[i], code, message)
                        c.pub_id[i] = -1
                        table.refs[slot] -= 1
            else:
                for j in range(c.max_subs):
                    if c.sub_id[j] >= 0 and c.sub_slot[j] == slot:
                        self._error(c, c.sub_id[j], code, message)
                        c.sub_id[j] = -1
                        c.sub_refs[slot] -= 1
                        table.refs[slot] -= 1
        topic = table.topic[slot]
        table.free(slot)  # the ROS side holds nothing for it: no unadvertise needed
        if kind == "sub":
            self._local_subs_changed(topic)

    def ros_error(self, kind, slot, code, message):
        table = self.pubs if kind == "pub" else self.subs
        if not (0 <= slot < table.size) or not table.refs[slot]:
            return
        now = self.now
        for c in self.clients:
            if c.state != S_READY:
                continue
            if kind == "pub":
                if self.publishing >= 0 and c.index != self.publishing:
                    continue
                for i in range(c.max_pubs):
                    if c.pub_id[i] >= 0 and c.pub_slot[i] == slot:
                        if c.should_report(code, c.pub_id[i], now):
                            self._error(c, c.pub_id[i], code, message)
            else:
                for j in range(c.max_subs):
                    if c.sub_id[j] >= 0 and c.sub_slot[j] == slot:
                        if c.should_report(code, c.sub_id[j], now):
                            self._error(c, c.sub_id[j], code, message)

    def ros_message(self, slot, buf, off, n):
        if not (0 <= slot < self.subs.size) or not self.subs.refs[slot]:
            return
        for c in self.clients:
            if c.state != S_READY or not c.sub_refs[slot]:
                continue
            for j in range(c.max_subs):
                if c.sub_id[j] >= 0 and c.sub_slot[j] == slot:
                    if c.queue.push_message(OP_MESSAGE, c.sub_id[j], buf, off, n):
                        c.tx_frames += 1
                        self.stats["message_out"] += 1
                    else:
                        c.dropped += 1
                        self.stats["dropped_queue"] += 1

    def ros_sub_count(self, slot, count):
        if not (0 <= slot < self.pubs.size) or not self.pubs.refs[slot]:
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
    return {"reliability": rel, "durability": dur, "depth": depth}


def _qos_text(q):
    return "%s/%s/depth %d" % (q["reliability"], q["durability"], q["depth"])


# ---------------------------------------------------------------------------------------------
# Entry point: `python ubrb_min.py ...` runs the port for the runtime it finds itself on.
# ---------------------------------------------------------------------------------------------
def main(argv=None):
    # The port imports `ubrb_min`; make that name this very module instead of a second copy.
    sys.modules["ubrb_min"] = sys.modules[__name__]
    if IS_MICROPYTHON:
        from ports.micropython import gateway as port  # type: ignore
    else:
        import os

        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.insert(0, here)
        from ports.cpython import gateway as port  # type: ignore
    return port.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
