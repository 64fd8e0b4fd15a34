"""Latched samples that outlive the companion process (issue 21, item 3).

A transient_local writer serves its last ``depth`` samples to ROS nodes that join late. When the
companion is restarted (``kill -9``, a crash, a systemd restart) in link mode, the gateway hands
its registrations over again (``Gateway.ros_up``: the same slot, topic, type, QoS and generation),
but the samples are gone: the new writer has an empty history, and the UBRB clients are not asked
to publish again (they get ERROR ``link_reset``, which the Unreal plugin does not act on). So the
companion keeps a copy of every transient_local writer's last ``depth`` samples in a state file
and, when the same registration comes back, writes them again before anything else.

Where the copy lives: here, on the PC, never on the gateway (an ESP32 gateway has ~100 KiB of
heap; the samples of one latched map can be megabytes). docs/COMPANION.md says why.

Identity and staleness. An entry is the samples published through one publisher slot under one
registration generation (``gen``, from the gateway's ADV record), with its topic, type and QoS.
Only a registration with all five equal gets the samples back. The gateway draws its first
generation from its link epoch (random per gateway process), so a restarted gateway's
registrations do not match an old one's. An entry is forgotten when the gateway releases the
registration (UNADV, also sent for releases that happened while the companion was away), when
the slot is registered under another identity or refused, and when a gateway has been up for
``CLAIM_WINDOW_MS`` without handing it over (its client has gone).

Bounds. Per entry ``depth`` samples (KEEP_LAST, as the writer's own history); in all at most
``max_bytes`` (``--latched-max-bytes``): past it the samples of the entries updated longest ago go
first (counted in ``evicted``). The file is at most that plus a small header.

Off the hot path. ``record`` only appends to a deque. ``tick`` (the companion's poll) takes a
snapshot (references to the immutable sample bytes, no copy) at most every ``WRITE_MIN_MS``
(or 10 times the last write's duration, whichever is longer) and hands it to one writer thread,
which writes a temporary file, fsyncs it and renames it over the state file (atomic: a reader
sees the old or the new file, never a torn one). A ``kill -9`` loses at most what was published
in the last interval plus one write.

File format: ``MAGIC``, u32 LE header length, the header (JSON: the entries with their sample
sizes), the samples back to back, u32 LE CRC-32 of everything before it.
"""

import collections
import json
import logging
import os
import re
import struct
import threading
import time
import zlib

log = logging.getLogger("ros_side.latched")

MAGIC = b"UBRB-LATCHED 1\n"
DEFAULT_MAX_BYTES = 64 << 20     # a few latched maps; /tf_static and /robot_description are KiB
WRITE_MIN_MS = 200
CLAIM_WINDOW_MS = 10000          # the gateway re-registers at once; 10 s is generous
_HEADER_MAX = 16 << 20           # bounds the JSON parse of a damaged file
_SLOT_MAX = 1 << 21
_GEN_MAX = 0x3FFFFFFF


def default_path(link):
    """Where a companion on ``link`` keeps its latched samples: one file per link address (two
    companions on one machine have two links), in ``$STATE_DIRECTORY`` (systemd's
    StateDirectory=, tools/systemd/ubrb-companion.service), else ``$XDG_STATE_HOME/ubrb``, else
    ``~/.local/state/ubrb``."""
    base = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if not base:
        base = os.path.join(os.environ.get("XDG_STATE_HOME")
                            or os.path.join(os.path.expanduser("~"), ".local", "state"), "ubrb")
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", link).strip("_")
    return os.path.join(base, "ros_side-%s.latched" % (name[:120] or "link"))


class _Entry:
    __slots__ = ("slot", "gen", "topic", "type", "qos", "samples", "nbytes", "claimed")

    def __init__(self, slot, gen, topic, ros_type, qos):
        self.slot = slot
        self.gen = gen
        self.topic = topic
        self.type = ros_type
        self.qos = tuple(qos)       # (reliable, transient_local, depth)
        self.samples = collections.deque()
        self.nbytes = 0
        self.claimed = True

    def ident(self):
        return (self.gen, self.topic, self.type, self.qos)


def encode(entries):
    """The file's bytes for [(slot, gen, topic, type, qos, samples)]."""
    head = json.dumps({"entries": [
        {"slot": s, "gen": g, "topic": t, "type": ty, "qos": list(q),
         "sizes": [len(d) for d in samples]}
        for s, g, t, ty, q, samples in entries]}, separators=(",", ":")).encode()
    parts = [MAGIC, struct.pack("<I", len(head)), head]
    for e in entries:
        parts.extend(e[5])
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
    parts.append(struct.pack("<I", crc & 0xFFFFFFFF))
    return parts


def decode(raw):
    """[(slot, gen, topic, type, qos, [samples])] of a state file's bytes; ValueError naming
    what is wrong."""
    if not raw.startswith(MAGIC):
        raise ValueError("not a latched-state file")
    if len(raw) < len(MAGIC) + 8:
        raise ValueError("truncated")
    if zlib.crc32(raw[:-4]) & 0xFFFFFFFF != struct.unpack_from("<I", raw, len(raw) - 4)[0]:
        raise ValueError("checksum mismatch")
    hl, = struct.unpack_from("<I", raw, len(MAGIC))
    o = len(MAGIC) + 4
    if hl > min(_HEADER_MAX, len(raw) - o - 4):
        raise ValueError("bad header length")
    try:
        head = json.loads(raw[o:o + hl].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("header is not JSON") from None
    o += hl
    out = []
    ents = head.get("entries") if isinstance(head, dict) else None
    if not isinstance(ents, list):
        raise ValueError("no entries")
    for e in ents:
        try:
            slot, gen, topic, ty, q, sizes = (e["slot"], e["gen"], e["topic"], e["type"],
                                              e["qos"], e["sizes"])
        except (KeyError, TypeError):
            raise ValueError("an entry lacks a field") from None
        ok = (_int(slot, 0, _SLOT_MAX - 1) and _int(gen, 1, _GEN_MAX)
              and isinstance(topic, str) and isinstance(ty, str)
              and isinstance(q, list) and len(q) == 3 and isinstance(q[0], bool)
              and q[1] is True and _int(q[2], 1, 1 << 31)
              and isinstance(sizes, list) and len(sizes) <= q[2]
              and all(_int(n, 0, len(raw)) for n in sizes))
        if not ok:
            raise ValueError("a malformed entry")
        samples = []
        for n in sizes:
            if o + n > len(raw) - 4:
                raise ValueError("samples truncated")
            samples.append(raw[o:o + n])
            o += n
        out.append((slot, gen, topic, ty, tuple(q), samples))
    if o != len(raw) - 4:
        raise ValueError("bytes left over")
    return out


def _int(v, lo, hi):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def write_atomically(path, parts):
    """Write ``parts`` to ``path`` so that a reader (or a crash) sees the old file or the new
    one: a temporary file in the same directory, fsync, rename, fsync of the directory."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o700, exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for p in parts:
            view = memoryview(p)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        dfd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - a directory we may not open
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)


class LatchedStore:
    """The latched samples of one companion and their state file (see the module's text).
    Every method is called from the companion's loop thread; only the file write runs on the
    store's own thread."""

    def __init__(self, path, max_bytes=DEFAULT_MAX_BYTES, claim_window_ms=CLAIM_WINDOW_MS,
                 write_min_ms=WRITE_MIN_MS):
        self.path = path
        self.max_bytes = int(max_bytes)
        self._window = int(claim_window_ms)
        self._write_min = int(write_min_ms)
        self.entries = collections.OrderedDict()   # slot -> _Entry, least recently updated first
        self.total = 0
        self.stats = collections.OrderedDict(
            (k, 0) for k in ("latched_loaded", "latched_restored", "latched_dropped",
                             "latched_evicted", "latched_writes", "latched_write_errors"))
        self._dirty = False
        self._next_write = 0
        self._last_write_ms = 0
        self._claim_by = None       # now after which unclaimed entries go (None: not running)
        self._window_pending = False
        self._cv = threading.Condition()
        self._pending = None        # the snapshot the writer thread takes next
        self._stop = False
        self._thread = None
        self._warned = None
        self._load()

    # -- loading ----------------------------------------------------------------------------------
    def _load(self):
        try:
            with open(self.path, "rb") as f:
                raw = f.read(self.max_bytes + _HEADER_MAX + 64)
                extra = f.read(1)
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("latched state %s cannot be read (%s): starting without it",
                        self.path, e.strerror or e)
            return
        try:
            if extra:
                raise ValueError("larger than --latched-max-bytes %d allows" % self.max_bytes)
            got = decode(raw)
        except ValueError as e:
            log.warning("latched state %s is unusable (%s): starting without it "
                        "(it is replaced at the next write)", self.path, e)
            return
        for slot, gen, topic, ty, q, samples in got:
            ent = _Entry(slot, gen, topic, ty, q)
            ent.claimed = False
            self.entries[slot] = ent
            for d in samples:
                self._append(ent, d)
        self._trim()
        self.stats["latched_loaded"] = sum(len(e.samples) for e in self.entries.values())
        if self.entries:
            log.info("latched state %s: %d sample(s) of %d topic(s), published again when the "
                     "gateway hands their registrations over", self.path,
                     self.stats["latched_loaded"], len(self.entries))

    # -- the companion's calls --------------------------------------------------------------------
    def claim(self, slot, gen, topic, ros_type, qos):
        """Publisher ``slot`` is now registration ``gen`` of (topic, type, qos): the samples the
        same registration held before, to be published again (oldest first), and from now on
        ``record`` keeps this slot's samples if the QoS is transient_local."""
        qos = tuple(qos)
        e = self.entries.get(slot)
        if e is not None and e.ident() == (gen, topic, ros_type, qos):
            if e.claimed:
                return []                 # the live registration, re-sent
            replay = list(e.samples)      # published again, so recorded again
            e.samples.clear()
            self.total -= e.nbytes
            e.nbytes = 0
            e.claimed = True
            self.stats["latched_restored"] += len(replay)
            return replay
        if e is not None:
            self._remove(e)               # another registration now holds the slot
        if qos[1] and gen:
            self.entries[slot] = _Entry(slot, gen, topic, ros_type, qos)
        return []

    def record(self, slot, data):
        """A sample went out on ``slot``'s writer (only transient_local slots are kept)."""
        e = self.entries.get(slot)
        if e is None or not e.claimed:
            return
        self._append(e, data)
        self.entries.move_to_end(slot)
        self._trim()
        self._dirty = True

    def drop(self, slot):
        """The gateway released (or lost) the registration of ``slot``: forget its samples."""
        e = self.entries.get(slot)
        if e is not None:
            self._remove(e)

    def unclaim(self):
        """The gateway session was reset: every entry waits for its registration again."""
        for e in self.entries.values():
            e.claimed = False

    def gateway_up(self):
        """A link session came up: the gateway hands its registrations over now; entries not
        claimed within the claim window belong to registrations that are gone."""
        self._window_pending = True

    def tick(self, now):
        if self._window_pending:
            self._window_pending = False
            self._claim_by = now + self._window
        if self._claim_by is not None and now >= self._claim_by:
            self._claim_by = None
            for e in [e for e in self.entries.values() if not e.claimed]:
                self._remove(e)
        if self._dirty and now >= self._next_write:
            self._dirty = False
            self._next_write = now + max(self._write_min, 10 * self._last_write_ms)
            self._hand_over(self._snapshot())

    def close(self):
        """Write what is not written yet and stop the writer (the entries stay in the file)."""
        snap = self._snapshot() if self._dirty else None
        self._dirty = False
        if self._thread is None:
            if snap is not None:
                self._write(snap)
            return
        with self._cv:
            if snap is not None:
                self._pending = snap
            self._stop = True
            self._cv.notify()
        self._thread.join(30)

    def counters(self):
        d = collections.OrderedDict(self.stats)
        d["latched_topics"] = len(self.entries)
        d["latched_bytes"] = self.total
        return d

    # -- internals --------------------------------------------------------------------------------
    def _append(self, e, data):
        n = len(data)
        if n > self.max_bytes:
            self.stats["latched_evicted"] += 1
            return
        e.samples.append(data)
        e.nbytes += n
        self.total += n
        while len(e.samples) > e.qos[2]:
            old = e.samples.popleft()
            e.nbytes -= len(old)
            self.total -= len(old)

    def _trim(self):
        # past the total cap, the samples of the entries updated longest ago go first
        while self.total > self.max_bytes:
            for e in self.entries.values():
                if e.samples:
                    break
            old = e.samples.popleft()
            e.nbytes -= len(old)
            self.total -= len(old)
            self.stats["latched_evicted"] += 1

    def _remove(self, e):
        del self.entries[e.slot]
        self.total -= e.nbytes
        self.stats["latched_dropped"] += len(e.samples)
        self._dirty = True

    def _snapshot(self):
        return [(e.slot, e.gen, e.topic, e.type, e.qos, tuple(e.samples))
                for e in self.entries.values() if e.samples]

    def _hand_over(self, snap):
        with self._cv:
            self._pending = snap       # a newer snapshot replaces one not written yet
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, daemon=True,
                                                name="ros_side-latched")
                self._thread.start()
            self._cv.notify()

    def _writer(self):
        while True:
            with self._cv:
                while self._pending is None and not self._stop:
                    self._cv.wait()
                snap, self._pending = self._pending, None
                if snap is None:
                    return
            self._write(snap)

    def _write(self, snap):
        t0 = time.monotonic()
        try:
            if snap:
                write_atomically(self.path, encode(snap))
            else:
                try:
                    os.remove(self.path)  # nothing latched: no file left behind
                except FileNotFoundError:
                    pass
        except OSError as e:
            self.stats["latched_write_errors"] += 1
            why = "%s" % (e.strerror or e)
            if why != self._warned:   # one line per kind of failure, not one per write
                self._warned = why
                log.warning("latched state %s cannot be written (%s): a companion restart "
                            "will not restore latched topics until it can", self.path, why)
            return
        self._warned = None
        self.stats["latched_writes"] += 1
        self._last_write_ms = int((time.monotonic() - t0) * 1000)
