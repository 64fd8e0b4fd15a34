"""CPython transports for the gateway <-> companion link (docs/LINK.md).

`open_link(url, gateway)` gives a transport:

- ``udp://HOST:PORT``: the gateway sends to the companion at HOST:PORT from an ephemeral local
  port; the companion binds HOST:PORT and locks onto the first peer whose HELLO it accepts.
  Datagrams from any other address are ignored and counted (``foreign``), except a HELLO that
  opens a *new* session (a restarted gateway comes back from a new ephemeral port).
- ``serial:PATH``: PATH is a device or any pyserial URL (``socket://``, ``rfc2217://``,
  ``loop://``); opened with ``serial_for_url``, non-blocking. A device that disappears is closed
  and reopened by the driver every 0.5 s.

Transports have ``fileno()`` (-1 when there is none to select on), ``read_into(buf) -> n``
(0: nothing now; raises OSError when the device is gone), ``write(buf, off, n) -> n``,
``can_write()``, ``close()`` and ``datagram``. `LinkDriver` plugs a transport and a
`LinkSession` into a selectors loop: ``on_readable(now)``, ``flush(now)``, ``tick(now)``,
``wants_write()``, ``fileno()``.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Dict, Optional, Tuple

import ubrb_min as L

log = logging.getLogger("ubrb.link")

DEFAULT_UDP_PORT = 8269
DEFAULT_MTU = 1400
SERIAL_FRAME = 1088           # serial frame cap: a 1 KiB message and its headers fit one frame (95 ms at 115200)
REOPEN_MS = 500
OUT_QUEUE_LIMIT = 256         # bytes in the UART driver before we stop building frames
MAX_MESSAGE_CAP = (1 << 23) - 64


def new_epoch() -> int:
    """Random per process start, < 2**30 (a small int on MicroPython too), never 0."""
    return (int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF) or 1


def parse_link_url(url: str) -> Tuple[str, str, int]:
    """('udp', host, port) or ('serial', path, 0)."""
    if url.startswith("udp://"):
        rest = url[6:].rstrip("/")
        if rest.startswith("["):
            host, _, port = rest[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = rest.rpartition(":")
            if not host:
                host, port = rest, ""
        return "udp", host or "127.0.0.1", int(port) if port else DEFAULT_UDP_PORT
    if url.startswith("serial:"):
        path = url[7:]
        if not path:
            raise ValueError("serial: needs a device path or pyserial URL")
        return "serial", path, 0
    raise ValueError(f"unknown link {url!r}: use udp://HOST:PORT or serial:PATH")


def _is_hello(buf: Any, n: int) -> bool:
    return n >= L.LK_OVH + 18 and buf[0] == L.LK_SYNC0 and buf[1] == L.LK_SYNC1 and (
        buf[4] & 15
    ) == L.LK_HELLO


class UdpTransport:
    datagram = True

    def __init__(self, host: str, port: int, gateway: bool) -> None:
        info = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)[0]
        fam, addr = info[0], info[4]
        self.sock = socket.socket(fam, socket.SOCK_DGRAM)
        self.gateway = gateway
        if gateway:
            loop = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
            local = ("::1" if fam == socket.AF_INET6 else "127.0.0.1") if loop else ""
            self.sock.bind((local, 0))
            self.peer: Optional[Any] = addr
        else:
            self.sock.bind(addr)  # no SO_REUSEADDR: a second companion on the port must fail
            self.peer = None
        self.sock.setblocking(False)
        self.last_addr: Any = None
        self.c_foreign = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def local_address(self) -> Any:
        return self.sock.getsockname()

    def read_into(self, buf: bytearray) -> int:
        try:
            n, self.last_addr = self.sock.recvfrom_into(buf)
        except (BlockingIOError, InterruptedError, ConnectionRefusedError):
            return 0
        return n

    def write(self, buf: bytearray, off: int, n: int) -> int:
        if self.peer is None:
            return n  # nobody to talk to yet: the frame is dropped like a lost datagram
        try:
            self.sock.sendto(memoryview(buf)[off : off + n], self.peer)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:  # unreachable network etc.: UDP is lossy anyway
            log.debug("link: sendto %s: %s", self.peer, e)
        return n

    def can_write(self) -> bool:
        return True

    def close(self) -> None:
        self.sock.close()


class SerialTransport:
    datagram = False

    def __init__(self, path: str, baud: int) -> None:
        self.path = path
        self.baud = baud
        self.ser: Any = None
        self.fd = -1
        try:
            import serial  # noqa: F401  (pyserial: only the serial link needs it)
        except ImportError:
            raise RuntimeError(
                "--link serial: needs pyserial (pip install pyserial); UDP links need nothing"
            ) from None
        try:
            self.open()
        except Exception as e:  # not plugged in yet: the driver keeps retrying
            log.warning("link: cannot open %s yet: %s", path, e)

    def open(self) -> None:
        import serial  # pyserial

        ser = serial.serial_for_url(self.path, baudrate=self.baud, timeout=0, write_timeout=0)
        fd = -1
        try:
            fd = ser.fileno()
            os.set_blocking(fd, False)
        except Exception:  # rfc2217:// and friends have no descriptor: polled instead
            fd = -1
        if fd >= 0 and os.isatty(fd):
            # pyserial's timeout=0 sets VMIN=0, where read() returns 0 for "no data";
            # VMIN=1 + O_NONBLOCK gives EAGAIN instead, so 0 can only mean hang-up
            import termios

            a = termios.tcgetattr(fd)
            a[6][termios.VMIN] = 1
            a[6][termios.VTIME] = 0
            termios.tcsetattr(fd, termios.TCSANOW, a)
        self.ser, self.fd = ser, fd

    def fileno(self) -> int:
        return self.fd if self.ser is not None else -1

    def read_into(self, buf: bytearray) -> int:
        if self.fd >= 0:
            try:
                n = os.readv(self.fd, [buf])
            except (BlockingIOError, InterruptedError):
                return 0
            if n == 0:  # non-blocking: 0 means the other end (device, pty, socket) is gone
                raise OSError("serial link closed")
            return n
        k = self.ser.in_waiting
        if not k:
            return 0
        data = self.ser.read(min(k, len(buf)))
        buf[: len(data)] = data
        return len(data)

    def write(self, buf: bytearray, off: int, n: int) -> int:
        if self.fd >= 0:
            try:
                return os.write(self.fd, memoryview(buf)[off : off + n])
            except (BlockingIOError, InterruptedError):
                return 0
        return self.ser.write(bytes(buf[off : off + n])) or 0

    def can_write(self) -> bool:
        # keep frames in our queues (where best-effort data can still be thinned) rather
        # than in the UART driver; ptys and sockets report 0 here
        try:
            return bool(self.ser.out_waiting < OUT_QUEUE_LIMIT)
        except Exception:
            return True

    def close(self) -> None:
        if self.ser is not None:
            try:
                self.ser.close()
            except Exception:
                pass
        self.ser = None
        self.fd = -1


def open_link(url: str, gateway: bool, baud: int = 115200) -> Any:
    kind, where, port = parse_link_url(url)
    if kind == "udp":
        return UdpTransport(where, port, gateway)
    return SerialTransport(where, baud)


class LinkDriver:
    """Moves bytes between a transport and a LinkSession; reopens a vanished serial device."""

    def __init__(self, transport: Any, session: L.LinkSession, pace_bps: int = -1) -> None:
        self.t = transport
        self.s = session
        # Serial: pace writes to the line rate (8N1: baud/10 bytes/s) so frames wait in our
        # queues, where best-effort data is still thinned, newest wins, and not in a kernel
        # or USB buffer whose drain time would inflate the RTT and the staleness of data.
        if pace_bps < 0:
            pace_bps = 0 if transport.datagram else getattr(transport, "baud", 0) // 10
        self.pace = pace_bps
        self.credit = 0.0
        self.credit_max = pace_bps * 0.06  # 60 ms of line time: a 50 ms loop keeps it busy
        self.last_flush = -1
        self.rbuf = bytearray(65536 if transport.datagram else 4096)
        self.tx_off = 0
        self.tx_n = 0
        self.broken = not transport.datagram and transport.ser is None
        self.retry_at = 0
        self.c_reopen = 0
        self.c_io_err = 0

    def fileno(self) -> int:
        return -1 if self.broken else self.t.fileno()

    def _lost(self, now: int, e: BaseException) -> None:
        log.warning("link: %s: %s; reopening every %d ms", getattr(self.t, "path", "?"), e,
                    REOPEN_MS)
        self.c_io_err += 1
        self.t.close()
        self.broken = True
        self.retry_at = now + REOPEN_MS
        self.tx_n = 0  # a half-written frame is lost with the device; the peer resyncs

    def on_readable(self, now: int) -> None:
        if self.broken:
            return
        t, s, buf = self.t, self.s, self.rbuf
        for _ in range(64):
            try:
                n = t.read_into(buf)
            except Exception as e:  # OSError, SerialException
                self._lost(now, e)
                return
            if n <= 0:
                return
            if not t.datagram:
                s.feed(buf, 0, n, now)
            elif t.peer is not None and t.last_addr == t.peer:
                s.feed(buf, 0, n, now)
            elif not t.gateway and _is_hello(buf, n):
                pe, hr = s.peer_epoch, s.c_hello_rx
                s.feed(buf, 0, n, now)
                if s.c_hello_rx != hr and (t.peer is None or s.peer_epoch != pe):
                    log.info("link: peer is now %s", t.last_addr)
                    t.peer = t.last_addr
            else:
                t.c_foreign += 1

    def flush(self, now: int) -> None:
        if self.broken:
            return
        t, s = self.t, self.s
        if self.pace:
            if self.last_flush >= 0:
                self.credit = min(self.credit + (now - self.last_flush) * self.pace / 1000.0,
                                  self.credit_max)
            self.last_flush = now
        for _ in range(256):
            if self.tx_n == 0:
                if not t.can_write() or (self.pace and self.credit <= 0):
                    return
                n = s.poll_tx(now)
                if n == 0:
                    return
                self.tx_off, self.tx_n = 0, n
            try:
                k = t.write(s.tx_buf, self.tx_off, self.tx_n)
            except Exception as e:
                self._lost(now, e)
                return
            if k <= 0:
                return
            self.tx_off += k
            self.tx_n -= k
            self.credit -= k
            if self.tx_n:
                return

    def tick(self, now: int) -> None:
        self.s.tick(now)
        if self.broken and now >= self.retry_at:
            try:
                self.t.open()
            except Exception as e:
                log.debug("link: reopen failed: %s", e)
                self.retry_at = now + REOPEN_MS
                return
            self.broken = False
            self.c_reopen += 1
            log.info("link: %s reopened", getattr(self.t, "path", "?"))

    def wants_write(self) -> bool:
        return self.tx_n > 0

    def counters(self) -> Dict[str, int]:
        d: Dict[str, int] = self.s.counters()
        d["foreign"] = getattr(self.t, "c_foreign", 0)
        d["reopen"] = self.c_reopen
        d["io_err"] = self.c_io_err
        return d

    def close(self) -> None:
        self.t.close()


def session_for(transport: Any, gateway: bool, max_message: int, mtu: int = DEFAULT_MTU,
                epoch: Optional[int] = None, handler: Any = None) -> L.LinkSession:
    """A LinkSession sized for CPython hosts (a Pi or a PC)."""
    mm = min(max_message or (1 << 20), MAX_MESSAGE_CAP)
    return L.LinkSession(
        handler,
        new_epoch() if epoch is None else epoch,
        gateway,
        datagram=transport.datagram,
        max_frame=mtu if transport.datagram else SERIAL_FRAME,
        max_message=mm,
        window=16 if transport.datagram else 8,
        # Small profiles (mcu) get small rings: the budget follows the largest message.
        rel_bytes=max(2 * mm, min(1 << 18, 4 * mm)) + 8192,
        be_bytes=max(mm + 4096, min(1 << 17, 4 * mm)),
    )


def open_gateway_link(url: str, baud: int = 115200, mtu: int = DEFAULT_MTU,
                      max_message: int = 1 << 20) -> Tuple[L.LinkRosPort, LinkDriver]:
    """(RosPort, driver) for the gateway; set `port.sink` to the Gateway."""
    t = open_link(url, True, baud)
    s = session_for(t, True, max_message, mtu or DEFAULT_MTU)
    return L.LinkRosPort(s), LinkDriver(t, s)


def open_companion_link(url: str, companion: Any, baud: int = 115200, mtu: int = DEFAULT_MTU,
                        max_message: int = 1 << 20) -> Tuple[L.LinkCompanionEnd, LinkDriver]:
    """(GatewaySink for the companion, driver); the companion's sink is the returned end."""
    t = open_link(url, False, baud)
    s = session_for(t, False, max_message, mtu or DEFAULT_MTU)
    return L.LinkCompanionEnd(s, companion), LinkDriver(t, s)
