"""Subprocess helper: a plain cyclonedds writer of std_msgs/msg/String on rt<TOPIC> at a fixed
rate, each sample ``<tag><seq:06d>`` padded to SIZE characters (raw CDR, as ROS 2 writes it).

usage: dds_writer.py DOMAIN TOPIC TAG HZ SIZE COUNT
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

from ros_side.backends.dds import make_qos  # noqa: E402
from ros_side.dds_types import TypeRegistry  # noqa: E402
from tests.support.qos import QOS_R  # noqa: E402


def sample(tag: str, seq: int, size: int) -> bytes:
    text = ("%s%06d" % (tag, seq)).ljust(size, "x").encode()
    return b"\x00\x01\x00\x00" + struct.pack("<I", len(text) + 1) + text + b"\x00"


def main() -> None:
    domain, topic, tag, hz, size, count = sys.argv[1:7]
    assert os.environ.get("CYCLONEDDS_URI", "").startswith("<CycloneDDS>")  # loopback only
    cls = TypeRegistry("humble").idl_type("std_msgs/msg/String")
    dp = DomainParticipant(int(domain))
    w = DataWriter(dp, Topic(dp, "rt" + topic, cls), qos=make_qos(QOS_R, True))
    end = time.monotonic() + 20
    while w.get_publication_matched_status().current_count < 1 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.2)
    print("writing", flush=True)
    period = 1.0 / float(hz)
    n = int(count)
    t0 = time.monotonic()
    for i in range(n):
        ahead = t0 + i * period - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        ddspy_write(w._ref, sample(tag, i, int(size)))
    took = time.monotonic() - t0
    time.sleep(0.5)  # let reliable data be acknowledged
    print("sent %d in %.2f s" % (n, took), flush=True)


if __name__ == "__main__":
    main()
