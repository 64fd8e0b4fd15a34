"""Frames kept past a gap: the receiving side of the link's selective repeat (docs/LINK.md,
section 5). A frame that arrives ahead of the one expected is copied here and delivered, in
order, once the gap before it is filled; the ACKs meanwhile carry the SACK bitmap made here.

Imported only by a LinkSession that keeps frames (hold > 0): a CPython end, and a board whose
heap has room for a window of frames beside its budget (ports/micropython/build.build). A
board without that room keeps none and never loads this module; its peer goes back over what it
did not keep, on its NAK. MicroPython-portable."""

from array import array


class Hold:
    """`n` slots of `stride` bytes (n a power of two, 8 ... 64): the slot of seq s is s & (n - 1),
    unique among the n seqs after the one expected."""

    def __init__(self, n, stride):
        k = 8
        while k < n and k < 64:
            k *= 2
        self.n = k
        self.stride = stride
        self.buf = bytearray(k * stride)
        self.mv = memoryview(self.buf)  # a frame kept is copied through it: no copy of its bytes
        self.len = array("H", bytes(2 * k))  # 0: the slot is empty
        self.seq = bytearray(k)
        self.held = 0

    def clear(self):
        for i in range(self.n):
            self.len[i] = 0
        self.held = 0

    def keep(self, seq, b, p, n):
        """Frame `seq`'s body b[p:p + n], ahead of the one expected by at most self.n."""
        j = seq & (self.n - 1)
        if self.len[j] and self.seq[j] == seq:
            return  # a copy we have
        if not self.len[j]:
            self.held += 1
        q = j * self.stride
        self.mv[q:q + n] = memoryview(b)[p:p + n]
        self.len[j] = n
        self.seq[j] = seq

    def release(self, s, seq):
        """Frame `seq` was delivered by session `s`: forget a copy of it, then deliver the
        frames kept behind it that are next in order."""
        m = self.n - 1
        j = seq & m
        if self.len[j] and self.seq[j] == seq:
            self.len[j] = 0
            self.held -= 1
        while self.held:
            e = s.rel_rx_expected
            j = e & m
            n = self.len[j]
            if not n or self.seq[j] != e:
                return
            self.len[j] = 0
            self.held -= 1
            s.rel_rx_expected = (e + 1) & 255
            p = j * self.stride
            s.reader.rel(self.buf, p, p + n)  # (the session's own delivery)

    def sack(self, tx, q, e):
        """The SACK bitmap at tx[q:q + n/8]: bit i & 7 of byte i >> 3 is "I hold seq e + 1 + i"
        (e: the next expected seq)."""
        m = self.n - 1
        for i in range(self.n >> 3):
            tx[q + i] = 0
        for i in range(self.n):
            s = (e + 1 + i) & 255
            j = s & m
            if self.len[j] and self.seq[j] == s:
                tx[q + (i >> 3)] |= 1 << (i & 7)
