"""Test helpers: parse UBRB frames out of a byte string, build bridge->client frames."""
import json

from ubrb_client import frames as F


def parse(data: bytes):
    """Complete frames in data as a list of (op_name, payload) with JSON decoded and data
    frames as (id, cdr)."""
    return [record(op, payload) for op, payload in F.FrameDecoder().feed(data)]


def record(op: int, payload: bytes) -> tuple[str, object]:
    """One frame as (op_name, payload): data frames as (id, cdr), JSON decoded, else None."""
    name = F.OP_NAMES.get(op, str(op))
    if op in (F.PUBLISH, F.MESSAGE):
        return name, F.split_data_payload(payload)
    if payload:
        return name, json.loads(payload)
    return name, None


def ops(data: bytes):
    return [name for name, _ in parse(data)]


def hello_ack(**fields):
    """HELLO_ACK of a bridge with a ROS side (humble); `fields` replace or add fields, a None
    value drops that field."""
    ack = {"protocol": 1, "server": "fake/0", "ros_distro": "humble", "ros_ready": True}
    ack.update(fields)
    return F.encode_json_frame(F.HELLO_ACK, {k: v for k, v in ack.items() if v is not None})


def sub_count(counts: dict):
    return F.encode_json_frame(F.SUB_COUNT, {"counts": {str(k): v for k, v in counts.items()}})


def error(id, code, message="x"):
    return F.encode_json_frame(F.ERROR, {"id": id, "code": code, "message": message})


def message(sid, cdr):
    return F.encode_data_frame(F.MESSAGE, sid, cdr)
