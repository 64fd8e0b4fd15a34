"""A stream link's own parts (serial: a byte stream, not datagrams): the bytes cut into frames
again whatever their chunking, and frames that fit a noisy line - smaller frames when bit errors
lose them, so that one error costs a small frame, not a 1 KiB one (docs/LINK.md, section 5).

Imported only by a LinkSession on a stream link; kept out of the core so that a board on UDP
never loads them. MicroPython-portable: floats and `math` run once per 64 frames, never per
frame."""

import math

from ubrb_min import copy_into


class Stream:
    """A stream session's parts. Frame fitting: how many REL frames went since the last fit,
    and the per-byte loss the fits measured (smoothed); the session counts the frames it deems
    lost (fit_lost). The probe that must come before frames in flight are cut again (recut)."""

    def __init__(self):
        self.sent = 0
        self.b = 0.0
        # 0: no probe; 1: a probe HELLO is to go (the session's next HELLO asks for a reply);
        # 2: it went, at probe_at; 3: the peer's answer came, the next frame of the peer decides
        self.probe = 0
        self.probe_at = 0
        self.round = 0   # our probes' round (1 .. 255), which the peer's answer names
        self.answer = 0  # the round of the peer's probe our next HELLO answers (0: none)

    def feed(self, s, buf, off, end):
        """Bytes of the stream arrived at session `s`, in any chunking: frames are parsed
        straight from `buf` while none is partial, else reassembled in s.rx (< 2 max_frame)."""
        rx = s.rx
        while off < end:
            if s.rx_n == 0:                  # fast path: frames straight from buf
                p = s._parse(buf, off, end)
                k = end - p
                copy_into(rx, 0, buf, p, k)  # k < max_frame by construction
                s.rx_n = k
                return
            k = len(rx) - s.rx_n
            if k > end - off:
                k = end - off
            copy_into(rx, s.rx_n, buf, off, k)
            off += k
            s.rx_n += k
            p = s._parse(rx, 0, s.rx_n)
            k = s.rx_n - p
            if p > 0 and k > 0:
                copy_into(rx, 0, rx, p, k)
            s.rx_n = k

    def frames(self, s):
        """Every 64 REL frames (or 8 lost): the frame size that carries most payload at the bit
        error rate those frames met. A frame of n bytes is lost with p = 1 - e^(-b n) (b: errors
        per byte), so b = -ln(1 - p) / n; payload per byte sent, (1 - h/n) e^(-b n) with h the
        frame overhead, is highest at n = (h + sqrt(h^2 + 4h/b)) / 2: 45 bytes at a bit error
        rate of 1e-3, 129 at 1e-4, 1,230 at 1e-6. A clean line doubles the size back, up to the
        peer's max_frame."""
        t = s.reliable
        n = t.frame_cap or s.peer_max_frame
        p = t.fit_lost / self.sent
        self.sent = t.fit_lost = 0
        b = -math.log(1.0 - (p if p < 0.95 else 0.95)) / n
        b = self.b = (self.b * 3 + b) / 4 if self.b else b
        h = s.ovh
        best = 2 * n if b < 1e-9 else int((h + math.sqrt(h * h + 4 * h / b)) / 2)
        if best > 2 * n:
            best = 2 * n
        if best < h + 24:
            best = h + 24
        t.frame_cap = 0 if best >= s.peer_max_frame else best
        if not t.frame_cap:
            self.b = 0.0

    def timeout(self, s, now):
        """An RTO of session `s` deemed its frames in flight lost. If the peer is still heard
        (a noisy line, not a silent one), fit the frame size to those losses now rather than
        at the next frame: that frame is then already cut to the line, and frames in flight too
        big for it are probed for and cut again (a noisy line's first RTO, not its second)."""
        t = s.reliable
        if self.sent and t.fit_lost >= 4 and now - s.last_rx < s.rtt.rto:
            self.frames(s)
        if t.frame_cap and t.frame_len[t.una & t.ft_mask] > t.frame_cap - s.ovh:
            self.start_probe(s, now)  # then recut, when it is safe

    def start_probe(self, s, now):
        """An RTO found frames in flight cut before the line got noisy, too big to get through.
        Cutting them again (new bytes under the same seqs) is safe only once no old copy can
        still reach the peer, and a line that stalls (a USB adapter, a busy host) may hold
        copies for longer than any RTO. So nothing more is sent and a HELLO asking for a reply
        goes: the line is a FIFO both ways, so the peer's reply comes after every ack it sent
        for our older frames, and the frame it sends after the reply tells what it holds once
        all of them were in (recut). A probe already out keeps its time: an answer to any of
        them tells of every frame sent before the first. Only the peer's answer to this round
        counts: its reply to one of our handshake HELLOs, its own probe or an answer to an
        earlier round may come late through a stalled line, sent before our frames were in."""
        if self.probe == 0:
            self.probe_at = now
            self.round = self.round % 255 + 1
        self.probe = 1
        s.hello_reply = True
        s.reliable.cwnd = 0

    def recut(self, s):
        """The peer's first frame after its reply to our probe (its acks applied): cut the
        frames in flight again at frame_cap if the peer holds none of them (no SACK), still
        needs the first, and every one of them was last sent before the probe. Else nothing:
        the next RTO probes again."""
        self.probe = 0
        t = s.reliable
        t.cwnd = 1
        if t.sack_n or t.una == t.nxt or not t.frame_cap or \
                t.frame_len[t.una & t.ft_mask] <= t.frame_cap - s.ovh:
            return
        sent_at = t.frame_sent_at
        q = t.una
        while q != t.nxt:
            if sent_at[q & t.ft_mask] - self.probe_at >= 0:
                return
            q = (q + 1) & 255
        t.nxt = t.una
        # from the oldest frame in flight, not from rel_head: the acknowledged head of a record
        # a frame ended inside is behind it (and must not go again)
        t.rel_framed = t.frame_off[t.una & t.ft_mask] - t.rel_head
        if t.rel_framed < 0:
            t.rel_framed += len(t.rel)
        t.lost_n = 0
