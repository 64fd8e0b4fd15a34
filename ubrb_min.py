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

# ---------------------------------------------------------------------------------------------
# Launcher: `python ubrb_min.py ...` / `micropython ubrb_min.py ...` start the gateway port of the
# runtime they find themselves on. This is the core's only reference to ports/.
#
# Why at the top, not at the end: run as a script, this file is the module `__main__`; the port
# does `import ubrb_min`, which loads this same file once more under its own name, and that copy
# (where __name__ == "ubrb_min") skips this block and defines the core. Placed here, the block
# hands over to the port and exits before the `__main__` copy defines anything, so the core exists
# once, as `ubrb_min`, on both runtimes - no sys.modules aliasing (MicroPython does not even
# register `__main__` in sys.modules), no second set of classes or buffers. It comes before the
# core's own imports too, so that a Ctrl-C from the script's first line on is a quiet exit 130,
# never a KeyboardInterrupt traceback (CPython parses the whole file before that first line runs:
# a Ctrl-C in those first tens of milliseconds is reported by CPython itself; README.md, the
# command-line contract).
# ---------------------------------------------------------------------------------------------
if __name__ == "__main__":  # the only block the `ubrb_min` copy skips

    def _launch():
        try:
            if sys.implementation.name == "micropython":
                from ports.micropython.run import main
            else:
                import os

                # the CPython runtime (ubrb_host) is in ports/cpython/ in the source tree, and a
                # top-level package once installed (pip install .)
                here = os.path.dirname(os.path.abspath(__file__))
                sys.path.insert(1, os.path.join(here, "ports", "cpython"))
                import ubrb_host

                ubrb_host.catch_stray_interrupts()  # a Ctrl-C CPython cannot raise: kept for later
                from ubrb_host.gateway import main  # type: ignore[assignment]
        except ImportError as e:
            print("ubrb_min.py: no gateway port next to this file (%s): run it from the source "
                  "tree, or use `python -m ros_side --listen` for the in-process gateway" % e,
                  file=sys.stderr)
            sys.exit(2)
        sys.exit(main(sys.argv[1:]))

    try:
        _launch()
    except KeyboardInterrupt:  # Ctrl-C while the port loads or starts: a quiet stop (the port's
        sys.exit(130)          # main reports one later in start-up the same way)

import json  # noqa: E402  (after the launcher: see above)
import struct  # noqa: E402
from array import array  # noqa: E402

try:  # const(): inlined by MicroPython's compiler (no global looked up at run time); CPython: as is
    from micropython import const
except ImportError:

    def const(x):  # type: ignore[no-redef]
        return x

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
PROTOCOL = const(1)
IS_MICROPYTHON = sys.implementation.name == "micropython"

# ---------------------------------------------------------------------------------------------
# UBRB v1 wire constants
# ---------------------------------------------------------------------------------------------
HDR = const(12)
MAGIC = b"UBRB"
OP_HELLO = const(1)
OP_HELLO_ACK = const(2)
OP_ADVERTISE = const(3)
OP_UNADVERTISE = const(4)
OP_PUBLISH = const(5)
OP_SUBSCRIBE = const(6)
OP_UNSUBSCRIBE = const(7)
OP_MESSAGE = const(8)
OP_SUB_COUNT = const(9)
OP_PING = const(10)
OP_PONG = const(11)
OP_ERROR = const(12)
_REG_OPS = (OP_ADVERTISE, OP_UNADVERTISE, OP_SUBSCRIBE, OP_UNSUBSCRIBE)

# Ops a client may send; anything else is treated like a malformed header ([decided] in the spec).
CLIENT_OPS = (0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0)  # indexed by op

_HELLO_TIMEOUT_MS = const(5000)
_IDLE_TIMEOUT_MS = const(10000)
# A link outage: reliable PUBLISHes wait (the clients are not read) this long for the ROS side to
# come back, then are dropped with an ERROR; meanwhile the gateway PINGs its clients (the Unreal
# plugin drops a session after 10 s with nothing from the bridge)
OUTAGE_HOLD_MS = const(30000)
_OUTAGE_PING_MS = const(3000)
_SUB_COUNT_INTERVAL_MS = const(500)
_ERROR_REPEAT_MS = const(1000)  # unknown_id / message_too_large: at most once per id per second
_CLOSE_FLUSH_MS = const(2000)  # a closing client that does not read its last frames is cut off after this
# Frames of one client handled per Gateway.received() call: the rest wait in its decoder for the
# next loop turn (Gateway.backlog), so a client flooding tiny frames gets a turn like the others.
FRAMES_PER_TURN = const(32)

# Decoder results
NEED_MORE = const(0)
MALFORMED = const(-1)

# Session states
S_FREE = const(0)
_S_OPEN = const(1)  # accepted, no HELLO yet
S_READY = const(2)  # HELLO received
_S_CLOSING = const(3)  # flush what is queued, then the port closes the socket

WANT_READ = const(1)  # Gateway.interest(ci): what a port waits for on a client socket
WANT_WRITE = const(2)

_UBRB_JSON_DEPTH = const(16)  # deepest JSON nesting a client's control frame may have (qos: 2)
RELIABILITIES = ("reliable", "best_effort")
DURABILITIES = ("volatile", "transient_local")


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
    b[o + 8] = n & 0xFF  # (put_u32, inline: one call fewer per relayed frame)
    b[o + 9] = (n >> 8) & 0xFF
    b[o + 10] = (n >> 16) & 0xFF
    b[o + 11] = (n >> 24) & 0xFF


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


_DECODER_SHORT = const(2048)  # a partial frame this short is moved to the decoder's front (_compact)


def encode_frame(op, payload):
    """A whole frame as bytes (control frames, tests, clients)."""
    b = bytearray(HDR + len(payload))
    put_header(b, 0, op, len(payload))
    b[HDR:] = payload
    return bytes(b)


def encode_json_frame(op, obj):
    return encode_frame(op, json.dumps(obj).encode())


class RateLog:
    """Warnings at most once per `interval_ms` per key, each carrying the count of those it held
    back: a client or peer that repeats a fault costs one log line a second, not a disk. Keys are
    fixed strings chosen by the code (an ERROR code, "bad_record"), so the tables stay small."""

    def __init__(self, log, interval_ms=1000):
        self.log = log            # callable(level, message) or None
        self.interval = interval_ms
        self.last = {}            # key -> when it was last logged (ms)
        self.held = {}            # key -> lines suppressed since

    def warn(self, key, now, msg, level="warning"):
        """Log `msg` unless `key` was logged less than interval_ms ago; True if logged."""
        if self.log is None:
            return False
        t = self.last.get(key)
        if t is not None and now - t < self.interval:
            self.held[key] = self.held.get(key, 0) + 1
            return False
        self.last[key] = now
        n = self.held.pop(key, 0)
        if n:
            msg = "%s (%d similar suppressed)" % (msg, n)
        self.log(level, msg)
        return True

    def rebase(self, d):
        for k in self.last:
            self.last[k] -= d


def json_depth_ok(b, limit):
    """False if the JSON text `b` (bytes) nests arrays/objects deeper than `limit`."""
    # MicroPython's json has no nesting limit (CPython's raises RecursionError, not ValueError):
    # refuse deep input before parsing. Counting brackets is C speed and settles every
    # well-formed record; only one with many brackets (e.g. inside strings) is scanned.
    if b.count(b"{") + b.count(b"[") <= limit:
        return True
    d = 0
    in_str = False
    esc = False
    for c in b:
        if in_str:
            if esc:
                esc = False
            elif c == 92:        # backslash
                esc = True
            elif c == 34:        # quote
                in_str = False
        elif c == 34:
            in_str = True
        elif c == 123 or c == 91:
            d += 1
            if d > limit:
                return False
        elif c == 125 or c == 93:
            d -= 1
    return True


# ---------------------------------------------------------------------------------------------
# Frame decoder: bytes in, whole frames out, into one preallocated buffer
# ---------------------------------------------------------------------------------------------
class FrameDecoder:
    """Reassembles UBRB frames from a byte stream split at arbitrary points.

    The port reads into `buf[fill:]` (at most `space()` bytes) and calls Gateway.received(ci,
    n, now), which adds n to `fill`; `next()` then yields frames one at a time. The header is checked as soon as its 12
    bytes are in, before any payload is waited for.
    """

    def __init__(self, max_bulk, max_control, bulk_op, allowed_ops, new_buffer=bytearray):
        self.max_bulk = max_bulk
        self.max_control = max_control
        self.bulk_op = bulk_op
        self.allowed = allowed_ops
        # its capacity is len(buf): one attribute less keeps the instance dict in 12 slots
        # instead of 17 (16 bytes each on a 64-bit board)
        self.buf = new_buffer(HDR + max(max_bulk, max_control))
        self.fill = 0  # bytes held
        self.pos = 0  # start of the first frame not yet returned
        self.skip = 0  # length of the frame returned by the last next(), released on the next call
        self.op = 0  # the frame returned by next(): op, payload offset and length
        self.poff = 0
        self.plen = 0
        self.error = ""

    def space(self):
        return len(self.buf) - self.fill

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
            if avail == 0:  # all read (the common case; _compact's first branch, without a call)
                self.pos = self.fill = 0
            else:
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
        elif p + frame_len > len(self.buf) or (p > 0 and self.fill - p <= _DECODER_SHORT):
            move_down(self.buf, 0, p, self.fill - p)
            self.fill -= p
            self.pos = 0


# ---------------------------------------------------------------------------------------------
# Per-client send queue: three preallocated rings (control, reliable, best-effort) in one buffer
# ---------------------------------------------------------------------------------------------
class FrameRing:
    """Whole frames, first in first out, in buf[lo:hi], written and sent without ever moving a
    byte: a frame never straddles the end (when it does not fit before `hi` the ring wraps at
    the last frame's end, `wrap`, and continues at `lo`), so every frame is contiguous.

    `rem` is what is left to send of the frame at `head` (0: head is at a frame boundary). Every
    operation is O(1) except `sent`, which walks the frame headers it passes (O(1) per frame)."""

    def __init__(self, buf, lo, size):
        self.buf = buf
        self.lo = lo
        self.hi = lo + size
        self.size = size
        self.head = lo  # first unsent byte
        self.tail = lo  # end of the last frame written
        self.wrap = -1  # >= 0: wrapped; frames from head run to wrap, then from lo to tail
        self.rem = 0
        self.pend = 0  # bytes still to send (the frame in progress included)
        self.frames = 0  # frames wholly unsent (the frame in progress excluded)

    def clear(self):
        self.head = self.tail = self.lo
        self.wrap = -1
        self.rem = self.pend = self.frames = 0

    def reserve(self, size):
        """Where a frame of `size` bytes may be written now (then `wrote(size)`), or -1."""
        if self.pend == 0 and self.tail != self.lo:  # (sent() already cleared a drained ring)
            self.clear()
        t = self.tail
        if self.wrap >= 0:
            return t if self.head - t >= size else -1
        if self.hi - t >= size:
            return t
        if self.head - self.lo >= size:  # wrap: the next frame starts at lo
            self.wrap = t
            self.tail = self.lo
            return self.lo
        return -1

    def wrote(self, size):
        self.tail += size
        self.pend += size
        self.frames += 1

    def fits_after_drop(self, size):
        """Would a frame of `size` fit once every wholly unsent frame is dropped? (O(1))"""
        if self.rem == 0:
            return self.size >= size
        end = self.head + self.rem
        return self.hi - end >= size or self.head - self.lo >= size

    def drop_oldest(self):
        """Drop the oldest wholly unsent frame; returns how many frames went (0: none left).
        While a frame is half written, the frames behind it cannot give their room back before
        it is done: then all of them go at once (older first is still the order of loss)."""
        k = self.frames
        if k == 0:
            return 0
        if self.rem:
            self.tail = self.head + self.rem
            self.wrap = -1
            self.pend = self.rem
            self.frames = 0
            return k
        h = self.head
        flen = HDR + get_u32(self.buf, h + 8)
        h += flen
        if h == self.wrap:
            h = self.lo
            self.wrap = -1
        self.head = h
        self.pend -= flen
        self.frames -= 1
        if self.pend == 0:
            self.clear()
        return 1

    def run(self):
        """Bytes that may be written to the socket from `head` in one piece."""
        if self.pend == 0:
            return 0
        if self.wrap >= 0:
            return self.wrap - self.head
        return self.tail - self.head

    def sent(self, n):
        """The socket took n bytes from head (n <= run()). Returns the frames it completed."""
        b = self.buf
        done = 0
        self.pend -= n
        while n > 0:
            if self.rem == 0:
                self.rem = HDR + get_u32(b, self.head + 8)
                self.frames -= 1
            k = n if n < self.rem else self.rem
            self.head += k
            self.rem -= k
            n -= k
            if self.rem == 0:
                done += 1
                if self.head == self.wrap:
                    self.head = self.lo
                    self.wrap = -1
        if self.pend == 0:
            self.clear()
        return done


RING_CONTROL = 0  # SendQueue.rings: control frames, reliable MESSAGE, best_effort MESSAGE
RING_RELIABLE = 1
RING_BEST_EFFORT = 2


class SendQueue:
    """Frames waiting for one client's socket, in one preallocated buffer of `cap` bytes split
    into three FrameRings: control frames (HELLO_ACK, PONG, ERROR, SUB_COUNT) in the first
    `reserve` bytes, then reliable and best_effort MESSAGE frames in half of the rest each.
    Each ring keeps its order, so each topic's messages keep theirs (a topic has one QoS).

    When a best_effort frame does not fit, the oldest queued best_effort frames are dropped
    (O(1) each); a reliable frame that does not fit, and a control frame, are refused (the
    reliable ones already queued are never touched). `full` is set on every drop or refusal
    and `progress` whenever the socket completes a frame: the gateway closes a client whose
    queue stays full with no progress (Gateway.tick).

    Port contract: n = peek() bytes are ready at buf[out:out + n]; write some and call sent(k).
    Control frames go first; the two data rings take turns, one run each; a frame the socket
    took in part is finished before anything else."""

    def __init__(self, cap, reserve, new_buffer=bytearray):
        self.cap = cap
        self.reserve = reserve
        self.buf = new_buffer(cap)
        data = cap - reserve
        rel = data // 2
        self.rings = (FrameRing(self.buf, 0, reserve), FrameRing(self.buf, reserve, rel),
                      FrameRing(self.buf, reserve + rel, data - rel))
        self.cur = 0  # the ring peek() chose: sent() applies to it
        self.turn = RING_RELIABLE  # which data ring goes first when both have frames
        self.out = 0
        self.evicted = 0  # best_effort MESSAGE frames dropped for newer ones
        self.refused = 0  # frames that found no room at all
        self.full = False
        self.progress = False

    def pending(self):
        r = self.rings
        return r[0].pend + r[1].pend + r[2].pend

    def replies_backed_up(self):
        """Half the control room is taken: the client is not reading its PONGs and ERRORs."""
        return self.rings[RING_CONTROL].pend >= self.reserve // 2

    def clear(self):
        for r in self.rings:
            r.clear()
        self.full = self.progress = False

    def peek(self):
        """How many bytes may be written now, from buf[out:]; 0 when nothing is pending."""
        rings = self.rings
        k = self.cur
        if rings[k].rem == 0:  # at a frame boundary: choose again
            if rings[RING_CONTROL].pend:
                k = RING_CONTROL
            else:
                k = self.turn
                if rings[k].pend == 0:
                    k = RING_RELIABLE + RING_BEST_EFFORT - k
                self.turn = RING_RELIABLE + RING_BEST_EFFORT - k
            self.cur = k
        r = rings[k]
        self.out = r.head
        n = r.run()
        if k != RING_CONTROL and r.rem and rings[RING_CONTROL].pend and n > r.rem:
            n = r.rem  # finish this frame, then the control frames waiting
        return n

    def sent(self, n):
        if n > 0 and self.rings[self.cur].sent(n):
            self.progress = True

    def push_message(self, op, sid, src, off, n, best_effort=False):
        """Queue a MESSAGE-like frame: header, u32 id, then src[off:off+n]. False if refused."""
        size = HDR + 4 + n
        r = self.rings[RING_BEST_EFFORT if best_effort else RING_RELIABLE]
        t = r.reserve(size)
        if t < 0 and best_effort and r.fits_after_drop(size):
            self.full = True
            while t < 0:
                k = r.drop_oldest()
                if k == 0:
                    break
                self.evicted += k
                t = r.reserve(size)
        if t < 0:
            self.full = True
            self.refused += 1
            return False
        b = self.buf
        put_header(b, t, op, 4 + n)
        put_u32(b, t + HDR, sid)
        copy_into(b, t + HDR + 4, src, off, n)
        r.wrote(size)
        return True

    def push_control(self, op, payload):
        """Queue a control frame (HELLO_ACK, PONG, ERROR, SUB_COUNT). False if refused."""
        n = len(payload)
        r = self.rings[RING_CONTROL]
        t = r.reserve(HDR + n)
        if t < 0:
            self.full = True
            self.refused += 1
            return False
        b = self.buf
        put_header(b, t, op, n)
        copy_into(b, t + HDR, payload, 0, n)
        r.wrote(HDR + n)
        return True


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
        self.refs = array("i", bytes(4 * size))  # an array: half a list's heap or less
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


PUB = const(0)  # registration kinds, as Registry methods take them
SUB = const(1)


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
        self.queue = SendQueue(p["queue_bytes"], p["control_reserve"], new_buffer)
        self.max_pubs = p["max_pubs"]
        self.max_subs = p["max_subs"]
        self.pub_id = [-1] * p["max_pubs"]  # publisher id, -1 = free entry
        self.pub_slot = [0] * p["max_pubs"]
        self.sub_id = [-1] * p["max_subs"]
        self.sub_slot = [0] * p["max_subs"]
        self.sub_reliable = bytearray(p["max_subs"])
        self.sub_refs = bytearray(p["max_topics"])  # how many of my sub ids sit on each sub slot
        self.name = ""
        self.host = None  # the peer's address (no port) until HELLO: max_clients_per_address
        self.accepted_ms = 0
        self.last_rx_ms = 0
        self.rx_start_ms = -1  # when the first byte of a still incomplete frame came; -1: none
        self.backlog = False  # whole frames wait in the decoder for the next turn
        self.full_ms = -1  # since when the send queue is full with no frame written; -1: not
        self.counts_dirty = False
        self.counts_sent_ms = -_SUB_COUNT_INTERVAL_MS
        self.close_reason = ""
        self.close_ms = 0
        # unknown_id / message_too_large repeat suppression: a small ring of 8 (code, id, time)
        # entries, flat in one list (errs[3k], errs[3k + 1], errs[3k + 2]): one object, not three
        self.errs = [None, 0, 0] * 8  # type: list
        self.err_next = 0
        # counters
        self.rx_frames = 0
        self.tx_frames = 0
        self.dropped = 0
        self.blocked = False  # holds a frame the ROS side cannot take yet: not read
        self.reg_held = False  # ... and that frame is a registration or release (reg_room)

    def open(self, now):
        self.state = _S_OPEN
        self.decoder.reset()
        self.queue.clear()
        for i in range(self.max_pubs):
            self.pub_id[i] = -1
        for i in range(self.max_subs):
            self.sub_id[i] = -1
        for i in range(len(self.sub_refs)):
            self.sub_refs[i] = 0
        for i in range(0, len(self.errs), 3):
            self.errs[i] = None
        self.name = ""
        self.host = None
        self.rx_start_ms = self.full_ms = -1
        self.backlog = False
        self.accepted_ms = self.last_rx_ms = now
        self.counts_dirty = False
        self.counts_sent_ms = now - _SUB_COUNT_INTERVAL_MS
        self.close_reason = ""
        self.rx_frames = self.tx_frames = self.dropped = 0
        self.blocked = self.reg_held = False

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
        """Rate limit: False if (code, id) was reported less than _ERROR_REPEAT_MS ago."""
        e = self.errs
        for k in range(0, len(e), 3):
            if e[k] == code and e[k + 1] == id_:
                if now - e[k + 2] < _ERROR_REPEAT_MS:
                    return False
                e[k + 2] = now
                return True
        k = self.err_next
        self.err_next = (k + 3) % len(e)
        e[k] = code
        e[k + 1] = id_
        e[k + 2] = now
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


# Gateway.stat_counts[i] is the counter named by word i of this string (one list and one string
# on a board instead of a dict with a string per key); the last two count only with a Policy
# (set_policy), and counters() reports them then. A new counter goes before those two.
_GW_STATS = ("clients_accepted clients_rejected frames_in frames_out publish_in message_out "
             "dropped_no_ros dropped_queue evicted errors_sent rejected_per_address closed_slow "
             "closed_frame_timeout clients_refused_address topics_denied")
_GS_CLIENTS_ACCEPTED = const(0)
_GS_CLIENTS_REJECTED = const(1)
_GS_FRAMES_IN = const(2)
_GS_FRAMES_OUT = const(3)
_GS_PUBLISH_IN = const(4)
_GS_MESSAGE_OUT = const(5)
_GS_DROPPED_NO_ROS = const(6)
_GS_DROPPED_QUEUE = const(7)
_GS_EVICTED = const(8)  # counters() reports the queues' sum
_GS_ERRORS_SENT = const(9)
_GS_REJECTED_PER_ADDRESS = const(10)
_GS_CLOSED_SLOW = const(11)  # send queue full with nothing read for slow_client_timeout
_GS_CLOSED_FRAME_TIMEOUT = const(12)  # a frame not complete frame_timeout after its first byte
_GS_CLIENTS_REFUSED_ADDRESS = const(13)
_GS_TOPICS_DENIED = const(14)
_GS_N_PLAIN = const(13)
_GS_N = const(15)


class Gateway:
    """The UBRB v1 bridge state machine for all clients. Implements GatewaySink for the ROS side.

    Port contract (see ports/cpython/ubrb_host/loop.py and ports/micropython/loop.py):
      ci = accept(now, peer)      -> client index, or -1: send reject_frame(), then close without
                                     a reset (read and drop the peer's input first); when
                                     crowded(peer), first read the clients and close the ones
                                     flushed_close(): their EOFs and HELLOs may free the room
      decoder = clients[ci].decoder; recv into decoder.buf[decoder.fill:]; received(ci, n, now)
      backlog(ci)                 -> frames wait: received(ci, 0, now) next turn, before reading
      interest(ci)                -> WANT_READ / WANT_WRITE: what to wait for (and whether to read)
      queue = clients[ci].queue;  n = queue.peek(); send queue.buf[queue.out:queue.out + n];
                                  queue.sent(k)
      wants_close(ci)             -> the port closes once the queue is flushed (or at once on error)
      closed(ci, reason)          -> the socket is gone; releases everything the client registered
      tick(now)                   -> timers; call at least every 100 ms
      hold_for_ros(until)         -> once at start-up with a link: serve clients at once, hold
                                     their reliable PUBLISHes until the ROS side is up or `until`
    """

    # ubrb_policy's Policy and Throttle, given by ubrb_setup.apply_policy when the flags ask for
    # them (a gateway without a policy never imports that module); None: everything open
    policy = None
    throttle = None
    _refused_address = False  # the last accept() refusal was --allow-clients, not capacity
    # the port's write_now(ci): write what client ci's queue holds, as far as its socket takes it
    # now, closing nothing (a reliable MESSAGE found the queue full); None: no second try
    write_now = None  # type: object

    def __init__(self, profile, ros=None, server=SERVER_NAME, log=None, new_buffer=bytearray):
        # new_buffer(n): where every large buffer (decoders, send queues) comes from, once, here.
        # bytearray by default; the CPython runtime passes one that maps big buffers from
        # anonymous memory, so a 128 MiB queue reserves address space but costs RAM only as far
        # as it is ever filled.
        self.p = profile
        self.server = server
        self.log = log  # callable(level, message) or None
        self.ratelog = RateLog(log)  # client-caused warnings: <= 1 line/s per ERROR code
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
        self.refusal = ""  # why accept() last refused a connection (reject_frame's message)
        # Backpressure (docs/PROTOCOL.md): ros.room(n) says whether a reliable message of n bytes
        # can be taken now (a link's send budget); a port without it (direct mode: DDS's own
        # write blocks) never makes a client wait. Waiting clients are served in turn.
        self.ros_room = getattr(self.ros, "room", None)
        # ... and ros.reg_room() whether a client's registration or release can be queued (a
        # link: a few control records at a time, so a client churning them waits its turn
        # instead of queueing ahead of everyone's)
        self.ros_reg_room = getattr(self.ros, "reg_room", None)
        self.n_blocked = 0  # clients holding a frame that waits for room (a reliable PUBLISH,
        # a registration) ...
        self.n_reg_blocked = 0  # ... of them those holding a registration: the two lines
        self.rr = 0  # the next waiting client to get a turn
        self.pass_ci = -1  # the client whose held frame may go now (one frame per turn)
        # Start-up with a link expected (hold_for_ros): a reliable PUBLISH waits, held like one
        # that waits for room, until the ROS side is up or until ros_hold_until (then dropped
        # as at any time it is unreachable). The connection itself is served from its accept.
        self.ros_hold = False
        self.ros_hold_until = 0
        self.ping_at = 0  # the last PING to the clients while the ROS side is away
        # 1: the ROS side went away (an outage: its reliable PUBLISHes held); 2: for longer than
        # OUTAGE_HOLD_MS (reliable PUBLISHes dropped, each client told with an ERROR)
        self.ros_away = 0
        # counters, by the _GS_* indices of _GW_STATS' names (counters() reports them by name)
        self.stat_counts = [0] * _GS_N

    # -- logging ---------------------------------------------------------------------------
    def _log(self, level, msg):
        if self.log is not None:
            self.log(level, msg)

    # -- port-facing -------------------------------------------------------------------------
    def hold_for_ros(self, until):
        """At start-up, with a link whose ROS side has not reported yet: clients are accepted
        and answered at once, but their reliable PUBLISHes wait (backpressure: the socket is not
        read meanwhile) until the ROS side is up or until `until` (ms). A client reconnecting
        to a restarted gateway replays its queued reliable messages at once; they would be
        dropped if they beat the link handshake."""
        self.ros_hold = True
        self.ros_hold_until = until

    def crowded(self, peer=None):
        """True when accept(now, peer) would refuse `peer` for want of room: no session free,
        or its address at max_clients_per_address. A port then first reaps its clients (reads
        EOFs and HELLOs already in their sockets, closes the flushed closes) and accepts after."""
        host = peer_host(peer)
        free = n = 0
        for c in self.clients:
            if c.state == S_FREE:
                free += 1
            elif host is not None and c.host == host:
                n += 1
        return free == 0 or n >= self.p["max_clients_per_address"]

    def accept(self, now, peer=None):
        """A new connection (from `peer`, the port's address object: for the log and the
        per-address limit): its client index, or -1 when every session is taken or the peer's
        address holds max_clients_per_address sessions that have not said HELLO yet (send
        reject_frame(), then close it). Sessions past HELLO never count against the address:
        two UE worlds on one PC are served as far as max_clients goes."""
        self.now = now
        self._refused_address = False
        if self.policy is not None and not self.policy.client_allowed(peer):
            self._refused_address = True
            self.stat_counts[_GS_CLIENTS_REFUSED_ADDRESS] += 1
            self._log("warning", "refusing %s: not in --allow-clients" % (peer,))
            return -1
        host = peer_host(peer)
        if host is not None:
            n = 0
            for c in self.clients:  # a session's host is None once it has said HELLO
                if c.state != S_FREE and c.host == host:
                    n += 1
            if n >= self.p["max_clients_per_address"]:
                self.stat_counts[_GS_CLIENTS_REJECTED] += 1
                self.stat_counts[_GS_REJECTED_PER_ADDRESS] += 1
                self.refusal = ("the gateway takes at most %d connections per address before "
                                "HELLO (--max-clients-per-address)" % self.p["max_clients_per_address"])
                self._log("warning", "refusing %s: its address holds %d connections before HELLO"
                          % (peer, n))
                return -1
        for c in self.clients:
            if c.state == S_FREE:
                c.open(now)
                c.host = host
                self.stat_counts[_GS_CLIENTS_ACCEPTED] += 1
                if peer is not None:
                    self._log("info", "client %d connected from %s" % (c.index, peer))
                return c.index
        self.stat_counts[_GS_CLIENTS_REJECTED] += 1
        self.refusal = "the gateway serves at most %d clients" % self.p["max_clients"]
        if peer is not None:
            self.ratelog.warn("too_many_clients", now, "refusing %s: too many clients" % (peer,))
        return -1

    def reject_frame(self):
        """The bytes to send a connection accept() just refused before closing it (none for a
        peer outside --allow-clients: it is closed without a word)."""
        if self._refused_address:
            return b""
        return encode_json_frame(
            OP_ERROR, {"id": None, "code": "too_many_clients", "message": self.refusal})

    def wants_close(self, ci):
        return self.clients[ci].state == _S_CLOSING

    def interest(self, ci):
        """What the port waits for on client ci's socket: WANT_READ and/or WANT_WRITE. A closing
        client is not read any more; it is watched for writing until its queue is flushed."""
        c = self.clients[ci]
        if c.state == _S_CLOSING or c.blocked:  # blocked: TCP pushes back on the client
            return WANT_WRITE if c.queue.pending() else 0
        if c.queue.replies_backed_up():
            # It does not read the PONGs and ERRORs its frames cause: read nothing more from
            # it until it does (or slow_client_timeout closes it).
            return WANT_WRITE
        return WANT_READ | WANT_WRITE if c.queue.pending() else WANT_READ

    def backlog(self, ci):
        """True when client ci has whole frames received() left for the next turn: the port
        calls received(ci, 0, now) for it each turn, before reading more from its socket."""
        return self.clients[ci].backlog

    def may_read(self, ci, now):
        """Asked by a port before it reads client ci's socket: frames left from an earlier read
        are handled first (one turn's worth); True when the port may read more now."""
        if self.clients[ci].backlog:
            self.received(ci, 0, now)
        return self.reading(ci)

    def reading(self, ci):
        """True while a port may go on reading client ci this turn: no frames are left for the
        next turn, and it is read at all (not closing, not waiting for link room, reads replies)."""
        return not self.clients[ci].backlog and self.interest(ci) & WANT_READ != 0

    def flushed_close(self, ci):
        """True when client ci is closing and everything queued for it is sent: close it now."""
        c = self.clients[ci]
        return c.state == _S_CLOSING and c.queue.pending() == 0

    def close_overdue(self, ci, now):
        """A closing client whose last frames (its ERROR) were not read within 2 s: the port
        closes the socket anyway, so a peer that stopped reading cannot hold its slot."""
        c = self.clients[ci]
        return c.state == _S_CLOSING and now - c.close_ms >= _CLOSE_FLUSH_MS

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
        if n:
            d.fill += n  # what the port read into d.buf[d.fill:]
            c.last_rx_ms = now
            if c.rx_start_ms < 0:
                c.rx_start_ms = now
        budget = FRAMES_PER_TURN
        c.backlog = False
        while c.state == _S_OPEN or c.state == S_READY:
            if budget == 0:
                c.backlog = True
                return
            budget -= 1
            op = d.next()
            if op == NEED_MORE:
                # The frame deadline runs from the first byte of a frame still incomplete.
                if d.fill == d.pos:
                    c.rx_start_ms = -1
                return
            c.rx_start_ms = now
            if op == MALFORMED:
                self._error(c, None, "protocol_error", d.error)
                self._close(c, "malformed frame: " + d.error)
                return
            if op == OP_PUBLISH:
                wait = self._on_publish(c, d.buf, d.poff, d.plen)
            else:
                wait = op in _REG_OPS and self._reg_waits(c)
            if wait:
                d.hold()  # stays in the decoder; the socket is not read until _resume
                if not c.blocked:
                    c.blocked = True
                    self.n_blocked += 1
                    c.reg_held = op != OP_PUBLISH
                    if c.reg_held:
                        self.n_reg_blocked += 1
                return
            if op != OP_PUBLISH:
                c.rx_frames += 1
                self.stat_counts[_GS_FRAMES_IN] += 1
                self._on_control(c, op, d.buf, d.poff, d.plen)

    def closed(self, ci, reason=""):
        c = self.clients[ci]
        if c.state == S_FREE:
            return
        for i in range(c.max_pubs):
            if c.pub_id[i] >= 0:
                self._release(c, PUB, i)
        for j in range(c.max_subs):
            if c.sub_id[j] >= 0:
                self._release(c, SUB, j)
        c.queue.clear()
        c.decoder.reset()
        c.backlog = False
        if c.blocked:
            c.blocked = False
            self.n_blocked -= 1
            if c.reg_held:
                self.n_reg_blocked -= 1
        c.state = S_FREE
        # Logged once the client is gone: whoever reads "closed" finds its slot and ids free.
        # Client-supplied strings are logged as repr: a name cannot forge a log line.
        self._log("info", "client %d (%r) closed: %s" % (ci, c.name, reason or c.close_reason))

    def tick(self, now):
        self.now = now
        if self.throttle is not None:
            self.throttle.release(self, now)
        if self.ros_hold:
            if self.ros_ready or now - self.ros_hold_until >= 0:
                self.ros_hold = False  # the held PUBLISHes go (or are dropped) in _resume below
                if not self.ros_ready and self.ros_away:
                    self.ros_away = 2
                    self._log("warning", "ROS side still unreachable: reliable PUBLISHes are "
                              "dropped (ERROR link_congested) until it is back")
            elif now - self.ping_at >= _OUTAGE_PING_MS:
                # the clients waiting on us hear from us (their sessions must not time out)
                self.ping_at = now
                for c in self.clients:
                    if c.state == S_READY:
                        self._send(c, OP_PING, b"")
        if self.n_blocked:
            self._resume(now)
        for c in self.clients:
            if c.state == S_FREE:
                continue
            q = c.queue
            if q.progress:
                q.progress = False
                c.full_ms = -1
            if q.full or q.replies_backed_up():  # (then it is not read: it stalls too)
                q.full = False
                if c.full_ms < 0:
                    c.full_ms = now
            if c.state == _S_CLOSING:
                continue
            if c.full_ms >= 0 and now - c.full_ms >= self.p["slow_client_timeout"] * 1000:
                self.stat_counts[_GS_CLOSED_SLOW] += 1
                self._close(c, "send queue full for %d s without a frame read (slow client)"
                            % self.p["slow_client_timeout"])
                c.close_ms = now - _CLOSE_FLUSH_MS  # nothing it would read: close at once
            elif c.rx_start_ms >= 0 and not c.blocked and \
                    now - c.rx_start_ms >= self.p["frame_timeout"] * 1000:
                self.stat_counts[_GS_CLOSED_FRAME_TIMEOUT] += 1
                self._error(c, None, "protocol_error", "frame not complete %d s after its first "
                            "byte" % self.p["frame_timeout"])
                self._close(c, "frame not complete %d s after its first byte (dribbling client)"
                            % self.p["frame_timeout"])
            elif c.state == _S_OPEN and now - c.accepted_ms >= _HELLO_TIMEOUT_MS:
                self._error(c, None, "hello_required", "no HELLO within 5 s of connecting")
                self._close(c, "no HELLO within 5 s")
            elif (c.state == _S_OPEN or c.state == S_READY) and not c.blocked and \
                    now - c.last_rx_ms >= _IDLE_TIMEOUT_MS:
                self._close(c, "nothing received for 10 s")
            elif (
                c.state == S_READY
                and c.counts_dirty
                and now - c.counts_sent_ms >= _SUB_COUNT_INTERVAL_MS
            ):
                self._send_counts(c, now)

    def rebase(self, d):
        """Move every stored time `d` ms back, for a port whose clock just did the same: on
        32-bit MicroPython ints >= 2**30 are heap objects, so a long-running board's clock is
        kept small (ports/micropython: every 2**28 ms)."""
        self.now -= d
        self.ros_hold_until -= d
        self.ping_at -= d
        if self.throttle is not None:
            self.throttle.rebase(d)
        for c in self.clients:
            c.accepted_ms -= d
            c.last_rx_ms -= d
            c.counts_sent_ms -= d
            c.close_ms -= d
            if c.rx_start_ms >= 0:
                c.rx_start_ms -= d
            if c.full_ms >= 0:
                c.full_ms -= d
            for k in range(2, len(c.errs), 3):
                c.errs[k] -= d
        self.ratelog.rebase(d)

    def next_deadline(self, now):
        """Milliseconds until tick() has work at the latest (for the port's poll timeout)."""
        t = 1000
        if self.throttle is not None:
            t = self.throttle.deadline(now)
        if self.ros_hold:
            t = min(t, self.ros_hold_until - now)
        for c in self.clients:
            if c.state == _S_OPEN:
                t = min(t, c.accepted_ms + _HELLO_TIMEOUT_MS - now)
            if c.state == S_READY and c.counts_dirty:
                t = min(t, c.counts_sent_ms + _SUB_COUNT_INTERVAL_MS - now)
        return max(0, t)

    # -- backpressure ----------------------------------------------------------------------------
    def _resume(self, now):
        """Hand the room freed on the ROS side to waiting clients, one held frame each in turn.
        Two lines: reliable PUBLISHes (room(n)) and registrations (reg_room()). The first in a
        line whose frame does not fit stops that line and keeps its turn (a large message is not
        starved by small ones); the other line goes on. A client with nothing more held is read
        again; one that meets its next frame that must wait waits in line again."""
        cl = self.clients
        n = len(cl)
        idle = 0
        data_at = -1  # the client heading the PUBLISH line, whose frame did not fit
        reg_full = False
        while self.n_blocked and idle < n:
            ci = self.rr
            self.rr = ci + 1 if ci + 1 < n else 0
            c = cl[ci]
            if not c.blocked or (reg_full if c.reg_held else data_at >= 0):
                idle += 1
                continue
            idle = 0
            c.blocked = False
            self.n_blocked -= 1
            reg = c.reg_held
            if reg:
                self.n_reg_blocked -= 1
            c.last_rx_ms = now  # it was waiting for us, not idle
            self.pass_ci = ci
            self.received(ci, 0, now)
            passed = self.pass_ci != ci
            self.pass_ci = -1
            if c.blocked and not passed:  # its frame still does not fit
                if reg:
                    reg_full = True
                else:
                    data_at = ci
        if data_at >= 0:
            self.rr = data_at  # it stays first in line

    # -- frames from a client ------------------------------------------------------------------
    def _reg_waits(self, c):
        """True when a registration or release of client c must wait for the ROS side's room
        (ros.reg_room), or for its turn: other clients are waiting (_resume)."""
        room = self.ros_reg_room
        if room is None or not self.ros_ready or c.state != S_READY:
            return False
        if self.pass_ci == c.index:  # its turn (see _resume)
            if not room():
                return True
            self.pass_ci = -1
            return False
        # others' registrations wait already: they go first (a line of its own: reliable
        # PUBLISHes waiting for room do not hold registrations up)
        return self.n_reg_blocked > 0 or not room()

    def _on_publish(self, c, buf, off, n):
        """Relay one PUBLISH (it is then counted as read), or return True when it is reliable
        and must wait for room on the ROS side (backpressure: it is not read yet): there is
        none, or other clients are already waiting (they go first: fair shares of the link).
        Anything refused or dropped below never waits. One publisher lookup serves both."""
        i = -1
        if c.state == S_READY and n >= 4 and buf[off + 3] < 0x40:  # ids >= 2**30: never
            i = c.find_pub(buf[off] | (buf[off + 1] << 8) | (buf[off + 2] << 16) |
                           (buf[off + 3] << 24))                   # advertised (_parse_id)
            if i >= 0 and self.ros_ready and n - 4 <= self.ros_max_message:
                # the data path (a known publisher, a ROS side that takes it): the checks
                # below all pass, so only the backpressure and the relay are left
                slot = c.pub_slot[i]
                rel = self.pubs.reliable[slot]
                room = self.ros_room
                if rel and room is not None:
                    if self.pass_ci == c.index:  # its turn (see _resume)
                        if not room(n - 4):
                            return True
                        self.pass_ci = -1
                    elif self.n_blocked > self.n_reg_blocked or not room(n - 4):
                        return True   # (others' PUBLISHes wait: behind them; registrations
                        # waiting are another line)
                c.rx_frames += 1
                stats = self.stat_counts
                stats[_GS_FRAMES_IN] += 1
                stats[_GS_PUBLISH_IN] += 1
                self.publishing = c.index
                self.ros.publish(slot, buf, off + 4, n - 4, rel)
                self.publishing = -1
                return False
        if i >= 0 and self.ros_hold and not self.ros_ready and self.pubs.reliable[c.pub_slot[i]]:
            return True  # the link is expected (start-up, an outage: hold_for_ros); tick() ends it
        # refused or dropped below: never waits
        c.rx_frames += 1
        stats = self.stat_counts
        stats[_GS_FRAMES_IN] += 1
        if c.state != S_READY:
            self._error(c, None, "hello_required", "PUBLISH before HELLO")
            return False
        if n < 4:
            self._error(c, None, "protocol_error", "PUBLISH payload shorter than its 4-byte id")
            return False
        if i < 0:
            c.dropped += 1
            pid = get_u32(buf, off) if buf[off + 3] < 0x40 else -1
            if c.should_report("unknown_id", pid, self.now):
                self._error(c, pid, "unknown_id", "PUBLISH for an id not advertised on this connection")
            return False
        stats[_GS_PUBLISH_IN] += 1
        if not self.ros_ready:
            stats[_GS_DROPPED_NO_ROS] += 1
            c.dropped += 1
            if self.ros_away == 2 and self.pubs.reliable[c.pub_slot[i]] and \
                    c.should_report("link_congested", c.pub_id[i], self.now):
                self._error(c, c.pub_id[i], "link_congested", "the ROS side is unreachable for "
                            "longer than %d s: reliable message dropped" % (OUTAGE_HOLD_MS // 1000))
            return False
        c.dropped += 1                  # too large (the data path above took the rest)
        pid = c.pub_id[i]
        if c.should_report("message_too_large", pid, self.now):
            self._error(
                c,
                pid,
                "message_too_large",
                "message of %d bytes exceeds the %d bytes the ROS side accepts"
                % (n - 4, self.ros_max_message),
            )
        return False

    def _on_control(self, c, op, buf, off, n):
        if op == OP_HELLO:
            self._on_hello(c, buf, off, n)
            return
        if c.state != S_READY:  # the spec's rule has no exception: a PING before HELLO too
            self._error(c, None, "hello_required", "op %d before HELLO" % op)
            return
        if op == OP_PING:
            self._send(c, OP_PONG, b"")
            return
        if op == OP_PONG:
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
        b = bytes(memoryview(buf)[off : off + n])
        if not json_depth_ok(b, _UBRB_JSON_DEPTH):  # before json.loads: see json_depth_ok
            raise ProtocolError("payload nests deeper than %d levels" % _UBRB_JSON_DEPTH)
        try:
            obj = json.loads(b)
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
        first = c.state == _S_OPEN
        c.state = S_READY
        c.host = None  # past HELLO: no longer counted against its address
        # ros_ready: whether the ROS side is there now (what a client's "no ROS side" rests on);
        # ros_distro is what it reported, "unknown" if it did not say
        self._send_json(
            c,
            OP_HELLO_ACK,
            {"protocol": PROTOCOL, "server": self.server, "ros_distro": self.ros_distro,
             "ros_ready": self.ros_ready},
        )
        if first:
            self._log("info", "client %d says HELLO: %r" % (c.index, c.name))

    def _on_register(self, c, kind, msg):
        id_ = _parse_id(msg)
        topic = msg.get("topic")
        type_ = msg.get("type")
        if not isinstance(topic, str) or not isinstance(type_, str):
            raise ProtocolError("'topic' and 'type' must be strings", id_)
        qos = _parse_qos(msg.get("qos"), id_)
        if self.policy is not None:
            why = self.policy.topic_refusal(topic)
            if why is not None:
                self.stat_counts[_GS_TOPICS_DENIED] += 1
                self._error(c, id_, "topic_denied", why)
                return
        reg = self.registry
        try:
            slot = reg.register(c, kind, id_, topic, type_, qos)
        except Refused as e:
            self._error(c, id_, e.code, e.message)
            return
        if kind == SUB and self.throttle is not None and reg.holders(SUB, slot) == 1:
            self.throttle.bind_topic(self, slot, topic)
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
            self.stat_counts[_GS_FRAMES_OUT] += 1
        else:
            c.dropped += 1
            self.stat_counts[_GS_DROPPED_QUEUE] += 1

    def _send_json(self, c, op, obj):
        self._send(c, op, json.dumps(obj).encode())

    def _error(self, c, id_, code, message):
        if c.queue.replies_backed_up():
            # A client that does not read its ERRORs: count them, queue and log nothing more
            # (a flood of bad frames must cost O(1) each, never a log line each).
            c.queue.full = True
            c.dropped += 1
            self.stat_counts[_GS_DROPPED_QUEUE] += 1
            return
        self.stat_counts[_GS_ERRORS_SENT] += 1
        self.ratelog.warn(code, self.now, "client %d: ERROR %s (id %s): %r"
                          % (c.index, code, id_, message))
        self._send_json(c, OP_ERROR, {"id": id_, "code": code, "message": message})

    def _close(self, c, reason):
        c.state = _S_CLOSING
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
        self.ros_away = 0
        self.ros_distro = distro or "unknown"
        self.ros_max_message = min(max_message, self.p["max_payload"])
        self._log("info", "ROS side up (%r, messages up to %d bytes)" % (distro, max_message))
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

    def ros_session_lost(self, message):
        """The link to the ROS side came back as a *new* session (the companion restarted, or the
        two ends disagreed and re-handshook): ROS entities were re-created and reliable messages in
        flight may be lost. Every client that said HELLO gets ERROR `link_reset` (id null)."""
        self._log("warning", "ROS side: %s" % message)
        for c in self.clients:
            if c.state == S_READY:
                self._error(c, None, "link_reset", message)

    def ros_down(self):
        if self.ros_ready:
            self._log("warning", "ROS side unreachable; keeping registrations, holding reliable "
                      "PUBLISHes for up to %d s" % (OUTAGE_HOLD_MS // 1000))
            self.hold_for_ros(self.now + OUTAGE_HOLD_MS)
            self.ping_at = self.now
            self.ros_away = 1
        self.ros_ready = False
        # HELLO_ACK tells a client whether anything is behind the gateway (a PUBLISH now is
        # dropped_no_ros): "unknown" again until the ROS side reports back.
        self.ros_distro = "unknown"

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
        subs = self.subs  # (Registry.holds, inline: this runs per message)
        if slot < 0 or slot >= subs.size or subs.refs[slot] <= 0:
            return
        if self.throttle is not None and not self.throttle.admit(slot, buf, off, n, self.now):
            return  # held: the newest of this period goes out when the period ends
        for c in self.clients:
            left = c.sub_refs[slot]  # this client's ids on the slot: stop after the last one
            if not left or c.state != S_READY:
                continue
            ids = c.sub_id
            j = next_held(ids, c.sub_slot, slot, 0)
            while j >= 0:
                if c.queue.push_message(OP_MESSAGE, ids[j], buf, off, n,
                                        not c.sub_reliable[j]) or (
                        c.sub_reliable[j] and self._pushed_after_write(c, ids[j], buf, off, n)):
                    c.tx_frames += 1
                    self.stat_counts[_GS_MESSAGE_OUT] += 1
                else:
                    c.dropped += 1
                    self.stat_counts[_GS_DROPPED_QUEUE] += 1
                left -= 1
                j = next_held(ids, c.sub_slot, slot, j + 1) if left > 0 else -1

    def _pushed_after_write(self, c, sid, buf, off, n):
        # A reliable MESSAGE found client c's queue full: the link hands over a window of frames
        # at once (a gap filled, a retransmission), more than an mcu queue holds. The port writes
        # what the client's socket takes now and it is tried once more, so a client that reads
        # gets all of them; one that does not still gets the gap (counted, docs/PROTOCOL.md)
        w = self.write_now
        if w is None:
            return False
        w(c.index)
        if c.state != S_READY:
            return False
        q = c.queue
        ok = q.push_message(OP_MESSAGE, sid, buf, off, n, False)
        q.refused -= 1  # one count per message refused: the second try's, or the first's undone
        return ok

    def ros_sub_count(self, slot, count):
        if not self.registry.holds(PUB, slot):
            return
        if self.pubs.count[slot] == count:
            return
        self.pubs.count[slot] = count
        self._mark_counts(slot)

    # -- statistics --------------------------------------------------------------------------
    def counters(self):
        names = _GW_STATS.split()
        n = _GS_N if self.policy is not None else _GS_N_PLAIN
        s = {}
        for i in range(n):
            s[names[i]] = self.stat_counts[i]
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
        if self.throttle is not None:  # newer messages replaced these within their period
            s["throttle_superseded"] = self.throttle.superseded
            s["throttle_unheld"] = self.throttle.unheld
        return s


def peer_host(peer):
    """The address of a peer without its port: a (host, port, ...) tuple gives host; a raw
    sockaddr (MicroPython's unix port) gives its bytes without the port's; None stays None."""
    if peer is None:
        return None
    if isinstance(peer, tuple) or isinstance(peer, list):
        return peer[0]
    if isinstance(peer, bytes) or isinstance(peer, bytearray):
        return bytes(peer[:2]) + bytes(peer[4:])
    return peer


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
_LK_VERSION = const(1)
LK_SYNC0 = const(0xA5)
LK_SYNC1 = const(0x4E)
_LK_SYNC = b"\xa5\x4e"
_LK_HDR = const(8)          # sync(2) len(2) ctl(1) hck(1) seq(1) ack(1)
LK_OVH = const(12)         # header + CRC-32
LK_RESIDUE = const(0x2144DF1C)  # CRC-32 of (frame + its own CRC, LE): a small int on MicroPython
LK_RHDR_MAX = const(8)     # record header: type(1) slot varint(<=3) len varint(<=4)

# frame kinds (low nibble of ctl)
LK_HELLO = const(1)
LK_REL = const(2)
_LK_BE = const(3)
LK_ACK = const(4)
LK_BEFRAG = const(5)
_LK_NAK = const(0x10)       # ctl flag: "I miss frame <ack>"

# results of LinkSession.send
_LINK_DOWN = const(0)  # session states: handshaking (HELLOs until the peer answers) or down
LINK_UP = const(1)

LK_OK = const(0)
LK_TOO_LARGE = const(1)
LK_FULL = const(2)
_LK_DOWN = const(3)

# timers (ms); see docs/LINK.md "Timers"
LK_HELLO_MS = const(250)
_LK_HB_MS = const(400)
LK_DEAD_MS = const(2000)
_LK_RTO_INIT = const(500)
_LK_RTO_MIN = const(40)
_LK_RTO_MAX = const(2000)
LK_FRAG_MS = const(2000)
_LK_ACK_REP_MS = const(30)
_LK_WMAX = const(64)        # largest window (frames in flight: a frame table entry each)
_LK_FS_RETX = const(1)      # frame table flags: sent more than once (no RTT sample from it),
_LK_FS_SACK = const(2)      # ... reported held by the peer (a selective ack),
_LK_FS_LOST = const(4)      # ... deemed lost: sent again before any new frame,
_LK_FS_END = const(8)       # ... ends at the end of a record (it took all that was queued)
# rel_framed at or above it: a gateway holds records kept from an old session for a new one, the
# first rel_framed - _LK_PARKED bytes at rel_head, and frames nothing reliable meanwhile (ubrb_keep)
_LK_PARKED = const(1 << 29)
_LK_DESYNC_MS = const(1000)  # the peer's acks outside what we sent, for this long: a desync, re-handshake
# A client's registration or release is taken only while the control records not yet acknowledged
# come to less than this many frames (LinkRosPort.reg_room): a client churning registrations waits
# (backpressure) instead of filling the ring, where another client's registration would wait
# behind all of it (a 64 KiB ring is 5.7 s of a 115200 line).
LK_CTL_FRAMES = const(4)
_LK_POS_MASK = const(0x3FFFFFFF)  # positions in the whole reliable stream, mod 2**30 (small ints)

# keyed link (docs/LINK.md "Authentication"): a trailer before the CRC of every frame
LK_TAG = const(12)          # a keyed frame's trailer: counter u32 + 8 bytes of HMAC (ubrb_keyed)
_LK_HF_REPLY = const(1)     # HELLO flags: reply wanted (I am not up)
_LK_HF_KEYED = const(2)     # the frames of this end carry the MAC trailer
_LK_HF_CHAL = const(4)      # a challenge: "name my epoch to prove you are live" (no acceptance)
_LK_HF_PROBE = const(8)     # a stream probe (ubrb_stream), its round in body byte 18: answer it
_LK_HF_ANSWER = const(16)   # this HELLO answers the probe of the round in body byte 19
_LK_HELLO_LEN = const(20)   # HELLO body; a peer of before the probe rounds sends 18 bytes
_LK_HELLO_GAP = const(50)   # at most one HELLO per 50 ms, whatever arrives: no two ends can storm
# why the last HELLO was refused (LinkSession.hello_why; the ports say it in words)
LKW_VERSION = const(1)     # another protocol version
LKW_ROLE = const(2)        # an end of my own role (two gateways, two companions)
LKW_KEYED = const(3)       # the peer is keyed and I am not
LKW_UNKEYED = const(4)     # I am keyed and the peer is not
_LK_STATS_SHARE = const(200)  # stats take at most 1/200 of a paced line's time (see send_stats)
_LK_STATS_MAX_MS = const(10000)  # ... and wait for an idle link at most this long
LK_STATS_CHUNK = const(128)  # bytes of counters per stats record on a paced line (11 ms at 115200)

# record types of the app layer (LinkRosPort <-> LinkCompanionEnd)
LK_T_ADV = const(1)
LK_T_UNADV = const(2)
LK_T_SUB = const(3)
LK_T_UNSUB = const(4)
LK_T_PUB = const(5)
LK_T_MSG = const(6)
LK_T_RESULT = const(7)
LK_T_ERROR = const(8)
LK_T_SUBCOUNT = const(9)
LK_T_CHELLO = const(10)
LK_T_STATS = const(11)
LK_STATS_SLOT = const(0xFFFF)
LK_T_BAD = const(12)       # either direction: "I rejected your record" (docs/LINK.md section 6)
LK_JSON_MAX = const(96 * 1024)  # longest JSON record either end parses (a registration's topic: 64 KiB)
LK_JSON_DEPTH = const(4)   # deepest JSON nesting a record may have (ADV/SUB: 2)
_LK_GEN_MAX = const(0x3FFFFFFF)  # registration generations are 1 ... 2**30-1 (small ints on MicroPython)
LK_TEXT_MAX = const(1024)  # longest message / distro string taken from the peer
# Every ERROR code the bridge sends (docs/PROTOCOL.md, "ERROR codes", has a row for each, and
# tests/core/test_codec.py checks that the code, that table and the spec agree). The first six
# may end a registration (a RESULT record from the companion), the four from the fifth on may
# come in an ERROR record on a live slot (resource_exhausted: a message past the companion's
# history budget); the companion's are checked against these slices.
ERROR_CODES = ("unknown_type", "invalid_topic", "type_conflict", "qos_conflict",
               "resource_exhausted", "link_congested", "message_too_large", "qos_incompatible",
               "hello_required", "unsupported_protocol", "too_many_clients", "protocol_error",
               "unknown_id", "duplicate_id", "topic_denied", "link_reset")
LK_RESULT_CODES = ERROR_CODES[0:6]
LK_ERROR_CODES = ERROR_CODES[4:8]


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
del _lk_t8  # run once: its code need not stay loaded on a board


def lk_hck(b0, b1, b2):
    t = _LK_T8
    return t[t[t[0xFF ^ b0] ^ b1] ^ b2]


# binascii.crc32 takes a whole buffer (no offset, no length), so the CRC of tx_buf[0:L - 4]
# needs an object whose length is L - 4: a memoryview slice is a new one per frame (16 bytes
# on a 32-bit port, 32 on 64-bit). MicroPython 1.26 and later build the slice of b[i:] = x on the
# stack for a bytearray (py/vm.c, MP_BC_BUILD_SLICE), and resize it within its allocation in
# place (py/objarray.c: a shrink keeps the block, a growth within it moves nothing): so
# LinkSession._seal shrinks tx_buf to the frame, takes crc32 of the whole object and grows it
# back with a memoryview of itself (a memmove onto itself). CPython: a view is cheap there, and
# a bytearray with an exported view cannot be resized.
_LK_RESIZE = IS_MICROPYTHON and sys.implementation.version >= (1, 26)


def lk_replayed(win, seq, d):
    """The anti-replay window (as IPsec's) of the best-effort frames and of a keyed link's frame
    counters: `win` is [highest seq seen, mask], bit i of the mask is seq highest-1-i; `d` is how
    far `seq` is ahead of the highest (0 or less: at or behind it). True: seen before, or too old
    to tell (drop it); False: new, now recorded. 24 bits: the mask stays a small int."""
    if d > 0:
        win[1] = 0 if d > 24 else ((win[1] & ((1 << (24 - d)) - 1)) << d) | (1 << (d - 1))
        win[0] = seq
        return False
    d = -d
    if d == 0 or d > 24 or win[1] & (1 << (d - 1)):
        return True
    win[1] |= 1 << (d - 1)
    return False


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


# ---- link pacing: a serial line's write credit, for every port ------------------------------
LINK_MAX_MESSAGE = const((1 << 23) - 64)  # largest message any link session carries (lengths < 2**24)
LINK_PACE_MS = const(60)            # line time of credit the pacing may bank: a 50 ms loop keeps it busy


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
        session.rtt.line_bps = bytes_per_s  # for the session's RTO floor and the stats budget
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

    def wait_ms(self, now):
        """How long a loop may sleep before the link has a frame to send (0: no such time, or
        now): the pacing's next frame, so a paced line does not sit idle, and the session's loss
        timer (RACK), so a frame deemed lost is sent again when it is, not when the loop next
        wakes for something else (its poll timeout of 20-50 ms). The later of the two: the
        frame goes when both allow it; a timer already due is the loop's next flush."""
        w = 0
        if self.pace and self.credit <= 0:
            w = -self.credit // self.pace + 1
        r = self.s.reliable.rack_at
        if r >= 0 and r - now > w:
            w = r - now
        return w

    def drop(self):
        """The device is gone with a half-written frame: the peer resyncs, we start afresh."""
        self.n = 0

    def rebase(self, d):
        if self.last >= 0:
            self.last -= d


# LinkSession.stat_counts[i] is the counter named by word i of this string, as the Gateway's
# (_GW_STATS): one list and one string, split when counters() is asked (a cold path), instead of
# 36 attributes, each a name and an instance-dict slot on a board. A new counter is a word at the
# end here and an _LKC_ index below (tests/core/test_link.py checks they agree).
_LK_COUNTERS = (
    "rx_frames tx_frames rx_bytes tx_bytes crc_err hdr_err resync noise retx timeouts "
    "fast_retx dup ooo drop_be drop_be_down drop_rel_full drop_down too_large rel_reset_bytes "
    "frag_tx frag_rx frag_drop up down new hello_tx hello_rx proto stale trunc auth replay "
    "desync renew hello_ok hello_ignored peer_resumed")
_LKC_RX_FRAMES = const(0)
_LKC_TX_FRAMES = const(1)
_LKC_RX_BYTES = const(2)
_LKC_TX_BYTES = const(3)
_LKC_CRC_ERR = const(4)
_LKC_HDR_ERR = const(5)
_LKC_RESYNC = const(6)
_LKC_NOISE = const(7)
_LKC_RETX = const(8)
_LKC_TIMEOUTS = const(9)
LKC_FAST_RETX = const(10)
_LKC_DUP = const(11)
_LKC_OOO = const(12)
_LKC_DROP_BE = const(13)
_LKC_DROP_BE_DOWN = const(14)
_LKC_DROP_REL_FULL = const(15)
_LKC_DROP_DOWN = const(16)
_LKC_TOO_LARGE = const(17)
_LKC_REL_RESET_BYTES = const(18)
_LKC_FRAG_TX = const(19)
_LKC_FRAG_RX = const(20)
_LKC_FRAG_DROP = const(21)
_LKC_UP = const(22)
_LKC_DOWN = const(23)
_LKC_NEW = const(24)
_LKC_HELLO_TX = const(25)
_LKC_HELLO_RX = const(26)
_LKC_PROTO = const(27)
LKC_STALE = const(28)
_LKC_TRUNC = const(29)
LKC_AUTH = const(30)
LKC_REPLAY = const(31)
_LKC_DESYNC = const(32)
_LKC_RENEW = const(33)
_LKC_HELLO_OK = const(34)
_LKC_HELLO_IGNORED = const(35)
LKC_PEER_RESUMED = const(36)
_LKC_N = const(37)


class RttEstimator:
    """The round trip as the acks measure it (smoothed, with its variation: RFC 6298), the
    retransmission timeout from it, and RACK's reordering allowance: how long a frame may be
    overtaken by later ones before it is deemed lost."""

    def __init__(self):
        self.srtt = 0
        self.rttvar = 0
        self.rto = _LK_RTO_INIT
        self.reo = 0  # ms of reordering allowed (grows when a frame sent again was not lost)
        self.line_bps = 0  # paced line rate (bytes/s; LinkOutput sets it), 0: fast or unknown

    def wait(self):
        # how long a frame may be out before a later one's arrival makes it lost: a round trip
        # and the reordering allowance, but less than the RTO (which would find every loss first)
        r = self.srtt >> 2
        if self.rttvar > r:
            r = self.rttvar
        if self.reo > r:
            r = self.reo
        r += self.srtt + 2
        return r if r < self.rto else self.rto - 1

    def sample(self, r, max_frame):
        if self.srtt == 0:
            self.srtt = r if r > 0 else 1
            self.rttvar = r >> 1
        else:
            d = self.srtt - r
            if d < 0:
                d = -d
            self.rttvar = (3 * self.rttvar + d) >> 2
            self.srtt = (7 * self.srtt + r) >> 3
        self.set_rto(max_frame)

    def set_rto(self, max_frame):
        v = self.rttvar * 4
        if v < 20:
            v = 20
        r = self.srtt + v
        lo = _LK_RTO_MIN
        if self.line_bps:
            # an ACK may wait behind a whole frame each way: never time out faster than that
            lo += 2 * max_frame * 1000 // self.line_bps
        self.rto = lo if r < lo else (_LK_RTO_MAX if r > _LK_RTO_MAX else r)


class BestEffortQueue:
    """The best-effort records waiting for the line: a ring of (6-byte tag + record), where
    each slot keeps its newest `depth` pending records (a newer one supersedes the oldest) and a
    full ring drops its oldest. Records that fit go out several to a frame; a bigger one goes
    out in fragments, and once started it is no longer superseded."""

    def __init__(self, size, max_slots, counts):
        self.ring = bytearray(size)
        self.tag = bytearray(6)
        self.max_slots = max_slots
        self.counts = counts
        self.last = array("i", [-1] * (max_slots + 1))  # per slot: ring position of its
        # newest record (-1: none)
        # per slot: how many pending records may wait (the topic's KEEP_LAST depth, <= 255;
        # LinkSession.set_depth) and how many do (live, not started)
        self.depth = bytearray(b"\x01" * (max_slots + 1))
        self.cnt = bytearray(max_slots + 1)
        self.kind = _LK_BE  # of the frame fill() built last
        self.reset()

    def reset(self):
        self.head = self.n = self.live = self.sent_part = 0
        self.seq = 0  # of the next best-effort frame
        for i in range(len(self.last)):
            self.last[i] = -1
            self.cnt[i] = 0

    def put(self, slot, hb, h, buf, off, n):
        # queue the record: header hb[0:h], body buf[off:off + n]
        be = self.ring
        cap = len(be)
        need = h + n
        key = slot if slot < self.max_slots else self.max_slots
        if self.cnt[key] >= self.depth[key]:  # newest win: the oldest pending one dies
            self._kill(key)
        tot = 6 + need
        while cap - self.n < tot:      # full: drop the oldest
            if self._pop():
                self.counts[_LKC_DROP_BE] += 1
        pos = self.head + self.n
        if pos >= cap:
            pos -= cap
        self.last[key] = pos
        self.cnt[key] += 1
        if pos + tot <= cap and h <= 4:  # the usual case, no wrap: tag and header byte by byte
            be[pos] = 1                   # (a copy call costs more), the body in one copy
            be[pos + 1] = key & 0xFF
            be[pos + 2] = key >> 8
            be[pos + 3] = need & 0xFF
            be[pos + 4] = (need >> 8) & 0xFF
            be[pos + 5] = need >> 16
            be[pos + 6] = hb[0]
            be[pos + 7] = hb[1]
            be[pos + 8] = hb[2]
            if h == 4:
                be[pos + 9] = hb[3]
            copy_into(be, pos + 6 + h, buf, off, n)
        else:
            tag = self.tag                # live, key(2), record length(3)
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
        self.n += tot
        self.live += 1

    def _kill(self, key):
        # the oldest pending (live, not started) record of `key` is superseded: mark it dead
        be = self.ring
        cap = len(be)
        pos = self.last[key]
        if self.cnt[key] > 1:          # depth > 1: find the oldest from the head
            h = self.head
            left = self.n
            while left > 0:
                w = 6 + (be[(h + 3) % cap] | (be[(h + 4) % cap] << 8) |
                         (be[(h + 5) % cap] << 16))
                if be[h] and (be[(h + 1) % cap] | (be[(h + 2) % cap] << 8)) == key and \
                        not (h == self.head and self.sent_part > 0):
                    pos = h
                    break
                h = (h + w) % cap
                left -= w
        be[pos] = 0
        self.live -= 1
        self.cnt[key] -= 1
        if self.last[key] == pos:
            self.last[key] = -1
        self.counts[_LKC_DROP_BE] += 1

    def _pop(self):
        # drop the head record of the ring; True if it was live
        be = self.ring
        cap = len(be)
        h = self.head
        live = be[h]
        key = be[(h + 1) % cap] | (be[(h + 2) % cap] << 8)
        w = be[(h + 3) % cap] | (be[(h + 4) % cap] << 8) | (be[(h + 5) % cap] << 16)
        if self.last[key] == h:
            self.last[key] = -1
        if live:
            self.live -= 1
            if self.sent_part == 0:    # not started: it was counted as pending
                self.cnt[key] -= 1
        h += 6 + w
        self.head = h % cap
        self.n -= 6 + w
        self.sent_part = 0
        return live

    def fill(self, tx, m):
        # the body of the next frame at tx[_LK_HDR:], at most m bytes: whole records, or one
        # fragment (self.kind says which); returns its length, 0: nothing to send
        be = self.ring
        cap = len(be)
        q = _LK_HDR
        kind = _LK_BE
        while self.n > 0:
            h = self.head
            w = be[(h + 3) % cap] | (be[(h + 4) % cap] << 8) | (be[(h + 5) % cap] << 16)
            if not be[h]:
                self._pop()
                continue
            if self.sent_part > 0 or w > m:
                if q > _LK_HDR:
                    break
                if self.sent_part == 0:        # started: no longer replaceable
                    key = be[(h + 1) % cap] | (be[(h + 2) % cap] << 8)
                    if self.last[key] == h:
                        self.last[key] = -1
                    self.cnt[key] -= 1
                q = _lk_putvar(tx, q, w)
                q = _lk_putvar(tx, q, self.sent_part)
                k = w - self.sent_part
                if k > m - (q - _LK_HDR):
                    k = m - (q - _LK_HDR)
                _lk_ring_get(tx, q, be, (h + 6 + self.sent_part) % cap, k)
                q += k
                self.sent_part += k
                if self.sent_part == w:
                    self._pop()
                kind = LK_BEFRAG
                self.counts[_LKC_FRAG_TX] += 1
                break
            if q + w > _LK_HDR + m:
                break
            _lk_ring_get(tx, q, be, (h + 6) % cap, w)
            q += w
            self._pop()
        self.kind = kind
        return q - _LK_HDR


class RecordReader:
    """The records in the peer's frames, handed to the handler: the reliable class is a byte
    stream of records that may span frames; a best-effort frame holds whole records, or one
    fragment of a record too big for a frame (reassembled here; one lost fragment loses the
    record). Best-effort seqs go through an anti-replay window: UDP may duplicate a datagram."""

    def __init__(self, handler, max_message, counts):
        self.handler = handler
        self.max_message = max_message
        self.counts = counts
        self.rec_buf = bytearray(max_message + LK_RHDR_MAX)  # a reliable record being assembled
        self.frag_buf = bytearray(max_message + LK_RHDR_MAX)  # a fragmented record reassembled
        self.win = [255, 0]  # lk_replayed's window over best-effort seqs
        # record header being parsed: type, slot, length (varints)
        self.hdr_var = self.hdr_slot = self.hdr_type = self.hdr_len = 0
        self.reset()

    def reset(self):
        self.rec_have = 0
        self.rec_need = 0
        self.rec_header_have = 0
        self.rec_type = self.rec_slot = self.rec_length = 0
        self.skip = 0
        self.frag_active = False
        self.frag_total = self.frag_have = self.frag_seq = self.frag_started_at = 0
        self.win[0] = 255
        self.win[1] = 0

    def expire(self, now):
        # a fragmented record whose next fragment is overdue is gone
        if self.frag_active and now - self.frag_started_at >= LK_FRAG_MS:
            self.frag_active = False
            self.counts[_LKC_FRAG_DROP] += 1

    def dup(self, seq):
        # best-effort frames are never delivered twice (UDP may duplicate them): seqs mod 256
        d = (seq - self.win[0]) & 255
        return lk_replayed(self.win, seq, d if d < 128 else d - 256)


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

    def rel(self, b, p, end):
        # the reliable channel is a byte stream of records: they may span frames
        while p < end:
            if end - p >= LK_RHDR_MAX and self.rec_have == 0 and self.skip == 0:
                # The common record, parsed inline (no call per varint): a whole header here,
                # slot < 128, length < 2**21 and allowed. Anything else takes the general path.
                s = b[p + 1]
                q = p + 3
                n = b[p + 2]
                if n >= 0x80:
                    n = (n & 0x7F) | (b[q] << 7)
                    q += 1
                    if n >= 0x4000:              # the second byte has a third after it
                        n = (n & 0x3FFF) | (b[q] << 14)
                        q += 1
                if s < 0x80 and n < 0x200000 and n <= self.max_message:
                    if q + n <= end:             # whole record here: no copy
                        self.handler.link_message(b[p], s, b, q, n, True)
                        p = q + n
                        continue
                    k = end - p                  # it goes on in the next frame(s)
                    copy_into(self.rec_buf, 0, b, p, k)
                    self.rec_type = b[p]
                    self.rec_slot = s
                    self.rec_length = n
                    self.rec_header_have = q - p
                    self.rec_need = q - p + n
                    self.rec_have = k
                    return
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
                        self.counts[_LKC_PROTO] += 1
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
                    self.counts[_LKC_PROTO] += 1
                    return
                else:
                    self.rec_need = 0
            if self.rec_need == 0:                 # header itself is split
                self.rec_buf[self.rec_have] = b[p]
                self.rec_have += 1
                p += 1
                h = self._hdr(self.rec_buf, 0, self.rec_have)
                if h < 0 or (h == 0 and self.rec_have >= LK_RHDR_MAX):
                    self.counts[_LKC_PROTO] += 1
                    self.rec_have = 0
                    return
                if h > 0:
                    if self.hdr_len > self.max_message:
                        self.counts[_LKC_PROTO] += 1
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
                self.counts[_LKC_FRAG_RX] += 1
                self.handler.link_message(self.rec_type, self.rec_slot, self.rec_buf, self.rec_header_have, self.rec_length, True)

    def be(self, b, p, end):
        while p < end:
            h = self._hdr(b, p, end)
            if h <= 0 or p + h + self.hdr_len > end:
                self.counts[_LKC_PROTO] += 1
                return
            p += h
            self.handler.link_message(self.hdr_type, self.hdr_slot, b, p, self.hdr_len, False)
            p += self.hdr_len

    def frag(self, b, p, end, seq, now):
        if self.frag_active and seq == self.frag_seq:
            self.counts[_LKC_DUP] += 1
            return
        p = self._varint(b, p, end, 21)  # a fragment is whole: incomplete is malformed too
        if p <= 0:
            self.counts[_LKC_PROTO] += 1
            return
        tot = self.hdr_var
        p = self._varint(b, p, end, 21)
        if p <= 0:
            self.counts[_LKC_PROTO] += 1
            return
        o = self.hdr_var
        k = end - p
        if o == 0:
            if self.frag_active:
                self.counts[_LKC_FRAG_DROP] += 1
            if tot > len(self.frag_buf):
                self.counts[_LKC_PROTO] += 1
                self.frag_active = False
                return
            self.frag_active = True
            self.frag_total = tot
            self.frag_have = 0
            self.frag_started_at = now
        elif not self.frag_active or o != self.frag_have or tot != self.frag_total or \
                seq != ((self.frag_seq + 1) & 255):
            if self.frag_active:
                self.counts[_LKC_FRAG_DROP] += 1    # a fragment was lost: the message is gone
                self.frag_active = False
            return
        if self.frag_have + k > self.frag_total:
            self.counts[_LKC_PROTO] += 1
            self.frag_active = False
            return
        copy_into(self.frag_buf, self.frag_have, b, p, k)
        self.frag_have += k
        self.frag_seq = seq
        self.counts[_LKC_FRAG_RX] += 1
        if self.frag_have == self.frag_total:
            self.frag_active = False
            self.be(self.frag_buf, 0, self.frag_total)


class ReliableSender:
    """The reliable class, sending: a ring of wire records (`rel`) cut into frames as the line
    takes them, and a table of the frames in flight (selective repeat over `ft` entries, a power
    of two <= _LK_WMAX: each frame's place in the ring, length, send time and state). Acks and
    SACKs release them; RACK and the RTO find the lost ones; the congestion window is 1 frame
    after an RTO and one more per frame acknowledged. Offsets < 2**31 and lengths < 2**16 are
    arrays: half a list's heap; a board's ring holds a few frames' worth (ubrb_setup.link_sizes)."""

    def __init__(self, rel_bytes, frames, datagram, rtt, counts):
        f = 8
        while f < frames and f < _LK_WMAX:
            f *= 2
        self.ft = f
        self.ft_mask = f - 1
        self.rel = bytearray(rel_bytes)
        self.rel_res = min(4096, rel_bytes // 4)  # reserved for control records
        self.rel_queued = 0
        self.frame_off = array("i", bytes(4 * f))  # per seq & ft_mask: its body in `rel`
        self.frame_len = array("H", bytes(2 * f))
        self.frame_sent_at = [0] * f  # ms: a list (CPython's clock outgrows an array's int)
        self.frame_st = bytearray(f)  # _LK_FS_* flags of each frame in flight
        self.datagram = datagram
        self.rtt = rtt
        self.counts = counts
        self.bad_ack_at = -1  # since when the peer acks what we never sent (-1: it does not)
        self.reset()

    def reset(self):
        # a new peer incarnation: nothing of the old stream may leak into it
        self.counts[_LKC_REL_RESET_BYTES] += self.rel_queued
        self.una = self.nxt = 0
        self.rel_head = self.rel_queued = self.rel_framed = 0
        # rel_head stays at a record's start: the acknowledged head of a record a frame ended
        # inside is released with its end (ack), so a new peer session can get it again
        # whole (ubrb_keep)
        self.lost_n = self.sack_n = 0  # frames in flight marked lost (to resend) / reported held
        self.fack = 0  # the highest seq the peer reported held (valid while above una)
        self.rack_at = -1  # when to look for lost frames again (-1: nothing to look for)
        self.cwnd = self.ft  # frames we let be in the network (<= peer_window); 1 after an RTO
        # a stream link (serial): frames are made smaller when the line loses them (ubrb_stream)
        self.frame_cap = 0  # the largest frame we send, 0: the peer's max_frame
        self.fit_lost = 0  # REL frames deemed lost since the last fit
        self.nak_late = False  # a NAK came while the last go-back was still on its way
        self.go_back_at = -100000
        self.released = 0  # bytes of the stream released by acks (rel_head's position), mod 2**30
        # bytes of the control records queued since the ring last held none unacknowledged,
        # and where the newest ends (a position in the whole stream): all are acked once it is
        self.ctl_bytes = self.ctl_end = 0

    def rebase(self, d):
        self.go_back_at -= d
        if self.rack_at >= 0:
            self.rack_at -= d
        if self.bad_ack_at >= 0:
            self.bad_ack_at -= d
        t = self.frame_sent_at
        for i in range(len(t)):
            t[i] -= d

    def take(self, now, m, ovh):
        # the seq of the next REL frame to send: the oldest deemed lost, as it was, else a new
        # one of at most m bytes of the ring (its place and length in frame_off / frame_len)
        if self.lost_n:
            s = self.una
            while not self.frame_st[s & self.ft_mask] & _LK_FS_LOST:
                s = (s + 1) & 255
            i = s & self.ft_mask
            self.frame_st[i] = (self.frame_st[i] & _LK_FS_END) | _LK_FS_RETX
            self.lost_n -= 1
            self.counts[_LKC_RETX] += 1
            if not self.frame_cap or self.frame_len[i] <= self.frame_cap - ovh:
                # RACK's timer for the copy too (a noisy line loses it in turn): else a window
                # stuck on it, the rest held by the peer, hears nothing new and waits for an RTO.
                # Not for a frame cut too big for the line: the RTO cuts it again
                t = now + self.rtt.wait()
                if self.rack_at < 0 or t - self.rack_at < 0:
                    self.rack_at = t
            return s
        s = self.nxt
        i = s & self.ft_mask
        n = self.rel_queued - self.rel_framed
        if n > m:
            n = m
        pos = self.rel_head + self.rel_framed
        cap = len(self.rel)
        if pos >= cap:
            pos -= cap
        self.frame_off[i] = pos
        self.frame_len[i] = n
        self.rel_framed += n
        self.frame_st[i] = 0 if self.rel_framed < self.rel_queued else _LK_FS_END
        self.nxt = (s + 1) & 255
        return s

    def rto_due(self, now):
        # True: the oldest frame in the network (sent, not reported held, not waiting to be
        # sent again; there is one) went a whole RTO ago
        s = self.una
        st = self.frame_st
        i = s & self.ft_mask
        while st[i] & (_LK_FS_LOST | _LK_FS_SACK):
            s = (s + 1) & 255
            i = s & self.ft_mask
        return now - self.frame_sent_at[i] >= self.rtt.rto

    def lose(self, now):
        # Mark lost the frames in flight below the highest one the peer reported held (fack)
        # that have been out longer than a round trip and a reordering allowance (so a frame
        # merely overtaken is not sent twice): RACK, with seq order for "sent before". now < 0:
        # every frame not reported held (an RTO, a go-back on NAK, a resumed session).
        n = (self.nxt - self.una) & 255
        f = n
        if now >= 0:
            f = (self.fack - self.una) & 255
            if f >= n:
                f = 0
        wait = self.rtt.wait()
        st = self.frame_st
        t = self.frame_sent_at
        self.rack_at = -1
        s = self.una
        k = self.lost_n
        for _ in range(f):
            i = s & self.ft_mask
            if not st[i] & (_LK_FS_SACK | _LK_FS_LOST):
                if now < 0 or now - t[i] >= wait:
                    st[i] |= _LK_FS_LOST
                    self.lost_n += 1
                    if now >= 0:
                        self.counts[LKC_FAST_RETX] += 1
                        self.rtt.reo -= self.rtt.reo >> 4
                        self.fit_lost += 1
                elif self.rack_at < 0 or t[i] + wait - self.rack_at < 0:
                    self.rack_at = t[i] + wait
            s = (s + 1) & 255
        return self.lost_n - k

    def ack(self, a, nak, b, q, bits, now, max_frame):
        # `a`: the peer's next expected seq; at b[q] `bits` bits of its SACK bitmap (0: none).
        # False: the peer acks what we never sent, for too long (a desync: the session starts
        # anew)
        una = self.una
        k = (a - una) & 255
        inflight = (self.nxt - una) & 255
        if k > inflight:
            # an ack of what we never sent: a delayed frame, or the ends disagree about the stream
            if self.bad_ack_at < 0:
                self.bad_ack_at = now
            elif now - self.bad_ack_at >= _LK_DESYNC_MS:
                return False
            return True
        self.bad_ack_at = -1
        st = self.frame_st
        rtt = self.rtt
        srtt = rtt.srtt
        sample = -1  # the newest frame acked now that was sent once: an RTT sample
        over = False  # a frame sent again was acked sooner than its second copy could have been
        if k:
            cap = len(self.rel)
            # rel_head moves to the end of the last frame acked that ended a record (_LK_FS_END):
            # the acknowledged head of a record a frame ended inside stays (m: bytes acked past
            # rel_head), so that a new peer session can get it again whole (ubrb_keep)
            m = self.frame_off[una & self.ft_mask] - self.rel_head
            if m < 0:
                m += cap
            r = 0
            while una != a:
                i = una & self.ft_mask
                m += self.frame_len[i]
                f = st[i]
                if f & _LK_FS_END:
                    r = m
                if f & _LK_FS_LOST:
                    self.lost_n -= 1
                if f & _LK_FS_SACK:
                    self.sack_n -= 1
                elif not f & _LK_FS_RETX:
                    sample = i
                elif now - self.frame_sent_at[i] < srtt >> 1:
                    over = True
                una = (una + 1) & 255
            self.una = a
            h = self.rel_head + r
            self.rel_head = h - cap if h >= cap else h
            self.rel_queued -= r
            self.rel_framed -= r
            if self.ctl_bytes and (self.released + m - self.ctl_end) & _LK_POS_MASK < 0x20000000:
                self.ctl_bytes = 0  # acked up to the newest control record's end (m: to the last
                # frame acked; the ring is released only to the last that ended a record)
            if r:
                self.released = (self.released + r) & _LK_POS_MASK
            self.nak_late = False
            inflight -= k
            self.cwnd += k  # a delivered frame lets one more in (from 1 after an RTO)
            if self.cwnd > self.ft:
                self.cwnd = self.ft
        if bits:
            top = 0
            for d in range(1, inflight if inflight <= bits else bits + 1):  # bit d - 1: a + d
                if b[q + ((d - 1) >> 3)] & (1 << ((d - 1) & 7)):
                    top = d
                    i = (a + d) & self.ft_mask
                    f = st[i]
                    if not f & _LK_FS_SACK:
                        if f & _LK_FS_LOST:
                            self.lost_n -= 1
                        elif not f & _LK_FS_RETX:
                            sample = i
                        elif now - self.frame_sent_at[i] < srtt >> 1:
                            over = True
                        st[i] = (f & (_LK_FS_RETX | _LK_FS_END)) | _LK_FS_SACK
                        self.sack_n += 1
            f = (self.fack - a) & 255
            if top and (f >= inflight or top > f):
                self.fack = (a + top) & 255
        if over and self.datagram:
            # its first copy had only been overtaken: wait longer before calling a frame lost
            # (down again, 1/16 each time one is: RACK's reordering window, adapted without DSACK).
            # A byte stream does not reorder: there an early ack only means the first copy's
            # ack was lost, and a small frame's round trip is shorter than srtt / 2 of large ones
            # (a noisy serial line grew the allowance to the RTO: every loss waited for one)
            r = rtt.reo + (srtt >> 2) + 1
            rtt.reo = r if r < srtt + 50 else srtt + 50
        if sample >= 0:
            rtt.sample(now - self.frame_sent_at[sample], max_frame)
        elif k and srtt:
            rtt.set_rto(max_frame)  # new data through: drop the backoff (Karn's samples may be rare)
        if not inflight:
            self.rack_at = -1
        elif nak:
            # the peer dropped a frame after a gap it could not hold (a board): _timer goes
            # back over every frame it does not hold, once per round trip (NAKs of frames sent
            # before the last go-back are still coming: one within it waits for it to be over)
            self.nak_late = True
        elif bits:
            self.lose(now)
        return True


class LinkSession:
    """One end of the link.  handler gets link_up(fresh), link_down() and
    link_message(type, slot, buf, off, n, reliable); buf is only valid during
    the call."""

    def __init__(self, handler, epoch, gateway=True, datagram=False,
                 max_frame=1024, max_message=16384, window=8,
                 rel_bytes=65536, be_bytes=32768, max_slots=256, key=None, nonce=None, hold=0,
                 frames=_LK_WMAX):
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
        self.window = max(1, min(window, _LK_WMAX))
        self.max_slots = max_slots
        self.state = _LINK_DOWN
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
        self.chal = 0  # a newcomer's epoch, named in our next HELLO as a challenge (0: none)
        self.hello_why = 0  # LKW_*: why the last HELLO was refused (the port reads and clears)
        self.last_rx = 0
        self.last_tx = 0
        self.peer_live = False  # a frame other than a HELLO came from the peer since LINK_UP
        self.rtt = RttEstimator()
        # -- framing: one frame out at a time, the stream being resynchronised on input ---------
        self.tx_buf = bytearray(max_frame)
        self.tx_mv = memoryview(self.tx_buf)
        self.rx = bytearray(0 if datagram else 2 * max_frame)  # stream mode only
        self.rx_mv = memoryview(self.rx)  # frames reassembled there are checked through it,
        self.in_buf = self.in_mv = None   # ... and those in the driver's buffer through this
        self.rx_n = 0
        self.rec_header = bytearray(LK_RHDR_MAX)  # scratch: a record header being written
        # receiving: up to `hold` frames ahead of a gap are kept and reported in SACKs
        # (ubrb_hold, imported only then); None keeps none (a board without the heap for them:
        # the sender then goes back over what was not kept, on our NAK)
        self.hold = None
        if hold > 0:
            from ubrb_hold import Hold

            self.hold = Hold(hold, max_frame)
        # -- counters, by the _LKC_* indices of _LK_COUNTERS' names (small ints: increments
        # allocate nothing); counters() reports them by name
        self.stat_counts = [0] * _LKC_N
        # -- the reliable records we send, those we receive, and the best-effort records waiting
        self.reliable = ReliableSender(rel_bytes, frames, datagram, self.rtt, self.stat_counts)
        self.reader = RecordReader(handler, max_message, self.stat_counts)
        self.beq = BestEffortQueue(be_bytes, max_slots, self.stat_counts)
        # -- session identity and authentication (docs/LINK.md section 3) ------------------------
        # `used`: went UP since the stream was last discarded, so the peer may hold state of it;
        # discarding such a stream renews our epoch, so the peer can never resume it (a resumed
        # session on one end and a fresh one on the other would stall for good).
        self.used = False
        self.nonce = nonce  # callable -> a random int: new epochs (keyed: must be unpredictable)
        # a keyed link: ubrb_keyed's LinkMac signs and checks every frame (imported only for a
        # link with a key: an unkeyed gateway never loads the MAC code)
        self.mac = None
        if key is not None:
            from ubrb_keyed import LinkMac

            self.mac = LinkMac(key)
        self.tag = LK_TAG if key is not None else 0  # MAC trailer bytes per frame
        # a stream link's own parts (ubrb_stream, imported only then): the byte stream cut into
        # frames again, frames fitted to the line's error rate (a UDP link loses datagrams
        # whatever their size)
        self.fit = None
        if not datagram:
            from ubrb_stream import Stream

            self.fit = Stream()
        self.ovh = LK_OVH + self.tag
        self._reset_stream()

    # ---- state ---------------------------------------------------------
    def _reset_stream(self):
        # a new peer incarnation: nothing of the old stream may leak into it
        self.reliable.reset()
        self.rtt.reo = 0
        self.rel_rx_expected = 0
        if self.hold is not None:
            self.hold.clear()
        self.ack_pending = False
        self.sack_pending = False
        self.ack_rep = 0
        self.nak_pending = False
        self.reader.reset()
        self.beq.reset()
        self.turn = 0

    def is_up(self):
        return self.state == LINK_UP

    def set_handler(self, handler):
        """Who gets link_up, link_down and the records (a port, made after its session)."""
        self.handler = self.reader.handler = handler

    def _go_down(self):
        # the one way out of LINK_UP: the dead timer, a new peer session, a desync
        f = self.fit
        if f is not None:  # a probe ends with the session it probed (ubrb_stream)
            f.answer = 0
            if f.probe:
                f.probe = 0
            self.reliable.cwnd = 1
        if self.state == LINK_UP:
            self.state = _LINK_DOWN
            self.stat_counts[_LKC_DOWN] += 1
            self.handler.link_down()

    def max_send(self):
        """Largest message send() accepts in both classes right now."""
        m = self.peer_max_message
        t = self.reliable
        r = len(t.rel) - t.rel_res - LK_RHDR_MAX
        b = len(self.beq.ring) - 6 - LK_RHDR_MAX
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
            self.beq.depth[slot] = 1 if depth < 1 else (255 if depth > 255 else depth)

    def rel_room(self, n):
        """True when a reliable data record of `n` payload bytes should be queued now: it fits
        the ring (minus the control reserve) and what is queued but not yet framed stays below
        one window of frames. The link then always has its next window ready, and a burst waits
        where it came from (the client's socket, a DDS reader) instead of in the ring, where it
        would delay registrations and results by the whole ring's line time."""
        t = self.reliable
        q = t.rel_queued
        if q + n + LK_RHDR_MAX > len(t.rel) - t.rel_res:
            return False
        return q - t.rel_framed < self.peer_window * self.peer_max_frame

    def counters(self):
        d = {}
        counts = self.stat_counts
        for i, k in enumerate(_LK_COUNTERS.split()):
            d[k] = counts[i]
        d["is_up"] = self.state
        d["rel_queued"] = self.reliable.rel_queued
        d["be_queued"] = self.beq.n
        d["srtt_ms"] = self.rtt.srtt
        d["rto_ms"] = self.rtt.rto
        return d

    # ---- sending -----------------------------------------------------------
    def send(self, t, slot, buf, off, n, reliable, control=False):
        """Queue one message; LK_OK or LK_TOO_LARGE / LK_FULL / _LK_DOWN."""
        if self.peer_epoch == 0:
            self.stat_counts[_LKC_DROP_DOWN] += 1
            return _LK_DOWN
        if n > self.max_send():
            self.stat_counts[_LKC_TOO_LARGE] += 1
            return LK_TOO_LARGE
        hb = self.rec_header
        hb[0] = t
        if slot < 0x80 and n < 0x4000:       # the usual header, written inline: 3 or 4 bytes
            hb[1] = slot
            if n < 0x80:
                hb[2] = n
                h = 3
            else:
                hb[2] = (n & 0x7F) | 0x80
                hb[3] = n >> 7
                h = 4
        else:
            h = _lk_putvar(hb, 1, slot)
            h = _lk_putvar(hb, h, n)
        need = h + n
        if n + h > self.peer_max_frame - self.ovh:
            self.stat_counts[_LKC_FRAG_TX] += 1
        if reliable:
            rs = self.reliable
            rel = rs.rel
            cap = len(rel)
            lim = cap if control else cap - rs.rel_res
            if rs.rel_queued + need > lim:
                self.stat_counts[_LKC_DROP_REL_FULL] += 1
                return LK_FULL
            pos = rs.rel_head + rs.rel_queued
            if pos >= cap:
                pos -= cap
            if pos + need <= cap and h <= 4:  # the usual case, no wrap: a short header byte
                # by byte (a copy call costs more), one copy
                rel[pos] = t
                rel[pos + 1] = hb[1]
                rel[pos + 2] = hb[2]
                if h == 4:
                    rel[pos + 3] = hb[3]
                copy_into(rel, pos + h, buf, off, n)
            else:
                _lk_ring_put(rel, pos, hb, 0, h)
                pos += h
                if pos >= cap:
                    pos -= cap
                _lk_ring_put(rel, pos, buf, off, n)
            rs.rel_queued += need
            if control:
                rs.ctl_bytes += need
                rs.ctl_end = (rs.released + rs.rel_queued) & _LK_POS_MASK
            return LK_OK
        if self.state != LINK_UP:
            self.stat_counts[_LKC_DROP_BE_DOWN] += 1
            return _LK_DOWN
        self.beq.put(slot, hb, h, buf, off, n)
        return LK_OK

    def _head(self, kind, seq, n_body):
        # fill sync/len/ctl/hck/seq/ack; returns total frame length
        b = self.tx_buf
        L = n_body + self.ovh
        ctl = kind
        if self.nak_pending and kind != LK_HELLO:
            ctl |= _LK_NAK
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
        if self.mac is not None:
            self.mac.seal(self.tx_buf, self.tx_mv, L)
        # The CRC over bytes 0 ... L-5 without a view of them (see _LK_RESIZE): tx_buf shrunk
        # to L-4 bytes (the rest is zeroed: nothing of this frame is there), crc32 of the
        # whole object, tx_buf back to max_frame bytes with its content. On a 32-bit port
        # the CRC value is >= 2**30 (a big int, 32 B) 3 times in 4: binascii.crc32 returns
        # the whole value, the only allocation of a sent frame there; pack_into takes the
        # big int as is (c & 0xFF etc. would each allocate another one).
        b = self.tx_buf
        if _LK_RESIZE:
            b[L - 4:] = b""
            c = _lk_crc32(b, seed)
            b[0:] = self.tx_mv
        else:
            c = _lk_crc32(self.tx_mv[0:L - 4], seed)
        struct.pack_into("<I", b, L - 4, c)
        self.last_tx = now
        # repeat a fresh ack once if nothing else follows it (a lost pure ACK would otherwise
        # stall the sender until its RTO); any later frame carries the ack and cancels that
        self.ack_rep = now + _LK_ACK_REP_MS if self.ack_pending else 0
        self.ack_pending = False
        self.stat_counts[_LKC_TX_FRAMES] += 1
        self.stat_counts[_LKC_TX_BYTES] += L
        return L

    def _hello(self, now):
        b = self.tx_buf
        L = self._head(LK_HELLO, 0, _LK_HELLO_LEN)
        flags = ((_LK_HF_REPLY if self.state != LINK_UP else 0) |
                 (_LK_HF_KEYED if self.tag else 0) | (_LK_HF_CHAL if self.chal else 0))
        b[26] = b[27] = 0
        f = self.fit
        if f is not None:  # (ubrb_stream) our probe, the peer's probe answered: either or both
            if f.probe == 1:
                f.probe = 2
                flags |= _LK_HF_REPLY | _LK_HF_PROBE
                b[26] = f.round
            if f.answer:
                flags |= _LK_HF_ANSWER
                b[27] = f.answer
                f.answer = 0
        b[8] = _LK_VERSION
        b[9] = 0 if self.is_gateway else 1
        struct.pack_into("<IIHIBB", b, 10, self.epoch, self.chal or self.peer_epoch,
                         self.max_frame, self.max_message, self.window, flags)
        self.hello_reply = False
        self.chal = 0
        self.hello_at = now + LK_HELLO_MS
        self.stat_counts[_LKC_HELLO_TX] += 1
        return self._seal(L, 0, now)

    def poll_tx(self, now):
        """Build the next frame in tx_buf; returns its length (0: nothing)."""
        self.now = now
        # a reply waits until _LK_HELLO_GAP after our last HELLO (sent at hello_at - LK_HELLO_MS)
        reply = self.hello_reply and now - self.hello_at >= _LK_HELLO_GAP - LK_HELLO_MS
        if self.state != LINK_UP:
            if now - self.hello_at >= 0 or reply:
                return self._hello(now)
            return 0
        if reply:
            return self._hello(now)
        self._timer(now)
        if self.sack_pending:            # what we hold goes out before anything else
            return self._ack(now)
        t = self.reliable
        inflight = (t.nxt - t.una) & 255
        pw = self.peer_window
        if t.frame_cap:   # smaller frames: as many bytes in flight as the window's worth
            pw = pw * self.peer_max_frame // t.frame_cap
            if pw > t.ft:
                pw = t.ft
        w = t.cwnd if t.cwnd < pw else pw
        rel = inflight - t.sack_n - t.lost_n < w and (
            t.lost_n or (t.rel_queued > t.rel_framed and inflight < pw))
        if rel and (self.turn == 0 or self.beq.live == 0):
            self.turn = 1
            return self._rel_frame(now)
        if self.beq.live > 0:
            self.turn = 0
            return self._be_frame(now)
        if self.ack_pending or self.nak_pending or now - self.last_tx >= _LK_HB_MS or \
                (self.ack_rep and now - self.ack_rep >= 0):
            self.ack_rep = 0
            return self._ack(now)
        return 0

    def _ack(self, now):
        # an ACK frame; while frames are held past a gap its body is the SACK bitmap, hold / 8
        # bytes: bit i & 7 of byte i >> 3 is "I hold seq ack + 1 + i"
        self.sack_pending = False
        h = self.hold
        if h is None or not h.held:
            return self._seal(self._head(LK_ACK, 0, 0), self.seed, now)
        L = self._head(LK_ACK, 0, h.n >> 3)
        h.sack(self.tx_buf, _LK_HDR, self.rel_rx_expected)
        return self._seal(L, self.seed, now)

    def _rel_frame(self, now):
        t = self.reliable
        s = t.take(now, (t.frame_cap or self.peer_max_frame) - self.ovh, self.ovh)
        f = self.fit
        if f is not None:
            f.sent += 1
            if f.sent >= 64 or t.fit_lost >= 4:  # enough frames, or enough lost
                f.frames(self)
        i = s & t.ft_mask
        n = t.frame_len[i]
        L = self._head(LK_REL, s, n)
        pos = t.frame_off[i]
        rel = t.rel
        if pos + n <= len(rel):         # no wrap (the usual case): one copy, no call
            copy_into(self.tx_buf, _LK_HDR, rel, pos, n)
        else:
            _lk_ring_get(self.tx_buf, _LK_HDR, rel, pos, n)
        t.frame_sent_at[i] = now
        return self._seal(L, self.seed, now)

    def _be_frame(self, now):
        q = self.beq
        n = q.fill(self.tx_buf, (self.reliable.frame_cap or self.peer_max_frame) - self.ovh)
        if n == 0:
            return 0
        L = self._head(q.kind, q.seq, n)
        q.seq = (q.seq + 1) & 255
        return self._seal(L, self.seed, now)

    # ---- time ----------------------------------------------------------------
    def _timer(self, now):
        # the retransmission timeout, on the oldest frame in the network (sent, not reported
        # held, not waiting to be sent again): nothing came back for a whole RTO, so every frame
        # in flight the peer did not report held is deemed lost and one frame at a time probes
        # the line again. The RTO doubles (up to _LK_RTO_MAX) when the peer has been silent as
        # long (an outage), not while its frames arrive (a noisy line loses ours: waiting longer
        # would not bring them through). Frames deemed lost that wait for the line (a paced
        # serial line) do not time out: they have not been sent again yet.
        f = self.fit
        rtt = self.rtt
        if f is not None and f.probe == 2 and now - self.hello_at + LK_HELLO_MS >= rtt.rto:
            f.start_probe(self, now)  # our probe went an RTO ago, no reply: ask again
        t = self.reliable
        if (t.nxt - t.una) & 255 > t.sack_n + t.lost_n and t.rto_due(now):  # (the call only
            t.fit_lost += t.lose(-1)           # when frames are in the network: poll_tx's path)  # (all of them, most likely, or their acks)
            self.stat_counts[_LKC_TIMEOUTS] += 1
            if now - self.last_rx >= rtt.rto:  # silence: an outage, not a noisy line
                rtt.rto = min(rtt.rto * 2, _LK_RTO_MAX)
            t.cwnd = 1
            if f is not None:
                f.timeout(self, now)  # smaller frames, and those in flight cut again
            return
        if t.nak_late and now - t.go_back_at >= rtt.wait():
            t.go_back_at = now
            t.nak_late = False
            t.lose(-1)
            t.fit_lost += 1  # (one frame lost: the rest were dropped behind it)
            self.stat_counts[LKC_FAST_RETX] += 1
        if t.rack_at >= 0 and now - t.rack_at >= 0:
            t.lose(now)

    def tick(self, now):
        self.now = now
        if self.mac is not None and self.mac.exhausted():
            self._desync(now)             # counters exhausted: a new session, new keys
        if self.state == LINK_UP:
            if now - self.last_rx >= LK_DEAD_MS:
                self._go_down()
                self.hello_at = now
            else:
                self._timer(now)
        self.reader.expire(now)

    def rebase(self, d):
        """Move every stored time `d` ms back (see Gateway.rebase)."""
        self.now -= d
        self.hello_at -= d
        self.last_rx -= d
        self.last_tx -= d
        if self.ack_rep:  # 0 means "no repeat scheduled"
            self.ack_rep -= d
        self.reader.frag_started_at -= d
        self.reliable.rebase(d)

    # ---- receiving -----------------------------------------------------------
    def feed(self, buf, off, n, now):
        """Bytes arrived (stream: any chunking; datagram: one datagram)."""
        self.now = now
        self.stat_counts[_LKC_RX_BYTES] += n
        end = off + n
        if self.fit is not None:
            self.fit.feed(self, buf, off, end)
            return
        p = self._parse(buf, off, end)
        if p < end:
            self.stat_counts[_LKC_TRUNC] += 1
            self.stat_counts[_LKC_NOISE] += end - p

    def _parse(self, b, p, end):
        # returns the first byte not consumed (a frame still incomplete)
        while p < end:
            i = b.find(_LK_SYNC, p, end)
            if i < 0:
                k = end - 1 if b[end - 1] == LK_SYNC0 else end
                if k > p:
                    self.stat_counts[_LKC_NOISE] += k - p
                    self.stat_counts[_LKC_RESYNC] += 1
                return k
            if i > p:
                self.stat_counts[_LKC_NOISE] += i - p
                self.stat_counts[_LKC_RESYNC] += 1
                p = i
            if end - p < 6:
                return p
            L = b[p + 2] | (b[p + 3] << 8)
            ctl = b[p + 4]
            if lk_hck(b[p + 2], b[p + 3], ctl) != b[p + 5] or L < self.ovh or L > self.max_frame:
                self.stat_counts[_LKC_HDR_ERR] += 1
                p += 1
                continue
            kind = ctl & 15
            if end - p < L:
                if kind == LK_HELLO or self.state == LINK_UP:
                    return p
                # a frame the link, being down, would throw away: not waited for. After an
                # outage cut one, its L bytes would otherwise have to come as HELLOs (a
                # quarter of a second each) before the first HELLO counted.
                self.stat_counts[LKC_STALE] += 1
                p += 1
                continue
            if self._crc(b, p, L, 0 if kind == LK_HELLO else self.seed) != LK_RESIDUE:
                self.stat_counts[_LKC_CRC_ERR] += 1
                p += 1
                continue
            if self.mac is None or self.mac.check(b, p, L, kind, self.stat_counts):
                self._frame(b, p, L, ctl)
            elif kind == LK_HELLO and L < self.ovh + 18:
                self.hello_why = LKW_UNKEYED  # (counted auth) an unkeyed HELLO: no trailer
            p += L
        return p

    def _crc(self, b, p, n, seed):
        # CRC-32 of b[p:p + n] (the check compares it with LK_RESIDUE: a small int). A frame
        # that is its whole buffer (a datagram) needs no view; one inside a longer buffer does
        # (binascii.crc32 takes no offset): a slice of a view of that buffer made once, so a
        # frame costs one object (16 B on a 32-bit port), not a view and a slice of it. A
        # stream session is fed the driver's read buffer (on MicroPython always the same one)
        # and reassembles in its own rx. Not kept: a view of a datagram (a new object each
        # time, rarely of two frames) or on CPython (it would forbid resizing the buffer, and
        # a new one is cheap there).
        if p == 0 and n == len(b):
            return _lk_crc32(b, seed)
        if b is self.rx:
            return _lk_crc32(self.rx_mv[p:p + n], seed)
        if self.datagram or not IS_MICROPYTHON:
            return _lk_crc32(memoryview(b)[p:p + n], seed)
        mv = self.in_mv
        if b is not self.in_buf or len(mv) != len(b):  # (a resized buffer: a new view)
            mv = self.in_mv = memoryview(b)
            self.in_buf = b
        return _lk_crc32(mv[p:p + n], seed)

    def _frame(self, b, p, L, ctl):
        now = self.now
        kind = ctl & 15
        self.stat_counts[_LKC_RX_FRAMES] += 1
        if kind == LK_HELLO:
            self._on_hello(b, p + _LK_HDR, L - self.ovh, now)
            return
        if self.state != LINK_UP:
            self.stat_counts[LKC_STALE] += 1
            return
        self.last_rx = now
        self.peer_live = True
        a = b[p + 7]
        end = p + L - 4 - self.tag
        sack = (end - p - _LK_HDR) << 3 if kind == LK_ACK else 0  # bits of SACK bitmap
        t = self.reliable
        if a != t.una or ctl & _LK_NAK or t.bad_ack_at >= 0 or sack:  # else: nothing new
            if not t.ack(a, ctl & _LK_NAK, b, p + _LK_HDR, sack, now, self.peer_max_frame):
                self._desync(now)         # the ack told of a desync
                return
        f = self.fit
        if f is not None and f.probe == 3:
            f.recut(self)                 # the first frame after the reply to our probe
        seq = b[p + 6]
        if kind == LK_REL:
            d = (seq - self.rel_rx_expected) & 255
            if d == 0:
                self.rel_rx_expected = (seq + 1) & 255
                self.ack_pending = True
                self.reader.rel(b, p + _LK_HDR, end)
                h = self.hold
                if h is not None and h.held:
                    h.release(self, seq)
            elif d < 128:
                self.stat_counts[_LKC_OOO] += 1
                h = self.hold
                if h is not None and d <= h.n:    # kept until the gap before it is filled
                    h.keep(seq, b, p + _LK_HDR, end - p - _LK_HDR)
                    self.sack_pending = True
                else:                         # not kept: each one tells the peer of the gap
                    self.nak_pending = True
            else:
                self.stat_counts[_LKC_DUP] += 1
                self.ack_pending = True
        elif kind == _LK_BE or kind == LK_BEFRAG:
            rd = self.reader
            if rd.dup(seq):
                self.stat_counts[_LKC_DUP] += 1
            elif kind == _LK_BE:
                rd.be(b, p + _LK_HDR, end)
            else:
                rd.frag(b, p + _LK_HDR, end, seq, now)
        elif kind != LK_ACK:
            self.stat_counts[_LKC_PROTO] += 1

    def _on_hello(self, b, p, n, now):
        why = LKW_VERSION if n < 18 or b[p] != _LK_VERSION else 0
        if not why and b[p + 1] == (0 if self.is_gateway else 1):
            why = LKW_ROLE                         # two ends of the same role
        if not why:
            pe, ye, pf, pm, pw, flags = struct.unpack_from("<IIHIBB", b, p + 2)
            if (flags & _LK_HF_KEYED) and not self.tag:
                why = LKW_KEYED                    # the peer has a link key and we have none
        if why:
            self.stat_counts[_LKC_PROTO] += 1       # never pair
            self.hello_why = why
            return
        self.stat_counts[_LKC_HELLO_RX] += 1
        # verified: the sender knows our current epoch (keyed: and proved the link key over it,
        # the MAC was checked in _parse); the only kind of HELLO that may change a used session
        verified = ye == self.epoch
        if flags & _LK_HF_CHAL and not verified:
            self.stat_counts[_LKC_HELLO_IGNORED] += 1  # a challenge to another epoch than ours
            return
        if pe != self.peer_epoch:
            if self.used and not verified:
                # someone who has not seen us (a restarted peer, the peer of a session we left,
                # or anyone at all): our session is not touched, but we challenge it to name our
                # epoch, so a live peer (keyed: with the key) proves it is no stale HELLO and a
                # new session can start even when both ends were used (section 3)
                self.stat_counts[_LKC_HELLO_IGNORED] += 1
                self.chal = pe
                self.hello_reply = True
                return
            # a new peer session: the old stream is gone for good, on both ends
            self._go_down()
            self._discard()
            self.peer_epoch = pe
            self.fresh = True
            self.stat_counts[_LKC_NEW] += 1
            self._rekey()
            verified = ye == self.epoch      # _discard may have renewed our epoch
        elif self.mac is not None and self.mac.rx_ctr <= self.mac.peer_hello:
            self.stat_counts[LKC_REPLAY] += 1      # a HELLO of this peer seen before: replayed
            return
        if self.mac is not None:
            self.mac.peer_hello = self.mac.rx_ctr
        self.peer_max_frame = min(pf, self.max_frame)
        self.peer_max_message = pm
        self.peer_window = max(1, min(pw, self.reliable.ft))
        if not verified:
            # the peer does not know our current epoch: tell it; an UP session stays up (a
            # stale or forged HELLO must not stop it; a real peer in doubt stops sending and
            # the dead timer, or its new epoch, settles it)
            self.hello_reply = True
            return
        if flags & _LK_HF_CHAL:
            self.hello_reply = True  # a challenge: answer it, but it accepts nothing yet
            return
        self.stat_counts[_LKC_HELLO_OK] += 1
        self.last_rx = now
        f = self.fit
        if flags & _LK_HF_REPLY:
            self.hello_reply = True
            if f is not None and self.state == LINK_UP:
                self.ack_pending = True  # (maybe a probe: what we hold, right after the reply)
                if flags & _LK_HF_PROBE and n >= _LK_HELLO_LEN:
                    f.answer = b[p + 18] or 1  # our reply answers that round
        if f is not None and f.probe == 2 and self.state == LINK_UP and (
                n < _LK_HELLO_LEN or flags & _LK_HF_ANSWER and b[p + 19] == f.round):
            f.probe = 3               # the answer to our probe (ubrb_stream); the next frame tells
        if self.state != LINK_UP:
            self.state = LINK_UP
            self.stat_counts[_LKC_UP] += 1
            self.used = True
            self.peer_live = False
            self.reliable.bad_ack_at = -1
            self.reliable.lose(-1)     # resume: resend whatever the peer does not hold
            fresh = self.fresh
            self.fresh = False
            self.handler.link_up(fresh)
        elif self.peer_live and (flags & (_LK_HF_REPLY | _LK_HF_PROBE)) == _LK_HF_REPLY:
            # The peer, up since our LINK_UP (it sent frames), is down and resumes: an outage
            # only it saw (one direction lost, or the line back before our dead timer ran out).
            # Our handler hears link_up again, as if we had seen it too, so that what an end
            # says at a resume is said: without the companion's CHELLO the gateway would wait
            # for its ROS side for good. (A handshake HELLO that crossed ours comes before the
            # peer's first frame: not taken for one.)
            self.peer_live = False
            self.stat_counts[LKC_PEER_RESUMED] += 1
            self.reliable.lose(-1)
            self.handler.link_up(False)

    def _discard(self):
        # throw the stream away; if the peer may hold state of it (we were UP since the last
        # discard), become a new incarnation: a new epoch, so the peer cannot resume it. The
        # gateway keeps the data records its peer may not have handed to ROS (_keep).
        if self.reliable.rel_queued:
            from ubrb_keep import keep  # (loaded only then: a board's heap is tight)

            keep(self)  # resets it; a gateway keeps the PUBLISHes its peer may not have had
        else:
            self._reset_stream()
        if self.used:
            self.used = False
            e = self.nonce() if self.nonce is not None else self.epoch * 1103515245 + 12345
            e &= 0x3FFFFFFF
            self.epoch = e if e and e != self.epoch else (self.epoch + 1) & 0x3FFFFFFF or 1
            self.stat_counts[_LKC_RENEW] += 1
        if self.mac is not None:
            self.mac.peer_hello = 0

    def _rekey(self):
        # the session key of (gateway epoch, companion epoch): the CRC seed, and on a keyed link
        # the MAC key HMAC(link key, "UBRB-LINK" | epochs); counters restart with the key
        g = self.epoch if self.is_gateway else self.peer_epoch
        c = self.peer_epoch if self.is_gateway else self.epoch
        self.seed = (g * 31 + c) & 0x3FFFFFFF
        if self.mac is not None:
            self.mac.rekey(g, c)

    def _desync(self, now):
        # the two ends disagree about the stream (or its counters ran out): drop it and
        # handshake anew with a new epoch, so the peer drops its side too (section 3)
        self.stat_counts[_LKC_DESYNC] += 1
        self._go_down()
        self.used = True
        self._discard()
        self._rekey()
        self.fresh = True
        self.hello_at = now


# ---- app layer: RosPort / GatewaySink over the link ---------------------------

def link_record_json(buf, off, n, max_len=LK_JSON_MAX):
    """The JSON object of a control record, or None if it is not one: empty, longer than
    `max_len`, nested deeper than LK_JSON_DEPTH, not UTF-8, not JSON, or not an object.
    Never raises: every byte of it came from the peer."""
    if n <= 0 or n > max_len:
        return None
    b = bytes(buf[off:off + n])
    if not json_depth_ok(b, LK_JSON_DEPTH):
        return None
    try:
        d = json.loads(b.decode())
    except Exception:    # ValueError, UnicodeError, RecursionError: CPython and MicroPython differ
        return None
    return d if isinstance(d, dict) else None


def link_record_body(obj):
    return json.dumps(obj).encode()


def link_text(d, key, max_len, required=True):
    """d[key] if it is a str of at most max_len characters that encodes as UTF-8 (JSON may
    carry lone surrogates), None if absent and not required; raises ValueError otherwise."""
    v = d.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or len(v) > max_len:
        raise ValueError("%r must be a string of at most %d characters" % (key, max_len))
    try:
        v.encode()
    except Exception:
        raise ValueError("%r is not valid UTF-8" % (key,))
    return v


def link_gen(d):
    """The registration generation of a record (1 ... _LK_GEN_MAX); raises ValueError."""
    g = d.get("gen")
    if not isinstance(g, int) or isinstance(g, bool) or g < 1 or g > _LK_GEN_MAX:
        raise ValueError("'gen' must be an integer from 1 to %d" % _LK_GEN_MAX)
    return g


def link_bad_record(end, t, slot, why):
    """What either end does with a record it cannot use: count it, log it (rate-limited,
    escaped), and answer a BAD record naming it. A BAD record is never answered."""
    end.c_bad += 1
    end.ratelog.warn("bad_record", end.s.now, "bad link record from the peer (type %d, slot %d): %r"
                     % (t, slot, why))
    if t == LK_T_BAD:
        return
    b = link_record_body({"type": t, "slot": slot, "message": why[:200]})
    if end.s.send(LK_T_BAD, 0, b, 0, len(b), True, True) != LK_OK:
        end.c_bad_unsent += 1


def link_peer_rejected(end, slot, buf, off, n):
    """The peer rejected one of our records (LK_T_BAD): a bug on one side; count and log it.
    Returns the BAD record's JSON object (None if unreadable)."""
    end.c_rejected += 1
    d = link_record_json(buf, off, n, 8 * LK_TEXT_MAX)
    end.ratelog.warn("rejected", end.s.now, "the peer rejected a link record: %r"
                     % (d if d is not None else "(unreadable)",))
    return d


class LinkRosPort:
    """Gateway end: RosPort calls become link records; companion records
    become GatewaySink calls on self.sink.

    Every registration record carries a generation (`gen`) that the companion echoes in its
    answers (RESULT, ERROR, SUBCOUNT); an answer whose generation is not the slot's live one is
    late - about a registration since released - and is dropped, so it cannot land on the
    next owner of the slot. MSG records of a subscription slot pass only once the companion has
    accepted the live generation: older ones precede that RESULT on the reliable stream."""

    def __init__(self, session, log=None):
        self.s = session
        session.set_handler(self)
        self.sink = None
        self.distro = None
        self.ros_is_up = False
        self.link_is_up = False
        self.had_session = False      # a session was up before: a fresh one replaces it
        self.c_congested = 0
        self.c_too_large = 0
        self.c_bad = 0            # records from the companion that could not be used
        self.c_bad_unsent = 0     # BAD answers the send ring had no room for
        self.c_rejected = 0       # our records the companion rejected
        self.c_stale = 0          # answers/messages for a registration that is gone
        self.c_reg_failed = 0     # registrations the link could not carry (answered with ERROR)
        self.c_release_retry = 0
        self._rep = {}            # slot -> last report (ms), rate limit 1/s
        self.gens = {}            # slot*2 + is_sub -> live generation; negative until accepted
        # The first one is this process's link epoch (random per gateway process): a restarted
        # gateway's registrations never pass for an earlier one's, whose latched samples the
        # companion keeps across its own restarts (ros_side/latched.py).
        self.next_gen = (session.epoch & _LK_GEN_MAX) or 1
        self.unreleased = {}      # slot*2 + is_sub -> True: a release still owed (send failed)
        self._log = log
        self.ratelog = RateLog(self._logger)
        self._stats = {}          # the counters the companion last got (send_stats)
        self._stats_lx = {}       # ... and the link's, by their own name (sent as link_<name>)
        self.stats_at = -_LK_STATS_MAX_MS  # when they went (ms)
        self.stats_gap = 0        # line time budget: no stats before stats_at + stats_gap
        self.stats_from = 0       # where the next record starts among the counters

    def _logger(self, level, msg):
        # Bad records go to the port's logger if given, else to the Gateway's.
        f = self._log if self._log is not None else getattr(self.sink, "log", None)
        if f is not None:
            f(level, msg)

    def _ctl(self, t, slot, obj):
        b = link_record_body(obj) if obj is not None else b""
        return self.s.send(t, slot, b, 0, len(b), True, True)

    def _register(self, t, sub, slot, topic, type, qos, period=0):
        self._retry_releases()
        key = slot * 2 + sub
        self.unreleased.pop(key, None)     # the new registration replaces it on the companion
        g = self.gens.get(key)
        if g is None:                      # a new registration; else re-sent after ros_up
            g = self.next_gen
            self.next_gen = 1 if g >= _LK_GEN_MAX else g + 1
            self.gens[key] = -g
        elif g < 0:
            g = -g
        rec = {"topic": topic, "type": type, "qos": qos, "gen": g}
        if period > 0:  # --throttle: the companion holds the topic to it before the link
            rec["period_ms"] = period
        r = self._ctl(t, slot, rec)
        if r == LK_OK or r == _LK_DOWN:     # down: ros_up hands every registration over again
            return
        # Never silently lost: the clients on the slot get an ERROR and their registrations end.
        self.c_reg_failed += 1
        self.gens.pop(key, None)
        if r == LK_TOO_LARGE:
            code = "invalid_topic"
            msg = "registration of %r is too large for the link (at most %d bytes)" % (
                topic[:64], self.s.max_send())
        else:
            code = "link_congested"
            msg = "link send buffer full; registration not sent, try again"
        if self.sink is not None:
            self.sink.ros_result("sub" if sub else "pub", slot, code, msg)

    def _release(self, t, sub, slot):
        key = slot * 2 + sub
        self.gens.pop(key, None)
        if self._ctl(t, slot, None) not in (LK_OK, _LK_DOWN):
            self.unreleased[key] = True    # retried at the next registration or stats record

    def _retry_releases(self):
        if not self.unreleased:
            return
        for key in list(self.unreleased):
            t = LK_T_UNSUB if key & 1 else LK_T_UNADV
            if self._ctl(t, key >> 1, None) != LK_OK:
                return
            self.c_release_retry += 1
            del self.unreleased[key]

    # RosPort
    def advertise(self, slot, topic, type, qos):
        self.s.set_depth(slot, qos.get("depth", 1) if qos else 1)
        self._register(LK_T_ADV, 0, slot, topic, type, qos)

    def unadvertise(self, slot):
        self._release(LK_T_UNADV, 0, slot)

    def subscribe(self, slot, topic, type, qos):
        pol = getattr(self.sink, "policy", None)  # the Gateway's --throttle rules, if any
        per = pol.throttle_period(topic) if pol is not None else 0
        self._register(LK_T_SUB, 1, slot, topic, type, qos, per)

    def unsubscribe(self, slot):
        self._release(LK_T_UNSUB, 1, slot)

    def max_message(self):
        return self.s.max_send()

    def reg_room(self):
        """True when a client's registration or release should be queued now: the control
        records queued since the ring last held none unacknowledged come to less than
        LK_CTL_FRAMES frames and less than the ring's control reserve (a board's ring is a few
        frames: past its reserve a registration could find it full and be refused). Else the
        Gateway holds the frame, as a reliable PUBLISH waiting for room(n), and clients take
        turns."""
        s = self.s
        t = s.reliable
        m = LK_CTL_FRAMES * s.peer_max_frame
        return t.ctl_bytes < (m if m < t.rel_res else t.rel_res)

    def room(self, n):
        """Backpressure (Gateway._on_publish): can a reliable message of n bytes go now?"""
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

    def send_stats(self, d, link=None):
        """Offer the gateway's counters `d` for the companion's /diagnostics (ports call this
        about once a second), and `link`'s (LinkDriver.counters()) as link_<name>. Only the
        counters that changed since the last record go, only when the link has nothing else
        queued (or has not sent stats for _LK_STATS_MAX_MS), and on a paced line no more than
        1/_LK_STATS_SHARE of its time: a stats frame cannot be interrupted, and every message
        behind it waits its whole line time. True when sent.

        The port hands the link's counters over as they are: merged into `d` by the port, each
        of them made a link_<name> string and a dict entry every second; here only the changed
        ones get their name. On MicroPython the JSON text is sent from the str (a view of it),
        not copied into bytes first."""
        self._retry_releases()
        s = self.s
        now = s.now
        if now - self.stats_at < self.stats_gap:
            return False
        if (s.reliable.rel_queued or s.beq.n) and now - self.stats_at < _LK_STATS_MAX_MS:
            return False
        last = self._stats
        lastl = self._stats_lx
        ch = {}
        # On a paced line a record carries at most LK_STATS_CHUNK bytes of counters, so a
        # message behind it waits ~10 ms, not a whole frame; the rest follow in later records,
        # resuming where this one stopped so that every counter gets its turn.
        keys = list(d)
        nd = len(keys)
        lkeys = list(link) if link is not None else keys
        n = nd + (len(lkeys) if link is not None else 0)
        cap = LK_STATS_CHUNK if s.rtt.line_bps else 0
        size = 2
        j = 0
        while j < n:
            i = (self.stats_from + j) % n
            j += 1
            if i < nd:
                k = keys[i]
                v = d[k]
                if last.get(k) == v:
                    continue
            else:
                k = lkeys[i - nd]
                v = link[k]
                if lastl.get(k) == v:
                    continue
            if cap:
                size += len(k) + len(str(v)) + (4 if i < nd else 9)
                if size > cap and ch:
                    j -= 1
                    break
            if i < nd:
                ch[k] = v
            else:
                lastl[k] = v          # (all of them forgotten if the record is not sent)
                ch["link_" + k] = v
        self.stats_from = (self.stats_from + j) % n if n else 0
        if not ch:
            return False
        try:
            b = json.dumps(ch, separators=(",", ":"))
        except TypeError:  # a MicroPython without separators=
            b = json.dumps(ch)
        b = memoryview(b) if IS_MICROPYTHON else b.encode()
        if s.send(LK_T_STATS, LK_STATS_SLOT, b, 0, len(b), False, False) != LK_OK:
            self._stats_lx = {}
            return False
        for k in keys:
            if k in ch:
                last[k] = ch[k]
        self.stats_at = now
        n = len(b) + LK_OVH + LK_RHDR_MAX
        self.stats_gap = n * 1000 * _LK_STATS_SHARE // s.rtt.line_bps if s.rtt.line_bps else 0
        return True

    def rebase(self, d):
        """Move every stored time `d` ms back (see Gateway.rebase); the session's too."""
        self.s.rebase(d)
        for k in self._rep:
            self._rep[k] -= d
        self.ratelog.rebase(d)
        self.stats_at -= d

    def counters(self):
        d = self.s.counters()
        d["pub_congested"] = self.c_congested
        d["pub_too_large"] = self.c_too_large
        d["bad_records"] = self.c_bad
        d["rejected_records"] = self.c_rejected
        d["stale_answers"] = self.c_stale
        d["reg_failed"] = self.c_reg_failed
        return d

    # link handler
    def link_up(self, fresh):
        self.link_is_up = True        # ros_up follows the companion's hello
        if fresh and self.had_session and self.sink is not None:
            self.sink.ros_session_lost("the link to the ROS side began a new session")
        self.had_session = True
        if fresh:
            self._stats = {}          # a new companion gets every counter
            self._stats_lx = {}

    def link_down(self):
        self.link_is_up = False
        if self.ros_is_up:
            self.ros_is_up = False
            if self.sink is not None:
                self.sink.ros_down()

    def link_message(self, t, slot, buf, off, n, reliable):
        sink = self.sink
        if t == LK_T_MSG:                  # the data path: no allocation, no try block
            g = self.gens.get(slot * 2 + 1)
            if g is None or g < 0:
                self.c_stale += 1          # not (yet) accepted, or released since
            elif sink is not None:
                sink.ros_message(slot, buf, off, n)
            return
        try:
            why = self._control(t, slot, buf, off, n)
        except Exception as e:             # a bug must cost one record, never the gateway
            why = "%s: %s" % (type(e).__name__, e)
        if why is not None:
            link_bad_record(self, t, slot, why)

    def _control(self, t, slot, buf, off, n):
        # One control record from the companion: None when used, else why it was not.
        sink = self.sink
        if t == LK_T_SUBCOUNT:
            if n != 8 or buf[off + 3] >= 0x40 or buf[off + 7] >= 0x40:
                return "SUBCOUNT must be count u32 + gen u32, each below 2**30"
            if self._current(slot * 2, get_u32(buf, off + 4)) and sink is not None:
                sink.ros_sub_count(slot, get_u32(buf, off))
            return None
        if t == LK_T_BAD:
            d = link_peer_rejected(self, slot, buf, off, n)
            # A registration the companion could not read gets no RESULT: end it here, with an
            # ERROR to its clients, rather than leave them waiting.
            rt = d.get("type") if d is not None else None
            rs = d.get("slot") if d is not None else None
            if (rt == LK_T_ADV or rt == LK_T_SUB) and isinstance(rs, int) \
                    and not isinstance(rs, bool) and 0 <= rs < (1 << 21):
                kind = "sub" if rt == LK_T_SUB else "pub"
                if self.gens.pop(rs * 2 + (1 if kind == "sub" else 0), 0) < 0 and sink is not None:
                    sink.ros_result(kind, rs, "protocol_error", "the ROS side could not read "
                                    "the registration: %s" % (link_text(d, "message", LK_TEXT_MAX,
                                                                        False) or "?",))
            return None
        # Answers are short: their message is at most LK_TEXT_MAX characters, 6 bytes each
        # as JSON escapes at worst, so 8 KiB bounds the parse (and the work) per record.
        d = link_record_json(buf, off, n, 8 * LK_TEXT_MAX)
        if d is None:
            return "not a JSON object of at most %d bytes and depth %d" % (8 * LK_TEXT_MAX,
                                                                           LK_JSON_DEPTH)
        try:
            if t == LK_T_CHELLO:
                self.distro = link_text(d, "distro", 64, False)
                self.ros_is_up = True
                if self.s.reliable.rel_framed >= _LK_PARKED:  # a new companion: the PUBLISHes kept for it
                    from ubrb_keep import keep

                    keep(self)  # (ros_up, then they follow)
                elif sink is not None:
                    sink.ros_up(self.distro, self.max_message())
                return None
            if t != LK_T_RESULT and t != LK_T_ERROR:
                return "unknown record type"
            kind = d.get("kind")
            if kind != "pub" and kind != "sub":
                return "'kind' must be \"pub\" or \"sub\""
            code = d.get("code")
            if t == LK_T_RESULT and code is not None and code not in LK_RESULT_CODES:
                return "RESULT code must be null or one of %s" % (LK_RESULT_CODES,)
            if t == LK_T_ERROR and code not in LK_ERROR_CODES:
                return "ERROR code must be one of %s" % (LK_ERROR_CODES,)
            msg = link_text(d, "message", LK_TEXT_MAX, False) or ""
            key = slot * 2 + (1 if kind == "sub" else 0)
            g = link_gen(d)
        except ValueError as e:
            return str(e)
        if not self._current(key, g):
            return None
        if t == LK_T_RESULT:
            if code is None:
                self.gens[key] = g         # accepted: its messages may pass
            else:
                self.gens.pop(key, None)   # refused: the slot's registrations end now
            if sink is not None:
                sink.ros_result(kind, slot, code, msg)
        elif sink is not None:
            sink.ros_error(kind, slot, code, msg)
        return None

    def _current(self, key, g):
        # Is `g` the live generation of registration `key`? A late answer is counted, not used.
        live = self.gens.get(key)
        if live is not None and (live == g or live == -g):
            return True
        self.c_stale += 1
        return False
