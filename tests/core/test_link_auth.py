# Link liveness against forged and stale HELLOs, desync detection, and the keyed link (docs/LINK.md
# section 3 and "Authentication"). Time is injected; runs under CPython (pytest) and MicroPython
# (tests/mp/run.mjs) alike.
import struct

import ubrb_keep
import ubrb_keyed
import ubrb_min as L
import ubrb_setup
from link_rig import Pair, Rec, rel_payload

MICROPYTHON_ONLY = {"test_mp_keyed_allocation_per_frame"}

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def sess(gateway, epoch, **kw):
    return L.LinkSession(Rec(), epoch, gateway, datagram=True, **kw)


def forged_hello(role_gateway, epoch, known, key=None):
    """A HELLO built by a third party: its own LinkSession, whatever it claims to know."""
    f = L.LinkSession(Rec(), epoch, role_gateway, datagram=True, key=key)
    f.peer_epoch = known
    n = f.poll_tx(0)
    return bytes(f.tx_buf[:n])


def stream(p, a, b, first, count, dt=5):
    """Send `count` reliable messages a -> b, one per `dt` ms; return b's payloads since `first`."""
    for i in range(first, first + count):
        a.send(L.LK_T_PUB, 1, rel_payload(i, 30), 0, 30, True)
        p.run(dt)


def got(s):
    return [m[2] for m in s.handler.msgs]


def test_unverified_hello_leaves_an_up_session_alone():
    # the issue: one datagram with an unknown epoch used to reset the companion's stream; the
    # same HELLO in a serial byte stream, and one of each role
    for datagram in (True, False):
        for role in (True, False):
            g = L.LinkSession(Rec(), 11, True, datagram=datagram)
            c = L.LinkSession(Rec(), 22, False, datagram=datagram)
            p = Pair(g, c)
            p.up()
            stream(p, g, c, 0, 10)
            h = forged_hello(True, 999, 0)
            victim = c if role else g
            if not role:
                h = forged_hello(False, 999, 0)
            victim.feed(h, 0, len(h), p.now)
            assert victim.is_up() and victim.counters()["hello_ignored"] == 1 and victim.counters()["down"] == 0
            stream(p, g, c, 10, 10)
            p.run(200)
            assert got(c) == [rel_payload(i, 30) for i in range(20)]
            assert g.handler.ups == [True] and c.handler.ups == [True]


def test_forged_hello_then_real_peer_cannot_desync():
    # the sequence: the companion loses its gateway for a while (its driver followed
    # the forger), then the gateway's HELLO wins it back; both must agree: fresh on both ends
    # (the companion discarded its stream) or resumed on both, never one of each
    g = sess(True, 11)
    c = sess(False, 22)
    cut = {"on": False}

    def mangle(data, d):
        return [] if cut["on"] else [data]

    p = Pair(g, c, mangle)
    p.up()
    stream(p, g, c, 0, 10)
    cut["on"] = True
    p.run(2100)                         # both notice the loss; their streams are resumable
    assert not g.is_up() and not c.is_up()
    h = forged_hello(True, 999, 0)      # a stranger, while the companion is down
    c.feed(h, 0, len(h), p.now)
    h = forged_hello(True, 999, c.epoch)  # ...that even learned the companion's epoch
    c.feed(h, 0, len(h), p.now)
    assert c.peer_epoch == 999 and c.counters()["renew"] == 1   # it took the session: the stream is gone
    stream(p, g, c, 10, 5)              # queued at the gateway meanwhile
    cut["on"] = False
    t0 = p.now
    p.run(2000, until=lambda: g.is_up() and c.is_up())
    assert p.now - t0 < 2000
    assert g.handler.ups[-1] == c.handler.ups[-1] == True  # noqa: E712  both fresh
    ubrb_keep.unpark(g)  # the 5 queued meanwhile go (LinkRosPort does it on the CHELLO)
    stream(p, g, c, 100, 10)
    p.run(300)
    assert got(c)[-10:] == [rel_payload(i, 30) for i in range(100, 110)]


def test_one_sided_reset_detected_within_2_s():
    # should the ends ever disagree about the stream (here: one end drops it without a new
    # epoch), the acks tell: re-handshake within 2 s, both fresh, data flows again
    g = sess(True, 11)
    c = sess(False, 22)
    p = Pair(g, c)
    p.up()
    stream(p, g, c, 0, 10)
    c._reset_stream()                   # companion: expects seq 0, gateway: una = 10
    t0 = p.now
    k = len(g.handler.ups)
    p.run(3000, until=lambda: len(g.handler.ups) > k and g.is_up() and c.is_up())
    assert p.now - t0 <= 2000
    assert g.counters()["desync"] == 1 and g.handler.ups[-1] and c.handler.ups[-1]
    n = len(got(c))
    stream(p, g, c, 50, 10)
    p.run(300)
    assert got(c)[n:] == [rel_payload(i, 30) for i in range(50, 60)]


def test_delayed_old_ack_is_not_a_desync():
    g = sess(True, 11)
    c = sess(False, 22)
    p = Pair(g, c)
    p.up()
    stream(p, g, c, 0, 3)
    stream(p, g, c, 3, 3)
    # a heartbeat of the companion acknowledging an older seq, arriving late, once
    b = bytearray(12)
    b[0], b[1], b[2], b[3], b[4] = 0xA5, 0x4E, 12, 0, L.LK_ACK
    b[5] = L.lk_hck(12, 0, L.LK_ACK)
    b[7] = (g.reliable.una - 2) & 255
    struct.pack_into("<I", b, 8, L._lk_crc32(memoryview(b)[0:8], g.seed))
    g.feed(b, 0, 12, p.now)
    assert g.reliable.bad_ack_at >= 0
    stream(p, g, c, 6, 300)            # a good ack clears it
    assert g.counters()["desync"] == 0 and g.is_up() and g.reliable.bad_ack_at < 0


def test_keyed_handshake_and_trailer():
    g = sess(True, 11, key=KEY)
    c = sess(False, 22, key=KEY)
    p = Pair(g, c)
    p.up()
    assert g.mac.s_in == c.mac.s_in and g.mac.s_in is not None
    g.send(L.LK_T_PUB, 5, b"hello", 0, 5, True)
    n = g.poll_tx(p.now)
    assert n == 12 + 3 + 5 + L.LK_TAG
    stream(p, g, c, 0, 20)
    p.run(200)
    assert got(c)[-20:] == [rel_payload(i, 30) for i in range(20)]
    assert g.counters()["auth"] == c.counters()["auth"] == 0


def test_wrong_key_or_no_key_never_pairs():
    for kw in ({"key": OTHER_KEY}, {}):
        g = sess(True, 11, key=KEY)
        c = sess(False, 22, **kw)
        p = Pair(g, c)
        p.run(2000)
        assert not g.is_up() and not c.is_up()
        assert g.counters()["auth"] > 0
        assert c.counters()["proto"] > 0 if not kw else c.counters()["auth"] > 0


def test_forged_replayed_and_cross_session_frames_dropped():
    g = sess(True, 11, key=KEY)
    c = sess(False, 22, key=KEY)
    p = Pair(g, c)
    p.up()
    g.send(L.LK_T_PUB, 1, b"one", 0, 3, True)
    n = g.poll_tx(p.now)
    frame = bytes(g.tx_buf[:n])
    c.feed(frame, 0, n, p.now)
    assert got(c) == [b"one"]
    # replayed (same counter): dropped, counted
    c.feed(frame, 0, n, p.now)
    assert c.counters()["replay"] == 1 and got(c) == [b"one"]
    # forged: valid CRC under the (guessable) seed, MAC of another key
    x = sess(True, 11, key=OTHER_KEY)
    x.peer_epoch = 22
    x.epoch = 11
    x._rekey()
    x.state = L.LINK_UP
    x.peer_max_frame = 1000
    x.peer_max_message = 1000
    x.send(L.LK_T_PUB, 1, b"evil", 0, 4, True)
    x.rel_rx_expected = c.rel_rx_expected
    x.reliable.una = x.reliable.nxt = g.reliable.nxt
    k = x.poll_tx(p.now)
    assert L._lk_crc32(memoryview(x.tx_buf)[0:k], c.seed) == L.LK_RESIDUE
    c.feed(x.tx_buf, 0, k, p.now)
    assert c.counters()["auth"] == 1 and got(c) == [b"one"]
    # a frame of this session after the companion restarted: a new session key
    c2 = sess(False, 33, key=KEY)
    p.b = c2
    p.up()
    c2.feed(frame, 0, n, p.now)
    assert got(c2) == []


def test_keyed_hello_replay_is_dropped():
    g = sess(True, 11, key=KEY)
    c = sess(False, 22, key=KEY)
    p = Pair(g, c)
    p.up()
    n = g._hello(p.now)
    h = bytes(g.tx_buf[:n])
    c.feed(h, 0, n, p.now)
    r = c.counters()["replay"]
    c.feed(h, 0, n, p.now)               # the same HELLO again
    assert c.counters()["replay"] == r + 1 and c.is_up()


def test_hmac_matches_rfc4231():
    # RFC 4231 test case 2: key "Jefe"
    ki, ko = ubrb_keyed.lk_hmac_pads(b"Jefe")
    d = ubrb_keyed.lk_hmac(ki, ko, b"what do ya want for nothing?")
    assert d == bytes([0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26,
                       0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83,
                       0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43])


def test_parse_link_key():
    assert ubrb_setup.parse_link_key(" 00112233445566778899aabbccddeeff\n") == bytes.fromhex(
        "00112233445566778899aabbccddeeff")
    assert len(ubrb_setup.parse_link_key("ab" * 32)) == 32
    assert ubrb_setup.parse_link_key(b"00112233 44556677\r\n8899AABB ccddeeff") == bytes.fromhex(
        "00112233445566778899aabbccddeeff")
    # what the file holds instead of a key, in words (never "found 51 digits")
    raw = bytes([(7 * i + 200) % 256 for i in range(32)])  # 32 raw key bytes
    for bad, says in (("", "empty"), (" \n\t", "empty"),
                      (raw, "binary data"), (b"\x00" * 32, "binary data"),
                      ("caf\u00e9" * 16, "binary data"),
                      ("correct horse battery staple, my secret link pass\n", "not hex"),
                      ("zz" * 16, "not hex"), ("0x" + "ab" * 16, "not hex"),
                      ("abcd", "too short: 4 hex digits"), ("a" * 33, "odd number of hex digits")):
        try:
            ubrb_setup.parse_link_key(bad)
        except ValueError as e:
            assert says in str(e) and "make link-key" in str(e), (bad, str(e))
            assert "digits (found" not in str(e)
        else:
            raise AssertionError(bad)


class Count:
    def __init__(self):
        self.n = 0

    def link_up(self, fresh):
        pass

    def link_down(self):
        pass

    def link_message(self, t, slot, buf, off, n, reliable):
        self.n += 1


def test_mp_keyed_allocation_per_frame():
    # what a keyed frame allocates beyond an unkeyed one: on each side, two hash objects, their
    # two digests and the memoryview slice hashed (docs/LINK.md, bench/link_auth.py)
    import gc

    def per_frame(key):
        g = sess(True, 11, key=key)
        c = sess(False, 22, key=key)
        p = Pair(g, c)
        p.up()
        c.set_handler(Count())                  # records nothing: only the link's own allocations
        msg = bytearray(64)
        now = p.now
        f0 = g.counters()["tx_frames"] + c.counters()["tx_frames"]
        gc.collect()
        gc.disable()
        m0 = gc.mem_alloc()
        for _ in range(100):
            g.send(L.LK_T_PUB, 1, msg, 0, 64, True)
            n = g.poll_tx(now)
            c.feed(g.tx_buf, 0, n, now)
            n = c.poll_tx(now)               # its ACK
            g.feed(c.tx_buf, 0, n, now)
        used = gc.mem_alloc() - m0
        gc.enable()
        frames = g.counters()["tx_frames"] + c.counters()["tx_frames"] - f0
        assert c.handler.n == 100 and frames == 200
        return used / frames

    plain = per_frame(None)
    keyed = per_frame(KEY)
    print("bytes allocated per frame (sent and checked): unkeyed %.1f, keyed %.1f (+%.1f)"
          % (plain, keyed, keyed - plain))
    assert plain < 80 and keyed - plain < 1024


def test_gateway_tells_every_client_when_the_ros_session_was_lost():
    from scripted import Client, gateway
    from tests.support.ubrb_frames import hello

    gw, ros = gateway()
    a = Client(gw)
    b = Client(gw)
    a.send(hello("a"))
    b.send(hello("b"))
    idle = Client(gw)                    # no HELLO yet: nothing to tell
    a.frames()
    b.frames()
    gw.ros_session_lost("the link to the ROS side restarted as a new session")
    assert a.errors() == [("link_reset", None)] and b.errors() == [("link_reset", None)]
    assert idle.frames() == [] and not a.closing()
