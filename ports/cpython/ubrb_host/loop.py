"""The selectors loop that serves UBRB clients for a core Gateway, and the runtime's clock and
allocation policy. Used by the gateway port (with a link driver) and by the companion's direct
mode (with the companion's wake pipe in the link's place).
"""

from __future__ import annotations

import logging
import mmap
import selectors
import socket
import time
from typing import Any, Callable, List, Optional

import ubrb_min as core

log = logging.getLogger("ubrb.gateway")

# At start-up, how long clients' reliable PUBLISHes may wait for the link (Gateway.hold_for_ros;
# the clients themselves are served from the start). Unkeyed, a companion still UP with the
# previous gateway answers a restarted one only once that session has timed out (LK_DEAD_MS
# after the old gateway went silent), at its next HELLO (LK_HELLO_MS later); the rest is margin
# for the round trips and a loaded machine: 3 s.
HOLD_FOR_ROS_MS = core.LK_DEAD_MS + 4 * core.LK_HELLO_MS
# Work per client per loop turn is bounded, so a flood from one client cannot delay the others,
# the link or a SIGTERM: at most this many bytes read (then its frames handled) per turn.
READ_BYTES_PER_TURN = 64 * 1024
WRITES_PER_TURN = 16
REFUSED_LINGER_S = 2.0  # a refused connection is drained this long so its ERROR is not reset
REFUSED_MAX = 16  # refused connections lingering at once; more are closed at once
READ_CHUNK = 256 * 1024  # bytes per recv: with the decoder's compaction, what a client touches
# A graceful stop (SIGINT, SIGTERM) drains what the gateway accepted: the reliable records in the
# link's ring until the companion has acknowledged them (handed them to ROS), and the PUBLISHes
# held for link room, while the link is up and for at most this long; a second signal stops at
# once (docs/LINK.md, "A graceful stop").
STOP_DRAIN_S = 3.0


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def mapped_buffer(n: int) -> Any:
    """The allocation policy of CPython hosts, for core.Gateway(new_buffer=...): anonymous
    mappings are zero pages until written, so the `pc` profile's 16 x 224 MiB of buffers are
    reserved at start-up (static bounds) but only touched pages cost RAM."""
    return mmap.mmap(-1, n) if n >= 1 << 20 else bytearray(n)


def _log_at(level: str, msg: str) -> None:
    log.log(logging.ERROR if level == "error" else logging.WARNING, msg)


# One rate limit for every contained fault of this process: a bug that fires on every event
# costs one line a second (with the count of those held back), never a full disk.
_faults = core.RateLog(_log_at)


def contained(what: str, fn: Callable[..., Any], *args: Any) -> bool:
    """fn(*args), containing any unexpected exception: it is logged with `what` as context
    (rate-limited; the traceback at debug level), that one event is dropped, and the loop keeps
    serving. True if fn returned normally. A bridge may never crash on one bad event."""
    try:
        fn(*args)
        return True
    except Exception as e:
        log.debug("unexpected error in %s", what, exc_info=True)
        _faults.warn(what, now_ms(), "unexpected error in %s: %s: %r; event dropped, serving on"
                     % (what, type(e).__name__, str(e)[:300]), "error")
        return False


class GatewayServer:
    """Selectors loop: a listening socket, client sockets, and optionally a link driver."""

    def __init__(
        self,
        gw: core.Gateway,
        listen: tuple[str, int],
        link: Any = None,
        hold_for_ros_ms: int = HOLD_FOR_ROS_MS,
    ) -> None:
        self.gw = gw
        gw.write_now = self._write_now  # a reliable MESSAGE finding a queue full: write, retry
        self.link = link  # object with fileno(), on_readable(now), wants_write(), flush(now), tick(now)
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.socket(socket.AF_INET6 if ":" in listen[0] else socket.AF_INET)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(listen)
        self.lsock.listen(16)
        self.lsock.setblocking(False)
        self.address = self.lsock.getsockname()[:2]
        # Clients are accepted from the start (their HELLO deadline runs from their connect);
        # what must wait for the link is their reliable data, held by the core meanwhile.
        self.sel.register(self.lsock, selectors.EVENT_READ, ("listen", -1))
        if link is not None:
            gw.hold_for_ros(now_ms() + hold_for_ros_ms)
        self.socks: List[Optional[socket.socket]] = [None] * len(gw.clients)
        # The events each client's socket is registered for (0: not registered), kept here so
        # the per-turn sync costs no selector lookup: get_key() of an unregistered socket (a
        # blocked client) raises a KeyError whose message formats the socket, measured at ~5%
        # of the gateway's CPU while backpressure blocks and resumes a client.
        self.watched: List[int] = [0] * len(gw.clients)
        # Refused connections: their ERROR too_many_clients sent, our side shut down for writing,
        # their input read and dropped until they close (or REFUSED_LINGER_S): closing a socket
        # with unread input (a HELLO) would send a reset that can destroy the ERROR in flight.
        self.refused: List[tuple[socket.socket, float]] = []
        self.running = True
        self.hurry = False  # a second stop signal: no drain
        self.link_fd = -1
        if link is not None:
            self._sync_link_fd()  # fileno() is -1 while a serial device is absent

    def stop(self, *_: Any) -> None:
        if not self.running:
            self.hurry = True
        self.running = False

    def serve(self, until: Optional[Callable[[], bool]] = None) -> None:
        while self.running and not (until and until()):
            self.step()
        if not self.running:
            contained("draining the link", self.drain)
        self.close()

    def _holding(self) -> int:
        """Bytes of reliable records in the link's ring (not yet acknowledged by the companion),
        plus one per client holding a PUBLISH for link room or with frames read, not handled."""
        s = getattr(self.link, "s", None)
        n = s.reliable.rel_queued if s is not None else 0
        return n + sum(1 for ci, c in enumerate(self.gw.clients)
                       if self.socks[ci] is not None and (c.blocked or self.gw.backlog(ci)))

    def drain(self, limit_s: float = STOP_DRAIN_S) -> bool:
        """After a stop: serve the link (and nothing new from the clients: their sockets are
        not read, the listening socket is not accepted from) until everything the gateway
        accepted is acknowledged by the companion, for at most `limit_s` or until a second stop
        signal. True when nothing was left."""
        s = getattr(self.link, "s", None)
        if s is None or not self._holding():
            return True
        end = time.monotonic() + limit_s
        log.info("stopping: %d bytes of reliable data not yet acknowledged by the companion; "
                 "draining for up to %g s (a second signal stops at once)",
                 s.reliable.rel_queued, limit_s)
        for ci, sock in enumerate(self.socks):   # what they send from now on is not taken
            if sock is not None and self.watched[ci]:
                self.sel.unregister(sock)
                self.watched[ci] = 0
        self.sel.unregister(self.lsock)
        while not self.hurry and time.monotonic() < end and self._holding() and s.is_up():
            for key, _ in self.sel.select(0.01):
                if key.data[0] == "link":
                    contained("handling link input", self.link.on_readable, now_ms())
            now = now_ms()
            contained("gateway timers", self.gw.tick, now)   # hands held PUBLISHes on
            for ci, sock in enumerate(self.socks):
                if sock is not None and self.gw.backlog(ci):
                    contained("serving client %d" % ci, self.gw.received, ci, 0, now)
            contained("link timers", self.link.tick, now)
            self._sync_link_fd()
            contained("link output", self.link.flush, now)
            for ci, sock in enumerate(self.socks):
                if sock is not None and self.gw.clients[ci].queue.pending():
                    self._write(ci)
        self.sel.register(self.lsock, selectors.EVENT_READ, ("listen", -1))  # (for close)
        left = self._holding()
        if left:
            log.warning("stopped before the companion acknowledged everything: %d bytes of "
                        "reliable data in the link's ring dropped%s", s.reliable.rel_queued,
                        " (a second signal)" if self.hurry else " (the link is down)"
                        if not s.is_up() else " after %g s" % limit_s)
        else:
            log.info("drained: the companion acknowledged every record the gateway accepted")
        return not left

    def step(self) -> None:
        now = now_ms()
        timeout = self.gw.next_deadline(now) / 1000.0
        timeout = min(timeout, 0.05)
        backlog = [ci for ci, s in enumerate(self.socks) if s is not None and self.gw.backlog(ci)]
        if backlog:
            timeout = 0  # frames are waiting to be handled: do not sleep
        wait = getattr(self.link, "wait_ms", None)  # wake when the link may send again
        w = wait(now) if wait is not None else 0
        if w:
            timeout = min(timeout, w / 1000.0)
        accept = False
        for key, events in self.sel.select(timeout):
            kind, ci = key.data
            now = now_ms()
            if kind == "listen":
                accept = True  # after every client's input: an EOF read there frees its slot
            elif kind == "link":
                contained("handling link input", self.link.on_readable, now)
            elif not contained("serving client %d" % ci, self._client_event, ci, events, now):
                contained("closing client %d" % ci, self._drop, ci, "internal error")
        for ci in backlog:  # their next slice of frames, readable or not
            if self.socks[ci] is not None and not contained("serving client %d" % ci, self._read,
                                                            ci, now_ms()):
                contained("closing client %d" % ci, self._drop, ci, "internal error")
        if accept:
            contained("accepting a client", self._accept, now_ms())
        now = now_ms()
        contained("gateway timers", self.gw.tick, now)
        if self.refused:
            contained("refused connections", self._drain_refused)
        if self.link is not None:
            contained("link timers", self.link.tick, now)
            self._sync_link_fd()
            contained("link output", self.link.flush, now)
        for ci, s in enumerate(self.socks):
            if s is None:
                continue
            if self.gw.close_overdue(ci, now):
                self._drop(ci, self.gw.clients[ci].close_reason + " (last frames not read)")
                continue
            if self.gw.clients[ci].queue.pending():
                self._write(ci)
            if self.socks[ci] is not None:
                self._sync_client(ci)

    def _client_event(self, ci: int, events: int, now: int) -> None:
        if events & selectors.EVENT_READ:
            self._read(ci, now)
        if events & selectors.EVENT_WRITE and self.socks[ci] is not None:
            self._write(ci)

    def _sync_link_fd(self) -> None:
        # A serial device may be re-opened under a new descriptor after an unplug.
        fd = self.link.fileno()
        if fd != self.link_fd:
            if self.link_fd >= 0:
                try:
                    self.sel.unregister(self.link_fd)
                except (KeyError, ValueError):
                    pass
            if fd >= 0:
                self.sel.register(fd, selectors.EVENT_READ, ("link", -1))
            self.link_fd = fd

    def _accept(self, now: int) -> None:
        reaped = False
        while True:
            try:
                sock, addr = self.lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not reaped and self.gw.crowded(addr):
                self._reap(now)  # again only once a connection was accepted since
                reaped = True
            ci = self.gw.accept(now, addr)  # the core logs who came and who was refused
            if ci >= 0:
                reaped = False
                self.socks[ci] = sock
                self.sel.register(sock, selectors.EVENT_READ, ("client", ci))
                self.watched[ci] = selectors.EVENT_READ
            else:
                self._refuse(sock)

    def _reap(self, now: int) -> None:
        """Before a connection is refused for want of room: close the clients done closing and
        read the others, so a client that closed and reconnects at once (its EOF still unread)
        frees its slot, and a HELLO already in a socket stops counting against its address."""
        gw = self.gw
        for ci, s in enumerate(self.socks):
            if s is None:
                continue
            if gw.flushed_close(ci):
                self._drop(ci, gw.clients[ci].close_reason)
            elif gw.close_overdue(ci, now):
                self._drop(ci, gw.clients[ci].close_reason + " (last frames not read)")
            elif not contained("serving client %d" % ci, self._read, ci, now):
                contained("closing client %d" % ci, self._drop, ci, "internal error")

    def _refuse(self, sock: socket.socket) -> None:
        try:  # best effort: the ERROR too_many_clients, then the close
            sock.send(self.gw.reject_frame())
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self.refused) >= REFUSED_MAX:
            self.refused.pop(0)[0].close()
        self.refused.append((sock, time.monotonic() + REFUSED_LINGER_S))
        self._drain_refused()

    def _drain_refused(self) -> None:
        now = time.monotonic()
        keep = []
        for sock, until in self.refused:
            done = now >= until
            for _ in range(4):  # bounded: a peer that keeps sending waits for the next turn
                if done:
                    break
                try:
                    done = not sock.recv(65536)  # b"": the peer closed too
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    done = True
            if done:
                sock.close()
            else:
                keep.append((sock, until))
        self.refused = keep

    def _read(self, ci: int, now: int) -> None:
        sock = self.socks[ci]
        if sock is None:
            return
        gw = self.gw
        dec = gw.clients[ci].decoder
        if not gw.may_read(ci, now):
            return  # frames of an earlier read wait, or it does not read its replies, or closing
        total = 0
        # Bounded reads per wake-up so one busy client cannot starve the others.
        while total < READ_BYTES_PER_TURN:
            if dec.space() == 0:
                break
            try:
                n = sock.recv_into(memoryview(dec.buf)[dec.fill :],
                                   min(dec.space(), READ_CHUNK, READ_BYTES_PER_TURN - total))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._drop(ci, f"read error: {e}")
                return
            if n == 0:
                self.gw.received(ci, 0, now)
                self._drop(ci, "closed by client")
                return
            total += n
            gw.received(ci, n, now)
            if not gw.reading(ci):
                break  # frames left for the next turn, closing, or waiting for link room

    def _write(self, ci: int) -> None:
        if self.socks[ci] is None:
            return
        err = self._write_now(ci)
        if err is not None:
            self._drop(ci, f"write error: {err}")
        elif self.gw.flushed_close(ci):
            self._drop(ci, self.gw.clients[ci].close_reason)

    def _write_now(self, ci: int) -> Optional[OSError]:
        """Write client ci's queue as far as its socket takes it now; the OSError, if one
        (Gateway.write_now: closing is left to the caller)."""
        sock = self.socks[ci]
        if sock is None:
            return None
        q = self.gw.clients[ci].queue
        for _ in range(WRITES_PER_TURN):
            k = q.peek()
            if k == 0:
                break
            try:
                n = sock.send(memoryview(q.buf)[q.out : q.out + k])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                return e
            q.sent(n)
            if n < k:
                break
        return None

    def _sync_client(self, ci: int) -> None:
        sock = self.socks[ci]
        assert sock is not None
        want = self.gw.interest(ci)
        events = (selectors.EVENT_READ if want & core.WANT_READ else 0) | (
            selectors.EVENT_WRITE if want & core.WANT_WRITE else 0)
        was = self.watched[ci]
        if events == was:
            return
        self.watched[ci] = events
        if not was:  # not watched at all while blocked with nothing to send
            self.sel.register(sock, events, ("client", ci))
        elif not events:  # selectors refuse an empty event mask
            self.sel.unregister(sock)
        else:
            self.sel.modify(sock, events, ("client", ci))

    def _drop(self, ci: int, reason: str) -> None:
        sock = self.socks[ci]
        if sock is None:
            return
        self.socks[ci] = None
        self.watched[ci] = 0
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
        self.gw.closed(ci, reason)

    def close(self) -> None:
        for sock, _ in self.refused:
            sock.close()
        self.refused = []
        for ci, s in enumerate(self.socks):
            if s is not None:
                self._drop(ci, "gateway shutting down")
        self.sel.unregister(self.lsock)
        self.lsock.close()
        if self.link is not None:
            self.link.close()
        self.sel.close()
