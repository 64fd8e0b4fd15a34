"""One raw UBRB v1 client on a real TCP socket: bytes and frames, nothing more (the client
library is ``ubrb_client``; this one can send malformed input and shows every frame as it is)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, List, Optional, Tuple

import ubrb_min as U
from tests.support import ubrb_frames as F

Frame = Tuple[int, bytes]


class RawClient:
    """Blocking: ``recv_frame``/``expect*`` read frames as they come. (A subclass may read from a
    thread of its own with ``receive``.)"""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0,
                 source: Optional[str] = None) -> None:
        # source: the local address to connect from (127.0.0.x: another host, as the gateway's
        # per-address limit sees it)
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pending: List[Frame] = []      # received, not yet handed out by recv_frame
        self.send_lock = threading.Lock()   # one sender at a time (e.g. test thread and pinger)

    # sending
    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(data)

    def hello(self, name: str = "test") -> None:
        self.send(F.hello(name))

    def advertise(self, id_: int, topic: str, type_: str, qos: Optional[dict] = None) -> None:
        self.send(F.advertise(id_, topic, type_, qos))

    def subscribe(self, id_: int, topic: str, type_: str, qos: Optional[dict] = None) -> None:
        self.send(F.subscribe(id_, topic, type_, qos))

    def unadvertise(self, id_: int) -> None:
        self.send(F.unadvertise(id_))

    def publish(self, id_: int, data: bytes) -> None:
        self.send(F.publish(id_, data))

    def ping(self) -> None:
        self.send(F.ping())

    # receiving
    def receive(self, max_bytes: int = 65536) -> Optional[List[Frame]]:
        """The frames completed by one read of the socket (maybe none); None once the server has
        closed the connection. Raises socket.timeout as the socket's timeout says."""
        chunk = self.sock.recv(max_bytes)
        if not chunk:
            return None
        self.buf += chunk
        frames, used = F.split_frames(self.buf)
        del self.buf[:used]
        return frames

    def recv_frame(self, timeout: float = 5.0) -> Optional[Frame]:
        """The next frame, or None if the server closed the connection."""
        self.sock.settimeout(timeout)
        while not self.pending:
            got = self.receive()
            if got is None:
                return None
            self.pending.extend(got)
        return self.pending.pop(0)

    def expect(self, op: int, timeout: float = 5.0) -> bytes:
        f = self.recv_frame(timeout)
        assert f is not None, f"connection closed while waiting for op {op}"
        assert f[0] == op, f"expected op {op}, got {f[0]}: {f[1][:200]!r}"
        return f[1]

    def expect_json(self, op: int) -> Any:
        return json.loads(self.expect(op))

    def expect_error(self) -> Tuple[str, Any]:
        e = self.expect_json(U.OP_ERROR)
        return e["code"], e["id"]

    def expect_closed(self, timeout: float = 5.0) -> List[Frame]:
        """Frames received until the server closes; fails if it does not close in time."""
        frames: List[Frame] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if f is None:
                return frames
            frames.append(f)
        raise AssertionError("server did not close the connection")

    def close(self) -> None:
        self.sock.close()
