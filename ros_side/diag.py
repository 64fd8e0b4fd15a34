"""``diagnostic_msgs/msg/DiagnosticArray`` as ROS 2 CDR bytes, without any ROS library.

The companion publishes its counters through the backend like any other topic, so it needs the
serialized form on both backends (rosbags is not a dependency of a ROS 2 installation). The
layout is plain XCDR1 little endian (encapsulation ``00 01 00 00``); alignment is relative to the
end of that 4-byte header. The tests check these bytes against rosbags' ``serialize_cdr``.

    DiagnosticArray: std_msgs/Header header (builtin_interfaces/Time stamp {int32 sec,
                     uint32 nanosec}, string frame_id), DiagnosticStatus[] status
    DiagnosticStatus: byte level, string name, string message, string hardware_id, KeyValue[] values
    KeyValue: string key, string value
"""

import struct

TYPE = "diagnostic_msgs/msg/DiagnosticArray"
OK, WARN, ERROR, STALE = 0, 1, 2, 3

_U32 = struct.Struct("<I")
_TIME = struct.Struct("<iI")


class _Cdr:
    def __init__(self):
        self.b = bytearray(b"\x00\x01\x00\x00")

    def align(self, n):
        pad = (-(len(self.b) - 4)) % n
        if pad:
            self.b += b"\x00" * pad

    def u32(self, v):
        self.align(4)
        self.b += _U32.pack(v)

    def string(self, s):
        raw = str(s).encode("utf-8") + b"\x00"
        self.u32(len(raw))
        self.b += raw


def encode_diagnostic_array(sec, nanosec, statuses, frame_id=""):
    """``statuses``: iterable of (level, name, message, hardware_id, [(key, value), ...])."""
    c = _Cdr()
    c.align(4)
    c.b += _TIME.pack(int(sec), int(nanosec))
    c.string(frame_id)
    statuses = list(statuses)
    c.u32(len(statuses))
    for level, name, message, hardware_id, values in statuses:
        c.b.append(int(level) & 0xFF)
        c.string(name)
        c.string(message)
        c.string(hardware_id)
        values = list(values)
        c.u32(len(values))
        for k, v in values:
            c.string(k)
            c.string(v)
    return bytes(c.b)
