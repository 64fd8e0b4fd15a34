"""Sans-IO core of a UBRB v1 client, behaving like the Unreal uBotROS plugin.

``ClientProtocol`` owns every client-side rule of the protocol and none of the I/O: the runner
(``ubrb_client.client.Client``, or a test) tells it what happened — "an attempt started", "the
TCP connection is up", "these bytes arrived", "time is now t", "n bytes were written" — and asks
it what to write (``pending_output()``) and whether to connect (``connect_due(now)``). Time is a
float in seconds from any monotonic origin, always passed in, so timer tests need no sleeps.

Connection states::

    IDLE --start()--> WAITING --connect_due()/connection_started()--> CONNECTING
    CONNECTING --connection_made()--> CONNECTED
    CONNECTING --connection_failed() or 3 s attempt timeout--> WAITING (retry after interval)
    CONNECTED --connection_lost(), 10 s silence or malformed frame--> WAITING (retry after interval)
    any --close()--> CLOSED (explicit Disconnect: no more retries)

The runner must close its socket whenever ``state`` is no longer the one it expects
(e.g. CONNECTED turning into WAITING after ``tick()`` or ``data_received()``).
"""
from __future__ import annotations

import collections
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import frames as F

log = logging.getLogger("ubrb_client")

IDLE = "idle"
WAITING = "waiting"
CONNECTING = "connecting"
CONNECTED = "connected"
CLOSED = "closed"

DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024
PROTOCOL_VERSION = 1

# Output queue entry kinds
_CTRL = 0   # control frame: regenerated on every connection, dropped on loss
_REL = 1    # reliable PUBLISH: kept across reconnects, counted against max_queued_bytes
_LATCH = 2  # latched re-publish: regenerated after each handshake, not requeued on loss
_BE = 3     # best-effort PUBLISH (newest only)


# ---------------------------------------------------------------------------------------- QoS
@dataclass(frozen=True)
class QoS:
    reliability: str = "reliable"
    durability: str = "volatile"
    depth: int = 10

    def __post_init__(self):
        if self.reliability not in ("reliable", "best_effort"):
            raise ValueError(f"reliability must be reliable or best_effort, not {self.reliability!r}")
        if self.durability not in ("volatile", "transient_local"):
            raise ValueError(f"durability must be volatile or transient_local, not {self.durability!r}")
        if not isinstance(self.depth, int) or self.depth < 0:
            raise ValueError(f"depth must be a non-negative int, not {self.depth!r}")

    @property
    def reliable(self) -> bool:
        return self.reliability == "reliable"

    def to_json(self) -> dict:
        return {"reliability": self.reliability, "durability": self.durability, "depth": self.depth}

    @classmethod
    def coerce(cls, qos) -> QoS:
        """Accept a QoS, None (ROS default: reliable/volatile/10), a dict, or a profile name."""
        if qos is None:
            return cls()
        if isinstance(qos, QoS):
            return qos
        if isinstance(qos, str):
            if qos not in PROFILES:
                raise ValueError(f"unknown QoS profile {qos!r} (known: {', '.join(PROFILES)})")
            return PROFILES[qos]
        if isinstance(qos, dict):
            return cls(**qos)
        raise TypeError(f"cannot make a QoS from {qos!r}")


PROFILES = {
    "default": QoS("reliable", "volatile", 10),
    "reliable": QoS("reliable", "volatile", 10),
    "best_effort": QoS("best_effort", "volatile", 10),
    "sensor_data": QoS("best_effort", "volatile", 5),
    "latched": QoS("reliable", "transient_local", 1),
    "clock": QoS("best_effort", "volatile", 1),
}


# ------------------------------------------------------------------------------------- events
@dataclass
class HelloAck:
    info: dict


@dataclass
class Message:
    sub_id: int
    data: bytes


@dataclass
class SubCount:
    counts: dict  # publisher id (int) -> subscriber count


@dataclass
class ErrorReceived:
    id: object
    code: str
    message: str


@dataclass
class PingReceived:
    pass


@dataclass
class PongReceived:
    seq: int  # how many PONGs this connection has received so far


@dataclass
class ProtocolViolation:
    reason: str


Event = (HelloAck | Message | SubCount | ErrorReceived | PingReceived | PongReceived
         | ProtocolViolation)


@dataclass
class _Pub:
    id: int
    topic: str
    type: str
    qos: QoS
    latch: bool = False
    latched_frame: bytes | None = None
    sub_count: int | None = None  # None = unknown (no SUB_COUNT yet in this session)


@dataclass
class _Sub:
    id: int
    topic: str
    type: str
    qos: QoS


@dataclass
class Stats:
    connect_attempts: int = 0
    connect_failures: int = 0
    connects: int = 0
    disconnects: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    published: int = 0              # PUBLISH frames accepted for sending (queued or slotted)
    publish_frames_sent: int = 0    # PUBLISH frames fully handed to the transport
    skipped_no_subscribers: int = 0
    dropped_best_effort_no_session: int = 0
    dropped_best_effort_replaced: int = 0
    dropped_reliable_queue_full: int = 0
    dropped_too_large: int = 0
    requeued_reliable: int = 0
    messages_received: int = 0
    messages_unknown_sub: int = 0
    errors_received: int = 0
    pings_sent: int = 0
    pongs_received: int = 0
    pings_received: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class ClientProtocol:
    """State machine of one UBRB client (all its connections over time)."""

    def __init__(self, name: str = "ubrb_client", *, reconnect_interval: float = 2.0,
                 attempt_timeout: float = 3.0, ping_interval: float = 2.0,
                 idle_timeout: float = 10.0, max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
                 max_payload: int = F.DEFAULT_MAX_PAYLOAD, chunk_size: int = 64 * 1024,
                 max_errors_kept: int = 1000, hello_interval: float | None = None):
        self.name = name
        self.reconnect_interval = float(reconnect_interval)
        self.attempt_timeout = float(attempt_timeout)
        self.ping_interval = float(ping_interval)
        self.idle_timeout = float(idle_timeout)
        self.max_queued_bytes = int(max_queued_bytes)
        self.max_payload = int(max_payload)
        self.chunk_size = int(chunk_size)
        # Re-send HELLO this often while connected (None: only once per connection, as the
        # plugin does): a bridge answers every HELLO with a HELLO_ACK of its present state, whose
        # ros_distro says whether a ROS side is behind it ("unknown": none). The CLI's echo and
        # hz use it to say when the companion goes away and comes back.
        self.hello_interval = None if hello_interval is None else float(hello_interval)

        self.state = IDLE
        self.stats = Stats()
        self.errors: collections.deque[ErrorReceived] = collections.deque(maxlen=max_errors_kept)
        self.server_info: dict | None = None  # HELLO_ACK payload of the current connection
        self.epoch = 0                         # number of the current/last connection (1-based)
        self.last_disconnect_reason: str | None = None

        self._pubs: dict[int, _Pub] = {}
        self._subs: dict[int, _Sub] = {}
        self._next_pub_id = 1
        self._next_sub_id = 1

        # Ordered queue of (kind, pub_id, frame): control + reliable + latched.
        self._q: collections.deque = collections.deque()
        self._queued_bytes = 0                 # bytes of _REL entries in _q
        self._be: dict[int, bytes] = {}        # best-effort newest pending frame per publisher
        self._chunk = bytearray()
        self._chunk_off = 0
        self._chunk_entries: list = []         # (end_offset, kind, pub_id, frame)

        self._decoder = F.FrameDecoder(max_payload)
        self._next_attempt = 0.0
        self._attempt_deadline = 0.0
        self._last_rx = 0.0
        self._next_ping = 0.0
        self._next_hello: float | None = None
        self._session_pings = 0
        self._session_pongs = 0
        self._warned_queue_full = False

    # ------------------------------------------------------------------------ registrations
    def advertise(self, topic: str, type: str, qos=None, *, latch: bool | None = None) -> int:
        """Register a publisher; returns its id (never reused). Sent now if connected, else
        on every connection. ``latch`` (default: transient_local durability) makes the last
        published message (see ``publish(..., latch=True)``) re-published after every handshake."""
        qos = QoS.coerce(qos)
        pid = self._next_pub_id
        self._next_pub_id += 1
        if latch is None:
            latch = qos.durability == "transient_local"
        p = _Pub(pid, topic, type, qos, latch=latch)
        self._pubs[pid] = p
        if self.state == CONNECTED:
            self._q.append((_CTRL, 0, self._advertise_frame(p)))
        return pid

    def unadvertise(self, pid: int) -> None:
        p = self._pubs.pop(pid, None)
        if p is None:
            return
        self._be.pop(pid, None)
        if self.state == CONNECTED:
            # Queued PUBLISHes of this id go first (queue order), then UNADVERTISE.
            self._q.append((_CTRL, 0, F.encode_json_frame(F.UNADVERTISE, {"id": pid})))
        else:
            self._drop_queued_of(pid)

    def subscribe(self, topic: str, type: str, qos=None) -> int:
        qos = QoS.coerce(qos)
        sid = self._next_sub_id
        self._next_sub_id += 1
        s = _Sub(sid, topic, type, qos)
        self._subs[sid] = s
        if self.state == CONNECTED:
            self._q.append((_CTRL, 0, self._subscribe_frame(s)))
        return sid

    def unsubscribe(self, sid: int) -> None:
        if self._subs.pop(sid, None) is None:
            return
        if self.state == CONNECTED:
            self._q.append((_CTRL, 0, F.encode_json_frame(F.UNSUBSCRIBE, {"id": sid})))

    def publishers(self) -> dict:
        return {pid: (p.topic, p.type, p.qos) for pid, p in self._pubs.items()}

    def subscriptions(self) -> dict:
        return {sid: (s.topic, s.type, s.qos) for sid, s in self._subs.items()}

    def subscriber_count(self, pid: int) -> int | None:
        """Last SUB_COUNT of this publisher in the current session (None: not reported yet)."""
        p = self._pubs.get(pid)
        return None if p is None else p.sub_count

    def wants_data(self, pid: int) -> bool:
        """False only when the bridge reported 0 subscribers for this publisher in this session.
        Latched publishers always want data (a late joiner must get it)."""
        p = self._pubs.get(pid)
        if p is None:
            return False
        return p.latch or p.sub_count is None or p.sub_count > 0

    # ---------------------------------------------------------------------------- publishing
    def publish(self, pid: int, data: bytes | bytearray | memoryview | Callable[[], bytes],
                *, force: bool = False) -> bool:
        """Publish CDR bytes (4-byte encapsulation header included) on publisher ``pid``.

        ``data`` may be a callable returning the bytes: it is only called (encoded) when the
        message will actually be queued. Returns True if the message was queued/slotted.
        Without ``force``, nothing is encoded or sent while the bridge reports 0 subscribers.
        """
        p = self._pubs.get(pid)
        if p is None:
            raise KeyError(f"publisher id {pid} is not advertised")
        if self.state == CLOSED:
            return False
        if not force and not self.wants_data(pid):
            self.stats.skipped_no_subscribers += 1
            return False
        reliable = p.qos.reliable
        connected = self.state == CONNECTED
        if not reliable and not connected and not p.latch:
            self.stats.dropped_best_effort_no_session += 1
            return False
        if callable(data):
            data = data()
        if 4 + len(data) > self.max_payload:
            self.stats.dropped_too_large += 1
            log.warning("UBRB: message of %d bytes on %s exceeds the payload limit; dropped",
                        len(data), p.topic)
            return False
        frame = F.encode_data_frame(F.PUBLISH, pid, data)
        if p.latch:
            # Kept to be re-published after every handshake; while disconnected the re-publish
            # supersedes queueing it.
            p.latched_frame = frame
            if not connected:
                return True
        if not reliable:
            if pid in self._be:
                self.stats.dropped_best_effort_replaced += 1
            self._be[pid] = frame
            self.stats.published += 1
            return True
        if self._queued_bytes + len(frame) > self.max_queued_bytes:
            self.stats.dropped_reliable_queue_full += 1
            if not self._warned_queue_full:
                self._warned_queue_full = True
                log.warning("UBRB: reliable send queue full (%d bytes); dropping new messages",
                            self.max_queued_bytes)
            return False
        self._warned_queue_full = False
        self._q.append((_REL, pid, frame))
        self._queued_bytes += len(frame)
        self.stats.published += 1
        return True

    @property
    def queued_bytes(self) -> int:
        """Reliable bytes waiting to be handed to the transport (bounded by max_queued_bytes)."""
        return self._queued_bytes

    def output_empty(self) -> bool:
        return not self._q and not self._be and self._chunk_off >= len(self._chunk)

    # ---------------------------------------------------------------------- connection cycle
    def start(self, now: float) -> None:
        if self.state == IDLE:
            self.state = WAITING
            self._next_attempt = now

    def connect_due(self, now: float) -> bool:
        return self.state == WAITING and now >= self._next_attempt

    def connection_started(self, now: float) -> None:
        if self.state != WAITING:
            raise RuntimeError(f"connection_started in state {self.state}")
        self.state = CONNECTING
        self._attempt_deadline = now + self.attempt_timeout
        self.stats.connect_attempts += 1

    def connection_failed(self, now: float, reason: str = "connect failed") -> None:
        if self.state != CONNECTING:
            return
        self.stats.connect_failures += 1
        self.last_disconnect_reason = reason
        self.state = WAITING
        self._next_attempt = now + self.reconnect_interval

    def connection_made(self, now: float) -> None:
        """TCP is up: HELLO, all ADVERTISE, all SUBSCRIBE, queued reliable, latched re-publish.
        No waiting for HELLO_ACK."""
        if self.state != CONNECTING:
            raise RuntimeError(f"connection_made in state {self.state}")
        self.state = CONNECTED
        self.epoch += 1
        self.stats.connects += 1
        self.server_info = None
        self._decoder.reset()
        self._last_rx = now
        self._next_ping = now + self.ping_interval
        self._next_hello = None if self.hello_interval is None else now + self.hello_interval
        self._session_pings = 0
        self._session_pongs = 0
        for p in self._pubs.values():
            p.sub_count = None
        head = [(_CTRL, 0, self._hello_frame())]
        head += [(_CTRL, 0, self._advertise_frame(p)) for p in self._pubs.values()]
        head += [(_CTRL, 0, self._subscribe_frame(s)) for s in self._subs.values()]
        # Queued reliable data of latched publishers is superseded by the latched re-publish.
        queued = [e for e in self._q if e[0] == _REL and not self._pubs[e[1]].latch]
        tail = [(_LATCH, p.id, p.latched_frame) for p in self._pubs.values()
                if p.latch and p.latched_frame is not None]
        self._q = collections.deque(head + queued + tail)
        self._queued_bytes = sum(len(e[2]) for e in queued)
        self._chunk = bytearray()
        self._chunk_off = 0
        self._chunk_entries.clear()

    def connection_lost(self, now: float, reason: str = "connection lost") -> None:
        if self.state == CONNECTING:
            self.connection_failed(now, reason)
            return
        if self.state != CONNECTED:
            return
        self._end_session(reason)
        self.state = WAITING
        self._next_attempt = now + self.reconnect_interval

    def close(self) -> None:
        """Explicit Disconnect: stop retrying; pending data is discarded."""
        if self.state == CONNECTED:
            self._end_session("closed")
        self.state = CLOSED
        self._q.clear()
        self._queued_bytes = 0
        self._be.clear()

    def _end_session(self, reason: str) -> None:
        self.stats.disconnects += 1
        self.last_disconnect_reason = reason
        # Reliable frames not completely written go back to the queue front, in order.
        unsent = []
        for end, kind, pid, frame in self._chunk_entries:
            if end > self._chunk_off and kind == _REL and pid in self._pubs:
                unsent.append((kind, pid, frame))
        self._chunk = bytearray()
        self._chunk_off = 0
        self._chunk_entries.clear()
        if unsent:
            self.stats.requeued_reliable += len(unsent)
        kept = [e for e in self._q if e[0] == _REL and e[1] in self._pubs]
        self._q = collections.deque(unsent + kept)
        self._queued_bytes = sum(len(e[2]) for e in self._q)
        if self._be:
            self.stats.dropped_best_effort_no_session += len(self._be)
            self._be.clear()
        for p in self._pubs.values():
            p.sub_count = None
        self.server_info = None

    def _drop_queued_of(self, pid: int) -> None:
        self._q = collections.deque(e for e in self._q if e[1] != pid)
        self._queued_bytes = sum(len(e[2]) for e in self._q if e[0] == _REL)

    # ------------------------------------------------------------------------------- timers
    def tick(self, now: float) -> None:
        """Run the timers: attempt timeout, 10 s silence, PING every ping_interval."""
        if self.state == CONNECTING and now >= self._attempt_deadline:
            self.connection_failed(now, "connect timeout")
        elif self.state == CONNECTED:
            if now - self._last_rx >= self.idle_timeout:
                log.warning("UBRB: nothing received for %.1f s; reconnecting", now - self._last_rx)
                self.connection_lost(now, "idle timeout")
                return
            if now >= self._next_ping:
                self._send_ping()
                self._next_ping += self.ping_interval
                if self._next_ping <= now:
                    self._next_ping = now + self.ping_interval
            if self._next_hello is not None and self.hello_interval is not None \
                    and now >= self._next_hello:
                self._q.append((_CTRL, 0, self._hello_frame()))
                self._next_hello = now + self.hello_interval

    def next_deadline(self) -> float | None:
        """Earliest time at which tick()/connect_due() has something to do (None: nothing)."""
        if self.state == WAITING:
            return self._next_attempt
        if self.state == CONNECTING:
            return self._attempt_deadline
        if self.state == CONNECTED:
            t = min(self._next_ping, self._last_rx + self.idle_timeout)
            return t if self._next_hello is None else min(t, self._next_hello)
        return None

    def _send_ping(self) -> int:
        self._q.append((_CTRL, 0, F.encode_frame(F.PING)))
        self._session_pings += 1
        self.stats.pings_sent += 1
        return self._session_pings

    def send_ping(self) -> int | None:
        """Queue an extra PING now; returns its sequence number in this connection. The bridge
        handles frames in order, so once ``pongs_in_session >= seq`` everything sent before
        that PING has been processed."""
        if self.state != CONNECTED:
            return None
        return self._send_ping()

    @property
    def pongs_in_session(self) -> int:
        return self._session_pongs

    # ------------------------------------------------------------------------------- input
    def data_received(self, data, now: float) -> list:
        """Bytes from the bridge. Returns the events they carry. A malformed header ends the
        connection (state becomes WAITING: the runner closes the socket)."""
        if self.state != CONNECTED:
            return []
        self._last_rx = now
        self.stats.bytes_in += len(data)
        try:
            frames = self._decoder.feed(data)
        except F.MalformedHeader as exc:
            log.warning("UBRB: malformed frame header from the bridge (%s); closing", exc)
            self.connection_lost(now, f"protocol error: {exc}")
            return [ProtocolViolation(str(exc))]
        events = []
        for op, payload in frames:
            self.stats.frames_in += 1
            ev = self._handle_frame(op, payload)
            if ev is not None:
                events.append(ev)
        return events

    def _handle_frame(self, op: int, payload: bytes):
        if op == F.MESSAGE:
            try:
                sid, cdr = F.split_data_payload(payload)
            except ValueError:
                log.warning("UBRB: MESSAGE frame too short (%d bytes)", len(payload))
                return None
            if sid not in self._subs:
                self.stats.messages_unknown_sub += 1
                return None
            self.stats.messages_received += 1
            return Message(sid, cdr)
        if op == F.PING:
            self.stats.pings_received += 1
            self._q.append((_CTRL, 0, F.encode_frame(F.PONG)))
            return PingReceived()
        if op == F.PONG:
            self._session_pongs += 1
            self.stats.pongs_received += 1
            return PongReceived(self._session_pongs)
        if op in (F.HELLO_ACK, F.SUB_COUNT, F.ERROR):
            try:
                obj = json.loads(payload.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning("UBRB: invalid JSON in %s frame: %s", F.OP_NAMES[op], exc)
                return None
            if not isinstance(obj, dict):
                log.warning("UBRB: %s payload is not a JSON object", F.OP_NAMES[op])
                return None
            if op == F.HELLO_ACK:
                self.server_info = obj
                if obj.get("protocol") != PROTOCOL_VERSION:
                    log.warning("UBRB: bridge answered protocol %r", obj.get("protocol"))
                log.info("UBRB: connected to %s (ROS %s)", obj.get("server"), obj.get("ros_distro"))
                return HelloAck(obj)
            if op == F.SUB_COUNT:
                counts = {}
                raw = obj.get("counts", {})
                if isinstance(raw, dict):
                    for k, v in raw.items():
                        try:
                            pid, n = int(k), int(v)
                        except (TypeError, ValueError):
                            continue
                        counts[pid] = n
                        p = self._pubs.get(pid)
                        if p is not None:
                            p.sub_count = n
                return SubCount(counts)
            ev = ErrorReceived(obj.get("id"), str(obj.get("code")), str(obj.get("message", "")))
            self.stats.errors_received += 1
            self.errors.append(ev)
            log.warning("UBRB ERROR %s (id=%s): %s", ev.code, ev.id, ev.message)
            return ev
        log.warning("UBRB: ignoring unexpected op %d (%d bytes) from the bridge", op, len(payload))
        return None

    # ------------------------------------------------------------------------------ output
    def pending_output(self) -> memoryview:
        """Bytes to write now (whole frames, about chunk_size at a time; empty if none).
        Report what was written with ``output_sent(n)``."""
        if self.state != CONNECTED:
            return memoryview(b"")
        if self._chunk_off >= len(self._chunk):
            self._fill_chunk()
        return memoryview(self._chunk)[self._chunk_off:]

    def output_sent(self, n: int) -> None:
        if n <= 0:
            return
        self._chunk_off += n
        self.stats.bytes_out += n
        self._chunk_off = min(len(self._chunk), self._chunk_off)

    def _fill_chunk(self) -> None:
        # A fresh buffer each time: memoryviews handed out earlier stay valid.
        chunk = self._chunk = bytearray()
        self._chunk_off = 0
        entries = self._chunk_entries
        entries.clear()
        q = self._q
        while q and len(chunk) < self.chunk_size:
            kind, pid, frame = q.popleft()
            if kind == _REL:
                self._queued_bytes -= len(frame)
            chunk += frame
            entries.append((len(chunk), kind, pid, frame))
            if kind != _CTRL:
                self.stats.publish_frames_sent += 1
        if len(chunk) < self.chunk_size and self._be:
            for pid in list(self._be):
                frame = self._be.pop(pid)
                chunk += frame
                entries.append((len(chunk), _BE, pid, frame))
                self.stats.publish_frames_sent += 1
                if len(chunk) >= self.chunk_size:
                    break

    def drain(self) -> bytes:
        """Convenience for tests and simple runners: everything pending, marked as sent."""
        out = bytearray()
        while True:
            mv = self.pending_output()
            if not len(mv):
                return bytes(out)
            out += mv
            self.output_sent(len(mv))

    # ----------------------------------------------------------------------------- helpers
    def _hello_frame(self) -> bytes:
        return F.encode_json_frame(F.HELLO, {"protocol": PROTOCOL_VERSION, "client": self.name})

    @staticmethod
    def _advertise_frame(p: _Pub) -> bytes:
        return F.encode_json_frame(F.ADVERTISE, {"id": p.id, "topic": p.topic, "type": p.type,
                                                 "qos": p.qos.to_json()})

    @staticmethod
    def _subscribe_frame(s: _Sub) -> bytes:
        return F.encode_json_frame(F.SUBSCRIBE, {"id": s.id, "topic": s.topic, "type": s.type,
                                                 "qos": s.qos.to_json()})
