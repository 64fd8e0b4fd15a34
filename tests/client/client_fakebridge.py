"""A small fake UBRB bridge for socket-level tests: plain sockets on 127.0.0.1.

Answers HELLO with HELLO_ACK and PING with PONG, records every frame per connection, and can be
killed (listener and connections closed) and restarted on the same port.
"""
import socket
import threading

import client_wire as W
from tests.support.procs import wait_for
from ubrb_client import frames as F


class Conn:
    def __init__(self, server, sock):
        self.server = server
        self.sock = sock
        self.frames = []           # (op_name, payload) as in client_wire.parse
        self.lock = threading.Lock()
        self.closed = False
        self.pubs = {}             # publisher id -> topic (route mode)
        self.subs = {}             # subscription id -> topic (route mode)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def send(self, data: bytes):
        with self.lock:
            self.sock.sendall(data)

    def _run(self):
        dec = F.FrameDecoder()
        try:
            while not self.closed:
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                for op, payload in dec.feed(data):
                    rec = W.record(op, payload)
                    self.frames.append(rec)
                    if op == F.HELLO and self.server.auto_ack:
                        self.send(W.hello_ack(**self.server.ack_fields))
                    elif op == F.PING and self.server.auto_pong:
                        self.send(F.encode_frame(F.PONG))
                    elif op in (F.ADVERTISE, F.SUBSCRIBE):
                        (self.pubs if op == F.ADVERTISE else self.subs)[rec[1]["id"]] = rec[1]["topic"]
                    elif op == F.PUBLISH and self.server.route:
                        pid, cdr = rec[1]
                        topic = self.pubs.get(pid)
                        for c in list(self.server.conns):
                            for sid, t in list(c.subs.items()):
                                if t == topic and not c.closed:
                                    try:
                                        c.send(W.message(sid, cdr))
                                    except OSError:
                                        pass
                    elif op == F.PUBLISH and self.server.echo is not None:
                        pid, cdr = rec[1]
                        sid = self.server.echo.get(pid)
                        if sid is not None:
                            self.send(W.message(sid, cdr))
        except OSError:
            pass
        finally:
            self.closed = True

    def kill(self):
        self.closed = True
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class FakeServer:
    def __init__(self, port=0, route=False):
        self.port = port
        self.route = route         # act as a tiny bridge: PUBLISH -> MESSAGE to every sub on the topic
        self.conns = []
        self.auto_ack = True
        self.ack_fields = {}       # HELLO_ACK fields other than the defaults (client_wire.hello_ack)
        self.auto_pong = True
        self.echo = None           # {publisher id: subscription id} to loop PUBLISH back
        self._lsock = None
        self._thread = None

    def start(self):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(8)
        ls.settimeout(0.05)
        self.port = ls.getsockname()[1]
        self._lsock = ls
        self._running = True
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        return self

    def _accept(self):
        while self._running:
            try:
                s, _ = self._lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            s.settimeout(0.05)
            conn = Conn(self, s)
            self.conns.append(conn)
            conn.thread.start()

    def stop(self):
        """Kill: stop listening and drop every connection (RST)."""
        self._running = False
        if self._thread:
            self._thread.join()
        self._lsock.close()
        for c in self.conns:
            c.kill()
        for c in self.conns:
            c.thread.join(2)

    @property
    def last(self) -> Conn:
        """The newest connection (waits briefly: the client may be connected before accept())."""
        self.wait(lambda: self.conns, 2.0)
        return self.conns[-1]

    def all_frames(self):
        return [f for c in self.conns for f in c.frames]

    def wait(self, pred, timeout=5.0):
        return wait_for(pred, timeout)
