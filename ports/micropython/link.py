# MicroPython transports for the gateway <-> companion link (docs/LINK.md), and the driver that
# moves bytes between a transport and the sans-IO LinkSession of ubrb_min.
#
# The counterpart of ports/cpython/ubrb_host/link.py, gateway end only. The link grammar, the
# session's buffer sizes, and what to write next with the pacing are the core's
# (ubrb_min.parse_link_url, link_sizes, LinkOutput), shared with the CPython runtime; this file
# keeps the I/O calls.
#
#   --link udp://HOST:PORT   a UDP socket *connected* to the companion at HOST:PORT (from an
#                            ephemeral local port). connect() makes the IP stack drop datagrams
#                            from anyone else (what the CPython driver checks by hand) and lets
#                            frames go out with write(buf, 0, n), which allocates nothing.
#   --link serial:ID         machine.UART(ID) (uart:ID is the same) at --baud, optional --tx/--rx pins; non-blocking
#                            (timeout=0). Writes are paced to the line rate (baud/10 bytes/s).
#
# Hot-path notes (MicroPython):
#   * UART: readinto(rbuf) into one buffer allocated here (machine.UART binds readinto to the
#     stream's read-once form, extmod/machine_uart.c), write(tx_buf, off, n): no allocation.
#   * UDP receive uses recv(max_frame): one bytes object per datagram, the only allocation of a
#     relay through this port (16 bytes + the data rounded up to 16 on a 32-bit port; 48 + that
#     on the 64-bit unix port: tests/link/test_link_alloc.py). A one-entry poll says whether a
#     datagram waits, so no recv() ends in an OSError(EAGAIN) (an exception object).
#     No stock port reads one datagram into a buffer of ours (MicroPython 1.29 sources):
#     - sockets have no recv_into/recvfrom_into; recv() makes the object (ports/unix/modsocket.c
#       socket_recv: m_new + mp_obj_new_str_of_type; ports/esp32/modsocket.c _socket_recvfrom
#       and extmod/modlwip.c lwip_socket_recv_common, the RP2040's: vstr_init_len of the size
#       asked, then mp_obj_new_bytes_from_vstr);
#     - readinto() is mp_stream_readinto_obj on every socket type (unix modsocket.c, esp32
#       modsocket.c, modlwip.c, extmod/modsocket.c): py/stream.c mp_stream_rw without
#       MP_STREAM_RW_ONCE, which reads again while room is left and stops only at EAGAIN, an
#       error or a 0-byte read. Several queued datagrams are concatenated, and the one that no
#       longer fits is cut by the stack and its rest discarded (modlwip.c lwip_raw_udp_receive:
#       pbuf_copy_partial of at most the room, then pbuf_free; read(2) on the unix port). The
#       frames are self-delimiting, so the concatenation itself would parse; the cut one is a
#       lost frame, and a room that no cut can reach would have to hold whatever the stack
#       queues while the loop runs: modlwip's 4-slot queue is refilled between its reads, an
#       ESP32's lwIP task fills its mailbox concurrently, Linux queues ~200 KiB. Under
#       load (acknowledgements between full frames) cuts would be the rule, each a go-back-N
#       of the whole window. The read-once readinto1 exists (py/stream.c) but no socket type
#       binds it.
#     One short-lived object per datagram is the lesser evil.
#
# Transports expose: datagram, stream (the object to register with select.poll, or None),
# recv() -> bytes or None (datagram), readinto(buf) -> n (stream; 0: nothing now),
# write(buf, off, n) -> n written (0: try later), close().
import ubrb_min as L
from ubrb_min import const  # micropython.const on MicroPython (inlined), identity on CPython

_MAX_READS = const(16)  # reads per wake-up, so a flood on the link cannot starve the clients


def new_epoch(time_mod=None):
    """Random per start, 1 .. 2**30-1 (a small int on MicroPython)."""
    v = 0
    try:
        import os

        b = os.urandom(4)
        v = b[0] | (b[1] << 8) | (b[2] << 16) | ((b[3] & 0x3F) << 24)
    except (ImportError, AttributeError, OSError, NotImplementedError):
        try:
            import random

            v = random.getrandbits(30)
        except (ImportError, AttributeError):
            v = 0
        if time_mod is not None:  # mix in the boot time, in case the PRNG is unseeded
            v ^= time_mod.ticks_us() & 0x3FFFFFFF
    return (v & 0x3FFFFFFF) or 1


class UdpTransport:
    datagram = True

    def __init__(self, socket_mod, select_mod, host, port, mtu):
        addr = socket_mod.getaddrinfo(host, port)[0][-1]
        s = socket_mod.socket(socket_mod.AF_INET, socket_mod.SOCK_DGRAM)
        try:  # an ephemeral port; connect() would also pick one. An address from getaddrinfo:
            # the unix port takes no (host, port) tuples.
            s.bind(socket_mod.getaddrinfo("0.0.0.0", 0)[0][-1])
        except OSError:
            pass
        s.connect(addr)
        s.setblocking(False)
        self.sock = s
        self.stream = s
        self.peer = addr
        self.where = "udp://%s:%d" % (host, port)
        self.mtu = mtu
        self.c_io_err = 0
        # recv() on an empty non-blocking socket raises OSError(EAGAIN): an exception object
        # (64 bytes) at the end of every read burst. A one-entry poll asked with timeout 0
        # (ipoll: allocation-free) says whether a datagram is waiting instead.
        self.rpoll = select_mod.poll()
        self.rpoll.register(s, select_mod.POLLIN)
        self._ripoll = getattr(self.rpoll, "ipoll", None) or self.rpoll.poll
        self.POLLIN = select_mod.POLLIN

    def recv(self):
        """The next datagram (a new bytes object), or None."""
        ready = False
        for ev in self._ripoll(0):
            ready = (ev[1] & self.POLLIN) != 0
        if not ready:
            return None
        try:
            return self.sock.recv(self.mtu)
        except OSError:  # ECONNREFUSED after an ICMP unreachable...: UDP is lossy anyway
            return None

    def write(self, buf, off, n):
        try:
            self.sock.write(buf, off, n)
        except OSError:  # ENOMEM (lwIP out of pbufs), EHOSTUNREACH...: a lost datagram
            self.c_io_err += 1
        return n  # a datagram is sent whole or not at all: never retried as a partial

    def close(self):
        try:
            self.rpoll.unregister(self.sock)
        except (OSError, KeyError, ValueError):
            pass
        self.sock.close()


class LinkDriver:
    """Moves bytes between a transport and a LinkSession; paces serial writes to the line rate.

    The loop calls on_readable(now) when poll() reports the transport's stream readable (or every
    step when `polled`), then tick(now) and flush(now) once per step.
    """

    def __init__(self, transport, session, pace_bps=-1):
        self.t = transport
        self.s = session
        self.stream = transport.stream
        self.polled = False  # set by the loop when the stream cannot be registered with poll
        if pace_bps < 0:
            pace_bps = 0 if transport.datagram else transport.baud // 10
        self.out = L.LinkOutput(session, pace_bps)  # the frame in progress and the pacing
        self.rbuf = None if transport.datagram else bytearray(512)

    def rebase(self, d):
        self.out.rebase(d)

    def on_readable(self, now):
        t = self.t
        s = self.s
        if t.datagram:
            for _ in range(_MAX_READS):
                d = t.recv()
                if d is None:
                    return
                s.feed(d, 0, len(d), now)
        else:
            buf = self.rbuf
            for _ in range(_MAX_READS):
                n = t.readinto(buf)
                if n <= 0:
                    return
                s.feed(buf, 0, n, now)

    def flush(self, now):
        t = self.t
        buf = self.s.tx_buf
        out = self.out
        out.start(now)
        for _ in range(64):
            n = out.next(now)
            if n == 0 or not out.wrote(t.write(buf, out.off, n)):
                return

    def tick(self, now):
        self.s.tick(now)

    def wants_write(self):
        return self.out.n > 0

    def counters(self):
        d = self.s.counters()
        d["io_err"] = self.t.c_io_err
        return d

    def close(self):
        self.t.close()
