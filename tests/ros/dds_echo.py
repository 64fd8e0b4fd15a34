"""Subprocess helper: a plain cyclonedds participant in another process that echoes raw samples
from ``rt/<in>`` to ``rt/<out>`` (so data crosses the real loopback wire twice).

usage: dds_echo.py DOMAIN IN_TOPIC OUT_TOPIC ROS_TYPE COUNT
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from cyclonedds._clayer import ddspy_take, ddspy_write  # noqa: E402
from cyclonedds.domain import DomainParticipant  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.sub import DataReader  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402

from ros_side.backends.dds import make_qos  # noqa: E402
from ros_side.dds_types import TypeRegistry  # noqa: E402
from tests.support.qos import QOS_R  # noqa: E402


def main():
    domain, tin, tout, rtype, count = sys.argv[1:6]
    assert os.environ.get("CYCLONEDDS_URI", "").startswith("<CycloneDDS>")  # loopback only
    cls = TypeRegistry("humble").idl_type(rtype)
    dp = DomainParticipant(int(domain))
    r = DataReader(dp, Topic(dp, "rt" + tin, cls), qos=make_qos(QOS_R, False))
    w = DataWriter(dp, Topic(dp, "rt" + tout, cls), qos=make_qos(QOS_R, True))
    print("ready", flush=True)
    left = int(count)
    end = time.monotonic() + 20
    while left and time.monotonic() < end:
        got = ddspy_take(r._ref, 0xFFFF, 8)
        if isinstance(got, int) or not got:
            time.sleep(0.002)
            continue
        for data, info in got:
            if info.valid_data:
                ddspy_write(w._ref, data)
                left -= 1
    time.sleep(0.5)  # let reliable data be acknowledged
    print("done", left, flush=True)


if __name__ == "__main__":
    main()
