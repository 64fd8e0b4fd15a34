"""A tiny blocking UBRB client for end-to-end tests (the full client library is ubrb_client)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any, List, Optional, Tuple

import ubrb_min as U

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TcpClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self, timeout: float = 5.0) -> Optional[Tuple[int, bytes]]:
        """The next frame, or None if the server closed the connection."""
        self.sock.settimeout(timeout)
        while True:
            if len(self.buf) >= 12:
                n = U.get_u32(self.buf, 8)
                if len(self.buf) >= 12 + n:
                    op, payload = self.buf[5], self.buf[12 : 12 + n]
                    self.buf = self.buf[12 + n :]
                    return op, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

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

    def expect_closed(self, timeout: float = 5.0) -> List[Tuple[int, bytes]]:
        """Frames received until the server closes; fails if it does not close in time."""
        frames: List[Tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if f is None:
                return frames
            frames.append(f)
        raise AssertionError("server did not close the connection")

    def close(self) -> None:
        self.sock.close()


class GatewayProcess:
    """`python ubrb_min.py ...` as a subprocess on an ephemeral loopback port."""

    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, os.path.join(ROOT, "ubrb_min.py"), "--listen", "127.0.0.1:0", *args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/"
        )
        self.lines: List[str] = []
        self.port = 0
        deadline = time.monotonic() + 10
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"listening on [\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                return
        raise AssertionError("gateway did not start:\n" + "".join(self.lines))

    def stop(self, sig: int = 15) -> str:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=10)
        self.lines.append(out)
        return "".join(self.lines)
