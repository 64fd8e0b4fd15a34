# Pairing converges (issue 20 item 4, docs/LINK.md section 3): ends that were both UP with
# someone else find each other again; HELLOs are paced, so no two ends can storm each other
# whatever they send; a challenge HELLO accepts nothing; why a HELLO was refused (hello_why).
# Sans-IO sessions on an injected clock; runs under CPython and MicroPython (tests/mp/run.mjs).
import ubrb_min as L
from tests.support.clock import VirtualClock


class Rec:
    def __init__(self):
        self.ups = []
        self.downs = 0

    def link_up(self, fresh):
        self.ups.append(fresh)

    def link_down(self):
        self.downs += 1

    def link_message(self, t, slot, buf, off, n, reliable):
        pass


def sess(gateway, epoch, **kw):
    return L.LinkSession(Rec(), epoch, gateway, datagram=True, **kw)


GAP = 50  # ubrb_min._LK_HELLO_GAP, HELLO pacing (a const MicroPython inlines: no module name)
CHAL = 4  # ubrb_min._LK_HF_CHAL, the challenge flag of a HELLO


def hellos(s):
    return s.counters()["hello_tx"]


class Hub(VirtualClock):
    """Sessions joined by an in-memory network: a frame from x reaches every y with (x, y) in
    `links` (a UDP companion answering whoever writes, a gateway gone silent...)."""

    def __init__(self, ends, now=1000):
        VirtualClock.__init__(self, now)
        self.ends = ends
        self.links = []

    def join(self, a, b):
        self.links = [(a, b), (b, a)]

    def step(self, dt=1):
        now = self.now
        for x in self.ends:
            x.tick(now)
            for _ in range(64):
                n = x.poll_tx(now)
                if n == 0:
                    break
                data = bytes(x.tx_buf[:n])
                for src, dst in self.links:
                    if src is x:
                        dst.feed(data, 0, n, now)
        self.now = now + dt


def both_up(a, b):
    return a.is_up() and b.is_up() and a.peer_epoch == b.epoch and b.peer_epoch == a.epoch


def test_two_used_ends_that_moved_on_pair_again_without_a_storm():
    # The case: a second gateway takes the companion over, then stops; the first one and
    # the companion were both UP before (used) and each knows an epoch the other has left, so
    # neither HELLO was verified at the other: before, each one answered the other's at once,
    # forever (553k HELLOs in 90 s), and they never paired again.
    g1, c, g2 = sess(True, 11), sess(False, 22), sess(True, 33)
    h = Hub([g1, c, g2])
    h.join(g1, c)
    assert h.run(2000, until=lambda: both_up(g1, c))
    h.join(g2, c)                       # the newcomer has the companion, g1 hears nothing
    assert h.run(4000, until=lambda: both_up(g2, c) and not g1.is_up())
    assert g1.used and c.used
    h.join(g1, c)                       # g2 stops
    h.ends.remove(g2)
    t0, n0 = h.now, hellos(g1) + hellos(c)
    assert h.run(3000, until=lambda: both_up(g1, c)), "g1 and the companion never paired again"
    # the core takes g1's answer to its challenge at once (keeping a second gateway out while
    # the first is alive is the UDP driver's part, which knows addresses)
    assert h.now - t0 <= 4 * L.LK_HELLO_MS, h.now - t0
    assert g1.handler.ups[-1] is True and c.handler.ups[-1] is True   # fresh on both
    h.run(1000)
    assert both_up(g1, c)
    # paced: at most one HELLO per _LK_HELLO_GAP from each end, whatever the other sends
    sent = hellos(g1) + hellos(c) - n0
    assert sent <= 2 * (h.now - t0) // GAP + 4, sent


def test_a_flood_of_hellos_gets_paced_answers():
    g, c = sess(True, 11), sess(False, 22)
    h = Hub([g, c])
    h.join(g, c)
    assert h.run(2000, until=lambda: both_up(g, c))
    # 1000 HELLOs of strangers in 1 s, each with an epoch of its own: the companion's session
    # stays up, and it sends at most one HELLO per gap (challenges) instead of one per HELLO
    n0 = hellos(c)
    stranger = sess(True, 1000)
    for i in range(1000):
        stranger.epoch = 1000 + i
        n = stranger._hello(h.now)
        c.feed(bytes(stranger.tx_buf[:n]), 0, n, h.now)
        h.step()
    assert both_up(g, c) and c.handler.downs == 0
    sent = hellos(c) - n0
    assert 0 < sent <= 1000 // GAP + 1, sent


def test_a_challenge_accepts_nothing():
    # A used end challenges a HELLO that does not know it: its answer names the newcomer's epoch
    # with the challenge flag. A fresh newcomer adopts the epoch but does not go UP on it (it
    # would be up alone: the challenger has not taken it yet); its answer is verified at the
    # challenger, which then starts the new session.
    g, c = sess(True, 11), sess(False, 22)
    h = Hub([g, c])
    h.join(g, c)
    assert h.run(2000, until=lambda: both_up(g, c))
    g2 = sess(True, 33)
    n = g2.poll_tx(h.now)                        # HELLO(33, 0)
    c.feed(bytes(g2.tx_buf[:n]), 0, n, h.now)
    assert c.chal == 33 and c.is_up()
    n = c.poll_tx(h.now + GAP)       # (paced: the answer leaves after the gap)
    assert c.tx_buf[4] & 15 == L.LK_HELLO and c.tx_buf[25] & CHAL
    assert int.from_bytes(bytes(c.tx_buf[14:18]), "little") == 33   # the epoch it knows: g2's
    g2.feed(bytes(c.tx_buf[:n]), 0, n, h.now)
    assert not g2.is_up() and g2.peer_epoch == 22 and g2.handler.ups == []
    h.ends = [g2, c]
    h.join(g2, c)
    assert h.run(1000, until=lambda: both_up(g2, c))
    # a challenge naming another epoch than ours is not answered
    g3 = sess(True, 44)
    c.chal = 55
    n = c._hello(h.now)
    g3.feed(bytes(c.tx_buf[:n]), 0, n, h.now)
    assert not g3.hello_reply and g3.peer_epoch == 0


def test_why_a_hello_was_refused():
    def refused(x, y):
        n = y._hello(0)
        x.feed(bytes(y.tx_buf[:n]), 0, n, 0)
        return x.hello_why

    key, other = bytes(range(32)), bytes(range(1, 33))
    assert refused(sess(True, 1), sess(True, 2)) == L.LKW_ROLE
    assert refused(sess(False, 1, key=key), sess(False, 2, key=key)) == L.LKW_ROLE
    assert refused(sess(True, 1), sess(False, 2, key=key)) == L.LKW_KEYED
    assert refused(sess(True, 1, key=key), sess(False, 2)) == L.LKW_UNKEYED
    assert refused(sess(True, 1), sess(False, 2)) == 0
    assert refused(sess(True, 1, key=key), sess(False, 2, key=other)) == 0  # (counted auth)
    v = sess(False, 2)
    n = v._hello(0)
    v.tx_buf[8] = 2                          # version 2: a new header check and CRC
    v.tx_buf[5] = L.lk_hck(v.tx_buf[2], v.tx_buf[3], v.tx_buf[4])
    v._seal(n, 0, 0)
    g = sess(True, 1)
    g.feed(bytes(v.tx_buf[:n]), 0, n, 0)
    assert g.hello_why == L.LKW_VERSION and g.counters()["proto"] == 1
