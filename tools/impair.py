"""A link in the field, made on this machine: a UDP impairment proxy and a serial line with bit
errors, both in real time, for the benches (bench/link_field.py) and the end-to-end tests
(tests/support/impair.py re-exports them).

    gateway --udp--> UdpImpairProxy.port | proxy | --udp--> companion (127.0.0.1:PORT)
    gateway <-slave A-> BerLine (paced at baud/10 bytes/s, bits flipped at BER) <-slave B-> companion

``Impairment`` is the decision, one per direction, sans-IO: given a datagram and the time, is it
lost, duplicated, held back behind up to ``depth`` later ones (reordering), and when does it leave
(a random delay that keeps the order: jitter, not reordering; reordering is its own knob)? Both
directions draw from one seeded ``random.Random``, so a run is repeatable up to the arrival
order the processes produce. ``UdpImpairProxy`` runs it in a thread on real sockets and
adds blackouts (``blackout(seconds)``, or ``dark(True/False)``): while dark, nothing crosses either
way, held datagrams included. Counts of what it did: ``counts()``.

Only 127.0.0.1: the proxy binds there and refuses another target.
"""

from __future__ import annotations

import collections
import math
import os
import random
import select
import socket
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from tools.ptyline import PtyLine

COUNTS = ("in", "out", "lost", "dup", "reordered", "blackout")


class Impairment:
    """One direction of an impaired network. ``offer(data, now)`` takes a datagram that arrived
    at ``now`` (seconds); ``due(now)`` gives those to send by ``now``, in order;
    ``next_at()`` when the next one is due (None: nothing waits).

    - ``loss``: probability a datagram is dropped;
    - ``dup``: probability it is sent twice (each copy goes through what follows on its own);
    - ``reorder``: probability a copy is held back until 1..``depth`` later copies have passed
      (uniform), or ``hold_max`` seconds at most when nothing follows;
    - ``delay``: (lo, hi) seconds added to each copy, uniform, without overtaking the previous
      one (a queue that varies, as Wi-Fi's does)."""

    def __init__(self, rng: random.Random, loss: float = 0.0, dup: float = 0.0,
                 reorder: float = 0.0, depth: int = 8, delay: Tuple[float, float] = (0.0, 0.0),
                 hold_max: float = 0.05) -> None:
        if not (0 <= loss <= 1 and 0 <= dup <= 1 and 0 <= reorder <= 1 and depth >= 1):
            raise ValueError("probabilities in [0, 1], depth >= 1")
        self.rng = rng
        self.loss, self.dup, self.reorder, self.depth = loss, dup, reorder, depth
        self.delay = delay
        self.hold_max = hold_max
        self.q: Deque[Tuple[float, bytes]] = collections.deque()   # release times never fall
        self.held: List[List[Any]] = []                            # [later ones to wait, deadline, data]
        self.last = 0.0
        self.c: Dict[str, int] = dict.fromkeys(COUNTS, 0)

    def offer(self, data: bytes, now: float) -> None:
        r = self.rng
        self.c["in"] += 1
        if self.loss and r.random() < self.loss:
            self.c["lost"] += 1
            return
        copies = 1
        if self.dup and r.random() < self.dup:
            copies = 2
            self.c["dup"] += 1
        for _ in range(copies):
            if self.reorder and r.random() < self.reorder:
                self.c["reordered"] += 1
                self.held.append([r.randint(1, self.depth), now + self.hold_max, data])
            else:
                self._queue(data, now)

    def _queue(self, data: bytes, now: float) -> None:
        lo, hi = self.delay
        t = now + (self.rng.uniform(lo, hi) if hi > 0 else 0.0)
        self.last = max(t, self.last)
        self.q.append((self.last, data))
        if self.held:                      # one more has passed each held datagram
            keep = []
            for h in self.held:
                h[0] -= 1
                if h[0] <= 0:
                    self.q.append((self.last, h[2]))   # right behind the one that freed it
                else:
                    keep.append(h)
            self.held = keep

    def due(self, now: float) -> List[bytes]:
        if self.held and min(h[1] for h in self.held) <= now:
            late = [h for h in self.held if h[1] <= now]
            self.held = [h for h in self.held if h[1] > now]
            for h in late:
                self.last = max(self.last, now)
                self.q.append((self.last, h[2]))
        out = []
        q = self.q
        while q and q[0][0] <= now:
            out.append(q.popleft()[1])
        return out

    def next_at(self) -> Optional[float]:
        ts = [self.q[0][0]] if self.q else []
        ts += [h[1] for h in self.held]
        return min(ts) if ts else None

    def clear(self) -> int:
        """Forget every datagram waiting (a blackout): how many."""
        n = len(self.q) + len(self.held)
        self.q.clear()
        self.held = []
        return n


class UdpImpairProxy:
    """Gateway -> ``port`` -> proxy -> ``target`` (the companion's UDP port) and back, each
    direction through its own ``Impairment`` (keyword arguments as Impairment's), in a thread.
    The gateway's address is the last one a datagram came from on ``port``; the companion's
    answers are accepted from ``target`` only."""

    def __init__(self, target: Tuple[str, int], seed: int = 1, **impair: Any) -> None:
        if target[0] != "127.0.0.1":
            raise ValueError("the impairment proxy works on 127.0.0.1 only")
        self.target = target
        self.rng = random.Random(seed)
        self.dirs = [Impairment(self.rng, **impair), Impairment(self.rng, **impair)]
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for s in (self.front, self.back):
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
        self.gw: Any = None
        self.lock = threading.Lock()
        self.dark_until = 0.0            # monotonic s; math.inf: dark until dark(False)
        self.darkened = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self.t = threading.Thread(target=self._run, daemon=True, name="udp-impair")
        self.t.start()

    @property
    def port(self) -> int:
        return int(self.front.getsockname()[1])

    def blackout(self, seconds: float) -> None:
        """Nothing crosses, either way, for ``seconds`` from now."""
        with self.lock:
            self.dark_until = time.monotonic() + seconds
        self.darkened.set()
        os.write(self._wake_w, b"w")

    def dark(self, on: bool) -> None:
        """A blackout until ``dark(False)``."""
        with self.lock:
            self.dark_until = math.inf if on else 0.0
        if on:
            self.darkened.set()
        os.write(self._wake_w, b"w")

    def is_dark(self, now: Optional[float] = None) -> bool:
        with self.lock:
            return (time.monotonic() if now is None else now) < self.dark_until

    def counts(self) -> Dict[str, Dict[str, int]]:
        """What the proxy did, per direction ("gw->comp", "comp->gw")."""
        with self.lock:
            return {"gw->comp": dict(self.dirs[0].c), "comp->gw": dict(self.dirs[1].c)}

    def _run(self) -> None:
        socks: List[Any] = [self.front, self.back]
        while not self._stop:
            with self.lock:
                nexts = [t for t in (d.next_at() for d in self.dirs) if t is not None]
                dark_until = self.dark_until
            now = time.monotonic()
            wait = 0.05
            if nexts:
                wait = max(0.0, min(wait, min(nexts) - now))
            if now < dark_until:
                wait = min(wait, max(0.0, dark_until - now))
            r, _, _ = select.select([self._wake_r, *socks], [], [], wait)
            if self._wake_r in r:
                os.read(self._wake_r, 64)
            now = time.monotonic()
            with self.lock:
                dark = now < self.dark_until
                for i, s in enumerate(socks):
                    if s not in r:
                        continue
                    for _ in range(512):
                        try:
                            data, addr = s.recvfrom(65536)
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError:          # ICMP unreachable of an earlier send
                            continue
                        if i == 0:
                            self.gw = addr
                        elif addr != self.target:
                            continue
                        d = self.dirs[i]
                        if dark:
                            d.c["in"] += 1
                            d.c["blackout"] += 1
                        else:
                            d.offer(data, now)
                for i, d in enumerate(self.dirs):
                    if dark:
                        d.c["blackout"] += d.clear()
                        continue
                    to = self.target if i == 0 else self.gw
                    out = self.back if i == 0 else self.front
                    for data in d.due(now):
                        d.c["out"] += 1
                        if to is None:
                            continue
                        try:
                            out.sendto(data, to)
                        except OSError:          # the other end is not there (restarting)
                            pass

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        self.t.join(5)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self.front.close()
        self.back.close()


def geometric_gap(rng: random.Random, p: float) -> int:
    """Bits before the next error when each bit fails independently with probability p."""
    if p >= 1:
        return 0
    return int(math.log(1.0 - rng.random()) / math.log1p(-p))


class BerLine(PtyLine):
    """A serial line at ``baud`` (tools/ptyline.PtyLine, paced to baud/10 bytes/s each way) whose
    every data bit is flipped with probability ``ber``, independently (seeded). 8N1: the start and
    stop bits are not modelled (a pty has none); ``flips[d]`` counts the bits flipped in
    direction d (0: gateway -> companion), ``bits[d]`` those carried."""

    def __init__(self, baud: int, ber: float, seed: int = 1, prefix: str = "ubrb-ber-",
                 observe: Any = None) -> None:
        if not 0 <= ber < 1:
            raise ValueError("ber in [0, 1)")
        self.ber = ber
        self.rng = random.Random(seed)
        self.flips = [0, 0]
        self.bits = [0, 0]
        self.gap = [geometric_gap(self.rng, ber) if ber else -1 for _ in (0, 1)]
        super().__init__(baud, prefix, observe)

    def impair(self, d: int, data: bytes) -> bytes:
        n = 8 * len(data)
        self.bits[d] += n
        if self.ber <= 0 or self.gap[d] >= n:
            if self.ber > 0:
                self.gap[d] -= n
            return data
        b = bytearray(data)
        k = self.gap[d]
        while k < n:
            b[k >> 3] ^= 1 << (k & 7)
            self.flips[d] += 1
            k += 1 + geometric_gap(self.rng, self.ber)
        self.gap[d] = k - n
        return bytes(b)


class StallLine(PtyLine):
    """A serial line at ``baud`` (paced like BerLine, no bit errors) that stalls: every
    ``every`` s on average (uniform in [every / 2, 3 every / 2]) nothing moves either way for
    ``length`` / 2 ... ``length`` s, then what waited goes on at the line's rate, in order (a USB
    adapter or a busy host; seeded). ``stalls`` counts them."""

    def __init__(self, baud: int, every: float = 2.0, length: float = 0.5, seed: int = 1,
                 prefix: str = "ubrb-stall-", observe: Any = None) -> None:
        self.rng = random.Random(seed)
        self.every, self.length = every, length
        self.stalls = 0
        self._quit = threading.Event()
        super().__init__(baud, prefix, observe)
        self.stall_thread = threading.Thread(target=self._stall, daemon=True, name="pty-stall")
        self.stall_thread.start()

    def _stall(self) -> None:
        while not self._quit.wait(self.every * (0.5 + self.rng.random())):
            self.stalled = True
            self.stalls += 1
            self._quit.wait(self.length * (0.5 + 0.5 * self.rng.random()))
            self.stalled = False

    def close(self) -> None:
        self._quit.set()
        self.stall_thread.join(5)
        super().close()
