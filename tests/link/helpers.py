"""Integration helpers for the link: pty pairs behind a noisy, throttled proxy; a lossy UDP
proxy; fake gateway/companion ends; a single-threaded loop on a virtual clock (real I/O, but
time advances a fixed step per iteration, so timers and baud rates are deterministic and fast).
"""

from __future__ import annotations

import os
import random
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

import ubrb_min as L
from ros_side.link_end import LinkCompanionEnd
from ubrb_host import link as host_link
from tests.support.clock import VirtualClock
from tools.ptyline import PtyCable


def payload(i: int, size: int) -> bytes:
    b = bytearray((i * 31 + k * 7) & 0xFF for k in range(size))
    b[0:4] = i.to_bytes(4, "little")
    return bytes(b)


def seqno(data: bytes) -> int:
    return int.from_bytes(data[0:4], "little")


class FakeGateway:
    """GatewaySink: records; on ros_up re-sends every registration like the real Gateway."""

    def __init__(self) -> None:
        self.port: Any = None
        self.pubs: Dict[int, Tuple[str, str, Dict[str, Any]]] = {}
        self.subs: Dict[int, Tuple[str, str, Dict[str, Any]]] = {}
        self.ups: List[Tuple[Optional[str], int]] = []
        self.downs = 0
        self.results: List[Tuple[str, int, Optional[str]]] = []
        self.errors: List[Tuple[str, int, str]] = []
        self.messages: Dict[int, List[bytes]] = {}
        self.counts: List[Tuple[int, int]] = []
        self.lost: List[str] = []

    def ros_up(self, distro: Optional[str], max_message: int) -> None:
        self.ups.append((distro, max_message))
        for s, (t, ty, q) in sorted(self.pubs.items()):
            self.port.advertise(s, t, ty, q)
        for s, (t, ty, q) in sorted(self.subs.items()):
            self.port.subscribe(s, t, ty, q)

    def ros_down(self) -> None:
        self.downs += 1

    def ros_session_lost(self, message: str) -> None:
        self.lost.append(message)

    def ros_result(self, kind: str, slot: int, code: Optional[str], message: str) -> None:
        self.results.append((kind, slot, code))

    def ros_error(self, kind: str, slot: int, code: str, message: str) -> None:
        self.errors.append((kind, slot, code))

    def ros_message(self, slot: int, buf: Any, off: int, n: int) -> None:
        self.messages.setdefault(slot, []).append(bytes(buf[off : off + n]))

    def ros_sub_count(self, slot: int, count: int) -> None:
        self.counts.append((slot, count))


class FakeCompanion:
    """RosPort on the companion side: records what the link delivers."""

    def __init__(self, distro: str = "humble") -> None:
        self.distro = distro
        self.sink: Any = None
        self.live: Dict[Tuple[str, int], str] = {}
        self.published: Dict[int, List[bytes]] = {}
        self.resets = 0
        self.stats: Any = None

    def advertise(self, slot: int, topic: str, type_: str, qos: Any) -> None:
        self.live[("p", slot)] = topic
        self.sink.ros_result("pub", slot, None, "")

    def unadvertise(self, slot: int) -> None:
        self.live.pop(("p", slot), None)

    def subscribe(self, slot: int, topic: str, type_: str, qos: Any) -> None:
        self.live[("s", slot)] = topic
        self.sink.ros_result("sub", slot, None, "")

    def unsubscribe(self, slot: int) -> None:
        self.live.pop(("s", slot), None)

    def publish(self, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
        self.published.setdefault(slot, []).append(bytes(buf[off : off + n]))

    def reset(self) -> None:
        self.resets += 1
        self.live = {}

    def gateway_stats(self, d: Any) -> None:
        self.stats = d


class GatewayEnd:
    def __init__(self, url: str, epoch: int, **kw: Any) -> None:
        self.s, self.d = host_link.open_link(url, True, kw.pop("max_message", 65536), epoch=epoch,
                                             **kw)
        self.t = self.d.t
        self.port = L.LinkRosPort(self.s)
        self.gw = FakeGateway()
        self.gw.port = self.port
        self.port.sink = self.gw


class CompanionEnd:
    def __init__(self, url: str, epoch: int, **kw: Any) -> None:
        self.s, self.d = host_link.open_link(url, False, kw.pop("max_message", 65536), epoch=epoch,
                                             **kw)
        self.t = self.d.t
        self.comp = FakeCompanion()
        self.end = LinkCompanionEnd(self.s, self.comp)
        self.comp.sink = self.end


class World(VirtualClock):
    """Runs drivers and proxies on a virtual clock: each step is `dt` virtual milliseconds."""

    def __init__(self) -> None:
        super().__init__(10_000)
        self.drivers: List[Any] = []
        self.proxies: List[Any] = []
        self.hooks: List[Callable[[int], None]] = []

    def step(self, dt: int = 1) -> None:
        now = self.now
        for h in self.hooks:
            h(now)
        for d in self.drivers:
            d.on_readable(now)
        for p in self.proxies:
            p.pump(now)
        for d in self.drivers:
            d.on_readable(now)
            d.tick(now)
            d.flush(now)
        self.now = now + dt


class SerialProxy(PtyCable):
    """Shuttles bytes between two pty masters at `baud`, injecting bit flips, dropped,
    duplicated and inserted bytes and cut-off runs (truncated frames)."""

    def __init__(self, seed: int, baud: int = 115200, noise: float = 1.0) -> None:
        super().__init__("ubrb-link-")
        self.rng = random.Random(seed)
        self.bpms = baud / 10000.0  # bytes per ms (8N1: 10 bits a byte)
        self.noise = noise
        self.budget = [0.0, 0.0]
        self.pending = [bytearray(), bytearray()]
        self.last = -1
        self.events = {"flip": 0, "drop": 0, "dup": 0, "insert": 0, "cut": 0}
        self.cutting = [0, 0]

    def mangle(self, data: bytes, d: int) -> bytes:
        if self.noise <= 0:
            return data
        out = bytearray()
        r = self.rng
        p = self.noise
        for c in data:
            if self.cutting[d] > 0:
                self.cutting[d] -= 1
                continue
            x = r.random()  # per-byte event rates (x noise): ~1e-4 in all, ~10% of 1 KiB frames
            if x < 4e-5 * p:
                c ^= 1 << r.randrange(8)
                self.events["flip"] += 1
            elif x < 6e-5 * p:
                self.events["drop"] += 1
                continue
            elif x < 8e-5 * p:
                out.append(c)
                self.events["dup"] += 1
            elif x < 10e-5 * p:
                out.extend(bytes([L.LK_SYNC0, L.LK_SYNC1, r.randrange(256)]))
                self.events["insert"] += 1
            elif x < 11e-5 * p:
                self.cutting[d] = r.randrange(1, 200)
                self.events["cut"] += 1
            out.append(c)
        return bytes(out)

    def pump(self, now: int) -> None:
        if self.last < 0:
            self.last = now
        el = now - self.last
        self.last = now
        for d, (src, dst) in enumerate(((self.a, self.b), (self.b, self.a))):
            if src.master < 0 or dst.master < 0:
                self.budget[d] = 0.0
                continue
            self.budget[d] = min(self.budget[d] + el * self.bpms, 4096.0)
            k = int(self.budget[d])
            if k > 0 and len(self.pending[d]) < 4096:
                try:
                    data = os.read(src.master, k)
                except (BlockingIOError, OSError):
                    data = b""
                self.budget[d] -= len(data)
                self.pending[d] += self.mangle(data, d)
            if self.pending[d]:
                try:
                    w = os.write(dst.master, self.pending[d])
                except (BlockingIOError, OSError):
                    w = 0
                del self.pending[d][:w]


class UdpProxy:
    """Gateway -> proxy (port `gw_port`) -> companion, and back, with loss, duplication and
    reordering. 127.0.0.1 only."""

    def __init__(self, comp_addr: Tuple[str, int], seed: int, loss: float = 0.05,
                 dup: float = 0.05, reorder: float = 0.05) -> None:
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        for s in (self.front, self.back):
            s.setblocking(False)
        self.comp = comp_addr
        self.gw: Any = None
        self.rng = random.Random(seed)
        self.loss, self.dup, self.reorder = loss, dup, reorder
        self.held: List[Tuple[Any, bytes, Any]] = []
        self.stats = {"lost": 0, "dup": 0, "reordered": 0}

    @property
    def port(self) -> int:
        return int(self.front.getsockname()[1])

    def _send(self, sock: Any, data: bytes, addr: Any) -> None:
        r = self.rng.random()
        if r < self.loss:
            self.stats["lost"] += 1
            return
        if r < self.loss + self.reorder:
            self.stats["reordered"] += 1
            self.held.append((sock, data, addr))
            return
        sock.sendto(data, addr)
        if r < self.loss + self.reorder + self.dup:
            self.stats["dup"] += 1
            sock.sendto(data, addr)
        if self.held and self.rng.random() < 0.5:
            for s, d, a in self.held:
                s.sendto(d, a)
            self.held = []

    def pump(self, now: int) -> None:
        for _ in range(256):
            try:
                data, addr = self.front.recvfrom(65536)
            except BlockingIOError:
                break
            self.gw = addr
            self._send(self.back, data, self.comp)
        for _ in range(256):
            try:
                data, addr = self.back.recvfrom(65536)
            except BlockingIOError:
                break
            if self.gw is not None:
                self._send(self.front, data, self.gw)

    def close(self) -> None:
        self.front.close()
        self.back.close()
