# The companion's end of the link (docs/LINK.md): link records from the gateway become RosPort
# calls on the companion, and the companion's GatewaySink calls become link records.
#
# Only the companion runs this, so it lives here and not in the core that is copied to every
# board. It keeps a few dicts (registrations answered from a cache after a resumed session) and
# parses JSON per registration - fine on a PC, not what an ESP32's heap is for.
#
# Written in the core's dialect (no annotations, %-formatting) because the MicroPython tests run
# it too: tests/core/mp_fakes.py puts a real companion end opposite the MicroPython port.
import struct

import ubrb_min as L
from ros_side.link_throttle import LinkThrottle

_T_PUB = L.LK_T_PUB  # read per record: a module global, not an attribute of the core module
PERIOD_MS_MAX = 1 << 30  # a SUB's "period_ms" (--throttle 0.001 Hz is 10^6 ms)


def _short(message):
    # A message quotes what it is about (a 60 KiB topic name, say): the gateway takes at most
    # LK_TEXT_MAX characters, so longer ones are cut here rather than refused there.
    if isinstance(message, str) and len(message) > L.LK_TEXT_MAX:
        return message[:L.LK_TEXT_MAX - 3] + "..."
    return message


class LinkCompanionEnd:
    """Companion end: link records become RosPort calls on `companion`; this
    object is the companion's GatewaySink (not thread-safe: call it from the
    loop that drives the session)."""

    def __init__(self, session, companion, log=None):
        self.s = session
        session.set_handler(self)
        self.companion = companion
        # key (slot*2 + is_sub) -> [topic, type, qos, gen, period_ms] of the live one
        self.regs = {}
        self.results = {}     # key -> (code, message) of the last ros_result
        self.sub_rel = {}     # sub slot -> reliable?
        self.had = False
        self._rep = {}
        self.c_congested = 0
        self.c_too_large = 0
        self.down_at = -1     # when the link went down (ms); -1 while up or already expired
        self._cnt = bytearray(8)
        self.c_bad = 0        # records from the gateway that could not be used
        self.c_bad_unsent = 0
        self.c_rejected = 0   # our records the gateway rejected
        self.ratelog = L.RateLog(log)
        # Answers (RESULT) the send ring had no room for: key -> the record, re-sent by
        # retry_answers(). Without its RESULT the gateway would wait for ever.
        self.owed = {}
        self.c_answer_retry = 0
        self.throttle = LinkThrottle()  # the gateway's --throttle, applied before the link
        # sub slot -> reliable ROS messages dropped when a session that did not come back in
        # time was released (expire): its clients get ERROR link_congested if it does come back
        self.drops = {}
        self.last_drops = 0   # how many the last release dropped (the companion logs it)

    def _ctl(self, t, slot, obj):
        b = L.link_record_body(obj) if obj is not None else b""
        return self.s.send(t, slot, b, 0, len(b), True, True)

    # link handler
    def link_up(self, fresh):
        self.down_at = -1
        if fresh:
            if self.had:
                self.companion.reset()     # a new gateway: release the old one's objects
            self.drops.clear()             # (and its clients, to be told of drops, are gone)
            self.regs.clear()
            self.results.clear()
            self.sub_rel.clear()
            self.owed.clear()
            self.throttle.clear(self.s.now)
        self.had = True
        f = getattr(self.companion, "gateway_up", None)
        if f is not None:
            f()                            # latched samples wait for their registrations
        f = getattr(self.companion, "set_max_message", None)
        if f is not None:
            f(self.s.max_send())           # the companion drops bigger ROS messages up front
        self._ctl(L.LK_T_CHELLO, 0, {"distro": getattr(self.companion, "distro", None)})

    def link_down(self):
        # Keep everything: it may be a glitch. expire() releases it if the gateway stays away.
        self.down_at = self.s.now

    def expire(self, now, after_ms):
        """Release everything the gateway registered once the link has been down `after_ms`:
        a session that ends without being resumed must not leave ROS entities behind. If the
        same session comes back later, the gateway hands its registrations over again (ros_up).
        True when it released."""
        if self.down_at < 0 or now - self.down_at < after_ms:
            return False
        self.down_at = -1
        # the reliable ROS messages waiting for the gateway go too: counted, and told to the
        # clients of each subscription when the gateway hands it over again (_control)
        self.last_drops = 0
        for slot, k in (self.companion.reset() or {}).items():
            self.drops[slot] = self.drops.get(slot, 0) + k
            self.last_drops += k
        self.regs.clear()
        self.results.clear()
        self.sub_rel.clear()
        self.throttle.clear(now)
        return True

    def link_message(self, t, slot, buf, off, n, reliable):
        if t == _T_PUB:                    # the data path: one compare, then the companion
            self.companion.publish(slot, buf, off, n, reliable)
            return
        if self.owed:
            self.retry_answers()
        try:
            why = self._control(t, slot, buf, off, n)
        except Exception as e:    # a bug must cost one record, never the companion
            why = "%s: %s" % (type(e).__name__, e)
        if why is not None:
            L.link_bad_record(self, t, slot, why)

    def _control(self, t, slot, buf, off, n):
        # One control record from the gateway: None when used, else why it was not.
        c = self.companion
        if t == L.LK_T_ADV or t == L.LK_T_SUB:
            d = L.link_record_json(buf, off, n)
            if d is None:
                return "not a JSON object of at most %d bytes and depth %d" % (
                    L.LK_JSON_MAX, L.LK_JSON_DEPTH)
            try:
                topic = L.link_text(d, "topic", L.LK_JSON_MAX)
                type_ = L.link_text(d, "type", L.LK_JSON_MAX)
                gen = L.link_gen(d)
            except ValueError as e:
                return str(e)
            qos = d.get("qos")
            if qos is not None and not isinstance(qos, dict):
                return "'qos' must be an object or null"
            period = d.get("period_ms", 0)  # absent (an older gateway, no --throttle): none
            if not isinstance(period, int) or isinstance(period, bool) or period < 0 \
                    or period > PERIOD_MS_MAX:
                return "'period_ms' must be an integer from 0 to %d" % PERIOD_MS_MAX
            sub = 1 if t == L.LK_T_SUB else 0
            key = slot * 2 + sub
            old = self.regs.get(key)
            if old is not None and old[0] == topic and old[1] == type_ and old[2] == qos \
                    and old[4] == period:
                # re-sent after a resumed session, or after a lost release: answer from the cache
                old[3] = gen
                r = self.results.get(key)
                if r is not None:
                    self._ctl(L.LK_T_RESULT, slot, {"kind": "sub" if sub else "pub",
                                                  "code": r[0], "message": r[1], "gen": gen})
                return None
            if old is not None:
                if sub:
                    c.unsubscribe(slot)
                else:
                    c.unadvertise(slot)
                self.results.pop(key, None)
            # Set before the call: the companion answers (ros_result) with this generation.
            self.regs[key] = [topic, type_, qos, gen, period]
            if sub:
                self.throttle.bind(slot, period, self.s.now)
                q = qos or {}
                self.sub_rel[slot] = q.get("reliability", "reliable") != "best_effort"
                self.s.set_depth(slot, q.get("depth", 1))
                c.subscribe(slot, topic, type_, qos)
                k = self.drops.pop(slot, 0)
                if k and key in self.regs:     # subscribed again: now its clients can be told
                    self.ros_error("sub", slot, "link_congested", _short(
                        "%d reliable message(s) from ROS on %s dropped: the link was down "
                        "longer than the companion holds them (--release-after)" % (k, topic)))
            else:
                c.advertise(slot, topic, type_, qos)
        elif t == L.LK_T_UNADV or t == L.LK_T_UNSUB:
            sub = 1 if t == L.LK_T_UNSUB else 0
            key = slot * 2 + sub
            if self.regs.pop(key, None) is not None:
                self.results.pop(key, None)
                if sub:
                    self.sub_rel.pop(slot, None)
                    self.throttle.release(slot, self.s.now)
                    c.unsubscribe(slot)
                else:
                    c.unadvertise(slot)
            elif not sub:
                # a release the gateway made while this (restarted) companion was away
                f = getattr(c, "forget_latched", None)
                if f is not None:
                    f(slot)
        elif t == L.LK_T_STATS:
            d = L.link_record_json(buf, off, n)
            if d is None:
                return "STATS must be a JSON object"
            f = getattr(c, "gateway_stats", None)
            if f is not None:
                f(d)
        elif t == L.LK_T_BAD:
            L.link_peer_rejected(self, slot, buf, off, n)
        else:
            return "unknown record type"
        return None

    def _gen(self, kind, slot):
        # The generation of the live registration an answer is about (0: none, the gateway
        # drops the answer as late).
        r = self.regs.get(slot * 2 + (1 if kind == "sub" else 0))
        return r[3] if r is not None else 0

    def registration_gen(self, kind, slot):
        """The gateway's generation of the registration on `slot` (0: none): with the slot, the
        identity under which the companion keeps a publisher's latched samples (latched.py)."""
        return self._gen(kind, slot)

    # GatewaySink
    def room(self, n):
        """Backpressure (Companion.poll): can a reliable message of n bytes go now?"""
        return self.s.rel_room(n)

    def ros_up(self, distro, max_message):
        pass

    def ros_down(self):
        pass

    def ros_result(self, kind, slot, code, message):
        key = slot * 2 + (1 if kind == "sub" else 0)
        if code is None:
            self.results[key] = (code, message)
        gen = self._gen(kind, slot)
        if code is not None:
            self.regs.pop(key, None)       # the gateway drops failed registrations
            self.results.pop(key, None)
        rec = {"kind": kind, "code": code, "message": _short(message), "gen": gen}
        self.owed.pop(key, None)           # a newer answer replaces one still owed
        if self._ctl(L.LK_T_RESULT, slot, rec) == L.LK_FULL:
            self.owed[key] = rec

    def retry_answers(self):
        """Send the answers the ring had no room for (call it from the loop, often)."""
        for key in list(self.owed):
            if self._ctl(L.LK_T_RESULT, key >> 1, self.owed[key]) != L.LK_OK:
                return
            del self.owed[key]
            self.c_answer_retry += 1

    def ros_error(self, kind, slot, code, message):
        self._ctl(L.LK_T_ERROR, slot, {"kind": kind, "code": code, "message": _short(message),
                                       "gen": self._gen(kind, slot)})

    def ros_message(self, slot, buf, off, n):
        if self.throttle.idx and not self.throttle.admit(slot, buf, off, n, self.s.now,
                                                         self.s.max_send()):
            return                         # held: tick() sends the newest at the period's end
        self._send_message(slot, buf, off, n)

    def tick(self, now):
        """Send the throttled messages whose period ended (call it from the loop, by deadline())."""
        while True:
            d = self.throttle.due(now)
            if d is None:
                return
            slot, buf, n, k = d
            if self.sub_rel.get(slot, True) and not self.s.rel_room(n):
                self.throttle.rehold(k, n)  # reliable: waits for link room, as in Companion.poll
                return
            self._send_message(slot, buf, 0, n)

    def deadline(self, now):
        """Milliseconds until tick() has work."""
        return self.throttle.deadline(now)

    def _send_message(self, slot, buf, off, n):
        rel = self.sub_rel.get(slot, True)
        r = self.s.send(L.LK_T_MSG, slot, buf, off, n, rel, False)
        if r == L.LK_OK:
            return
        if r == L.LK_TOO_LARGE:
            self.c_too_large += 1
            code = "message_too_large"
            msg = "ROS message of %d bytes exceeds the gateway's maximum of %d" % (n, self.s.max_send())
        elif rel:
            self.c_congested += 1
            code = "link_congested"
            msg = "link send buffer full; reliable message dropped"
        else:
            return
        t = self._rep.get(slot)
        now = self.s.now
        if t is None or now - t >= 1000:
            self._rep[slot] = now
            self.ros_error("sub", slot, code, msg)

    def ros_sub_count(self, slot, count):
        b = self._cnt
        struct.pack_into("<II", b, 0, count, self._gen("pub", slot))
        self.s.send(L.LK_T_SUBCOUNT, slot, b, 0, 8, True, True)

    def rebase(self, d):
        """Move every stored time `d` ms back (see Gateway.rebase); the session's too."""
        self.s.rebase(d)
        for k in self._rep:
            self._rep[k] -= d
        if self.down_at >= 0:
            self.down_at -= d
        self.ratelog.rebase(d)
        self.throttle.rebase(d)

    def counters(self):
        d = self.s.counters()
        d["msg_congested"] = self.c_congested
        d["msg_too_large"] = self.c_too_large
        d["bad_records"] = self.c_bad
        d["rejected_records"] = self.c_rejected
        d.update(self.throttle.counters())
        return d
