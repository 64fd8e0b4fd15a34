"""Subprocess helper: a plain cyclonedds writer on rt<TOPIC> at a fixed rate (raw CDR, as ROS 2
writes it), for the tests that need real DDS traffic from outside the bridge.

usage: python -m tests.support.dds_writer DOMAIN TOPIC HZ COUNT string TAG SIZE
       python -m tests.support.dds_writer DOMAIN TOPIC HZ COUNT imu
  string: std_msgs/msg/String, reliable; sample i is ``<TAG><i:06d>`` padded to SIZE characters.
  imu:    sensor_msgs/msg/Imu, best effort (as IMU drivers publish); sample i has stamp.sec = i.
Waits (up to 20 s) for a matched reader, prints "writing N bytes", then "sent N in S s".
"""

import os
import struct
import sys
import time

from cyclonedds._clayer import ddspy_write
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.topic import Topic

from ros_side.backends.dds import make_qos
from ros_side.dds_types import TypeRegistry
from tests.support.qos import QOS_BE, QOS_R

IMU = "sensor_msgs/msg/Imu"


def string_cdr(tag: str, seq: int, size: int) -> bytearray:
    text = ("%s%06d" % (tag, seq)).ljust(size, "x").encode()
    return bytearray(b"\x00\x01\x00\x00" + struct.pack("<I", len(text) + 1) + text + b"\x00")


def imu_cdr() -> bytearray:
    """One Imu (every field set) as ROS 2 serializes it; stamp.sec sits at offset 4."""
    import numpy as np
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    t = T["builtin_interfaces/msg/Time"](sec=0, nanosec=0)
    h = T["std_msgs/msg/Header"](stamp=t, frame_id="imu_link")
    q = T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)
    v = T["geometry_msgs/msg/Vector3"](x=0.1, y=0.2, z=9.81)
    cov = np.arange(9, dtype=np.float64)
    m = T[IMU](header=h, orientation=q, orientation_covariance=cov, angular_velocity=v,
               angular_velocity_covariance=cov, linear_acceleration=v,
               linear_acceleration_covariance=cov)
    return bytearray(ts.serialize_cdr(m, IMU))


def main() -> None:
    domain, topic, hz, count, kind = sys.argv[1:6]
    assert os.environ.get("CYCLONEDDS_URI", "").startswith("<CycloneDDS>")  # loopback only
    if kind == "imu":
        ros_type, qos, data = IMU, QOS_BE, imu_cdr()
    else:
        tag, size = sys.argv[6], int(sys.argv[7])
        ros_type, qos, data = "std_msgs/msg/String", QOS_R, string_cdr(tag, 0, size)
    cls = TypeRegistry("humble").idl_type(ros_type)
    dp = DomainParticipant(int(domain))
    w = DataWriter(dp, Topic(dp, "rt" + topic, cls), qos=make_qos(qos, True))
    end = time.monotonic() + 20
    while w.get_publication_matched_status().current_count < 1 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.2)
    print("writing %d bytes" % len(data), flush=True)
    period = 1.0 / float(hz)
    n = int(count)
    t0 = time.monotonic()
    for i in range(n):
        ahead = t0 + i * period - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        if kind == "imu":
            struct.pack_into("<i", data, 4, i)
        else:
            data = string_cdr(tag, i, size)
        ddspy_write(w._ref, bytes(data))
    print("sent %d in %.2f s" % (n, time.monotonic() - t0), flush=True)
    time.sleep(0.5)  # let reliable data be acknowledged


if __name__ == "__main__":
    main()
