# The board side of the 32-bit heap leg (tests/gateway/test_heap_ci_wasm32.py), run inside the
# board's MicroPython instance by tests/mp/board_heap.mjs (the npm WebAssembly build, 32-bit).
#
# The board is the deployed layout of tools/deploy.py (the .mpy files, main.py's run.main,
# config.py) on the thin socket/select/time fakes of tests/core/mp_fakes.py; the world (the
# companion's real LinkSession and the two clients) runs in the test's CPython process, and
# bytes cross between them through two buffers of this module that the runner reads and writes
# in the instance's memory (uctypes.addressof): no object of the world lives in this heap.
#
# What this module and the fakes take in the heap is not the board's: it is all allocated before
# the board's code loads, and then a ballast bytearray is allocated so that exactly as many bytes
# are free as in a fresh instance of the board heap (board_heap.mjs measures that one); the
# modules the fakes imported (the rig's own copy of the core) are dropped from sys.modules first,
# so the board loads and pays for its own.
#
# This build collects only when control returns to JavaScript (MICROPY_GC_SPLIT_HEAP_AUTO:
# inside a call gc.collect() only marks a collection pending), so every phase is one call from
# the runner: boot() is gateway.boot, the first half of run.main, with run.main's unloads of the
# start-up modules; start() is run.main itself, unmodified, whose gateway.boot is answered with
# boot()'s result (a board collects at run.main's heap() right after those unloads: here the
# collection runs between the two calls); step() is one GatewayLoop.step, as serve() calls it,
# with the world's bytes in and out; stop() runs GatewayLoop.run's own shut-down and counters.
import gc
import sys

import uctypes  # type: ignore[import-not-found]

import mp_fakes as F

SPLIT = 128 * 1024 * 1024  # gc.mem_free() adds the build's gc_get_max_new_split() (128 MiB)
COMPANION = ("127.0.0.1", 8269)
PORT = 8268
CLIENTS = 2
CAP = 8192  # each direction of a fake TCP connection (the stack's buffers, not the board's)
BOX = 32768  # the inbox and the outbox the runner reads and writes
K_UDP = 0  # record kinds in both boxes: a datagram to/from the companion
K_TCP = 1  # bytes to/from client idx
K_CONNECT = 2  # client idx connects (inbox only)

inbox = bytearray(BOX)
outbox = bytearray(BOX)
mv_in = memoryview(inbox)
slots = [None, None, None, 0, 0]  # boot()'s result, the loop, its real run(), outbox fill, errors
ballast = [None]


def heap_free():
    return gc.mem_free() - SPLIT


class IO:
    """ports.micropython.loop.IO's attributes (the rig does not load the port's modules)."""

    def __init__(self, socket, select, time):
        self.socket = socket
        self.select = select
        self.time = time
        self.machine = None
        self.network = None
        self.config = None
        # the board heap's free bytes: what gc.mem_free() says, less the build's growth reserve
        # (a heap of exactly H32 cannot grow)
        self.mem_free = heap_free


class CompanionAddress:
    """What the gateway's UDP socket sends to: each datagram goes into the outbox."""

    def deliver_from(self, buf, off, n, frm):
        put(K_UDP, 0, buf, off, n)


class StartedGateway:
    """Stands for ports.micropython.gateway when start() runs run.main: its boot() hands over
    boot()'s result (the rig keeps no reference to it afterwards, as run.main keeps none)."""

    def boot(self, argv, io):
        first = slots[0]
        slots[0] = None
        return first


net = F.Net()
ftime = F.FakeTime(0)
io = IO(net.socket, F.select_module(), ftime)
net.udp[COMPANION] = CompanionAddress()
clients = []
servers = []
for i in range(CLIENTS):
    addr = ("10.0.0.%d" % (101 + i), 40001 + i)
    c = F.FakeConn(CAP, addr)
    s = F.FakeConn(CAP, addr)
    c.peer = s
    s.peer = c
    clients.append(c)
    servers.append(s)
stub = StartedGateway()
argv = []  # type: list
gw_udp = [None]  # the gateway's UDP socket (a FakeUdp), once the link is built


def put(kind, idx, buf, off, n):
    o = slots[3]
    if o + 4 + n > BOX:
        slots[4] += 1
        return
    outbox[o] = kind
    outbox[o + 1] = idx
    outbox[o + 2] = n & 255
    outbox[o + 3] = n >> 8
    F.U.copy_into(outbox, o + 4, buf, off, n)
    slots[3] = o + 4 + n


def address(which):
    return uctypes.addressof(inbox if which == 0 else outbox)


def heap(which):
    """0: bytes free, 1: bytes allocated, 2: the heap's total (free + allocated)."""
    free = heap_free()
    if which == 0:
        return free
    if which == 1:
        return gc.mem_alloc()
    return free + gc.mem_alloc()


def collect():
    gc.collect()  # runs when this call returns to JavaScript
    return 0


def set_argv(n):
    """The gateway's flags: n strings the runner put in the inbox, NUL-separated."""
    o = 0
    for _ in range(n):
        e = o
        while inbox[e]:
            e += 1
        argv.append(str(inbox[o:e], "ascii"))
        o = e + 1
    return len(argv)


def forget_modules():
    """Drop the rig's copies of the board's modules from sys.modules (the fakes keep theirs):
    the board imports and pays for its own."""
    for name in list(sys.modules):
        if name.startswith("ubrb") or name == "ports" or name.startswith("ports."):
            del sys.modules[name]
    gc.collect()
    return 0


def fill(target_free):
    """The ballast: once collected, exactly `target_free` bytes are free (to 16 bytes), as in a
    fresh instance of the board heap. Its size, or -1 when the rig left less than that."""
    free = gc.mem_free() - SPLIT
    n = (free - target_free - 16) & ~15  # a bytearray is a 16-byte object + its data blocks
    if n < 16:
        return -1
    ballast[0] = bytearray(n)
    return n


def boot():
    """gateway.boot, the first half of run.main, then run.main's unloads; GatewayLoop.run is
    replaced by capture() for start(). Returns -1, or boot()'s exit status when it cannot start."""
    config = __import__("config")  # gateway.default_io() on a board
    io.config = config
    config = None
    from ports.micropython import run
    from ports.micropython import gateway

    first = gateway.boot(argv, io)
    gateway = None
    for name in run.START_UP_MODULES + ("config",):
        run.unload(name)
    run = None
    if isinstance(first, int):
        io.config = None
        return first
    slots[0] = first
    first = None
    cls = sys.modules["ports.micropython.loop"].GatewayLoop
    slots[2] = cls.run
    cls.run = capture
    collect()
    return -1


def capture(loop):
    """GatewayLoop.run for start(): run.main has printed its memory line; serving is step()."""
    slots[1] = loop
    return 0


def start():
    """run.main, unmodified, with boot()'s result; its exit status."""
    sys.modules["ports.micropython.gateway"] = stub
    sys.modules["ports.micropython"].gateway = stub
    run = sys.modules["ports.micropython.run"]
    status = run.main(argv, io)
    run = None
    sys.modules["ports.micropython.loop"].GatewayLoop.run = slots[2]  # the class as built
    for addr in net.udp:
        if addr != COMPANION:
            gw_udp[0] = net.udp[addr]
    collect()
    return status


def step(dt, n_in):
    """The world's n_in inbox records in, `dt` ms of time, one GatewayLoop.step(), and what the
    gateway wrote out; the outbox's length (or -1 - records that did not fit)."""
    slots[3] = 0
    o = 0
    for _ in range(n_in):
        kind = inbox[o]
        idx = inbox[o + 1]
        n = inbox[o + 2] | (inbox[o + 3] << 8)
        o += 4
        if kind == K_UDP:
            gw_udp[0].deliver(bytes(mv_in[o:o + n]), COMPANION)  # as a real recv() allocates
        elif kind == K_TCP:
            if clients[idx].write(inbox, o, n) != n:
                slots[4] += 1
        elif kind == K_CONNECT:
            net.listeners[PORT].pending.append(servers[idx])
        o += n
    ftime.advance(dt)
    slots[1].step()
    for i in range(CLIENTS):
        c = clients[i]
        n = c.t - c.h
        if n:
            put(K_TCP, i, c.rx, c.h, n)
            c.h = c.t = 0
    gc.collect()  # runs when this call returns to JavaScript
    if slots[4]:
        return -1 - slots[4]
    return slots[3]


def stop():
    """GatewayLoop.run as on Ctrl-C: serve() ends at once (running is False), closes every
    socket and the link, then the heap at stop and the counters are printed."""
    loop = slots[1]
    slots[1] = None
    loop.running = False
    status = slots[2](loop)
    loop = None
    collect()
    return status
