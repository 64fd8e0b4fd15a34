"""The companion: RosPort on top of a Backend, reporting to a GatewaySink (docs/DESIGN.md).

Everything here is backend-neutral and runs on the caller's loop thread, except
``_on_message`` (a backend callback, any thread), which only touches the bounded hand-over queue.

Threads and time
    RosPort calls (advertise ... publish) and ``poll(now)`` are made from one loop thread; every
    GatewaySink call is made from that thread too, inside those calls or inside ``poll``. Backend
    subscription callbacks may come from any thread: they queue ``(entity, bytes)`` (bounded by
    count and bytes; overflow is counted as ``queue_drops``) and write one byte to a pipe whose read
    end is ``wake_fd()``, so the loop can select on it and then call ``poll``. ``now`` is an int of
    milliseconds from any monotonic origin, as in the gateway core. Call ``poll`` when
    ``wake_fd()`` is readable and also at least every ~50 ms: subscriber counts, the
    ``message_too_large`` rate limit and diagnostics are driven by it.

Entities
    One ROS publisher per published topic and one subscription per subscribed topic. Slots map to
    entities; two slots on the same topic with the same type and QoS share the entity (the gateway
    normally sends one slot per topic, so this only happens across sessions/resumes).

Errors the companion decides (the gateway could not know them)
    ``invalid_topic``  the name, resolved as rcl resolves a node's (``names.Names``: relative and
                       ``~`` names under the namespace, then remapped), breaks ROS 2's
                       full-topic-name rules (``names.py``; the rclpy backend may override
                       with rclpy's own ``validate_full_topic_name``);
    ``unknown_type``   malformed type string, or a type the backend cannot load;
    ``type_conflict``  the topic is already published or subscribed here (by any slot of either
                       kind, or by the companion's own ``/diagnostics`` publisher) with another type;
    ``qos_conflict``   the topic already has an entity of the same kind with another QoS, or the QoS
                       dict holds values ROS 2 does not have;
    ``message_too_large`` (via ``ros_error``) a subscribed message exceeds ``max_message``; the message
                       is dropped and the report is rate-limited to one per slot per second.
    ``qos_incompatible`` (via ``ros_error``) the backend saw a ROS peer on the topic whose QoS
                       cannot match (e.g. a reliable subscription vs a best_effort publisher);
                       the message names the policy; at most once per slot per 5 s.
    ``resource_exhausted`` (via ``ros_error``) a message would take what the DDS histories hold
                       past ``max_history_bytes``; not written; at most once per topic per second.

History budget
    Counted as held, never reserved up front: a writer holds its last ``depth`` samples (their
    sizes are kept; KEEP_LAST replaces the oldest), a reader the companion can pause ``depth`` x
    the largest sample it delivered (what DDS keeps for it while it is paused); a reader that the
    budget cannot afford is not paused any more. Other readers are taken from as samples arrive.

Latched samples across a restart (link mode)
    With a ``LatchedStore`` (``latched.py``) the samples of every transient_local writer are
    kept in a state file under the registration's identity (slot and the gateway's ``gen``, from
    the sink's ``registration_gen``); a registration with the same identity after a restart gets
    them published again at once.

Several worlds, one ``/tf_static``
    The gateway shares one publisher slot per topic among its clients, so a transient_local
    writer's latched sample would be the last client's message only. For a transient_local
    publisher of ``tf2_msgs/msg/TFMessage`` (``/tf_static``, under any name) the companion keeps
    the union of every transform it was given, the newest per ``child_frame_id``, and publishes
    that union in place of each message (``TfUnion``): a late ROS node gets every client's static
    transforms, as if each client were its own static broadcaster (what tf2_ros'
    StaticTransformBroadcaster does with its own transforms). Bounded: ``TF_UNION_MAX_FRAMES``
    child frames and the largest message; past either the frames updated longest ago go.

Releasing a publisher (issue 21)
    A reliable writer released (its last slot's UNADV, or a session reset) after it wrote is kept
    until the backend's ``acked(handle, 0)`` says its matched readers acknowledged every sample,
    or ``DRAIN_MS`` passed, asked every ``DRAIN_CHECK_MS`` from ``poll`` (at most ``DRAIN_MAX`` of
    them: past it the oldest goes); its history stays charged until then. So what the gateway
    accepted before a client closed or unadvertised reaches ROS. ``close`` waits for them,
    ``CLOSE_DRAIN_MS`` in all.

Registration work is bounded
    Creating or deleting a DDS reader or writer costs about a millisecond (more with peers to tell),
    and a UBRB client can churn SUBSCRIBE/UNSUBSCRIBE as fast as TCP carries them. So the backend
    work of registrations and releases is done at most ``registration_budget_ms`` between two
    polls; past it, they wait in ``_pending`` (one entry per slot and kind, in arrival order), which
    ``poll`` works through under the same budget, waking the loop again while any is left. A newer
    registration or release of a slot replaces its waiting one (``reg_coalesced``): a slot
    subscribed and released again before its turn costs no DDS call, and a churning client holds
    one entry per slot, so another client's registration waits behind at most one per slot. A
    PUBLISH for a slot whose registration waits applies it first (the data follows its ADVERTISE).

    A volatile reader or writer whose last slot is released lingers ``linger_ms`` (at most
    ``linger_max`` of them, the oldest go first) and is taken again by a registration of the same
    kind, topic, type and QoS: a topic subscribed and released over and over keeps one DDS
    entity, with no create/delete per pair (each costs the loop a millisecond, every DDS peer a
    discovery round, and Cyclone ~80 bytes it never gives back). So a released entity leaves the
    ROS graph ``linger_ms`` later (250 ms: a client's release is still seen within a second). A
    transient_local one is deleted at once: its history would hand the last registration's
    samples to a late joiner of the next one. A gateway's session reset releases every slot
    the same way, and its volatile entities linger at least ``SESSION_LINGER_MS``: a new session of
    the gateway registers its topics again at once, and the PUBLISHes it kept (ubrb_keep) follow,
    so they go to the writer its readers already matched (a new one would hand a volatile reader
    nothing written before discovery matched them).

Subscriber counts
    Every ``sub_count_interval_ms`` the companion asks the backend for the count of each publisher
    (foreign subscribers only) and calls ``ros_sub_count(slot, count)`` when a slot's count differs
    from the last one reported. The first report for a new slot waits up to
    ``sub_count_grace_ms`` so that discovery of existing subscribers can complete, unless a
    subscriber is already matched.
"""

import collections
import logging
import os
import struct
import threading
import time

from . import diag
from .errors import RosError
from .names import Names, check_topic, normalize_type
from .qos import check_qos, qos_dict

log = logging.getLogger("ros_side.companion")


def default_history_bytes():
    """--max-history-bytes when not given: half of this machine's physical memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 30


def _mib(n):
    if n < 1048576:
        return "%.1f KiB" % (n / 1024.0)
    return "%.1f MiB" % (n / 1048576.0)


def _warn_at(level, msg):
    log.warning("%s", msg)


# Warnings a gateway's traffic can repeat (one per message): at most one line a second per kind,
# with the count of those held back. Topic and type names come from UBRB clients: logged as repr.
_repeated = None


def _warn(key, msg):
    global _repeated
    if _repeated is None:
        from ubrb_min import RateLog   # the core's; imported late (direct mode loads it anyway)
        _repeated = RateLog(_warn_at)
    _repeated.warn(key, int(time.monotonic() * 1000), msg)


# A released reliable writer is kept until its matched readers acknowledged what it wrote, or this
# long (issue 21: a client that closes, or UNADVERTISEs, right after its PONG loses nothing): two
# heartbeat periods of a Fast DDS writer (3 s, rmw_fastrtps' default): a reader that lost the tail
# of a burst only learns of it from the next heartbeat (a subscriber busy 1.4 s got 25 of 300 with
# 2 s). A reader that stopped acknowledging (a killed process) keeps a released writer this long.
DRAIN_MS = 6000
DRAIN_MAX = 32          # released writers kept at once (registration churn): past it the oldest go
DRAIN_CHECK_MS = 20     # how often poll() asks them (one backend call each)
CLOSE_DRAIN_MS = 2000   # at close: how long the companion waits for them in all before it exits
# a session reset's released volatile entities linger at least this long for the new session's
# registrations (the handshake, then its registrations: well under a second on a serial line)
SESSION_LINGER_MS = 1000
TF_TYPE = "tf2_msgs/msg/TFMessage"
TF_UNION_MAX_FRAMES = 10000   # child frames a /tf_static union keeps (a robot has tens)
_LE_HEADER = b"\x00\x01\x00\x00"


class TfUnion:
    """The union of the transforms of every ``tf2_msgs/msg/TFMessage`` given to ``merge``, the
    newest per ``child_frame_id`` (a later message replaces a child frame's transform in place;
    new child frames are appended), as XCDR1 CDR (little endian).

    The codec is written out here so that no backend needs tf2_msgs (the rclpy backend runs on
    a ROS install that may not have the Python package): TFMessage is ``sequence<
    TransformStamped>``, TransformStamped is ``{Header {Time {int32 sec, uint32 nanosec},
    string frame_id}, string child_frame_id, Transform {Vector3, Quaternion}: 7 float64}``;
    alignment counts from the end of the 4-byte encapsulation header. Bounded: at most
    ``max_frames`` child frames and ``max_bytes`` encoded; past either, the child frames updated
    longest ago are dropped (``evicted`` counts them).
    """

    _TIME = struct.Struct("<iI")
    _XFORM = struct.Struct("<7d")

    def __init__(self, max_bytes, max_frames=TF_UNION_MAX_FRAMES):
        self.max_bytes = int(max_bytes)
        self.max_frames = int(max_frames)
        self.frames = collections.OrderedDict()  # child_frame_id -> (sec, nsec, frame, xform)
        self.size = 8                            # header + sequence length
        self.evicted = 0

    @staticmethod
    def decode(data):
        """[(sec, nanosec, frame_id, child_frame_id, (7 floats))] of a TFMessage, or None when
        ``data`` is not one (not XCDR1, truncated, or bytes left over beyond alignment)."""
        if len(data) < 8 or data[0] != 0 or data[1] not in (0, 1):
            return None
        e = "<" if data[1] == 1 else ">"
        body = memoryview(data)[4:]
        end = len(body)
        try:
            n, = struct.unpack_from(e + "I", body, 0)
            if n > end // 64:  # each element takes at least 64 bytes
                return None
            o = 4
            out = []
            for _ in range(n):
                o += -o % 4
                sec, nsec = struct.unpack_from(e + "iI", body, o)
                o += 8
                strs = []
                for _ in range(2):
                    o += -o % 4
                    ln, = struct.unpack_from(e + "I", body, o)
                    o += 4
                    if ln > end - o:
                        return None
                    raw = bytes(body[o:o + ln])
                    o += ln
                    strs.append(raw[:-1].decode("utf-8") if ln else "")
                o += -o % 8
                xf = struct.unpack_from(e + "7d", body, o)
                o += 56
                out.append((sec, nsec, strs[0], strs[1], xf))
        except (struct.error, UnicodeDecodeError):
            return None
        if end - o > 7:  # at most the writer's padding to 4 (Fast DDS, our dds backend) or 8
            return None
        return out

    @staticmethod
    def _cost(frame, child):
        """An upper bound of one element's encoded size (alignment included)."""
        return 8 + 4 + len(frame.encode()) + 1 + 3 + 4 + len(child.encode()) + 1 + 7 + 56

    def merge(self, data):
        """The union's CDR once ``data``'s transforms are in it; None if ``data`` is not a
        TFMessage (then the union is unchanged)."""
        got = self.decode(data)
        if got is None:
            return None
        frames = self.frames
        for sec, nsec, frame, child, xf in got:
            old = frames.pop(child, None)
            if old is not None:
                self.size -= self._cost(old[2], child)
            frames[child] = (sec, nsec, frame, xf)   # the newest goes to the end
            self.size += self._cost(frame, child)
        while frames and (len(frames) > self.max_frames or self.size > self.max_bytes):
            child, old = frames.popitem(last=False)
            self.size -= self._cost(old[2], child)
            self.evicted += 1
        return self.encode()

    def encode(self):
        out = bytearray(_LE_HEADER)
        out += struct.pack("<I", len(self.frames))
        for child, (sec, nsec, frame, xf) in self.frames.items():
            out += b"\0" * (-(len(out) - 4) % 4)
            out += self._TIME.pack(sec, nsec)
            for text in (frame, child):
                raw = text.encode() + b"\0"
                out += b"\0" * (-(len(out) - 4) % 4)
                out += struct.pack("<I", len(raw)) + raw
            out += b"\0" * (-(len(out) - 4) % 8)
            out += self._XFORM.pack(*xf)
        return bytes(out)


class _Entity:
    __slots__ = ("kind", "topic", "type", "qos", "handle", "slots", "created",
                 "count", "too_large", "too_large_size", "too_large_last", "msgs", "bytes",
                 "history_charge", "incompatible_seen", "incompatible_last",
                 "incompatible_policy", "tf_union", "sizes", "largest", "pause_ok",
                 "refused_last", "idle_since")

    def __init__(self, kind, topic, ros_type, qos, now):
        self.kind = kind
        self.topic = topic
        self.type = ros_type
        self.qos = qos
        self.handle = None
        self.slots = set()
        self.created = now
        self.count = None
        self.too_large = 0          # dropped since the last report (guarded by the queue lock)
        self.too_large_size = 0
        self.too_large_last = None  # now of the last report (loop thread)
        self.msgs = 0
        self.bytes = 0
        self.history_charge = 0     # bytes of --max-history-bytes this entity holds
        # what the DDS history can hold: a writer its last `depth` samples (their sizes, oldest
        # first); a paused reader `depth` samples of the largest size it delivered so far
        self.sizes = collections.deque() if kind == "pub" else None
        self.largest = 0
        self.pause_ok = True        # False: the budget cannot afford this reader's history
        self.refused_last = None    # now of the last resource_exhausted report (writers)
        self.incompatible_seen = 0    # the backend's incompatible-QoS total already reported
        self.incompatible_last = None  # now of the last qos_incompatible report
        self.incompatible_policy = ""  # the policy the backend named last (for /diagnostics)
        self.tf_union = None        # TfUnion of a transient_local TFMessage publisher
        self.idle_since = None      # now when its last slot went (lingering, Companion._idle)


# Registration work between two polls, ms of wall-clock time (the default; the tests of
# tests/ros that count registrations set it out of reach: on a loaded machine a fake backend's
# work crossed 10 ms and coalesced them, tests/ros/conftest.py)
REGISTRATION_BUDGET_MS = 10


class Companion:
    """``Companion(backend, sink, max_message)`` implements RosPort (see docs/DESIGN.md)."""

    def __init__(self, backend, sink=None, max_message=64 * 1024 * 1024, *,
                 queue_limit=1024, queue_bytes=64 * 1024 * 1024,
                 sub_count_interval_ms=100, sub_count_grace_ms=200,
                 too_large_interval_ms=1000, incompatible_interval_ms=5000,
                 diagnostics_period_ms=1000,
                 diagnostics_topic="/diagnostics", hardware_id="ubrb",
                 max_history_bytes=None, latched=None, history_interval_ms=1000, names=None,
                 registration_budget_ms=None, linger_ms=250, linger_max=64):
        self.backend = backend
        self.sink = sink
        self.distro = getattr(backend, "distro", "unknown")
        self._max_message = int(max_message)
        self._queue_limit = int(queue_limit)
        self._queue_bytes_limit = int(queue_bytes)
        self._count_interval = int(sub_count_interval_ms)
        self._count_grace = int(sub_count_grace_ms)
        self._too_large_interval = int(too_large_interval_ms)
        self._incompatible_interval = int(incompatible_interval_ms)
        self._diag_period = diagnostics_period_ms
        # names.Names: the node's name, namespace and remap rules; every topic a client names
        # is resolved by it (relative ones under the namespace), /diagnostics too
        self.names = names if names is not None else Names(getattr(backend, "node_name",
                                                                   "ros_side"))
        self._diag_topic = self.names.resolve(diagnostics_topic)
        # /diagnostics' hardware_id: a string, or a function giving it (the link's peer, which
        # a UDP link learns once the gateway speaks: cli.link_peer)
        self.hardware_id = hardware_id
        self._check_topic = getattr(backend, "check_topic", None) or check_topic
        # What DDS holds for the gateway's registrations (KEEP_LAST: at most depth samples per
        # writer and reader), counted as it is held: a writer its last depth samples' sizes, a
        # pausable reader depth x the largest sample it delivered (what its history holds when
        # the link makes it pause). A message that would take a writer past the budget is refused.
        self.history_limit = (default_history_bytes() if max_history_bytes is None
                              else int(max_history_bytes))
        self.history_used = 0
        self._history_interval = int(history_interval_ms)
        log.info("DDS history budget %s (--max-history-bytes): what the writers' and readers' "
                 "histories hold", _mib(self.history_limit))
        # transient_local samples kept across a companion restart (link mode): latched.py
        self.latched = latched

        self._pub_slots = {}      # slot -> _Entity
        self._sub_slots = {}
        self._pubs = {}           # topic -> _Entity
        self._subs = {}
        self._reported = {}       # pub slot -> last count sent
        self._too_large_waiting = set()  # entities with drops not yet reported (loop thread)
        self._draining = []       # [(deadline ms, _Entity, handle)]: released writers (DRAIN_MS)
        self._next_drain = 0
        self._acked = getattr(backend, "acked", None)

        self._qlock = threading.Lock()
        self._queue = collections.deque()
        self._queued_bytes = 0
        self._too_large_pending = set()
        self._paused = set()      # reliable entities whose reader waits (backpressure)
        self._stopping = False    # stop_taking(): a graceful stop takes no more messages
        self._held = collections.deque()  # reliable messages waiting for link room (loop thread)
        self._held_bytes = 0
        self._q_rel = self._q_rel_bytes = 0  # pausable (reliable) part of _queue
        # the pausable messages poll() took out of _queue and _held and is handing over right
        # now: they still count against the bound until poll() has delivered or held them again
        # (without this a reader could add a whole take batch while poll() runs: 2 batches over)
        self._inflight_rel = self._inflight_rel_bytes = 0
        self._can_pause = hasattr(backend, "resume_subscription")
        self._signalled = False
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)

        # registrations and releases waiting for their turn: (kind, slot) -> (topic, type, qos),
        # (topic, type, qos, True) when the slot's held registration is released first, or None
        # for a release; and the ms of backend work done for them since the last poll
        self._pending = {}
        self._reg_budget = float(REGISTRATION_BUDGET_MS if registration_budget_ms is None
                                 else registration_budget_ms)
        self._reg_spent = 0.0
        # released volatile entities kept for reuse: (kind, topic) -> _Entity, oldest first
        self._idle = {}
        self._linger = int(linger_ms)
        self._linger_max = int(linger_max)

        self._now = None
        self._next_count = None
        self._next_diag = None
        self._diag_handle = None
        self._diag_failed = False
        self._group_stats = {}    # "gateway" -> {...}, "link" -> {...}
        self.stats = collections.OrderedDict(
            (k, 0) for k in ("pub_msgs", "pub_bytes", "pub_dropped", "pub_errors",
                             "sub_msgs", "sub_bytes", "queue_drops", "too_large_drops",
                             "errors_sent", "results_ok", "diag_published", "sessions_reset",
                             "reader_pauses", "qos_incompatible", "history_drops",
                             "writers_drained", "drain_timeouts", "release_drops",
                             "reg_deferred", "reg_coalesced", "entities_reused"))

    # -- wiring -------------------------------------------------------------------------------
    def wake_fd(self):
        """Read end of the wake pipe: readable when backend callbacks queued something."""
        return self._rfd

    def start(self):
        """Direct mode: tell the gateway the ROS side is up (the link end does this otherwise)."""
        self.sink.ros_up(self.distro, self._max_message)

    def set_max_message(self, n):
        """What the gateway can take (link: negotiated). Larger ROS messages: message_too_large."""
        self._max_message = int(n)

    def gateway_stats(self, stats):
        """Gateway counters (a flat dict; the gateway sends only those that changed), merged
        into diagnostics()."""
        self._group_stats.setdefault("gateway", {}).update(stats)

    def gateway_up(self):
        """Link mode: a link session came up (the gateway hands its registrations over now)."""
        if self.latched is not None:
            self.latched.gateway_up()

    def set_stats(self, group, stats):
        """Counters of another part (e.g. ``"link"``), merged into diagnostics() as ``group.key``."""
        self._group_stats[group] = dict(stats)

    # -- RosPort ------------------------------------------------------------------------------
    def max_message(self):
        return self._max_message

    def advertise(self, slot, topic, type, qos):  # noqa: A002 - DESIGN.md's parameter name
        self._reg_op("pub", slot, (topic, type, qos))

    def subscribe(self, slot, topic, type, qos):  # noqa: A002
        self._reg_op("sub", slot, (topic, type, qos))

    def unadvertise(self, slot):
        self._reg_op("pub", slot, None)
        self.forget_latched(slot)        # released by the gateway: its samples go too

    def unsubscribe(self, slot):
        self._reg_op("sub", slot, None)

    def _reg_op(self, kind, slot, want):
        """A registration (``want`` = (topic, type, qos)) or release (None) of a slot: done now
        while this poll interval's budget lasts and nothing waits, else queued for poll()."""
        pend = self._pending
        if not pend and self._reg_spent < self._reg_budget:
            self._apply(kind, slot, want)
            return
        key = (kind, slot)
        prev = pend.pop(key, 0)
        if prev != 0:
            self.stats["reg_coalesced"] += 1
        self.stats["reg_deferred"] += 1
        held = self._pub_slots if kind == "pub" else self._sub_slots
        if want is None and slot not in held:
            return                       # registered and released before its turn: nothing
        if want is not None and (prev is None or (prev != 0 and len(prev) > 3)):
            # a release of the held one came first: this is a new registration even if it is
            # the same again (its subscriber count is reported afresh, a latched one is new)
            want = want + (True,)
        if not pend:
            self._wake()                 # poll() soon, not after the loop's idle timeout
        pend[key] = want                 # to the end: a churning slot never jumps the queue

    def _apply(self, kind, slot, want):
        t = time.perf_counter()
        if want is None or len(want) > 3:
            self._release_slot(kind, slot)
        if want is not None:
            self._register(kind, slot, want[0], want[1], want[2])
        self._reg_spent += (time.perf_counter() - t) * 1000.0

    def _run_pending(self):
        """poll(): the waiting registrations and releases, oldest first, within the budget
        (at least one a poll)."""
        self._reg_spent = 0.0
        pend = self._pending
        while pend:
            key = next(iter(pend))
            self._apply(key[0], key[1], pend.pop(key))
            if self._reg_spent >= self._reg_budget:
                break
        if pend:
            self._wake()                 # the rest on the next poll, after the loop's other work

    def _wake(self):
        try:
            os.write(self._wfd, b"\x00")
        except (BlockingIOError, OSError):
            pass

    def forget_latched(self, slot):
        """Link mode: the gateway released publisher `slot`, which this companion does not hold
        (it was restarted meanwhile): the samples kept for it must not come back."""
        if self.latched is not None:
            self.latched.drop(slot)

    def publish(self, slot, buf, off, n, reliable):
        if self._pending and ("pub", slot) in self._pending:
            self._apply("pub", slot, self._pending.pop(("pub", slot)))  # its ADVERTISE first
        ent = self._pub_slots.get(slot)
        if ent is None or ent.handle is None:
            self.stats["pub_dropped"] += 1
            return
        data = bytes(memoryview(buf)[off:off + n])
        if ent.tf_union is not None:
            union = ent.tf_union.merge(data)
            if union is None:
                _warn("tf_union", "%r: not a %s, published as it is" % (ent.topic, TF_TYPE))
            else:
                data = union
        m = len(data)
        sizes = ent.sizes
        gone = sizes[0] if len(sizes) >= ent.qos[2] else 0  # KEEP_LAST: the oldest one goes
        if m > gone and self.history_used + m - gone > self.history_limit:
            self._refuse_history(slot, ent, m)
            return
        try:
            self.backend.publish(ent.handle, data)
        except Exception as e:
            self.stats["pub_errors"] += 1
            _warn("publish", "publish on %r failed: %s" % (ent.topic, e))
            return
        if len(sizes) >= ent.qos[2]:
            sizes.popleft()
        sizes.append(m)
        ent.history_charge += m - gone
        self.history_used += m - gone
        if self.latched is not None and ent.qos[1]:
            self.latched.record(slot, data)
        ent.msgs += 1
        ent.bytes += n
        self.stats["pub_msgs"] += 1
        self.stats["pub_bytes"] += n

    def _refuse_history(self, slot, ent, m):
        """A message that would take the held history past --max-history-bytes is not written:
        ERROR resource_exhausted to the slot's clients, at most once per entity per second."""
        self.stats["history_drops"] += 1
        now = self._now if self._now is not None else int(time.monotonic() * 1000)
        if ent.refused_last is not None and now - ent.refused_last < self._history_interval:
            return
        ent.refused_last = now
        self.stats["errors_sent"] += 1
        if self.sink is not None:
            self.sink.ros_error("pub", slot, "resource_exhausted", (
                "%s: a %d-byte message would take the DDS history the companion holds past its "
                "budget (--max-history-bytes %d, %s in use, this topic's last %d samples %s): "
                "dropped; lower the depth, or raise --max-history-bytes"
                % (ent.topic, m, self.history_limit, _mib(self.history_used),
                   len(ent.sizes), _mib(ent.history_charge))))

    def stop_taking(self):
        """A graceful stop (ros_side/__main__.py, drain_link): take no more ROS messages, so that
        what was taken can be handed on within the drain's bound. Reliable readers are paused
        (their samples stay in DDS, as when the link is full); others' are dropped, counted in
        queue_drops."""
        with self._qlock:
            self._stopping = True

    def waiting(self):
        """Reliable ROS messages taken from DDS and not handed to the sink yet (the link had no
        room): what a graceful stop drains (ros_side/__main__.py, drain_link)."""
        with self._qlock:
            return len(self._held) + sum(1 for ent, _ in self._queue if ent.qos[0])

    def reset(self):
        """A gateway session ended for good: release every ROS object it made us create. The
        reliable ROS messages that were waiting for the link go with them: counted
        (``release_drops``) and returned, {subscription slot: how many}, so that the clients
        can be told (link_end.LinkCompanionEnd.expire)."""
        dropped = {}
        with self._qlock:
            for ent, _ in self._held + self._queue:
                if ent.qos[0] and ent.slots:
                    self.stats["release_drops"] += 1
                    for slot in ent.slots:
                        dropped[slot] = dropped.get(slot, 0) + 1
        self._pending.clear()
        for slot in list(self._pub_slots):
            self._release_slot("pub", slot, SESSION_LINGER_MS)
        for slot in list(self._sub_slots):
            self._release_slot("sub", slot, SESSION_LINGER_MS)
        with self._qlock:
            self._queue.clear()
            self._queued_bytes = 0
            self._held.clear()
            self._held_bytes = self._q_rel = self._q_rel_bytes = 0
            self._inflight_rel = self._inflight_rel_bytes = 0
            self._paused = set()
            self._too_large_pending.clear()
        self._reported.clear()
        self._too_large_waiting.clear()
        self.stats["sessions_reset"] += 1
        if self.latched is not None:
            self.latched.unclaim()       # kept for the gateway's registrations coming back
        return dropped

    def close(self, close_backend=True):
        self.reset()
        self._expire_idle(0, everything=True)
        self._drain_at_close()
        if self.latched is not None:
            self.latched.close()
        if self._diag_handle is not None:
            try:
                self.backend.destroy_publisher(self._diag_handle)
            except Exception:  # pragma: no cover
                pass
            self._diag_handle = None
        if close_backend:
            self.backend.close()
        for fd in (self._rfd, self._wfd):
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass
        self._rfd = self._wfd = -1

    # -- registration -------------------------------------------------------------------------
    def _result(self, kind, slot, code, message):
        if code is None:
            self.stats["results_ok"] += 1
        else:
            self.stats["errors_sent"] += 1
            if kind == "pub" and self.latched is not None:
                self.latched.drop(slot)  # the gateway drops a refused registration
        if self.sink is not None:
            self.sink.ros_result(kind, slot, code, message)

    def _register(self, kind, slot, topic, type_string, qos):
        slots = self._pub_slots if kind == "pub" else self._sub_slots
        same_kind = self._pubs if kind == "pub" else self._subs
        other_kind = self._subs if kind == "pub" else self._pubs
        try:
            topic = self._check_topic(self.names.resolve(topic))
            ros_type = normalize_type(type_string)
            q = check_qos(qos)
        except RosError as e:
            self._release_slot(kind, slot)
            self._result(kind, slot, e.code, e.message)
            return
        old = slots.get(slot)
        if old is not None:
            if old.topic == topic and old.type == ros_type and old.qos == q:
                self._result(kind, slot, None, "")  # re-sent registration (after ros_up)
                return
            self._release_slot(kind, slot)
        try:
            self._check_conflicts(kind, topic, ros_type, q, same_kind, other_kind)
        except RosError as e:
            self._result(kind, slot, e.code, e.message)
            return
        ent = same_kind.get(topic)
        if ent is None and self._idle:
            ent = self._take_idle(kind, topic, ros_type, q)
            if ent is not None:
                same_kind[topic] = ent
        if ent is None:
            if self._draining:
                self._end_drains(topic, ros_type)
            ent = _Entity(kind, topic, ros_type, q, None)
            try:
                if kind == "pub":
                    ent.handle = self.backend.create_publisher(topic, ros_type, qos_dict(q))
                else:
                    ent.handle = self.backend.create_subscription(
                        topic, ros_type, qos_dict(q), self._callback_for(ent))
            except RosError as e:
                self._result(kind, slot, e.code, e.message)
                return
            except Exception as e:  # a backend that failed to load the type
                log.exception("creating %s %r %r failed", kind, topic, ros_type)
                self._result(kind, slot, "unknown_type", "%s: failed to load: %s" % (ros_type, e))
                return
            same_kind[topic] = ent
            if kind == "pub" and ros_type == TF_TYPE and q[1]:
                ent.tf_union = TfUnion(self._max_message)
        ent.slots.add(slot)
        slots[slot] = ent
        replay = ()
        if kind == "pub":
            self._reported.pop(slot, None)
            self._next_count = None  # look at counts on the next poll
            gen = getattr(self.sink, "registration_gen", None)
            if self.latched is not None and gen is not None:
                replay = self.latched.claim(slot, gen("pub", slot), topic, ros_type, q)
        self._result(kind, slot, None, "")
        for data in replay:          # the same registration before a restart: latched again
            self.publish(slot, data, 0, len(data), True)

    def _check_conflicts(self, kind, topic, ros_type, q, same_kind, other_kind):
        ent = same_kind.get(topic)
        if ent is not None:
            if ent.type != ros_type:
                raise RosError("type_conflict", "%s is already %s here with type %s"
                               % (topic, "published" if kind == "pub" else "subscribed", ent.type))
            if ent.qos != q:
                raise RosError("qos_conflict", "%s is already %s here with qos %s"
                               % (topic, "published" if kind == "pub" else "subscribed",
                                  qos_dict(ent.qos)))
        other = other_kind.get(topic)
        if other is not None and other.type != ros_type:
            raise RosError("type_conflict", "%s is already %s here with type %s"
                           % (topic, "subscribed" if kind == "pub" else "published", other.type))
        if self._diag_period and topic == self._diag_topic and ros_type != diag.TYPE:
            raise RosError("type_conflict", "%s is published by the companion with type %s"
                           % (topic, diag.TYPE))

    def _release_slot(self, kind, slot, linger_ms=0):
        slots = self._pub_slots if kind == "pub" else self._sub_slots
        ent = slots.pop(slot, None)
        if kind == "pub":
            self._reported.pop(slot, None)
        if ent is None:
            return
        ent.slots.discard(slot)
        if ent.slots:
            return
        same_kind = self._pubs if kind == "pub" else self._subs
        if same_kind.get(ent.topic) is ent:
            del same_kind[ent.topic]
        if self._linger > 0 and not ent.qos[1] and ent.handle is not None:
            # its share of --max-history-bytes is given back now, as for a deleted one: what
            # DDS still holds for it lingers too, and is counted afresh if it is taken again
            self.history_used -= ent.history_charge
            ent.history_charge = ent.largest = 0
            if ent.sizes:
                ent.sizes.clear()
            idle = self._idle
            idle.pop((kind, ent.topic), None)
            ent.idle_since = self._now
            if linger_ms > self._linger and self._now is not None:
                ent.idle_since += linger_ms - self._linger   # (expires linger_ms from now)
            idle[(kind, ent.topic)] = ent
            if len(idle) > self._linger_max:
                self._destroy(idle.pop(next(iter(idle))))
            return
        self._destroy(ent)

    def _take_idle(self, kind, topic, ros_type, q):
        """A lingering entity for this registration, or None. One on the topic that does not fit
        (another kind with another type, or another QoS) is deleted: the backend could not
        create the new one beside it."""
        ent = self._idle.pop((kind, topic), None)
        if ent is not None:
            if ent.type == ros_type and ent.qos == q:
                self.stats["entities_reused"] += 1
                ent.created = None          # counts: the grace starts again
                return ent
            self._destroy(ent)
        other = self._idle.get(("sub" if kind == "pub" else "pub", topic))
        if other is not None and other.type != ros_type:
            self._destroy(self._idle.pop((other.kind, topic)))
        return None

    def _expire_idle(self, now, everything=False):
        idle = self._idle
        while idle:
            key = next(iter(idle))
            ent = idle[key]
            if not everything and ent.idle_since is not None \
                    and now - ent.idle_since < self._linger:
                return
            self._destroy(idle.pop(key))

    def _destroy(self, ent):
        """Its DDS entity goes: at once, or a reliable writer that wrote once its readers
        acknowledged it (``_draining``)."""
        handle, ent.handle = ent.handle, None
        if ent.kind == "pub" and ent.qos[0] and ent.msgs and \
                not self._all_acked(ent, handle, 0):
            # what it wrote may not have reached its readers yet: destroying the writer now
            # would lose it (Fast DDS drops it with the writer; Cyclone lingers 1 s at most)
            now = self._now if self._now is not None else int(time.monotonic() * 1000)
            self._draining.append((now + DRAIN_MS, ent, handle))
            if len(self._draining) > DRAIN_MAX:
                _, old, old_handle = self._draining.pop(0)
                self._drain_timeout(old, "%d writers released since" % DRAIN_MAX)
                self._delete(old, old_handle)
            return
        self._delete(ent, handle)

    def _delete(self, ent, handle):
        self.history_used -= ent.history_charge  # held until the DDS entity goes
        ent.history_charge = 0
        try:
            if ent.kind == "pub":
                self.backend.destroy_publisher(handle)
            else:
                self.backend.destroy_subscription(handle)
        except Exception:
            log.exception("releasing %s %r failed", ent.kind, ent.topic)

    def _all_acked(self, ent, handle, timeout_s):
        """Has every matched reliable reader acknowledged all ``handle`` wrote (waiting up to
        ``timeout_s``)? True for a backend that cannot tell, and when asking fails."""
        if self._acked is None:
            return True
        try:
            return bool(self._acked(handle, timeout_s))
        except Exception as e:
            _warn("acked", "%r: cannot ask for acknowledgements: %s" % (ent.topic, e))
            return True

    def _drain(self, now):
        """Destroy the released writers whose readers acknowledged everything, or whose
        DRAIN_MS passed (asked, never waited for: this is the loop)."""
        keep = []
        for item in self._draining:
            deadline, ent, handle = item
            if self._all_acked(ent, handle, 0):
                self.stats["writers_drained"] += 1
            elif now < deadline:
                keep.append(item)
                continue
            else:
                self._drain_timeout(ent, "%d ms after its release" % DRAIN_MS)
            self._delete(ent, handle)
        self._draining = keep

    def _end_drains(self, topic, ros_type):
        """A new entity on ``topic`` with another type: the released writers of the old one go
        now (DDS has one type per topic in a participant: the new one would be refused)."""
        keep = []
        for item in self._draining:
            ent = item[1]
            if ent.topic == topic and ent.type != ros_type:
                self._drain_timeout(ent, "when %s was registered again as %s" % (topic, ros_type))
                self._delete(ent, item[2])
            else:
                keep.append(item)
        self._draining = keep

    def _drain_timeout(self, ent, when):
        self.stats["drain_timeouts"] += 1
        _warn("drain", "%r: released writer destroyed with samples its readers had not "
              "acknowledged %s" % (ent.topic, when))

    def _drain_at_close(self):
        """At close (the loop is over): wait for what is still draining, CLOSE_DRAIN_MS in all."""
        end = time.monotonic() + CLOSE_DRAIN_MS / 1000.0
        for _, ent, handle in self._draining:
            if self._all_acked(ent, handle, max(0.0, end - time.monotonic())):
                self.stats["writers_drained"] += 1
            else:
                self._drain_timeout(ent, "when the companion stopped")
            self._delete(ent, handle)
        self._draining = []

    # -- backend thread -> loop thread ---------------------------------------------------------
    def _callback_for(self, ent):
        def on_message(data, ent=ent):
            return self._on_message(ent, data)
        return on_message

    def _on_message(self, ent, data):
        """Any thread. Queue (bounded) and wake the loop. Returns False to ask a backend that
        can pause a reader (resume_subscription) to stop taking from this reliable one: the
        queue is full, so its samples wait in DDS rather than being dropped here."""
        n = len(data)
        go_on = True
        with self._qlock:
            # reliable readers that can pause and everything else have a bound each, so
            # reliable messages waiting for the link never crowd out best-effort ones
            pausable = ent.qos[0] and self._can_pause and ent.pause_ok
            if pausable:
                qn = self._q_rel + len(self._held) + self._inflight_rel
                qb = self._q_rel_bytes + self._held_bytes + self._inflight_rel_bytes
            else:
                qn = len(self._queue) - self._q_rel
                qb = self._queued_bytes - self._q_rel_bytes
            full = qn >= self._queue_limit or qb + n > self._queue_bytes_limit or self._stopping
            if n > self._max_message:
                ent.too_large += 1
                ent.too_large_size = n
                self.stats["too_large_drops"] += 1
                self._too_large_pending.add(ent)
            elif full and not pausable:
                self.stats["queue_drops"] += 1
                return True
            else:
                # a pausable reader overshoots the bound by at most one take batch
                self._queue.append((ent, data))
                self._queued_bytes += n
                if pausable:
                    self._q_rel += 1
                    self._q_rel_bytes += n
                if full:
                    self._paused.add(ent)
                    self.stats["reader_pauses"] += 1
                    go_on = False
            if self._signalled:
                return go_on
            self._signalled = True
        try:
            os.write(self._wfd, b"\x00")
        except (BlockingIOError, OSError):
            pass
        return go_on

    # -- the loop ------------------------------------------------------------------------------
    def poll(self, now=None):
        """Drain queued messages into sink calls; report counts; publish diagnostics when due."""
        if now is None:
            now = int(time.monotonic() * 1000)
        self._now = now
        try:
            while os.read(self._rfd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        self._run_pending()
        with self._qlock:
            self._signalled = False
            batch = self._queue
            self._queue = collections.deque()
            self._inflight_rel = self._q_rel + len(self._held)
            self._inflight_rel_bytes = self._q_rel_bytes + self._held_bytes
            self._queued_bytes = self._q_rel = self._q_rel_bytes = 0
            if self._held:  # what waited for link room goes first
                self._held.extend(batch)
                batch, self._held = self._held, collections.deque()
                self._held_bytes = 0
            pending = self._too_large_pending
            self._too_large_pending = set()
        sink = self.sink
        room = getattr(sink, "room", None)  # a link end: reliable messages wait for link room
        held = None
        for ent, data in batch:
            if ent.handle is None or sink is None or not ent.slots:
                continue                 # (no slots: a lingering reader's, for nobody)
            n = len(data)
            if room is not None and ent.qos[0] and (
                    (held is not None and ent in held[1]) or not room(n * len(ent.slots))):
                if held is None:
                    held = ([], set())
                held[0].append((ent, data))  # in order: the rest of this entity waits too
                held[1].add(ent)
                continue
            if n > ent.largest:
                self._reader_grew(ent, n)
            ent.msgs += 1
            ent.bytes += n
            self.stats["sub_msgs"] += 1
            self.stats["sub_bytes"] += n
            for slot in tuple(ent.slots):
                sink.ros_message(slot, data, 0, n)
        self._requeue(held[0] if held is not None else ())
        self._too_large_waiting.update(pending)
        for ent in tuple(self._too_large_waiting):
            if self._report_too_large(ent, now):
                self._too_large_waiting.discard(ent)
        if self._next_count is None or now >= self._next_count:
            self._next_count = now + self._count_interval
            self._poll_counts(now)
        if self._draining and now >= self._next_drain:
            self._next_drain = now + DRAIN_CHECK_MS
            self._drain(now)
        if self._idle:
            self._expire_idle(now)
        if self.latched is not None:
            self.latched.tick(now)
        if self._diag_period and (self._next_diag is None or now >= self._next_diag):
            self._next_diag = now + int(self._diag_period)
            self._publish_diagnostics()

    def _reader_grew(self, ent, n):
        """A reader delivered its largest sample yet. One the companion can pause (reliable,
        a backend with resume_subscription) holds depth of them in DDS while paused: charged.
        Past the budget it is no longer paused (its overflow is dropped and counted, as for a
        best-effort reader), so DDS never holds more for it than the budget allows. Any other
        reader is taken from as samples arrive: DDS holds nothing for it to charge."""
        ent.largest = n
        if not (ent.qos[0] and self._can_pause):
            return
        charge = ent.qos[2] * n
        grow = charge - ent.history_charge
        if ent.pause_ok and self.history_used + grow > self.history_limit:
            ent.pause_ok = False
            _warn("history_reader", "%r: depth %d x %d bytes would take the DDS history past "
                  "--max-history-bytes %d: this reader is no longer paused when the link is "
                  "busy (messages beyond the hand-over queue are dropped)"
                  % (ent.topic, ent.qos[2], n, self.history_limit))
        if ent.pause_ok:
            ent.history_charge = charge
            self.history_used += grow

    def _requeue(self, held):
        """Keep reliable messages the link could not take for the next poll (they count against
        the queue's bounds for reliable readers only, so best-effort ones still flow), and let
        paused readers be taken from again once those have drained to a quarter."""
        with self._qlock:
            self._held.extend(held)
            self._held_bytes += sum(len(d) for _, d in held)
            self._inflight_rel = self._inflight_rel_bytes = 0  # delivered, or held again
            if (len(self._queue) + len(self._held) > self._queue_limit // 4
                    or self._queued_bytes + self._held_bytes > self._queue_bytes_limit // 4
                    or self._stopping):
                return
            paused = self._paused
            self._paused = set()
        for ent in paused:
            if ent.handle is not None:
                self.backend.resume_subscription(ent.handle)

    def _report_too_large(self, ent, now):
        """One ``message_too_large`` per entity (hence per slot) per ``too_large_interval_ms``."""
        if ent.handle is None:
            return True
        last = ent.too_large_last
        if last is not None and now - last < self._too_large_interval:
            return False  # keep waiting; the count keeps growing meanwhile
        with self._qlock:
            dropped, size = ent.too_large, ent.too_large_size
            ent.too_large = 0
        if not dropped:
            return True
        ent.too_large_last = now
        for slot in tuple(ent.slots):
            self.stats["errors_sent"] += 1
            if self.sink is not None:
                self.sink.ros_error("sub", slot, "message_too_large",
                                    "%s: a %d-byte message exceeds the %d-byte limit "
                                    "(%d dropped since the last report)"
                                    % (ent.topic, size, self._max_message, dropped))
        return True

    def _poll_incompatible(self, now):
        """``qos_incompatible`` (spec: ERROR codes) when the backend saw a peer on an entity's
        topic whose QoS cannot match (DDS requested/offered incompatible QoS), naming the policy;
        at most once per entity (hence per slot) per ``incompatible_interval_ms``."""
        probe = getattr(self.backend, "incompatible_qos", None)
        if probe is None:
            return
        for ent in list(self._pubs.values()) + list(self._subs.values()):
            if ent.handle is None:
                continue
            try:
                total, policy = probe(ent.handle)
            except Exception:
                continue
            if total <= ent.incompatible_seen:
                continue
            last = ent.incompatible_last
            if last is not None and now - last < self._incompatible_interval:
                continue
            ent.incompatible_seen = total
            ent.incompatible_last = now
            ent.incompatible_policy = policy
            self.stats["qos_incompatible"] += 1
            other = "subscription" if ent.kind == "pub" else "publisher"
            msg = ("%s: a ROS %s with incompatible QoS (%s) does not match this %s (qos %s)"
                   % (ent.topic, other, policy, "publisher" if ent.kind == "pub"
                      else "subscription", qos_dict(ent.qos)))
            for slot in tuple(ent.slots):
                self.stats["errors_sent"] += 1
                if self.sink is not None:
                    self.sink.ros_error(ent.kind, slot, "qos_incompatible", msg)

    def _poll_counts(self, now):
        self._poll_incompatible(now)
        for ent in list(self._pubs.values()):
            if ent.handle is None:
                continue
            try:
                count = int(self.backend.subscription_count(ent.handle))
            except Exception:
                continue
            ent.count = count
            if ent.created is None:
                ent.created = now
            if count == 0 and now - ent.created < self._count_grace:
                continue
            for slot in tuple(ent.slots):
                if self._reported.get(slot) != count:
                    self._reported[slot] = count
                    if self.sink is not None:
                        self.sink.ros_sub_count(slot, count)

    # -- diagnostics ---------------------------------------------------------------------------
    def diagnostics(self):
        """Flat key -> value counters: the companion's own, then ``group.key`` for each group."""
        with self._qlock:
            qlen, qbytes = len(self._queue), self._queued_bytes
        d = collections.OrderedDict()
        d["backend"] = getattr(self.backend, "name", type(self.backend).__name__)
        d["distro"] = self.distro
        d["pub_slots"] = len(self._pub_slots)
        d["sub_slots"] = len(self._sub_slots)
        d["pub_topics"] = len(self._pubs)
        d["sub_topics"] = len(self._subs)
        d["queue_len"] = qlen
        d["queue_bytes"] = qbytes
        d["queue_fill_pct"] = (100 * qlen) // self._queue_limit if self._queue_limit else 0
        d["max_message"] = self._max_message
        d["history_bytes_reserved"] = self.history_used
        d["history_bytes_limit"] = self.history_limit
        d["writers_draining"] = len(self._draining)
        d["reg_waiting"] = len(self._pending)
        d["entities_lingering"] = len(self._idle)
        d.update(self.stats)
        if self.latched is not None:
            d.update(self.latched.counters())
        # Which of our publishers/subscriptions met a ROS peer whose QoS cannot match (issue 13:
        # /diagnostics lists them, beside the qos_incompatible ERROR the clients get).
        d["qos_incompatible_topics"] = ", ".join(
            "%s (%s, %s)" % (e.topic, e.kind, e.incompatible_policy)
            for e in list(self._pubs.values()) + list(self._subs.values()) if e.incompatible_seen)
        cb_err = getattr(self.backend, "callback_errors", None)
        if cb_err is not None:
            d["backend_callback_errors"] = cb_err
        for group, stats in self._group_stats.items():
            for k, v in stats.items():
                d["%s.%s" % (group, k)] = v
        return d

    def _diag_statuses(self):
        d = self.diagnostics()
        own = [(k, str(v)) for k, v in d.items() if "." not in k]
        drops = d.get("queue_drops", 0) or d.get("too_large_drops", 0)
        qos = d.get("qos_incompatible_topics")
        what = "messages dropped" if drops else "QoS incompatible: " + qos[:200] if qos else "ok"
        fqn = self.names.fqn  # each companion by its node's name and namespace
        hw = self.hardware_id() if callable(self.hardware_id) else str(self.hardware_id)
        out = [(diag.WARN if drops or qos else diag.OK, "%s: companion" % fqn, what, hw, own)]
        for group in self._group_stats:
            prefix = group + "."
            vals = [(k[len(prefix):], str(v)) for k, v in d.items() if k.startswith(prefix)]
            out.append((diag.OK, "%s: %s" % (fqn, group), "ok", hw, vals))
        return out

    def _publish_diagnostics(self):
        if self._diag_failed:
            return
        if self._diag_handle is None:
            try:
                self._diag_handle = self.backend.create_publisher(
                    self._diag_topic, diag.TYPE,
                    {"reliability": "reliable", "durability": "volatile", "depth": 10})
            except Exception as e:
                self._diag_failed = True
                log.warning("diagnostics disabled: cannot publish %s: %s", self._diag_topic, e)
                return
        t = time.time()
        sec = int(t)
        data = diag.encode_diagnostic_array(sec, int((t - sec) * 1e9), self._diag_statuses())
        try:
            self.backend.publish(self._diag_handle, data)
            self.stats["diag_published"] += 1
        except Exception as e:  # pragma: no cover
            log.warning("diagnostics publish failed: %s", e)
