# The MicroPython gateway's loop (the counterpart of ports/cpython/ubrb_host/loop.py): a
# non-blocking TCP listener, the client sockets and the link on one select.poll(), and the clock.
# Everything protocol-shaped, and every decision both runtimes make alike (who is accepted, what
# to wait for on a socket, when a closing client is done), is in the core; this module keeps the
# MicroPython I/O calls:
#
#   * one select.poll() for the listener, the clients and the link; events are read with ipoll()
#     (allocation-free, callee-owned tuples) and handled after the iteration, so the poll set is
#     never modified while it is being iterated;
#   * readinto() straight into each session's decoder buffer: at decoder.fill == 0 (the usual
#     case: every frame of the last read was whole) into decoder.buf itself, which allocates
#     nothing; otherwise into a slice of a memoryview made once per session (MicroPython's
#     readinto(buf, n) writes at the start of buf, and a memoryview slice is one 16-byte heap
#     object on 32-bit ports: one per read that continues a partial frame, measured in
#     tests/core/test_mp_port.py);
#   * write(buf, off, n) straight from each send queue (a stream method of every MicroPython
#     socket: no slice, no allocation);
#   * time.ticks_ms()/ticks_diff() turned into a non-wrapping millisecond clock for the core.
#
# The I/O modules (socket, select, time, machine, network, config) are looked up in an `IO`
# object, built from the real modules by gateway.default_io() at start-up; tests pass fakes
# (tests/core/mp_fakes.py).
import gc

import ubrb_min as core
from ubrb_min import const  # micropython.const on MicroPython (inlined), identity on CPython

_POLL_MS = const(50)  # longest poll() wait: the core's and the link's timers need tick() this often
STATS_MS = const(1000)  # gateway counters to the companion (its /diagnostics); 0: never
_MAX_READS = const(4)  # reads per client per wake-up, so one busy client cannot starve the others
_MAX_WRITES = const(4)
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class IO:
    """The modules the port talks to the world through; None where the port has none."""

    def __init__(self, socket=None, select=None, time=None, machine=None, network=None,
                 config=None, mem_free=None):
        self.socket = socket
        self.select = select
        self.time = time
        self.machine = machine
        self.network = network
        self.config = config  # a module/object with WIFI_SSID, WIFI_PASSWORD, GATEWAY (optional)
        # the heap's free bytes, for sizing at start-up: gc.mem_free when None (a test rig whose
        # heap is not what gc reports gives its own)
        self.mem_free = mem_free


# The clock is moved back by REBASE_STEP whenever it reaches REBASE_AT: times stay below 2**30.
REBASE_AT = const(1 << 29)
REBASE_STEP = const(1 << 28)


class Clock:
    """time.ticks_ms() wraps (at 2**30 ms on most ports, ~12.4 days); the core wants an int of
    milliseconds that never goes back. Starts at 0; GatewayLoop.rebase keeps it below 2**30 so
    it stays a small int (no heap). Must be read at least every 2**29 ms (ticks_diff's range)."""

    def __init__(self, time_mod):
        self.t = time_mod
        self.last = time_mod.ticks_ms()
        self.now = 0

    def ms(self):
        t = self.t.ticks_ms()
        d = self.t.ticks_diff(t, self.last)
        if d > 0:
            self.now += d
            self.last = t
        return self.now


class Log:
    """print()-based logger with a threshold; also the core's log callable(level, message)."""

    def __init__(self, level="info", out=None):
        self.threshold = LEVELS.get(level, 20)
        self.out = out

    def __call__(self, level, msg):
        if LEVELS.get(level, 20) >= self.threshold:
            if "\n" in msg or "\r" in msg:   # one record, one line: nothing forges a line
                msg = msg.replace("\n", "\\n").replace("\r", "\\r")
            if self.out is not None:
                self.out(level, msg)
            else:
                print("%s %s" % (level.upper(), msg))


def accepted_peer(addr):
    """An accept()ed peer as Gateway.accept takes it: (host, port), as lwIP ports and CPython
    give it; the unix port's raw IPv4 sockaddr (family(2) port(2, big-endian) IPv4(4) ...) made
    one. Other raw sockaddrs stay as they are (the core reads those too). Not text: the core
    matches the host against --allow-clients and counts clients per host."""
    if not isinstance(addr, tuple) and len(addr) >= 8 and addr[0] == 2:  # AF_INET, little-endian
        return ("%d.%d.%d.%d" % (addr[4], addr[5], addr[6], addr[7]), (addr[2] << 8) | addr[3])
    return addr


class GatewayLoop:
    """The poll loop: a listening socket, client sockets, and optionally a link driver."""

    def __init__(self, gw, listen, io, link=None, ros=None, clock=None, log=None,
                 hold_for_ros_ms=core.LK_DEAD_MS + 4 * core.LK_HELLO_MS, stats_ms=STATS_MS,
                 backlog=2):
        # hold_for_ros_ms: at start-up clients' reliable PUBLISHes wait this long for the link
        # (Gateway.hold_for_ros; a restarted gateway's companion answers once its old session's
        # dead timer ran out, then at its next HELLO). The clients are served from the start.
        self.gw = gw
        gw.write_now = self._write_now  # a reliable MESSAGE finding a queue full: write, retry
        self.link = link  # LinkDriver or None
        self.ros = ros  # LinkRosPort (send_stats) or None
        self.io = io  # gateway.default_io(), or the tests' fakes
        self.log = log if log is not None else Log()
        self.faults = core.RateLog(self.log)
        sk = self.io.socket
        sel = self.io.select
        self.POLLIN = sel.POLLIN
        self.POLLOUT = sel.POLLOUT
        self.POLLBAD = sel.POLLHUP | sel.POLLERR
        self.clock = clock if clock is not None else Clock(self.io.time)
        self.poll = sel.poll()
        self._ipoll = getattr(self.poll, "ipoll", None) or self.poll.poll  # bound once
        addr = sk.getaddrinfo(listen[0], listen[1])[0][-1]
        ls = sk.socket(sk.AF_INET, sk.SOCK_STREAM)
        ls.setsockopt(sk.SOL_SOCKET, sk.SO_REUSEADDR, 1)
        ls.bind(addr)
        ls.listen(backlog)
        ls.setblocking(False)
        self.lsock = ls
        self.listen_addr = listen
        self.nodelay = getattr(sk, "TCP_NODELAY", None)
        self.ipproto_tcp = getattr(sk, "IPPROTO_TCP", 6)
        n = len(gw.clients)
        self.socks = [None] * n
        self.mask = [0] * n
        # One memoryview per session, made now: readinto(mv[fill:], n) when a frame is partial.
        self.mvs = [memoryview(c.decoder.buf) for c in gw.clients]
        # Events collected during ipoll(), handled after it: who (0 listener, 1 link, 2+ci) and what.
        self.ev_who = [0] * (n + 2)
        self.ev_bits = [0] * (n + 2)
        self.scratch = bytearray(64)  # where a refused connection's input is read and dropped
        self.running = True
        now = self.clock.ms()
        self.poll.register(ls, self.POLLIN)  # HELLO deadlines run from the connect
        if link is not None:
            gw.hold_for_ros(now + hold_for_ros_ms)
        self.stats_ms = stats_ms
        self.stats_at = now + stats_ms
        self.poll_ms = _POLL_MS  # longest wait in poll(); tests on a fake clock set 0
        self.link_stream = None
        if link is not None and link.stream is not None:
            try:
                self.poll.register(link.stream, self.POLLIN)
                self.link_stream = link.stream
            except (OSError, TypeError, ValueError):
                link.polled = True  # no poll support on this object: read it every step
        elif link is not None:
            link.polled = True

    # -- the loop ---------------------------------------------------------------------------
    def stop(self):
        self.running = False

    def serve(self, until=None):
        """Run until stop(), until() returns True, or Ctrl-C (KeyboardInterrupt); then close."""
        try:
            while self.running and not (until is not None and until()):
                self.step()
        except KeyboardInterrupt:
            self.log("info", "interrupted")
        finally:
            self.close()

    def run(self):
        """serve() until Ctrl-C, then log the counters; the exit status (0)."""
        self.serve()
        gc.collect()  # the buffers are still held: make room for the counters' text
        try:
            # against "heap after start-up": what serving left behind (a leak would show here)
            self.log("info", "heap at stop: %d bytes used, %d free" % (gc.mem_alloc(), gc.mem_free()))
        except AttributeError:  # CPython (the tests of this port): no heap figures
            pass
        try:
            self.log("info", "stopped; counters: %s" % self.gw.counters())
            if self.link is not None:
                self.log("info", "link counters: %s" % self.link.counters())
        except MemoryError:
            self.log("info", "stopped (no heap left to print the counters)")
        return 0

    def step(self):
        """One poll round. Never raises: an unexpected exception in one event costs that event
        (see _contained); one in the timers or the output costs the rest of this round."""
        try:
            self._step()
        except Exception as e:
            self._contained(e, -1, self.clock.ms())

    def _step(self):
        gw = self.gw
        link = self.link
        now = self.clock.ms()
        if now >= REBASE_AT:
            now = self.rebase(REBASE_STEP)
        timeout = gw.next_deadline(now)
        if timeout > self.poll_ms:
            timeout = self.poll_ms
        if link is not None:
            if link.wants_write() or link.polled:
                timeout = 5 if timeout > 5 else timeout
            w = link.out.wait_ms(now)  # wake when the next frame may go
            if w and timeout > w:
                timeout = w
        socks = self.socks
        n = len(socks)
        backlog = False
        for ci in range(n):
            if socks[ci] is not None and gw.backlog(ci):
                backlog = True
                timeout = 0  # frames are waiting to be handled: do not sleep
        k = 0
        for ev in self._ipoll(timeout):
            obj = ev[0]
            if obj is self.lsock:
                who = 0
            elif obj is self.link_stream:
                who = 1
            else:
                who = -1
                for i in range(n):
                    if socks[i] is obj:
                        who = i + 2
                        break
                if who < 0:
                    continue
            if k < len(self.ev_who):
                self.ev_who[k] = who
                self.ev_bits[k] = ev[1]
                k += 1
        now = self.clock.ms()
        accept = False
        for j in range(k):
            who = self.ev_who[j]
            if who == 0:
                accept = True  # after every client's input: an EOF read there frees its slot
                continue
            try:
                self._event(who, self.ev_bits[j], now)
            except Exception as e:   # one bad event is dropped; the gateway serves on
                self._contained(e, who, now)
        if link is not None and link.polled:
            link.on_readable(now)
        if backlog:
            for ci in range(n):  # their next slice of frames, readable or not
                if socks[ci] is not None and gw.backlog(ci):
                    self._read(ci, now)
        if accept:
            try:
                self._accept(now)
            except Exception as e:
                self._contained(e, 0, now)
        now = self.clock.ms()
        gw.tick(now)
        if link is not None:
            link.tick(now)
            if self.stats_ms and now - self.stats_at >= 0:
                self.stats_at = now + self.stats_ms
                self._send_stats()
            link.flush(now)
        for ci in range(n):
            if socks[ci] is None:
                continue
            if gw.close_overdue(ci, now):
                self._drop(ci, "closing: last frames not read")
                continue
            if gw.clients[ci].queue.pending():
                self._write(ci)
            if socks[ci] is not None:
                self._sync(ci)

    def _event(self, who, bits, now):
        socks = self.socks
        if who == 1:
            self.link.on_readable(now)
        else:
            ci = who - 2
            if bits & (self.POLLIN | self.POLLBAD):
                self._read(ci, now)
            if bits & self.POLLBAD and socks[ci] is not None:
                self._drop(ci, "connection lost (poll: hang-up or error)")
            if bits & self.POLLOUT and socks[ci] is not None:
                self._write(ci)

    def _contained(self, e, who, now):
        """An unexpected exception in one event (who: 0 listen, 1 link, 2+ client) or in the
        timers (-1): log it (rate-limited), drop that event, close the client it came from."""
        what = "timers" if who < 0 else ("accept" if who == 0 else
                                         ("link" if who == 1 else "client %d" % (who - 2)))
        self.faults.warn(what, now, "unexpected error in %s: %s: %r; event dropped, serving on"
                         % (what, type(e).__name__, str(e)[:300]), "error")
        if who >= 2 and self.socks[who - 2] is not None:
            try:
                self._drop(who - 2, "internal error")
            except Exception:
                self.socks[who - 2] = None

    def rebase(self, d):
        """Move the clock and every stored time `d` ms back, so times stay small ints (ints
        >= 2**30 are heap objects on 32-bit boards). Returns the new now."""
        self.clock.now -= d
        self.stats_at -= d
        self.faults.rebase(d)
        self.gw.rebase(d)
        if self.ros is not None:
            self.ros.rebase(d)  # the link session's times too
        if self.link is not None:
            self.link.rebase(d)
        return self.clock.now

    # -- clients ----------------------------------------------------------------------------
    def _accept(self, now):
        reaped = False
        for _ in range(4):
            try:
                r = self.lsock.accept()
            except OSError:  # EAGAIN: nobody waiting
                return
            s = r[0]
            s.setblocking(False)
            if self.nodelay is not None:
                try:
                    s.setsockopt(self.ipproto_tcp, self.nodelay, 1)
                except OSError:
                    pass
            peer = accepted_peer(r[1])
            if not reaped and self.gw.crowded(peer):
                self._reap(now)  # again only once a connection was accepted since
                reaped = True
            ci = self.gw.accept(now, peer)  # the core logs who came or was refused
            if ci >= 0:
                reaped = False
                self.socks[ci] = s
                self.mask[ci] = self.POLLIN
                self.poll.register(s, self.POLLIN)
            else:
                self._refuse(s)

    def _reap(self, now):
        """Before a connection is refused for want of room: close the clients done closing and
        read the others, so a client that closed and reconnects at once (its EOF still unread)
        frees its slot, and a HELLO already in a socket stops counting against its address."""
        gw = self.gw
        for ci in range(len(self.socks)):
            if self.socks[ci] is None:
                continue
            if gw.flushed_close(ci):
                self._drop(ci, gw.clients[ci].close_reason)
            elif gw.close_overdue(ci, now):
                self._drop(ci, "closing: last frames not read")
            else:
                try:
                    self._read(ci, now)
                except Exception as e:   # that client is closed; the accept goes on
                    self._contained(e, ci + 2, now)

    def _refuse(self, s):
        try:  # best effort: the ERROR too_many_clients, then the close
            s.write(self.gw.reject_frame())
            # Read what the peer already sent (its HELLO): closing with unread input would
            # reset the connection, and a reset can destroy the ERROR before it is read.
            for _ in range(4):
                if not s.readinto(self.scratch):  # None: nothing waiting; 0: the peer closed
                    break
        except OSError:
            pass
        s.close()

    def _read(self, ci, now):
        s = self.socks[ci]
        gw = self.gw
        dec = gw.clients[ci].decoder
        if not gw.may_read(ci, now):
            return  # frames of an earlier read wait, or it does not read its replies, or closing
        for _ in range(_MAX_READS):
            space = dec.space()
            if space == 0:
                return
            try:
                if dec.fill == 0:
                    n = s.readinto(dec.buf, space)  # no allocation
                else:
                    n = s.readinto(self.mvs[ci][dec.fill:], space)  # one memoryview slice
            except OSError as e:
                self._drop(ci, "read error: %s" % e)
                return
            if n is None:  # EAGAIN
                return
            if n == 0:
                gw.received(ci, 0, now)
                self._drop(ci, "closed by client")
                return
            gw.received(ci, n, now)
            if n < space or not gw.reading(ci):
                return  # drained, frames left for the next turn, closing, or waiting for link room

    def _write(self, ci):
        err = self._write_now(ci)
        if err is not None:
            self._drop(ci, "write error: %s" % err)
        elif self.gw.flushed_close(ci):
            self._drop(ci, self.gw.clients[ci].close_reason)

    def _write_now(self, ci):
        """Write client ci's queue as far as its socket takes it now; the OSError, if one
        (Gateway.write_now: closing is left to the caller)."""
        s = self.socks[ci]
        if s is None:
            return None
        q = self.gw.clients[ci].queue
        for _ in range(_MAX_WRITES):
            n = q.peek()
            if n == 0:
                break
            try:
                k = s.write(q.buf, q.out, n)
            except OSError as e:
                return e
            if not k:  # None: EAGAIN
                break
            q.sent(k)
            if k < n:
                break
        return None

    def _sync(self, ci):
        want = self.gw.interest(ci)
        m = (self.POLLIN if want & core.WANT_READ else 0) | (
            self.POLLOUT if want & core.WANT_WRITE else 0)
        if m != self.mask[ci]:
            self.mask[ci] = m
            self.poll.modify(self.socks[ci], m)

    def _drop(self, ci, reason):
        s = self.socks[ci]
        if s is None:
            return
        self.socks[ci] = None
        self.mask[ci] = 0
        try:
            self.poll.unregister(s)
        except (OSError, KeyError, ValueError):
            pass
        try:
            s.close()
        except OSError:
            pass
        self.gw.closed(ci, reason)

    def _send_stats(self):
        ros = self.ros
        if ros is None or not ros.s.is_up():
            return
        ros.send_stats(self.gw.counters(), self.link.counters())  # the link's as link_<name>

    def close(self):
        for ci in range(len(self.socks)):
            self._drop(ci, "gateway shutting down")
        try:
            self.poll.unregister(self.lsock)
        except (OSError, KeyError, ValueError):
            pass
        try:
            self.lsock.close()
        except OSError:
            pass
        if self.link is not None:
            if self.link_stream is not None:
                try:
                    self.poll.unregister(self.link_stream)
                except (OSError, KeyError, ValueError):
                    pass
                self.link_stream = None
            self.link.close()
        self.running = False
