"""ROS 2 messages with the rosbags typestore: CDR encoding/decoding and dict <-> dataclass.

``from_dict(store, 'geometry_msgs/msg/Twist', {'linear': {'x': 0.5}})`` builds a rosbags
message, recursing into nested messages, filling fixed arrays and sequences (numpy arrays for
primitive elements) and using zero/empty defaults for missing fields. ``to_dict(msg)`` goes the
other way with plain Python values (for YAML output).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.store import Typestore

DEFAULT_DISTRO = "humble"

_DTYPES = {
    "bool": np.bool_, "byte": np.uint8, "octet": np.uint8, "char": np.uint8,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
    "float32": np.float32, "float64": np.float64,
}
# Default values declared in .msg files that the rosbags typestore does not carry.
MSG_DEFAULTS = {
    "geometry_msgs/msg/Quaternion": {"w": 1.0},
}

_INTS = {"byte", "octet", "char", "int8", "uint8", "int16", "uint16", "int32", "uint32",
         "int64", "uint64"}
# The values each integer type holds (byte, octet and char are 8-bit unsigned in ROS 2).
_INT_RANGES = {t: (int(np.iinfo(_DTYPES[t]).min), int(np.iinfo(_DTYPES[t]).max)) for t in _INTS}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@functools.cache
def get_store(distro: str = DEFAULT_DISTRO) -> Typestore:
    """The rosbags typestore of a ROS 2 distro (humble, iron, jazzy, kilted, ...)."""
    name = distro if distro.startswith("ros2_") else f"ros2_{distro}"
    return get_typestore(Stores(name))


def normalize_type(typename: str) -> str:
    """'std_msgs/String' -> 'std_msgs/msg/String'; full names are returned unchanged."""
    parts = typename.strip().split("/")
    if len(parts) == 2:
        return f"{parts[0]}/msg/{parts[1]}"
    return typename.strip()


def check_type(store: Typestore, typename: str) -> str:
    typename = normalize_type(typename)
    if typename not in store.fielddefs:
        raise KeyError(f"unknown message type {typename}: not among the standard ROS 2 messages "
                       "of --distro (spell it pkg/msg/Type; a custom package's types reach ROS "
                       "through the companion's --msg-path, this client encodes standard ones)")
    return typename


def encode(store: Typestore, msg, typename: str | None = None) -> bytes:
    """CDR bytes (little-endian, 4-byte encapsulation header included)."""
    return bytes(store.serialize_cdr(msg, typename or msg.__msgtype__))


def decode(store: Typestore, data, typename: str):
    return store.deserialize_cdr(bytes(data), typename)


# ------------------------------------------------------------------------ dict -> message
def _base_default(t: str):
    if t in ("string", "wstring"):
        return ""
    if t == "bool":
        return False
    if t in _INTS:
        return 0
    return 0.0


def _base_value(t: str, v, path: str):
    if t in ("string", "wstring"):
        if not isinstance(v, str):
            raise TypeError(f"{path}: expected a string, got {v!r}")
        return v
    if t == "bool":
        if isinstance(v, str):
            if v.lower() in ("true", "1", "yes"):
                return True
            if v.lower() in ("false", "0", "no"):
                return False
            raise TypeError(f"{path}: expected a bool, got {v!r}")
        return bool(v)
    if t in _INTS:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            if not (isinstance(v, float) and v.is_integer()):
                raise TypeError(f"{path}: expected an integer, got {v!r}")
        n = int(v)
        low, high = _INT_RANGES[t]
        if not low <= n <= high:
            raise ValueError(f"{path}: {n} is out of range for {t} ({low} to {high})")
        return n
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{path}: expected a number, got {v!r}")
    try:
        f = float(v)
    except OverflowError:             # an int beyond any double
        raise ValueError(f"{path}: {v} is out of range for {t}") from None
    if t == "float32" and math.isfinite(f) and abs(f) > _FLOAT32_MAX:
        raise ValueError(f"{path}: {v!r} is out of range for float32 (-{_FLOAT32_MAX:.7g} to "
                         f"{_FLOAT32_MAX:.7g}; .inf and -.inf are allowed)")
    return f


def _value(store: Typestore, desc, v, path: str):
    kind, arg = desc
    kname = getattr(kind, "name", str(kind))
    if kname == "BASE":
        t = arg[0]
        return _base_default(t) if v is None else _base_value(t, v, path)
    if kname == "NAME":
        if v is None:
            v = {}
        if not isinstance(v, dict):
            raise TypeError(f"{path}: expected a mapping for {arg}, got {v!r}")
        return from_dict(store, arg, v, _path=path)
    if kname in ("ARRAY", "SEQUENCE"):
        sub, n = arg
        if v is None:
            v = []
        if isinstance(v, (bytes, bytearray)):
            v = list(v)
        if not isinstance(v, (list, tuple, np.ndarray)):
            raise TypeError(f"{path}: expected a list, got {v!r}")
        if kname == "ARRAY":
            if len(v) == 0:
                v = [None] * n
            elif len(v) != n:
                raise ValueError(f"{path}: expected {n} elements, got {len(v)}")
        elif n and len(v) > n:
            raise ValueError(f"{path}: at most {n} elements allowed, got {len(v)}")
        skind = getattr(sub[0], "name", str(sub[0]))
        if skind == "BASE" and sub[1][0] in _DTYPES:
            t = sub[1][0]
            vals = [_base_default(t) if x is None else _base_value(t, x, f"{path}[{i}]")
                    for i, x in enumerate(v)]
            return np.array(vals, dtype=_DTYPES[t])
        return [_value(store, sub, x, f"{path}[{i}]") for i, x in enumerate(v)]
    raise TypeError(f"{path}: unsupported field kind {kind}")


def from_dict(store: Typestore, typename: str, data: dict | None = None, *, _path: str = ""):
    """Build a rosbags message of ``typename`` from a (possibly partial) mapping of fields."""
    typename = check_type(store, typename)
    data = dict(data or {})
    _consts, fields = store.fielddefs[typename]
    kwargs = {}
    defaults = MSG_DEFAULTS.get(typename, {})
    for fname, desc in fields:
        kwargs[fname] = _value(store, desc, data.pop(fname, defaults.get(fname)),
                               f"{_path}.{fname}" if _path else fname)
    if data:
        raise KeyError(f"{_path or typename}: unknown field(s) {', '.join(sorted(data))} "
                       f"(fields: {', '.join(f for f, _ in fields)})")
    return store.types[typename](**kwargs)


# ------------------------------------------------------------------------ message -> dict
@functools.cache
def _field_names(cls) -> tuple:
    """The fields of a rosbags message class, without its constants: those are class-level
    (``OK: ClassVar[int] = 0`` in diagnostic_msgs/msg/DiagnosticStatus), not fields of a message,
    though the generated dataclass lists them (its annotations are strings)."""
    def constant(f) -> bool:
        t = f.type if isinstance(f.type, str) else repr(f.type)
        return t.replace("typing.", "").startswith("ClassVar")
    return tuple(f.name for f in dataclasses.fields(cls)
                 if not f.name.startswith("__") and not constant(f))


def to_dict(msg):
    """A rosbags message as plain dicts/lists/scalars (field order kept; constants left out)."""
    if hasattr(msg, "__msgtype__") and dataclasses.is_dataclass(msg):
        return {f: to_dict(getattr(msg, f)) for f in _field_names(type(msg))}
    if isinstance(msg, np.ndarray):
        return msg.tolist()
    if isinstance(msg, (list, tuple)):
        return [to_dict(x) for x in msg]
    if isinstance(msg, np.generic):
        return msg.item()
    return msg
