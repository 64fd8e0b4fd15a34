"""Threaded, selector-based runner around ClientProtocol: the UBRB client library.

    from ubrb_client import Client
    with Client("127.0.0.1", 8268, name="my_robot") as c:
        pub = c.advertise("/chatter", "std_msgs/msg/String")
        c.subscribe("/cmd_vel", "geometry_msgs/msg/Twist", lambda msg: print(msg))
        c.wait_connected(5)
        pub.publish_msg(c.make("std_msgs/msg/String", {"data": "hi"}))

One background thread does all socket I/O; ``publish`` may be called from any thread and writes
directly when the socket can take it. Subscription/error callbacks run on the I/O thread: keep
them short (they may publish).
"""
from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from . import protocol as P
from .protocol import QoS


class _LazyMsgs:
    """ubrb_client.msgs (rosbags, numpy), imported on first use: the connection layer and the
    CLI's --help need neither, and a missing one is then reported by what needs it."""

    def __getattr__(self, name: str) -> Any:
        from . import msgs

        return getattr(msgs, name)


M = _LazyMsgs()

log = logging.getLogger("ubrb_client")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8268


def parse_server(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """'host:port', 'host', 'port' or ':port' -> (host, port); IPv6 as '[::1]:8268'. A number
    alone is a port on this machine (127.0.0.1), never a host: '8268' is not 0.0.32.76."""
    text = text.strip()
    if text.isdigit():
        return DEFAULT_HOST, int(text)
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if text.count(":") == 1:
        host, port = text.split(":")
        return host or DEFAULT_HOST, int(port)
    return text or DEFAULT_HOST, default_port


class Publisher:
    """Handle of one advertised publisher (id fixed for the life of the client)."""

    def __init__(self, client: Client, pid: int, topic: str, type: str, qos: QoS):
        self.client = client
        self.id = pid
        self.topic = topic
        self.type = type
        self.qos = qos
        self.closed = False

    def wants_data(self) -> bool:
        """False when the bridge reported 0 subscribers in this session: skip building the
        message. True before the first SUB_COUNT (unknown count: publish normally)."""
        with self.client._lock:
            return not self.closed and self.client.proto.wants_data(self.id)

    @property
    def subscriber_count(self) -> int | None:
        with self.client._lock:
            return self.client.proto.subscriber_count(self.id)

    def publish(self, data, *, force: bool = False) -> bool:
        """Publish CDR bytes (encapsulation header included) or a zero-argument callable that
        returns them (called only if the message is going to be sent). ``force`` ignores a
        0-subscriber report. Returns True if queued."""
        return self.client._publish(self, data, force)

    def publish_msg(self, msg, *, force: bool = False) -> bool:
        """Publish a rosbags message object (or a callable returning one), encoded lazily."""
        store = self.client.store

        def encode():
            m = msg() if callable(msg) else msg
            return M.encode(store, m, self.type)
        return self.client._publish(self, encode, force)

    def unadvertise(self) -> None:
        self.client.unadvertise(self)

    close = unadvertise

    def __repr__(self):
        return f"<Publisher id={self.id} {self.topic} [{self.type}] {self.qos.reliability}>"


class TfStaticPublisher(Publisher):
    """/tf_static publisher: merges transforms (latest per child_frame_id) and always publishes
    the merged TFMessage; the merged message is re-published after every handshake."""

    def __init__(self, *args):
        super().__init__(*args)
        self._transforms: dict[str, object] = {}

    def _merged(self, data):
        store = self.client.store
        if callable(data):
            data = data()
        msg = data if hasattr(data, "transforms") else M.decode(store, data, self.type)
        with self.client._lock:
            for t in msg.transforms:
                self._transforms[t.child_frame_id] = t
            merged = store.types[self.type](transforms=list(self._transforms.values()))
        return M.encode(store, merged, self.type)

    def publish(self, data, *, force: bool = False) -> bool:
        return self.client._publish(self, lambda: self._merged(data), True)

    def publish_msg(self, msg, *, force: bool = False) -> bool:
        return self.client._publish(self, lambda: self._merged(msg), True)

    @property
    def transforms(self) -> list:
        with self.client._lock:
            return list(self._transforms.values())


class Subscription:
    def __init__(self, client: Client, sid: int, topic: str, type: str, qos: QoS,
                 callback: Callable, raw: bool):
        self.client = client
        self.id = sid
        self.topic = topic
        self.type = type
        self.qos = qos
        self.callback = callback
        self.raw = raw
        self.received = 0

    def unsubscribe(self) -> None:
        self.client.unsubscribe(self)

    close = unsubscribe

    def __repr__(self):
        return f"<Subscription id={self.id} {self.topic} [{self.type}] {self.qos.reliability}>"


class Client:
    """A UBRB v1 client that behaves like the Unreal uBotROS plugin (see docs/CLIENT.md)."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                 name: str = "ubrb_client", reconnect_interval: float = 2.0,
                 attempt_timeout: float = 3.0, ping_interval: float = 2.0,
                 idle_timeout: float = 10.0,
                 max_queued_bytes: int = P.DEFAULT_MAX_QUEUED_BYTES,
                 distro: str | None = None, typestore=None,
                 on_error: Callable | None = None, on_connect: Callable | None = None,
                 on_disconnect: Callable | None = None, clock: Callable[[], float] = time.monotonic,
                 hello_interval: float | None = None):
        self.host = host
        self.port = int(port)
        self._distro = distro
        self._store = typestore
        self.proto = P.ClientProtocol(name, reconnect_interval=reconnect_interval,
                                      attempt_timeout=attempt_timeout, ping_interval=ping_interval,
                                      idle_timeout=idle_timeout, max_queued_bytes=max_queued_bytes,
                                      hello_interval=hello_interval)
        self.on_error = on_error
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.clock = clock
        self.callback_errors = 0

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._pubs: dict[int, Publisher] = {}
        self._subs: dict[int, Subscription] = {}
        self._sock: socket.socket | None = None
        self._sock_connecting = False
        self._want_write = False
        self._pending_disconnect: str | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    # ---------------------------------------------------------------------------- messages
    @property
    def store(self):
        """The rosbags typestore used for publish_msg / decoded subscriptions."""
        if self._store is None:
            self._store = M.get_store(self._distro or M.DEFAULT_DISTRO)
        return self._store

    def make(self, type: str, fields: dict | None = None):
        """Build a message of ``type`` from a mapping of fields (defaults for missing ones)."""
        return M.from_dict(self.store, type, fields or {})

    # ------------------------------------------------------------------------ registration
    def advertise(self, topic: str, type: str, qos=None, *, latch: bool | None = None) -> Publisher:
        """Advertise a publisher. ``qos``: QoS, dict, profile name (reliable, best_effort,
        sensor_data, latched, clock) or None (reliable, volatile, depth 10). /tf_static of type
        tf2_msgs/msg/TFMessage gets a merging TfStaticPublisher (latched)."""
        type = M.normalize_type(type)
        qos = QoS.coerce(qos)
        with self._lock:
            pid = self.proto.advertise(topic, type, qos, latch=latch)
            cls = (TfStaticPublisher if topic == "/tf_static" and type == "tf2_msgs/msg/TFMessage"
                   else Publisher)
            pub = cls(self, pid, topic, type, qos)
            self._pubs[pid] = pub
            self._kick_locked()
        return pub

    def unadvertise(self, pub: Publisher) -> None:
        with self._lock:
            if pub.closed:
                return
            pub.closed = True
            self._pubs.pop(pub.id, None)
            self.proto.unadvertise(pub.id)
            self._kick_locked()

    def subscribe(self, topic: str, type: str, callback: Callable, qos=None, *,
                  raw: bool = False) -> Subscription:
        """Subscribe; ``callback(msg)`` gets a decoded rosbags message, or the CDR ``bytes``
        with ``raw=True``. It runs on the client's I/O thread."""
        type = M.normalize_type(type)
        qos = QoS.coerce(qos)
        with self._lock:
            sid = self.proto.subscribe(topic, type, qos)
            sub = Subscription(self, sid, topic, type, qos, callback, raw)
            self._subs[sid] = sub
            self._kick_locked()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if self._subs.pop(sub.id, None) is not None:
                self.proto.unsubscribe(sub.id)
                self._kick_locked()

    def _publish(self, pub: Publisher, data, force: bool) -> bool:
        with self._lock:
            if pub.closed:
                return False
            ok = self.proto.publish(pub.id, data, force=force)
            if ok:
                self._kick_locked()
            return ok

    # ------------------------------------------------------------------------------- state
    @property
    def connected(self) -> bool:
        return self.proto.state == P.CONNECTED

    @property
    def state(self) -> str:
        return self.proto.state

    @property
    def server_info(self) -> dict | None:
        return self.proto.server_info

    @property
    def errors(self) -> list:
        """ERROR frames received so far (ErrorReceived: id, code, message), oldest first."""
        with self._lock:
            return list(self.proto.errors)

    @property
    def stats(self) -> dict:
        with self._lock:
            d = self.proto.stats.as_dict()
            d["queued_bytes"] = self.proto.queued_bytes
            d["callback_errors"] = self.callback_errors
            d["state"] = self.proto.state
            return d

    def wait_connected(self, timeout: float | None = None, *, ack: bool = False) -> bool:
        """Wait until a session is up (and, with ``ack``, its HELLO_ACK arrived)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.connected and (not ack or self.proto.server_info is not None)
                or self.proto.state == P.CLOSED, timeout) and self.connected

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued has been written to the socket (needs a session)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.connected and self.proto.output_empty()
                or self.proto.state == P.CLOSED, timeout) and self.connected

    def sync(self, timeout: float = 5.0) -> bool:
        """flush, then PING and wait for its PONG: the bridge has processed everything sent
        before it (frames are handled in order). False on timeout or reconnect."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        with self._cond:
            epoch = self.proto.epoch
            seq = self.proto.send_ping()
            if seq is None:
                return False
            self._kick_locked()
            return self._cond.wait_for(
                lambda: self.proto.epoch != epoch or not self.connected
                or self.proto.pongs_in_session >= seq,
                max(0.0, deadline - time.monotonic())) and self.proto.epoch == epoch \
                and self.connected and self.proto.pongs_in_session >= seq

    # ----------------------------------------------------------------------------- running
    def start(self) -> Client:
        with self._lock:
            if self._thread is not None:
                return self
            self.proto.start(self.clock())
            self._thread = threading.Thread(target=self._run, name=f"ubrb-{self.proto.name}",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, flush_timeout: float = 0.0) -> None:
        """Explicit Disconnect: optionally flush first, then close and stop retrying."""
        if flush_timeout > 0 and self.connected:
            self.flush(flush_timeout)
        with self._cond:
            self._closing = True
            was_connected = self.connected
            self.proto.close()
            self._close_socket_locked()
            self._cond.notify_all()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        try:
            self._sel.close()
        except (OSError, ValueError, RuntimeError) as exc:
            log.debug("UBRB: selector close: %s", exc)
        for s in (self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        if was_connected and self.on_disconnect:
            self._safe_call(self.on_disconnect, "closed")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # --------------------------------------------------------------------------- internals
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _kick_locked(self) -> None:
        """Write what we can right now; let the I/O thread know if something is left."""
        if self._sock is not None and not self._sock_connecting:
            self._write_locked()
        if not self.proto.output_empty() and self.proto.state == P.CONNECTED and not self._want_write:
            self._want_write = True
            self._wake()

    def _write_locked(self) -> None:
        sock = self._sock
        while sock is not None:
            mv = self.proto.pending_output()
            if not len(mv):
                self._cond.notify_all()
                return
            try:
                n = sock.send(mv)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost_locked(f"send failed: {exc}")
                return
            finally:
                mv.release()
            self.proto.output_sent(n)

    def _lost_locked(self, reason: str) -> None:
        self.proto.connection_lost(self.clock(), reason)
        self._sync_socket_locked()

    def _close_socket_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sel.unregister(self._sock)
            except (KeyError, ValueError, OSError):
                pass
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
            self._sock_connecting = False
            self._want_write = False

    def _sync_socket_locked(self) -> bool:
        """Close the socket if the protocol left the connecting/connected state.
        Returns True if a session ended."""
        st = self.proto.state
        if self._sock is None:
            return False
        if self._sock_connecting and st == P.CONNECTING:
            return False
        if not self._sock_connecting and st == P.CONNECTED:
            return False
        ended = not self._sock_connecting
        self._close_socket_locked()
        if ended:
            log.info("UBRB: disconnected (%s)", self.proto.last_disconnect_reason)
            self._pending_disconnect = self.proto.last_disconnect_reason
        self._cond.notify_all()
        return ended

    def _start_connect_locked(self, now: float) -> None:
        self.proto.connection_started(now)
        try:
            infos = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
            family, stype, proto, _, addr = infos[0]
            sock = socket.socket(family, stype, proto)
        except OSError as exc:
            log.debug("UBRB: cannot resolve %s:%s: %s", self.host, self.port, exc)
            self.proto.connection_failed(now, f"resolve failed: {exc}")
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            err = sock.connect_ex(addr)
        except OSError as exc:        # refused before any packet (an audit hook, a bad address)
            err = exc.errno or errno.EINVAL
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            sock.close()
            self.proto.connection_failed(now, f"connect failed: {errno.errorcode.get(err, err)}")
            return
        self._sock = sock
        self._sock_connecting = True
        self._sel.register(sock, selectors.EVENT_WRITE, "sock")

    def _finish_connect_locked(self, now: float) -> bool:
        assert self._sock is not None
        err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.proto.connection_failed(now, f"connect failed: {errno.errorcode.get(err, err)}")
            self._close_socket_locked()
            return False
        self._sock_connecting = False
        self.proto.connection_made(now)
        log.info("UBRB: connected to %s:%s (session %d)", self.host, self.port, self.proto.epoch)
        self._cond.notify_all()
        return True

    def _safe_call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:
            self.callback_errors += 1
            log.exception("UBRB: exception in callback %r", fn)

    def _dispatch(self, events: list, connected_now: bool, disconnected: str | None) -> None:
        if disconnected is not None and self.on_disconnect:
            self._safe_call(self.on_disconnect, disconnected)
        if connected_now and self.on_connect:
            self._safe_call(self.on_connect)
        for ev in events:
            if isinstance(ev, P.Message):
                sub = self._subs.get(ev.sub_id)
                if sub is None:
                    continue
                sub.received += 1
                if sub.raw:
                    self._safe_call(sub.callback, ev.data)
                else:
                    try:
                        msg = M.decode(self.store, ev.data, sub.type)
                    except Exception as exc:  # noqa: BLE001 - bad data must not kill the I/O thread
                        self.callback_errors += 1
                        log.warning("UBRB: cannot decode %s as %s: %s", sub.topic, sub.type, exc)
                        continue
                    self._safe_call(sub.callback, msg)
            elif isinstance(ev, P.ErrorReceived) and self.on_error:
                self._safe_call(self.on_error, ev)

    def _run(self) -> None:
        sel = self._sel
        while True:
            events: list = []
            connected_now = False
            with self._lock:
                if self._closing:
                    return
                now = self.clock()
                self.proto.tick(now)
                self._sync_socket_locked()
                if self.proto.connect_due(now):
                    self._start_connect_locked(now)
                if self._sock is not None:
                    if self._sock_connecting:
                        mask = selectors.EVENT_WRITE
                    else:
                        self._write_locked()
                        mask = selectors.EVENT_READ
                        self._want_write = not self.proto.output_empty()
                        if self._want_write:
                            mask |= selectors.EVENT_WRITE
                    if self._sock is not None:
                        sel.modify(self._sock, mask, "sock")
                deadline = self.proto.next_deadline()
                disconnected, self._pending_disconnect = self._pending_disconnect, None
            if disconnected is not None:
                self._dispatch([], False, disconnected)
            timeout = 1.0 if deadline is None else min(1.0, max(0.0, deadline - now))
            try:
                ready = sel.select(timeout)
            except (OSError, ValueError):
                if self._closing:
                    return
                ready = []
            with self._lock:
                if self._closing:
                    return
                now = self.clock()
                for key, mask in ready:
                    if key.data == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except (BlockingIOError, OSError):
                            pass
                        continue
                    if key.fileobj is not self._sock:
                        continue
                    if self._sock_connecting:
                        connected_now = self._finish_connect_locked(now)
                        continue
                    if mask & selectors.EVENT_READ:
                        try:
                            data = self._sock.recv(256 * 1024)
                        except (BlockingIOError, InterruptedError):
                            data = None
                        except OSError as exc:
                            self._lost_locked(f"recv failed: {exc}")
                            continue
                        if data is not None:
                            if not data:
                                self._lost_locked("closed by the bridge")
                                continue
                            events += self.proto.data_received(data, now)
                            self._sync_socket_locked()
                            if any(isinstance(e, (P.HelloAck, P.PongReceived)) for e in events):
                                self._cond.notify_all()
                    if self._sock is not None and mask & selectors.EVENT_WRITE:
                        self._write_locked()
                disconnected, self._pending_disconnect = self._pending_disconnect, None
            self._dispatch(events, connected_now, disconnected)
