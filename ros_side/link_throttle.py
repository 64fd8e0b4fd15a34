# --throttle on the companion's side of the link (docs/LINK.md, SUB's "period_ms"): a throttled
# ROS topic is held to its rate *before* it crosses the link, so a 1 kHz IMU does not fill a
# 115200 serial line with messages the gateway would only supersede.
#
# The period arithmetic and the newest-wins holding are the core's Throttle (one implementation
# for both ends); this adapter maps the link's sparse subscription slots onto its dense indices
# and lets its holding buffers grow to the largest message seen (a PC, not a board).
#
# Written in the core's dialect (no annotations, %-formatting): link_end imports it, and the
# MicroPython tests run link_end.
import ubrb_policy

CAPACITY = 256  # throttled subscription slots at once; more go unthrottled here (the gateway's stays)


class LinkThrottle:
    def __init__(self, capacity=CAPACITY):
        self.t = ubrb_policy.Throttle(capacity, capacity, 0)  # empty buffers: grown on demand
        self.idx = {}                 # link slot -> dense index
        self.slot_of = [-1] * capacity  # dense index -> link slot
        self.refs = bytearray(capacity)  # Throttle.bind's "is this index live"
        self.unheld = 0               # slots left unthrottled: capacity full

    def bind(self, slot, period, now):
        """Hold `slot` to one message per `period` ms (0: no throttle). Replaces what it had."""
        self.release(slot, now)
        if period <= 0:
            return
        for i in range(len(self.slot_of)):
            if self.slot_of[i] < 0:
                self.refs[i] = 1
                if self.t.bind(i, period, now, self.refs):
                    self.slot_of[i] = slot
                    self.idx[slot] = i
                    return
                self.refs[i] = 0
                break
        self.unheld += 1

    def release(self, slot, now):
        """The slot's subscription ended: a message still held for it goes nowhere."""
        i = self.idx.pop(slot, -1)
        if i >= 0:
            self.t.bind(i, 0, now, self.refs)
            self.refs[i] = 0
            self.slot_of[i] = -1

    def clear(self, now):
        for slot in list(self.idx):
            self.release(slot, now)

    def admit(self, slot, buf, off, n, now, max_n):
        """True: send it now. False: held (newest wins) until tick() sends it."""
        i = self.idx.get(slot, -1)
        if i < 0:
            return True
        t = self.t
        k = t.pool_of[i]
        if n > len(t.buf[k]) and n <= max_n:  # larger than max_n is refused by the link anyway
            t.buf[k] = bytearray(max(n, min(2 * len(t.buf[k]), max_n)))
        return t.admit(i, buf, off, n, now)

    def due(self, now):
        """(slot, buf, n, k) of a held message whose period ended, or None. Send it now, or
        give it back with rehold(k, n) when the link has no room for it."""
        t = self.t
        k = t.due(now)
        if k < 0:
            return None
        t.passing = False  # we send it ourselves, not through admit()
        return self.slot_of[t.slot[k]], t.buf[k], t.out_n, k

    def rehold(self, k, n):
        # The link could not take it: it goes at the end of the next period unless a newer
        # message replaces it (newest wins, as for any held message).
        self.t.held[k] = n

    def deadline(self, now):
        return self.t.deadline(now) if self.idx else 1000

    def rebase(self, d):
        self.t.rebase(d)

    def counters(self):
        return {"throttle_superseded": self.t.superseded, "throttle_unheld": self.unheld}
