"""UBRB v1 framing: the 12-byte header, op codes and an incremental frame decoder.

Header layout (all little-endian)::

    0  4  magic  b"UBRB"
    4  1  version 1
    5  1  op
    6  2  flags (sender writes 0, receiver ignores)
    8  4  payload length N (u32)
"""
from __future__ import annotations

import json
import struct

MAGIC = b"UBRB"
VERSION = 1
HEADER_SIZE = 12
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024

HELLO = 1
HELLO_ACK = 2
ADVERTISE = 3
UNADVERTISE = 4
PUBLISH = 5
SUBSCRIBE = 6
UNSUBSCRIBE = 7
MESSAGE = 8
SUB_COUNT = 9
PING = 10
PONG = 11
ERROR = 12

OP_NAMES = {
    HELLO: "HELLO", HELLO_ACK: "HELLO_ACK", ADVERTISE: "ADVERTISE", UNADVERTISE: "UNADVERTISE",
    PUBLISH: "PUBLISH", SUBSCRIBE: "SUBSCRIBE", UNSUBSCRIBE: "UNSUBSCRIBE", MESSAGE: "MESSAGE",
    SUB_COUNT: "SUB_COUNT", PING: "PING", PONG: "PONG", ERROR: "ERROR",
}

_HDR = struct.Struct("<4sBBHI")
_U32 = struct.Struct("<I")


class MalformedHeader(Exception):
    """A frame header with a wrong magic/version or an oversized length: close the connection."""


def encode_frame(op: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """One complete frame (header + payload) as bytes."""
    return _HDR.pack(MAGIC, VERSION, op, 0, len(payload)) + bytes(payload)


def encode_json_frame(op: int, obj) -> bytes:
    return encode_frame(op, json.dumps(obj, separators=(",", ":")).encode())


def encode_data_frame(op: int, ident: int, cdr) -> bytes:
    """PUBLISH / MESSAGE: u32 LE id followed by the CDR bytes."""
    n = 4 + len(cdr)
    return _HDR.pack(MAGIC, VERSION, op, 0, n) + _U32.pack(ident) + bytes(cdr)


def split_data_payload(payload) -> tuple[int, bytes]:
    if len(payload) < 4:
        raise ValueError("data frame shorter than its 4-byte id")
    return _U32.unpack_from(payload, 0)[0], bytes(payload[4:])


class FrameDecoder:
    """Reassembles frames from a byte stream.

    ``feed(data)`` returns a list of ``(op, payload_bytes)``. The header is validated as soon as
    its 12 bytes are in, before any payload is buffered; a bad header raises MalformedHeader.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD):
        self.max_payload = max_payload
        self._buf = bytearray()
        self._need: int | None = None  # payload length of the frame being read
        self._op = 0

    def reset(self) -> None:
        self._buf.clear()
        self._need = None

    def feed(self, data) -> list[tuple[int, bytes]]:
        self._buf += data
        out = []
        buf = self._buf
        pos = 0
        while True:
            if self._need is None:
                if len(buf) - pos < HEADER_SIZE:
                    break
                magic, version, op, _flags, n = _HDR.unpack_from(buf, pos)
                if magic != MAGIC:
                    raise MalformedHeader(f"bad magic {bytes(magic)!r}")
                if version != VERSION:
                    raise MalformedHeader(f"unsupported version {version}")
                if n > self.max_payload:
                    raise MalformedHeader(f"payload length {n} above limit {self.max_payload}")
                pos += HEADER_SIZE
                self._need = n
                self._op = op
            if len(buf) - pos < self._need:
                break
            out.append((self._op, bytes(buf[pos:pos + self._need])))
            pos += self._need
            self._need = None
        if pos:
            del buf[:pos]
        return out
