# Thin fakes of the I/O modules the MicroPython port talks through (socket, select, time,
# machine), for tests/core/test_mp_port.py under CPython (pytest) and real MicroPython (the
# WebAssembly build, which has select but no socket and no machine module).
#
# Fakes are used only because real sockets and UARTs cannot run on these machines. They keep
# MicroPython's stream semantics: readinto(buf, n) writes at the start of buf and returns None
# when nothing is there (EAGAIN) and 0 at end of stream; write(buf, off, n) returns the count or
# None; accept() raises OSError(EAGAIN); poll readiness comes from ioctl(MP_STREAM_POLL, mask).
# Under MicroPython the fakes derive from io.IOBase, so the *real* select.poll()/ipoll() polls
# them; under CPython a small poll object calls the same ioctl().

import ubrb_min as U
from ros_side.link_end import LinkCompanionEnd

MP = U.IS_MICROPYTHON

if MP:
    import io as _io
    import select as _select

    _Base = _io.IOBase
else:
    _select = None  # type: ignore[assignment]
    _Base = object  # type: ignore[misc,assignment]

POLLIN = 1
POLLOUT = 4
POLLERR = 8
POLLHUP = 16
MP_STREAM_POLL = 3
EAGAIN = 11
EBADF = 9
EPIPE = 32
ECONNRESET = 104
ENOENT = 2


# ---------------------------------------------------------------------------------------------
# select
# ---------------------------------------------------------------------------------------------
class FakePoll:
    """MicroPython's poll object over objects with ioctl(MP_STREAM_POLL, mask) (CPython only)."""

    def __init__(self):
        self.objs = []
        self.masks = []

    def _find(self, obj):
        for i in range(len(self.objs)):
            if self.objs[i] is obj:
                return i
        return -1

    def register(self, obj, mask=POLLIN | POLLOUT):
        i = self._find(obj)
        if i >= 0:
            self.masks[i] = mask
        else:
            self.objs.append(obj)
            self.masks.append(mask)

    def modify(self, obj, mask):
        i = self._find(obj)
        if i < 0:
            raise OSError(ENOENT)
        self.masks[i] = mask

    def unregister(self, obj):
        i = self._find(obj)
        if i >= 0:
            self.objs.pop(i)
            self.masks.pop(i)

    def poll(self, timeout=-1):
        out = []
        for i in range(len(self.objs)):
            ev = self.objs[i].ioctl(MP_STREAM_POLL, self.masks[i])
            if ev:
                out.append((self.objs[i], ev))
        return out

    ipoll = poll


class FakeSelect:
    POLLIN = POLLIN
    POLLOUT = POLLOUT
    POLLERR = POLLERR
    POLLHUP = POLLHUP

    def poll(self):
        return FakePoll()


def select_module():
    """The real select module under MicroPython (it polls the IOBase fakes), a fake elsewhere."""
    return _select if MP else FakeSelect()


# ---------------------------------------------------------------------------------------------
# time: ticks that wrap at 2**30 like MicroPython's, moved by the test
# ---------------------------------------------------------------------------------------------
TICKS_MASK = (1 << 30) - 1
TICKS_HALF = 1 << 29


class FakeTime:
    def __init__(self, start=0):
        self.ticks = start & TICKS_MASK
        self.slept = 0

    def ticks_ms(self):
        return self.ticks

    def ticks_us(self):
        return (self.ticks * 1000) & TICKS_MASK

    def ticks_diff(self, a, b):
        d = a - b  # no intermediate >= 2**30: no big ints on 32-bit MicroPython
        if d >= TICKS_HALF:
            d = d - TICKS_MASK - 1
        elif d < -TICKS_HALF:
            d = d + TICKS_MASK + 1
        return d

    def ticks_add(self, a, d):
        return self.add(a, d)

    def add(self, a, d):
        if d > TICKS_MASK - a:
            return d - (TICKS_MASK - a) - 1
        return a + d

    def advance(self, ms):
        self.ticks = self.add(self.ticks, ms)

    def sleep_ms(self, ms):
        self.slept += ms
        self.advance(ms)


# ---------------------------------------------------------------------------------------------
# socket
# ---------------------------------------------------------------------------------------------
class FakeConn(_Base):
    """One end of a TCP connection; bytes written at one end are read at the other."""

    def __init__(self, cap, addr):
        self.rx = bytearray(cap)
        self.h = 0
        self.t = 0
        self.peer = None
        self.addr = addr
        self.closed = False
        self.peer_closed = False  # EOF after the buffered bytes
        self.hup = False  # poll reports POLLHUP (e.g. a reset the stack noticed)
        self.err = False  # poll reports POLLERR and reads fail with ECONNRESET
        self.reads = 0

    # socket API used by the port
    def setblocking(self, flag):
        pass

    def setsockopt(self, *args):
        pass

    def readinto(self, buf, n=-1):
        if self.closed:
            raise OSError(EBADF)
        if self.err:
            raise OSError(ECONNRESET)
        avail = self.t - self.h
        if avail == 0:
            return 0 if self.peer_closed else None
        if n < 0 or n > len(buf):
            n = len(buf)
        if n > avail:
            n = avail
        U.copy_into(buf, 0, self.rx, self.h, n)
        self.h += n
        if self.h == self.t:
            self.h = self.t = 0
        self.reads += 1
        return n

    def write(self, buf, off=0, n=-1):
        if self.closed:
            raise OSError(EBADF)
        p = self.peer
        if self.err or p is None or p.closed:
            raise OSError(ECONNRESET)
        if n < 0:
            n = len(buf) - off
        k = p._put(buf, off, n)
        return k if k else None

    def ioctl(self, req, arg):
        if req != MP_STREAM_POLL:
            return 0
        ev = 0
        if self.t > self.h or self.peer_closed:
            ev |= POLLIN
        p = self.peer
        if p is not None and not p.closed and p.room():
            ev |= POLLOUT
        if self.hup:
            ev |= POLLHUP
        if self.err:
            ev |= POLLERR
        return ev & (arg | POLLHUP | POLLERR)

    def close(self):
        if not self.closed:
            self.closed = True
            if self.peer is not None:
                self.peer.peer_closed = True

    # the buffer behind the socket
    def room(self):
        return len(self.rx) - (self.t - self.h)

    def _put(self, src, off, n):
        if self.t + n > len(self.rx) and self.h > 0:
            U.copy_into(self.rx, 0, self.rx, self.h, self.t - self.h)
            self.t -= self.h
            self.h = 0
        k = len(self.rx) - self.t
        if k > n:
            k = n
        U.copy_into(self.rx, self.t, src, off, k)
        self.t += k
        return k

    # test-side helpers (the client end)
    def send(self, data):
        k = self.write(data, 0, len(data)) or 0
        assert k == len(data), "fake socket buffer full"

    def take(self):
        """Everything received so far, as bytes."""
        d = bytes(self.rx[self.h:self.t])
        self.h = self.t = 0
        return d

    def drop(self):
        """Discard what was received without allocating (allocation tests)."""
        n = self.t - self.h
        self.h = self.t = 0
        return n


class FakeListener(_Base):
    def __init__(self, net):
        self.net = net
        self.pending = []
        self.addr = None
        self.closed = False

    def setsockopt(self, *args):
        pass

    def bind(self, addr):
        self.addr = addr
        self.net.listeners[addr[1]] = self

    def listen(self, backlog):
        pass

    def setblocking(self, flag):
        pass

    def accept(self):
        if not self.pending:
            raise OSError(EAGAIN)
        c = self.pending.pop(0)
        return c, c.addr

    def ioctl(self, req, arg):
        if req != MP_STREAM_POLL:
            return 0
        return (POLLIN if self.pending else 0) & arg

    def close(self):
        self.closed = True
        if self.addr is not None and self.net.listeners.get(self.addr[1]) is self:
            del self.net.listeners[self.addr[1]]


class FakeUdp(_Base):
    """A UDP socket; connect() filters senders like the stack does. recv() returns the stored
    bytes object of the datagram (a real recv allocates one; the fake does not)."""

    def __init__(self, net, depth=64):
        self.net = net
        self.local = None
        self.peer = None
        self.q = [None] * depth
        self.qh = 0
        self.qn = 0
        self.foreign = 0
        self.overflow = 0
        self.fail_writes = 0  # > 0: the next writes raise OSError(ENOMEM), like lwIP out of pbufs
        self.closed = False

    def setblocking(self, flag):
        pass

    def bind(self, addr):
        if addr[1] == 0:
            self.net.next_port += 1
            addr = ("10.0.0.1", self.net.next_port)
        self.local = addr
        self.net.udp[addr] = self

    def connect(self, addr):
        if self.local is None:
            self.bind(("0.0.0.0", 0))
        self.peer = addr

    def deliver(self, data, frm):
        if self.peer is not None and frm != self.peer:
            self.foreign += 1
            return
        if self.qn == len(self.q):
            self.overflow += 1  # a full receive queue drops the datagram, as lwIP does
            return
        self.q[(self.qh + self.qn) % len(self.q)] = data
        self.qn += 1

    def recv(self, n):
        if self.qn == 0:
            raise OSError(EAGAIN)
        d = self.q[self.qh]
        self.q[self.qh] = None
        self.qh = (self.qh + 1) % len(self.q)
        self.qn -= 1
        return d if len(d) <= n else d[:n]

    def write(self, buf, off=0, n=-1):
        if n < 0:
            n = len(buf) - off
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise OSError(12)
        ep = self.net.udp.get(self.peer)
        if ep is not None:
            ep.deliver_from(buf, off, n, self.local)
        return n

    def ioctl(self, req, arg):
        if req != MP_STREAM_POLL:
            return 0
        return ((POLLIN if self.qn else 0) | POLLOUT) & arg

    def close(self):
        self.closed = True


class UdpPeer:
    """The companion's UDP socket (test side): datagrams are copied into preallocated slots."""

    def __init__(self, net, addr, mtu=1400, depth=64):
        self.net = net
        self.addr = addr
        self.slots = [bytearray(mtu) for _ in range(depth)]
        self.lens = [0] * depth
        self.qh = 0
        self.qn = 0
        self.last_from = None
        self.received = 0
        self.drop_next = 0  # > 0: lose that many datagrams towards the companion
        net.udp[addr] = self

    def deliver_from(self, buf, off, n, frm):
        if self.drop_next > 0:
            self.drop_next -= 1
            return
        self.last_from = frm
        self.received += 1
        if self.qn == len(self.slots):
            return
        i = (self.qh + self.qn) % len(self.slots)
        U.copy_into(self.slots[i], 0, buf, off, n)
        self.lens[i] = n
        self.qn += 1

    def pop(self):
        """(slot buffer, length) of the oldest datagram; consume with done()."""
        return self.slots[self.qh], self.lens[self.qh]

    def done(self):
        self.qh = (self.qh + 1) % len(self.slots)
        self.qn -= 1

    def send(self, buf, off, n, to=None):
        to = to if to is not None else self.last_from
        ep = self.net.udp.get(to)
        if ep is not None:
            ep.deliver(bytes(buf[off:off + n]), self.addr)


class SocketModule:
    AF_INET = 2
    SOCK_STREAM = 1
    SOCK_DGRAM = 2
    SOL_SOCKET = 1
    SO_REUSEADDR = 4
    IPPROTO_TCP = 6
    TCP_NODELAY = 1

    def __init__(self, net):
        self.net = net

    def getaddrinfo(self, host, port, *args):
        return [(self.AF_INET, self.SOCK_STREAM, 0, "", (host, port))]

    def socket(self, af=2, type=1, *args):
        if type == self.SOCK_DGRAM:
            return FakeUdp(self.net)
        return FakeListener(self.net)


class Net:
    """The fake network: TCP listeners by port, UDP endpoints by address."""

    def __init__(self):
        self.listeners = {}
        self.udp = {}
        self.next_port = 50000
        self.socket = SocketModule(self)
        self.clients = 0

    def connect(self, port, cap=8192):
        """A client connects to the listener on `port`; returns the client's end."""
        self.clients += 1
        client = FakeConn(cap, ("10.0.0.%d" % (100 + self.clients), 40000 + self.clients))
        server = FakeConn(cap, client.addr)
        client.peer = server
        server.peer = client
        self.listeners[port].pending.append(server)
        return client


# ---------------------------------------------------------------------------------------------
# machine.UART: a byte pipe to the test (the companion's end of the cable)
# ---------------------------------------------------------------------------------------------
class FakeUart(_Base):
    def __init__(self, uart_id, kw, cap=16384):
        self.id = uart_id
        self.kw = kw
        self.rx = FakeConn(cap, None)  # bytes from the companion
        self.wire = bytearray(cap)  # bytes the gateway wrote, not yet taken by the test
        self.wn = 0
        self.written = 0

    def readinto(self, buf, n=-1):
        return self.rx.readinto(buf, n)  # None when empty (timeout=0), never 0

    def write(self, buf, off=0, n=-1):
        if n < 0:
            n = len(buf) - off
        k = len(self.wire) - self.wn
        if k > n:
            k = n
        U.copy_into(self.wire, self.wn, buf, off, k)
        self.wn += k
        self.written += k
        return k

    def ioctl(self, req, arg):
        if req != MP_STREAM_POLL:
            return 0
        return ((POLLIN if self.rx.t > self.rx.h else 0) | POLLOUT) & arg

    def deinit(self):
        pass

    # test side
    def inject(self, buf, off, n):
        return self.rx._put(buf, off, n)


class FakeMachine:
    def __init__(self):
        self.uarts = {}

    def UART(self, uart_id, **kw):
        u = FakeUart(uart_id, kw)
        self.uarts[uart_id] = u
        return u


class FakeWLAN:
    def __init__(self, net_mod, connect_after_ms=300):
        self.m = net_mod
        self.on = False
        self.joined = None
        self.cfg = {}
        self.t_connect = None
        self.after = connect_after_ms

    def active(self, on=None):
        if on is not None:
            self.on = on
        return self.on

    def config(self, **kw):
        self.cfg.update(kw)

    def connect(self, ssid, password):
        self.joined = (ssid, password)
        self.t_connect = self.m.time.ticks_ms()

    def isconnected(self):
        t = self.m.time
        return self.t_connect is not None and t.ticks_diff(t.ticks_ms(), self.t_connect) >= self.after

    def ifconfig(self):
        return ("10.0.0.1", "255.255.255.0", "10.0.0.254", "10.0.0.254")


class FakeNetwork:
    STA_IF = 0

    def __init__(self, time_mod):
        self.time = time_mod
        self.wlan = None

    def WLAN(self, iface):
        if self.wlan is None:
            self.wlan = FakeWLAN(self)
        return self.wlan


# ---------------------------------------------------------------------------------------------
# The companion end of the link: the real LinkSession + LinkCompanionEnd, a scripted ROS side
# ---------------------------------------------------------------------------------------------
class ScriptedCompanion:
    """RosPort on the companion side: records calls; answers registrations at once."""

    def __init__(self, distro="humble", max_message=4096):
        self.sink = None
        self.distro = distro
        self.calls = []
        self.record = True
        self.last = bytearray(max_message)
        self.last_len = 0
        self.published = 0
        self.stats = None

    def advertise(self, slot, topic, type_, qos):
        self.calls.append(("advertise", slot, topic, type_))
        self.sink.ros_result("pub", slot, None, "")

    def unadvertise(self, slot):
        self.calls.append(("unadvertise", slot))

    def subscribe(self, slot, topic, type_, qos):
        self.calls.append(("subscribe", slot, topic, type_))
        self.sink.ros_result("sub", slot, None, "")

    def unsubscribe(self, slot):
        self.calls.append(("unsubscribe", slot))

    def publish(self, slot, buf, off, n, reliable):
        U.copy_into(self.last, 0, buf, off, n)
        self.last_len = n
        self.published += 1
        if self.record:
            self.calls.append(("publish", slot, bytes(self.last[:n]), reliable))

    def reset(self):
        self.calls.append(("reset",))

    def gateway_stats(self, d):
        self.stats = d

    def names(self):
        return [c[0] for c in self.calls]


class UdpCompanion:
    """The companion process, reduced to its link end, on the fake network."""

    def __init__(self, net, addr, epoch=0x1234567, mtu=1400, max_message=4096, key=None):
        self.sock = UdpPeer(net, addr, mtu)
        self.ros = ScriptedCompanion(max_message=max_message)
        self.s = U.LinkSession(None, epoch, False, True, mtu, max_message, 16, 65536, 32768, 256,
                               key)
        self.end = LinkCompanionEnd(self.s, self.ros)
        self.ros.sink = self.end

    def pump(self, now):
        sock = self.sock
        while sock.qn:
            b, n = sock.pop()
            self.s.feed(b, 0, n, now)
            sock.done()
        self.s.tick(now)
        for _ in range(64):
            n = self.s.poll_tx(now)
            if n == 0:
                break
            sock.send(self.s.tx_buf, 0, n)


class UartCompanion:
    """The companion at the other end of a FakeUart (stream mode)."""

    def __init__(self, uart, epoch=0x2345678, max_message=4096, key=None):
        self.uart = uart
        self.ros = ScriptedCompanion(max_message=max_message)
        self.s = U.LinkSession(None, epoch, False, False, 1088, max_message, 8, 65536, 32768, 256,
                               key)
        self.end = LinkCompanionEnd(self.s, self.ros)
        self.ros.sink = self.end

    def pump(self, now):
        u = self.uart
        if u.wn:
            self.s.feed(u.wire, 0, u.wn, now)
            u.wn = 0
        self.s.tick(now)
        for _ in range(64):
            n = self.s.poll_tx(now)
            if n == 0:
                break
            u.inject(self.s.tx_buf, 0, n)


# ---------------------------------------------------------------------------------------------
# Loading the port
# ---------------------------------------------------------------------------------------------
def load_port():
    """(gateway module, link module) of ports/micropython."""
    from ports.micropython import gateway, link

    return gateway, link


def load_loop():
    """The loop module of ports/micropython (GatewayLoop, IO, Clock, Log)."""
    from ports.micropython import loop

    return loop
