"""Test helpers: parse UBRB frames out of a byte string, build bridge->client frames."""
import json

from ubrb_client import frames as F


def parse(data: bytes):
    """Complete frames in data as a list of (op_name, payload) with JSON decoded and data
    frames as (id, cdr)."""
    dec = F.FrameDecoder()
    out: list[tuple[str, object]] = []
    for op, payload in dec.feed(data):
        name = F.OP_NAMES.get(op, str(op))
        if op in (F.PUBLISH, F.MESSAGE):
            out.append((name, F.split_data_payload(payload)))
        elif payload:
            out.append((name, json.loads(payload)))
        else:
            out.append((name, None))
    return out


def ops(data: bytes):
    return [name for name, _ in parse(data)]


def hello_ack():
    return F.encode_json_frame(F.HELLO_ACK, {"protocol": 1, "server": "fake/0", "ros_distro": "humble"})


def sub_count(counts: dict):
    return F.encode_json_frame(F.SUB_COUNT, {"counts": {str(k): v for k, v in counts.items()}})


def error(id, code, message="x"):
    return F.encode_json_frame(F.ERROR, {"id": id, "code": code, "message": message})


def message(sid, cdr):
    return F.encode_data_frame(F.MESSAGE, sid, cdr)
