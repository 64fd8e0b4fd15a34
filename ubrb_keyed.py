# ubrb_keyed.py - the keyed link's authentication: HMAC-SHA256 over every link frame, an
# anti-replay window over the session's frame counter, and the session keys (docs/LINK.md,
# "Authentication"). Imported only by a LinkSession given a link key (--link-key): an unkeyed
# gateway never loads it.
#
# The trailer of a keyed frame: counter u32 LE + 8 bytes of HMAC-SHA256 over the frame from sync
# to counter; HELLOs under the link key (counter: my HELLO count), every other frame under the
# session key (counter: this session's frame count, never reused).
import struct

from ubrb_min import LK_HELLO, LK_OVH, LK_TAG, LKC_AUTH, LKC_REPLAY, LKC_STALE, const, lk_replayed

try:  # hashlib.sha256 exists on CPython and on the MicroPython ports we target
    from hashlib import sha256 as _sha256
except ImportError:  # pragma: no cover - a port without it can run unkeyed links only
    _sha256 = None  # type: ignore[assignment]

_MAC = const(8)  # bytes of HMAC-SHA256 kept (truncated)
_CTR_MAX = const(0x3FFFFF00)  # counters stay small ints on MicroPython; the session renews before


def lk_hmac_pads(key):
    """The two key blocks of HMAC-SHA256 (RFC 2104) for `key`, computed once per key: with them a
    MAC is two fresh hash objects (MicroPython's cannot be copied, so none can be kept primed)."""
    if len(key) > 64:
        key = _sha256(key).digest()
    i = bytearray(64)
    o = bytearray(64)
    for k in range(len(key)):
        i[k] = key[k]
        o[k] = key[k]
    for k in range(64):
        i[k] ^= 0x36
        o[k] ^= 0x5C
    return bytes(i), bytes(o)


def lk_hmac(k_in, k_out, data):
    """HMAC-SHA256 of `data` (any buffer) with the key blocks of lk_hmac_pads."""
    h = _sha256(k_in)
    h.update(data)
    o = _sha256(k_out)
    o.update(h.digest())
    return o.digest()


class LinkMac:
    """One LinkSession's keys and counters: seal() what it sends, check() what it receives."""

    def __init__(self, key):
        if _sha256 is None:
            raise ValueError("a keyed link needs hashlib.sha256")
        self.k_in, self.k_out = lk_hmac_pads(key)  # the link key's blocks: HELLOs, session keys
        self.s_in = self.s_out = None  # the session key's (every other frame)
        self.tx_ctr = 0  # frames sent in this session
        self.win = [0, 0]  # anti-replay window of the frames received: [highest counter, mask]
        self.hello_ctr = 0  # my HELLOs, counted so a replayed one is told apart
        self.peer_hello = 0  # the last HELLO counter accepted from the peer epoch
        self.rx_ctr = 0  # counter of the frame being handled

    def rekey(self, g, c):
        """The session of gateway epoch `g` and companion epoch `c`: its key is
        HMAC(link key, "UBRB-LINK" | epochs); the counters restart with it."""
        m = bytearray(b"UBRB-LINK\x00\x00\x00\x00\x00\x00\x00\x00")
        struct.pack_into("<II", m, 9, g, c)
        self.s_in, self.s_out = lk_hmac_pads(lk_hmac(self.k_in, self.k_out, m))
        self.tx_ctr = 0
        self.win[0] = self.win[1] = 0

    def exhausted(self):
        """The counters are about to leave the small ints: time for a new session."""
        return self.tx_ctr > _CTR_MAX or self.win[0] > _CTR_MAX

    def seal(self, b, mv, L):
        """Write the trailer of the frame of `L` bytes in `b` (`mv`: its memoryview)."""
        q = L - 4 - LK_TAG
        if b[4] & 15 == LK_HELLO:
            self.hello_ctr += 1
            c = self.hello_ctr
            ki = self.k_in
            ko = self.k_out
        else:
            self.tx_ctr += 1
            c = self.tx_ctr
            ki = self.s_in
            ko = self.s_out
        b[q] = c & 0xFF
        b[q + 1] = (c >> 8) & 0xFF
        b[q + 2] = (c >> 16) & 0xFF
        b[q + 3] = c >> 24
        d = lk_hmac(ki, ko, mv[0:q + 4])
        for i in range(_MAC):
            b[q + 4 + i] = d[i]

    def check(self, b, p, L, kind, counts):
        """Is the frame b[p:p + L] (its CRC checked) genuine and new? False drops it, counted
        in `counts` (the session's stat_counts)."""
        q = p + L - 4 - LK_TAG
        if L < LK_OVH + LK_TAG or b[q + 3] >= 0x40:
            counts[LKC_AUTH] += 1
            return False
        if kind == LK_HELLO:
            ki = self.k_in
            ko = self.k_out
        elif self.s_in is None:
            counts[LKC_STALE] += 1
            return False
        else:
            ki = self.s_in
            ko = self.s_out
        d = lk_hmac(ki, ko, memoryview(b)[p:q + 4])
        x = 0
        for i in range(_MAC):
            x |= d[i] ^ b[q + 4 + i]
        if x:
            counts[LKC_AUTH] += 1
            return False
        c = b[q] | (b[q + 1] << 8) | (b[q + 2] << 16) | (b[q + 3] << 24)
        self.rx_ctr = c
        if kind == LK_HELLO:
            return True  # its counter is judged by the session's HELLO handling
        if lk_replayed(self.win, c, c - self.win[0]):
            counts[LKC_REPLAY] += 1
            return False
        return True
