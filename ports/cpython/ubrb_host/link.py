"""CPython transports for the gateway <-> companion link (docs/LINK.md), for both ends.

`open_transport(url, gateway)` gives a transport for a link URL (grammar: ubrb_min.parse_link_url):

- ``udp://HOST:PORT``: the gateway sends to the companion at HOST:PORT from an ephemeral local
  port; the companion binds HOST:PORT and locks onto the address of a *verified* HELLO (its
  sender knows the companion's current epoch and, on a keyed link, proved the key over it).
  Other datagrams from any other address are ignored and counted (``foreign``); a HELLO from
  elsewhere is answered there (a restarted gateway comes back from a new ephemeral port) but
  moves nothing until that address completes the handshake.
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

import errno
import logging
import os
import socket
import stat
import sys
import time
from typing import Any, Dict, Optional, Tuple

import ubrb_min as L
import ubrb_setup

log = logging.getLogger("ubrb.link")

REOPEN_MS = 500
AUTH_LOG_MS = 10000           # at most one warning about unauthenticated frames per 10 s
# The companion on UDP takes a HELLO from another address than its gateway's only once that
# gateway has been silent this long (3 heartbeats, under the 2 s dead time, so a newcomer is up
# within 2 s of the old one leaving); before, it is refused unread (a second gateway with the
# same key would otherwise take the companion over, docs/LINK.md section 10).
TAKEOVER_MS = 1200
OUT_QUEUE_LIMIT = 256         # bytes in the UART driver before we stop building frames
RCVBUF = 4 * ubrb_setup.LINK_WINDOW_BYTES  # UDP receive queue asked for (the kernel counts ~2x)
UDP_WINDOW = 64  # frames a CPython end lets be in flight towards it on UDP (udp_window)
UDP_WINDOW_BYTES = 88 * 1024  # ... and bytes of them: 64 of 1400, 11 of 8192, 5 of 16384

# Linux UDP segmentation offload (linux/udp.h): one sendmsg carries several same-size datagrams
# (UDP_SEGMENT, Linux >= 4.18) and one recvmsg returns several (UDP_GRO, Linux >= 5.0). Every
# frame is still a datagram of its own on the wire, no larger than --link-mtu (nothing is
# IP-fragmented, and a peer without GRO receives them one by one), but the system call, the
# trip through the network stack and the receiver's wake-up are paid once per batch instead of
# once per frame: on loopback, 4.9 us of CPU per 1400-byte datagram sent and received one at a
# time, 0.4 us in batches of 16 (bench/udp_batching.py). Elsewhere, or where the kernel or
# device refuses it, one sendto per frame as before.
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO = getattr(socket, "UDP_GRO", 104)
GSO_MAX_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
GSO_MAX_BYTES = 65000  # UDP payload of one batch: under an IP datagram's 65535 with headers
_GSO_REFUSED = (errno.EINVAL, errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP)


def address(a: Any) -> str:
    """host:port of a socket address (IPv6: [host]:port)."""
    if not isinstance(a, tuple):
        return str(a)
    return ("[%s]:%d" if ":" in a[0] else "%s:%d") % (a[0], a[1])


def new_epoch() -> int:
    """Random per process start, < 2**30 (a small int on MicroPython too), never 0."""
    return (int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF) or 1


_GRO_CMSG_SPACE = socket.CMSG_SPACE(4) if hasattr(socket, "CMSG_SPACE") else 0


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
        # Headroom in the receive queue for best-effort frames interleaved with a full window
        # of reliable ones (which ubrb_min.link_sizes fits into a default queue): what the kernel
        # cannot queue it drops unseen. Capped by net.core.rmem_max; best effort.
        try:
            if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < RCVBUF:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        except OSError:
            pass
        self.last_addr: Any = None
        self.candidate: Any = None  # where an unverified HELLO came from: HELLOs answer there too
        self.c_foreign = 0
        # Frames written during one LinkDriver.flush wait here and leave in one sendmsg (push):
        # b_n datagrams of b_seg bytes (the last may be shorter) in batch[:b_fill].
        linux = sys.platform.startswith("linux") and hasattr(self.sock, "sendmsg")
        self.batch: Optional[bytearray] = bytearray(65536) if linux else None
        # written through a view: bytearray[i:j] = memoryview would first copy the frame into
        # a new bytearray (CPython's bytearray_ass_subscript takes only a bytearray as is)
        self.batch_mv = memoryview(self.batch) if self.batch is not None else None
        self.b_fill = 0
        self.b_n = 0
        self.b_seg = 0
        self.gro = False
        if linux:
            try:
                self.sock.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                pass
        self.seg = 0  # datagram size of the last read: GRO hands over several of this size

    def fileno(self) -> int:
        return self.sock.fileno()

    def local_address(self) -> Any:
        return self.sock.getsockname()

    def read_into(self, buf: bytearray) -> int:
        """One datagram, or with GRO several consecutive ones of `self.seg` bytes each (the
        last may be shorter), into buf; their total length (0: nothing now)."""
        try:
            if not self.gro:
                n, self.last_addr = self.sock.recvfrom_into(buf)
                self.seg = n
                return n
            n, anc, _, self.last_addr = self.sock.recvmsg_into([buf], _GRO_CMSG_SPACE)
        except (BlockingIOError, InterruptedError, ConnectionRefusedError):
            return 0
        self.seg = n
        for level, kind, data in anc:
            if level == socket.IPPROTO_UDP and kind == UDP_GRO and len(data) >= 4:
                self.seg = int.from_bytes(data[:4], sys.byteorder) or n
        return n

    def write(self, buf: bytearray, off: int, n: int) -> int:
        to = self.candidate
        if to is not None and to != self.peer and _is_hello(memoryview(buf)[off:], n):
            self.push()
            self._send(buf, off, n, to)  # the handshake with a newcomer; data never goes there
        if self.peer is None:
            return n  # nobody to talk to yet: the frame is dropped like a lost datagram
        if self.batch is None:
            return self._send(buf, off, n, self.peer)
        # Batched (sent by push): one segment size per batch, only the last may be shorter.
        if self.b_n and (n > self.b_seg or self.b_n >= GSO_MAX_SEGMENTS
                         or self.b_fill + n > GSO_MAX_BYTES):
            if not self.push():
                return 0  # the socket is full: this frame waits for the next flush
        if self.b_n == 0:
            self.b_seg = n
        assert self.batch_mv is not None
        self.batch_mv[self.b_fill : self.b_fill + n] = memoryview(buf)[off : off + n]
        self.b_fill += n
        self.b_n += 1
        if n < self.b_seg:
            self.push()  # a shorter datagram ends its batch
        return n

    def push(self) -> bool:
        """Send the batched frames (one sendmsg); False if the socket had no room for them
        (they stay batched, and write() takes no more until they are gone)."""
        if self.b_n == 0:
            return True
        assert self.batch is not None
        data = memoryview(self.batch)[: self.b_fill]
        to = self.peer
        if to is None:  # (frames are only batched for a peer)
            self.b_n = self.b_fill = 0
            return True
        try:
            if self.b_n == 1:
                self.sock.sendto(data, to)
            else:
                self.sock.sendmsg([data], [(socket.IPPROTO_UDP, UDP_SEGMENT,
                                            self.b_seg.to_bytes(2, sys.byteorder))], 0, to)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            if self.b_n > 1:
                # no segmentation offload on this kernel, device or path (EIO: a device without
                # checksum offload; EINVAL: a path MTU below the frames): the same datagrams
                # one by one, now and from now on
                if e.errno in _GSO_REFUSED:
                    log.info("link: UDP segmentation offload refused (%s): one send per frame",
                             os.strerror(e.errno or 0))
                    self.batch = self.batch_mv = None
                for p in range(0, self.b_fill, self.b_seg):
                    k = min(self.b_seg, self.b_fill - p)
                    self._send(data, p, k, to)
            else:  # unreachable network etc.: UDP is lossy anyway
                log.debug("link: sendto %s: %s", to, e)
        self.b_n = self.b_fill = 0
        return True

    def pending(self) -> bool:
        return self.b_n > 0

    def _send(self, buf: Any, off: int, n: int, to: Any) -> int:
        try:
            self.sock.sendto(memoryview(buf)[off : off + n], to)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:  # unreachable network etc.: UDP is lossy anyway
            log.debug("link: sendto %s: %s", to, e)
        return n

    def can_write(self) -> bool:
        return True

    def close(self) -> None:
        self.push()
        self.sock.close()


def serial_problem(e: BaseException) -> str:
    """Why a serial device did not open, in words (pyserial nests the OS error in its text)."""
    import errno

    code = getattr(e, "errno", None)
    text = str(e)
    if code == errno.ENOENT or "No such file" in text:
        return "no such device: check the path, e.g. ls /dev/serial/by-id/"
    if code == errno.EACCES or "Permission denied" in text:
        return "permission denied: add this user to the dialout group"
    if code == errno.EBUSY or "busy" in text.lower():
        return "busy: another program has it open"
    return text


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
        # A device that is not there yet may be plugged in (the driver waits, saying so every
        # few seconds); a path that is there but is no serial device never becomes one.
        not_serial = RuntimeError(
            "%s is not a serial device: give the device (e.g. /dev/ttyACM0, or one of "
            "/dev/serial/by-id/) or a pyserial URL" % path)
        if "://" not in path and os.path.exists(path) and not stat.S_ISCHR(os.stat(path).st_mode):
            raise not_serial
        try:
            self.open()
        except Exception as e:  # not plugged in yet: the driver keeps retrying
            if getattr(e, "errno", None) == errno.ENOTTY or "Inappropriate ioctl" in str(e):
                raise not_serial from None  # a character device, but no tty (/dev/null)
            log.warning("link: cannot open %s yet (%s); retrying every %.1f s", path,
                        serial_problem(e), REOPEN_MS / 1000)

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
        # A device with a descriptor (a tty, a pty, socket://) is read straight into buf. The
        # others (rfc2217://, loop://) only have pyserial's read(), which makes a bytes object
        # (its readinto() is read() plus a copy, serialutil.py); copied in through a view.
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
        memoryview(buf)[: len(data)] = data  # (buf[:n] = bytes would copy it once more)
        return len(data)

    def write(self, buf: bytearray, off: int, n: int) -> int:
        if self.fd >= 0:
            try:
                return os.write(self.fd, memoryview(buf)[off : off + n])
            except (BlockingIOError, InterruptedError):
                return 0
        return self.ser.write(memoryview(buf)[off : off + n]) or 0

    def push(self) -> bool:
        return True  # every write() went straight to the device

    def pending(self) -> bool:
        return False

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


def open_transport(url: str, gateway: bool, baud: int = 115200) -> Any:
    """The transport for a link URL; ValueError for 'none' or a URL outside the grammar."""
    kind, where, port = ubrb_setup.parse_link_url(url)
    if kind == "udp":
        return UdpTransport(where, port, gateway)
    if kind == "serial":
        return SerialTransport(where, baud)
    raise ValueError("no link to open: %r" % url)


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
        self.out = L.LinkOutput(session, pace_bps)
        self.rbuf = bytearray(65536 if transport.datagram else 4096)
        self.broken = not transport.datagram and transport.ser is None
        self.retry_at = 0
        self.auth_seen = 0  # frames failing authentication, as last reported (tick)
        self.auth_at = 0
        self.replay_seen = 0  # replayed frames (valid MAC, seen before), as last reported
        self.replay_at = 0
        # HELLOs refused from another address while the gateway we have is alive (companion, UDP)
        self.c_refused = 0
        self.refused_from: Any = None  # the newcomer last refused,
        self.refused_since = 0         # ... since when,
        self.refused_said = -AUTH_LOG_MS  # ... and when we last warned about one
        self.c_reopen = 0
        self.c_io_err = 0
        self.unacked = 0  # datagrams taken in since the last flush
        self.ack_every = max(1, session.window // 2)

    def fileno(self) -> int:
        return -1 if self.broken else self.t.fileno()

    def _lost(self, now: int, e: BaseException) -> None:
        log.warning("link: %s: %s; reopening every %d ms", getattr(self.t, "path", "?"), e,
                    REOPEN_MS)
        self.c_io_err += 1
        self.t.close()
        self.broken = True
        self.retry_at = now + REOPEN_MS
        self.out.drop()

    def on_readable(self, now: int, budget_ms: float = 0.0) -> None:
        """Take in what arrived: up to 64 reads, and with ``budget_ms`` no new read once that
        long was spent (the rest waits in the socket for the loop's next turn: a flood of
        records costs the loop its other work at most that long)."""
        if self.broken:
            return
        t, s, buf = self.t, self.s, self.rbuf
        end = time.perf_counter() + budget_ms / 1000.0 if budget_ms else 0.0
        for _ in range(64):
            if end and time.perf_counter() >= end:
                return
            try:
                n = t.read_into(buf)
            except Exception as e:  # OSError, SerialException
                self._lost(now, e)
                return
            if n <= 0:
                return
            if not t.datagram:
                s.feed(buf, 0, n, now)
                continue
            # One datagram, or several of t.seg bytes each (UDP GRO), each one frame. From the
            # peer, the session takes them a run at a time (a datagram-mode feed parses every
            # frame in its range); anything else one by one (a HELLO may move the peer).
            seg = t.seg
            direct = t.peer is not None and t.last_addr == t.peer
            p = 0
            while p < n:
                if direct:
                    k = min(n - p, seg * max(1, self.ack_every - self.unacked))
                    s.feed(buf, p, k, now)
                    self.unacked += (k + seg - 1) // seg
                else:
                    k = min(seg, n - p)
                    self._datagram(buf, p, k, now)
                    self.unacked += 1
                p += k
                # Acknowledge every half window as it comes, not once after handling all that
                # was queued: the peer sends the next half while this end still works on the
                # last one, instead of both taking turns at sitting idle.
                if self.unacked >= self.ack_every:
                    if s.ack_pending:
                        self.flush(now)
                    self.unacked = 0

    def _datagram(self, buf: bytearray, off: int, n: int, now: int) -> None:
        t, s = self.t, self.s
        if t.peer is not None and t.last_addr == t.peer:
            s.feed(buf, off, n, now)
        elif not t.gateway and _is_hello(memoryview(buf)[off:], n):
            if s.is_up() and now - s.last_rx < TAKEOVER_MS:
                # Our gateway is alive: a second one is not let in. Keyed, only a HELLO with a
                # valid MAC is a gateway's (the rest is counted `auth`, as the session would).
                k = buf[off + 2] | (buf[off + 3] << 8)
                if s.mac is None or (k <= n and s.mac.check(buf, off, k, L.LK_HELLO,
                                                           s.stat_counts)):
                    self._refuse(now)
                return
            # Our gateway is silent (or there is none): the HELLO is handled and answered at its
            # address. Re-lock only on a verified HELLO: one that knows our current epoch
            # (keyed: and proves the key over it); anything less is answered, nothing more.
            ok = s.stat_counts[L._LKC_HELLO_OK]
            t.candidate = t.last_addr
            s.feed(buf, off, n, now)
            if s.stat_counts[L._LKC_HELLO_OK] != ok:
                log.info("link: peer is now %s", t.last_addr)
                t.peer = t.last_addr
                t.candidate = None
        else:
            t.c_foreign += 1
            if (not t.gateway and not s.is_up() and n >= L.LK_OVH and buf[off] == L.LK_SYNC0
                    and buf[off + 1] == L.LK_SYNC1):
                # A frame of a session we do not have (we restarted; the gateway goes on until
                # its dead timer): a HELLO there (paced by the session) tells it our epoch, and
                # the handshake (section 3) starts a new session at once instead of in 2 s.
                t.candidate = t.last_addr
                s.hello_reply = True

    def _refuse(self, now: int) -> None:
        t = self.t
        self.c_refused += 1
        if t.last_addr != self.refused_from:
            self.refused_from, self.refused_since = t.last_addr, now
        # Said once our gateway has spoken since this newcomer began (it is alive, not a
        # gateway that restarted from a new port while the old one's session runs out), then at
        # most every AUTH_LOG_MS.
        if self.s.last_rx > self.refused_since and now - self.refused_said >= AUTH_LOG_MS:
            self.refused_said = now
            log.warning("link: refused the gateway at %s: the gateway at %s is alive on this "
                        "link (two gateways for one companion?); a newcomer takes over only once "
                        "the gateway in use is silent for %.1f s", address(t.last_addr),
                        address(t.peer), TAKEOVER_MS / 1000)

    def flush(self, now: int) -> None:
        if self.broken:
            return
        self.unacked = 0
        t, s, out = self.t, self.s, self.out
        out.start(now)
        if t.pending() and not t.push():
            return  # last flush's batch still waits for room in the socket
        for _ in range(256):
            if out.n == 0 and not t.can_write():
                break
            n = out.next(now)
            if n == 0:
                break
            try:
                k = t.write(s.tx_buf, out.off, n)
            except Exception as e:
                self._lost(now, e)
                return
            if not out.wrote(k):
                break
        t.push()  # the frames batched by this flush leave together (UdpTransport)

    def tick(self, now: int) -> None:
        self.s.tick(now)
        counts = self.s.stat_counts  # by ubrb_min's _LKC_* indices
        bad = counts[L.LKC_AUTH]
        if not self.s.is_up():
            self.auth_seen = bad  # (while down, LinkWatch says it as what this end waits for)
        elif bad != self.auth_seen and now - self.auth_at >= AUTH_LOG_MS:
            log.warning("link: %d frames failed authentication (a peer with another "
                        "--link-key or none, or someone else on the link)", bad - self.auth_seen)
            self.auth_seen, self.auth_at = bad, now
        bad = counts[L.LKC_REPLAY]
        if bad != self.replay_seen and now - self.replay_at >= AUTH_LOG_MS:
            log.warning("link: %d replayed frames dropped (a valid MAC, but seen before: "
                        "someone re-sends captured link traffic)", bad - self.replay_seen)
            self.replay_seen, self.replay_at = bad, now
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
        return self.out.n > 0 or self.t.pending()

    def wait_ms(self, now: int) -> int:
        """Milliseconds until the link has a frame to send (ubrb_min.LinkOutput.wait_ms)."""
        return self.out.wait_ms(now)

    def counters(self) -> Dict[str, int]:
        d: Dict[str, int] = self.s.counters()
        d["foreign"] = getattr(self.t, "c_foreign", 0)
        d["refused"] = self.c_refused
        d["reopen"] = self.c_reopen
        d["io_err"] = self.c_io_err
        d["rel_kept_bytes"] = getattr(self.s, "rel_kept", 0)  # ubrb_keep's (a restarted companion)
        return d

    def close(self) -> None:
        self.t.close()


def open_link(url: str, gateway: bool, max_message: int, baud: int = 115200,
              mtu: int = ubrb_setup.LINK_DEFAULT_MTU, epoch: Optional[int] = None,
              max_slots: int = 256, key: Optional[bytes] = None) -> Tuple[L.LinkSession, LinkDriver]:
    """(session, driver) for one end of the link at `url`, sized by ubrb_min.link_sizes. The
    caller puts its end on the session: ubrb_min.LinkRosPort (gateway) or
    ros_side.link_end.LinkCompanionEnd (companion)."""
    t = open_transport(url, gateway, baud)
    mtu = mtu or ubrb_setup.LINK_DEFAULT_MTU
    z = ubrb_setup.link_sizes(max_message, t.datagram, mtu)
    window = udp_window(z["window"], z["max_frame"]) if t.datagram else 0
    s = ubrb_setup.new_link_session(None, new_epoch() if epoch is None else epoch, gateway,
                                    t.datagram, max_message, mtu, max_slots, key, new_epoch,
                                    window)
    return s, LinkDriver(t, s)


def udp_window(window: int, max_frame: int) -> int:
    """The receive window a CPython end announces on UDP: as many frames as the link allows
    (the core's 64, and UDP_WINDOW_BYTES of them) rather than the 16 every port gets from
    ubrb_min.link_sizes, which also sizes boards whose network stack queues few datagrams. A
    PC's socket queues them: UdpTransport asks for RCVBUF, and even Linux's default queue holds
    92 datagrams of 1400 bytes (12 of 8 KiB). A window is what keeps a lossy line busy while a
    gap is repaired: at 20 % loss with 0-20 ms of delay a repair takes two or three round
    trips, and 1,000 frames/s need ~60 in flight meanwhile (tests/core/test_link_sack.py)."""
    return max(window, min(UDP_WINDOW, UDP_WINDOW_BYTES // max_frame))


class LinkWatch:
    """Says what the link is doing the moment it changes (up; down, and why; the peer restarted)
    and, while it is down, what this end sees of the other: after FIRST_MS without a link, then
    every REMIND_MS, one line from the counters' growth over that time (nothing at all, bytes that
    fail the CRC, frames that fail authentication, HELLOs this end cannot take). Both programs
    call check(now) on every turn of their loop."""

    FIRST_MS = 3000
    REMIND_MS = 10000

    def __init__(self, driver: LinkDriver, url: str, peer: str, now: int,
                 down_note: str = "") -> None:
        self.d = driver
        self.url = url
        self.peer = peer              # "companion" / "gateway": who is at the other end
        self.down_note = down_note    # what this end does about a lost link
        self.up = False
        self.epoch: Optional[int] = None
        self.remind_at = now + self.FIRST_MS
        self.base = driver.counters()  # at the last change or report: what grew since is seen

    def check(self, now: int) -> None:
        s = self.d.s
        up = s.is_up()
        if up and self.up and s.peer_epoch != self.epoch:
            log.info("link: the %s restarted (new session)", self.peer)
            self.epoch = s.peer_epoch
        elif up != self.up:
            self.up = up
            c = self.d.counters()
            if up:
                new = self.epoch is not None and s.peer_epoch != self.epoch
                log.info("link up: the %s%s answers on %s", self.peer,
                         " (restarted: new session)" if new else "", self.url)
                self.epoch = s.peer_epoch
            else:
                log.warning("link down: %s%s", self.down_cause(c), self.down_note)
                self.remind_at = now + self.FIRST_MS
            self.base = c
        if not up and now >= self.remind_at:
            self.remind_at = now + self.REMIND_MS
            if self.d.broken:
                log.warning("link: waiting for %s to open (retrying every %.1f s)",
                            getattr(self.d.t, "path", self.url), REOPEN_MS / 1000)
                return
            c = self.d.counters()
            why, bad = self.seen({k: v - self.base.get(k, 0) for k, v in c.items()})
            s.hello_why = 0
            self.base = c
            (log.warning if bad else log.info)("link: waiting for the %s on %s: %s", self.peer,
                                               self.url, why)

    def down_cause(self, c: Dict[str, int]) -> str:
        """Why the link just went down, from what the counters gained while it was up."""
        if c["desync"] > self.base["desync"]:
            return ("the %s and this end disagreed about the stream (desync, or its keys ran "
                    "out): a new session starts" % self.peer)
        if c["new"] > self.base["new"]:
            other = " (or another gateway took over)" if self.peer == "gateway" else ""
            return "the %s began a new session: it restarted%s" % (self.peer, other)
        return "nothing from the %s for %.0f s" % (self.peer, L.LK_DEAD_MS / 1000)

    def seen(self, d: Dict[str, int]) -> Tuple[str, bool]:
        """What this end saw of the other while waiting, from the counters' growth `d` (and the
        session's hello_why); and whether it is a mistake to fix rather than an absent peer."""
        why = self.d.s.hello_why
        peer = self.peer
        serial = not self.d.t.datagram
        if d["proto"] and why == L.LKW_VERSION:
            return ("its HELLOs are of another link protocol version: run the same release on "
                    "both ends", True)
        if d["proto"] and why == L.LKW_ROLE:
            me = "gateway" if self.d.s.is_gateway else "companion"
            return ("HELLOs from another %s, not a %s: check --link on both ends" % (me, peer),
                    True)
        if d["proto"] and why == L.LKW_KEYED:
            return ("HELLOs from a %s with a link key, and this end has none: give both the same "
                    "--link-key" % peer, True)
        if d["auth"] and why == L.LKW_UNKEYED:
            return ("HELLOs from a %s without a link key: give both the same --link-key" % peer,
                    True)
        if d["auth"]:
            return ("%d frames failed authentication: the %s has another --link-key"
                    % (d["auth"], peer), True)
        if d["replay"]:
            return ("%d replayed frames (a valid MAC, seen before): someone re-sends captured "
                    "link traffic" % d["replay"], True)
        if d["rx_bytes"] and not d["rx_frames"]:
            hint = "check --baud on both ends, or the cable" if serial else "no link peer there?"
            return ("%d bytes received, but no frame passes the CRC: %s" % (d["rx_bytes"], hint),
                    True)
        if d.get("foreign") and not d["rx_bytes"]:
            return ("%d datagrams from other addresses only (ignored)" % d["foreign"], True)
        if not d["rx_bytes"]:
            if serial:
                return "nothing received (is the %s running, on this line?)" % peer, False
            if peer == "companion":
                return ("nothing received (is the companion running there? one paired with "
                        "another gateway does not answer)", False)
            return "nothing received (no gateway sends to this address)", False
        return ("%d frames received, %d HELLOs, no handshake yet" % (d["rx_frames"],
                                                                   d["hello_rx"]), False)
