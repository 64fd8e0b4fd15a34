# UBRB v1 frames as a client sends them, and a byte stream split into frames; built on the
# core's own encoders (ubrb_min).
# MicroPython-compatible: imported by tests/core under real MicroPython too.
import ubrb_min as U

from tests.support.qos import QOS_R

HEADER = 12  # magic(4) version(1) op(1) flags(2) length(4)


def hello(name="test"):
    return U.encode_json_frame(U.OP_HELLO, {"protocol": 1, "client": name})


def advertise(id_, topic, type_="std_msgs/msg/String", qos=None):
    return U.encode_json_frame(
        U.OP_ADVERTISE, {"id": id_, "topic": topic, "type": type_, "qos": qos or QOS_R}
    )


def subscribe(id_, topic, type_="std_msgs/msg/String", qos=None):
    return U.encode_json_frame(
        U.OP_SUBSCRIBE, {"id": id_, "topic": topic, "type": type_, "qos": qos or QOS_R}
    )


def unadvertise(id_):
    return U.encode_json_frame(U.OP_UNADVERTISE, {"id": id_})


def publish(id_, data):
    b = bytearray(4)
    U.put_u32(b, 0, id_)
    return U.encode_frame(U.OP_PUBLISH, bytes(b) + data)


def ping():
    return U.encode_frame(U.OP_PING, b"")


def split_frames(data):
    """The whole frames at the start of ``data`` as [(op, payload)], and how many bytes they
    take (a partial frame at the end is left for the next call)."""
    out = []
    o = 0
    while len(data) - o >= HEADER:
        n = U.get_u32(data, o + 8)
        if len(data) - o < HEADER + n:
            break
        out.append((data[o + 5], bytes(data[o + HEADER : o + HEADER + n])))
        o += HEADER + n
    return out, o


def parse_frames(data):
    """[(op, payload)] of a byte string of whole frames (a cut-off last frame comes out with
    the payload bytes that are there)."""
    out = []
    o = 0
    while o < len(data):
        assert data[o : o + 4] == b"UBRB", "bad magic in output"
        n = U.get_u32(data, o + 8)
        out.append((data[o + 5], bytes(data[o + HEADER : o + HEADER + n])))
        o += HEADER + n
    return out
