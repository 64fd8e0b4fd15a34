"""Subprocess helper: a plain cyclonedds writer of sensor_msgs/msg/Imu (best effort, as IMU
drivers publish) on rt<TOPIC> at a fixed rate; sample i has header.stamp.sec = i.

usage: imu_writer.py DOMAIN TOPIC HZ COUNT
Waits (up to 20 s) for a matched reader, prints "writing", then "sent N in S s".
"""

import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from cyclonedds._clayer import ddspy_write  # noqa: E402
from cyclonedds.domain import DomainParticipant  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

from ros_side.backends.dds import make_qos  # noqa: E402
from ros_side.dds_types import TypeRegistry  # noqa: E402

IMU = "sensor_msgs/msg/Imu"
QOS_BE = {"reliability": "best_effort", "durability": "volatile", "depth": 1}


def imu_cdr() -> bytearray:
    """One Imu (every field set) as ROS 2 serializes it; stamp.sec sits at offset 4."""
    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    t = T["builtin_interfaces/msg/Time"](sec=0, nanosec=0)
    h = T["std_msgs/msg/Header"](stamp=t, frame_id="imu_link")
    q = T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)
    v = T["geometry_msgs/msg/Vector3"](x=0.1, y=0.2, z=9.81)
    import numpy as np
    cov = np.arange(9, dtype=np.float64)
    m = T[IMU](header=h, orientation=q, orientation_covariance=cov, angular_velocity=v,
               angular_velocity_covariance=cov, linear_acceleration=v,
               linear_acceleration_covariance=cov)
    return bytearray(ts.serialize_cdr(m, IMU))


def main() -> None:
    domain, topic, hz, count = sys.argv[1:5]
    assert os.environ.get("CYCLONEDDS_URI", "").startswith("<CycloneDDS>")  # loopback only
    cls = TypeRegistry("humble").idl_type(IMU)
    dp = DomainParticipant(int(domain))
    w = DataWriter(dp, Topic(dp, "rt" + topic, cls), qos=make_qos(QOS_BE, True))
    end = time.monotonic() + 20
    while w.get_publication_matched_status().current_count < 1 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.2)
    data = imu_cdr()
    print("writing %d bytes" % len(data), flush=True)
    period = 1.0 / float(hz)
    n = int(count)
    t0 = time.monotonic()
    for i in range(n):
        ahead = t0 + i * period - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        struct.pack_into("<i", data, 4, i)
        ddspy_write(w._ref, bytes(data))
    print("sent %d in %.2f s" % (n, time.monotonic() - t0), flush=True)
    time.sleep(0.5)


if __name__ == "__main__":
    main()
