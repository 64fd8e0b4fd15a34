"""The PUBLISHes a restarted companion must still get (docs/LINK.md, section 5, "A new companion
session"). The companion acknowledges a frame once it has handed the whole records in it to ROS;
when it restarts (a new link session), the gateway's records not wholly acknowledged may never
have reached ROS. `keep` saves the PUB records among them for the new session, `unpark` lets
them go once the registrations for it are queued.

Imported by the gateway's LinkSession only when a session it had used ends for a new one (a
companion restart, a desync), so a board's heap carries none of it until then.
MicroPython-portable."""

from ubrb_min import LK_T_PUB, const

_REL_RESET_BYTES = const(18)  # the core's _LKC_REL_RESET_BYTES and _LK_PARKED, which a module
_PARKED = const(1 << 29)      # cannot import on MicroPython (tests/core/test_link.py checks them)


def parked(s):
    """How many bytes of kept records session `s` holds at rel_head (0: none)."""
    t = s.reliable
    return t.rel_framed - _PARKED if t.rel_framed >= _PARKED else 0


def _rec_len(ring, p):
    # the whole length (header included) of the record that starts at ring[p]: its type byte,
    # then two varints, the slot and the body's length
    cap = len(ring)
    q = p + 1
    for _ in range(2):
        v = sh = 0
        while True:
            if q >= cap:
                q -= cap
            c = ring[q]
            q += 1
            v |= (c & 0x7F) << sh
            sh += 7
            if c < 0x80:
                break
    q -= p
    return (q if q > 0 else q + cap) + v


def keep(s):
    """LinkSession._discard (a new peer session): see _keep. LinkRosPort on the new companion's
    CHELLO while records are kept: see resume."""
    if hasattr(s, "sink"):
        resume(s)
    else:
        _keep(s)


def _keep(s):
    """Reset session `s`'s stream for a new peer session, but keep every PUB record not wholly
    acknowledged, moved together in order; the old stream's control records are dropped
    (Gateway.ros_up hands the registrations over anew), counted in rel_reset_bytes. rel_head is
    a record's start (it moves only to the end of a frame that ended a record), the bytes
    acknowledged past it run to the oldest frame in flight (all that was framed, if none is):
    the records wholly among them were handed to ROS and go. The kept records stay at rel_head,
    parked (nothing reliable is framed: rel_framed says how many, see parked()) until the
    registrations for the new session are queued behind them and unpark() moves those in
    front."""
    if not s.is_gateway:
        s._reset_stream()
        return
    t = s.reliable
    rel = t.rel
    cap = len(rel)
    p = t.rel_head
    acked = t.rel_framed if t.rel_framed < _PARKED else 0  # (kept once already: none acked)
    if t.una != t.nxt:
        acked = t.frame_off[t.una & t.ft_mask] - p
        if acked < 0:
            acked += cap
    left = t.rel_queued
    while left > 0:                   # the records the old peer handed to ROS
        L = _rec_len(rel, p)
        if L > acked:
            break
        acked -= L
        left -= L
        p += L
        if p >= cap:
            p -= cap
    t.rel_queued = left               # (the rest of the stream, from the first not handed on)
    w = start = p
    n = 0
    while left > 0:
        L = _rec_len(rel, p)
        left -= L
        if rel[p] == LK_T_PUB:
            n += L
            if w == p:
                w += L
                if w >= cap:
                    w -= cap
            else:
                for _ in range(L):
                    rel[w] = rel[p]
                    w = w + 1 if w + 1 < cap else 0
                    p = p + 1 if p + 1 < cap else 0
                continue
        p += L
        if p >= cap:
            p -= cap
    t.rel_queued -= n  # what goes: the reset counts it in rel_reset_bytes
    s.rel_kept = getattr(s, "rel_kept", 0) + n  # (a counter the CPython driver reports)
    s._reset_stream()
    t.rel_head = start
    t.rel_queued = n
    if n:
        t.rel_framed = _PARKED + n


def resume(port):
    """The new companion said hello (its CHELLO) to `port`, the gateway's LinkRosPort, whose
    session holds kept records: the gateway hands its registrations over (ros_up), and the kept
    records go behind them. During ros_up they lie just behind rel_head, outside the queue, so
    that the registrations have the whole ring: if they need more than the kept records leave,
    those are overwritten - dropped, counted in rel_reset_bytes (without its registrations the
    new companion could not use them anyway)."""
    s = port.s
    t = s.reliable
    cap = len(t.rel)
    k = parked(s)
    h = t.rel_head + k
    t.rel_head = h - cap if h >= cap else h
    t.rel_queued -= k  # (registrations queued while parked, if any, stay queued)
    t.rel_framed = 0
    if port.sink is not None:
        port.sink.ros_up(port.distro, port.max_message())
    if t.rel_queued + k > cap:
        s.stat_counts[_REL_RESET_BYTES] += k
        return
    t.rel_queued += k   # the kept records back in the queue, and the registrations ahead:
    t.rel_framed = _PARKED + k
    unpark(s, t.rel_head - k)


def unpark(s, start=None):
    """The registrations for the new session are queued in session `s` behind its kept records,
    parked(s) bytes from `start` (rel_head if None; nothing was framed: nothing reliable is
    while parked): they are moved to just before them, and go first."""
    t = s.reliable
    rel = t.rel
    cap = len(rel)
    if start is None:
        start = t.rel_head
    if start < 0:
        start += cap
    k = parked(s)
    h = start + k                 # where the registrations are (behind the kept records)
    if h >= cap:
        h -= cap
    q = t.rel_queued - k
    d = start - q                 # where they go
    if d < 0:
        d += cap
    i = q
    while i:  # from the end: the two may overlap, the target behind the source
        i -= 1
        a = h + i
        b = d + i
        rel[b - cap if b >= cap else b] = rel[a - cap if a >= cap else a]
    t.rel_head = d
    t.rel_framed = 0
