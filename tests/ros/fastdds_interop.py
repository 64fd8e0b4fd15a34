"""The dds backend (cyclonedds) next to a real Fast DDS node (Kilted rclpy from .venv-ros), with and
without the Cyclone settings the backend adds (backends/dds.py: FASTDDS_COMPAT_XML). Reproduces the
interop findings of docs/COMPANION.md and prints, in one run, each next to its comparison:

  * matching: a sensor_msgs/Image subscription of a ROS node sees our publisher (count) and gets
    a sample — with the settings vs. with the loopback configuration alone (XTypes type
    information from Fast DDS rejected by Cyclone: no match);
  * ghost subscriptions: how long a ROS publisher keeps counting our deleted subscription — with
    GenerateKeyhash vs. without (Fast DDS ignores the dispose without a key hash);
  * the first fragmented sample a Fast DDS writer sends to a Cyclone reader: how many 1 MiB images
    the node writes until the first arrives — right after matching, after a small sample and a
    0.5 s pause, and after a small sample the Cyclone reader acknowledged (rclpy
    wait_for_all_acked: Cyclone acknowledges only once it accepted a HEARTBEAT from the writer);
    and a 60 kB image (one datagram) for comparison. See docs/COMPANION.md, "first large sample".

Each case runs in a process of its own (a process applies one Cyclone configuration per domain).
Loopback only (tests/ros/ros_procs.ros_env). Needs `make venv venv-ros`.
Usage: .venv/bin/python tests/ros/fastdds_interop.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "ros"))

import ros_helpers  # type: ignore[import-not-found]  # noqa: E402,F401  (loopback, own domain id)
from tests.support.ros_procs import Peer, ros_env  # noqa: E402

from ros_side.backends.dds import FASTDDS_COMPAT_XML, LOOPBACK_XML, DdsBackend  # noqa: E402

IMAGE = "sensor_msgs/msg/Image"
Q = {"reliability": "reliable", "durability": "volatile", "depth": 2}
KEYHASH_ONLY = FASTDDS_COMPAT_XML.replace(
    "<Compatibility><IgnoreTypeInformation>1.15</IgnoreTypeInformation></Compatibility>", "")
TYPEINFO_ONLY = FASTDDS_COMPAT_XML.replace(
    "<Internal><GenerateKeyhash>true</GenerateKeyhash></Internal>", "")


def until(cond: Callable[[], Any], timeout: float) -> float:
    """Seconds until ``cond()`` is true, or -1 after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.01)
    return -1.0


def image(n: int) -> bytes:
    from rosbags.typesys import Stores, get_typestore
    import numpy as np
    st = get_typestore(Stores.ROS2_KILTED)
    T = st.types
    msg = T[IMAGE](header=T["std_msgs/msg/Header"](
        stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=2), frame_id="cam"),
        height=1, width=n, encoding="mono8", is_bigendian=0, step=n,
        data=(np.arange(n) % 251).astype(np.uint8))
    return bytes(st.serialize_cdr(msg, IMAGE))


def backend(config: str) -> DdsBackend:
    return DdsBackend(domain=int(os.environ["ROS_DOMAIN_ID"]), distro="kilted", config=config)


def matching(peer: Peer, config: str, topic: str) -> str:
    b = backend(config)
    try:
        k = peer.endpoint("sub", topic, IMAGE, Q)
        h = b.create_publisher(topic, IMAGE, Q)
        t = until(lambda: peer.call("count", id=k)["count"] == 1
                  and b.subscription_count(h) == 1, 5)
        if t < 0:
            return "no match in 5 s"
        b.publish(h, image(64))
        got = until(lambda: peer.received(k), 5)
        return "matched in %.0f ms, sample %s" % (t * 1000, "received" if got >= 0 else "lost")
    finally:
        b.close()


def ghost(peer: Peer, config: str, topic: str) -> str:
    b = backend(config)
    try:
        k = peer.endpoint("pub", topic, "std_msgs/msg/String", Q)
        h = b.create_subscription(topic, "std_msgs/msg/String", Q, lambda d: None)
        if until(lambda: peer.call("count", id=k)["count"] == 1, 5) < 0:
            return "never counted"
        b.destroy_subscription(h)
        t = until(lambda: peer.call("count", id=k)["count"] == 0, 12)
        return "count back to 0 in %.0f ms" % (t * 1000) if t >= 0 else "still counted after 12 s"
    finally:
        b.close()


def first_sample(peer: Peer, config: str, topic: str, primer: str, size: int) -> str:
    """``primer``: "" (none), "pause" (a small image, then 0.5 s) or "acked" (a small image,
    then until the Cyclone reader acknowledged it)."""
    b = backend(config)
    got: List[bytes] = []
    try:
        h = b.create_subscription(topic, IMAGE, Q, got.append)
        k = peer.endpoint("pub", topic, IMAGE, Q)
        until(lambda: peer.call("count", id=k)["count"] == 1
              and h.reader.get_subscription_matched_status().current_count == 1, 5)
        if primer:
            peer.call("write", id=k, data=image(16).hex())
            until(lambda: got, 5)
            if primer == "pause":
                time.sleep(0.5)
            elif not peer.call("acked", id=k, within=10)["acked"]:
                return "the small image was never acknowledged"
        before = len(got)
        big = image(size).hex()
        for sends in range(1, 6):
            peer.call("write", id=k, data=big)
            if until(lambda: len(got) > before, 2) >= 0:
                return "arrived after %d write(s)" % sends
        return "none of 5 writes arrived"
    finally:
        b.close()


CFG = {"all": LOOPBACK_XML + "," + FASTDDS_COMPAT_XML,
       "no-typeinfo": LOOPBACK_XML + "," + KEYHASH_ONLY,
       "no-keyhash": LOOPBACK_XML + "," + TYPEINFO_ONLY}
CASES = [
    ("matching, sensor_msgs/Image, with the backend's settings", "match", "all"),
    ("matching, sensor_msgs/Image, without IgnoreTypeInformation", "match", "no-typeinfo"),
    ("ghost subscription, with GenerateKeyhash", "ghost", "all"),
    ("ghost subscription, without GenerateKeyhash", "ghost", "no-keyhash"),
    ("first 1 MiB image, right after matching", "big", "all"),
    ("first 1 MiB image, after a small one and 0.5 s", "big-primed", "all"),
    ("first 1 MiB image, after a small one acknowledged", "big-acked", "all"),
    ("first 60 kB image (one datagram), right after matching", "one-datagram", "all"),
]


def run_case(case: str, cfg: str) -> str:
    env = ros_env(ROS_DISTRO="kilted")
    os.environ.update(env)
    peer = Peer("rclpy", env)
    try:
        config = CFG[cfg]
        if case == "match":
            return matching(peer, config, "/m")
        if case == "ghost":
            return ghost(peer, config, "/g")
        if case == "big":
            return first_sample(peer, config, "/f", "", 1024 * 1024)
        if case == "big-primed":
            return first_sample(peer, config, "/f", "pause", 1024 * 1024)
        if case == "big-acked":
            return first_sample(peer, config, "/f", "acked", 1024 * 1024)
        return first_sample(peer, config, "/f", "", 60000)
    finally:
        peer.close()


def main() -> None:
    if len(sys.argv) == 3:
        print("RESULT", run_case(sys.argv[1], sys.argv[2]), flush=True)
        return
    print("Fast DDS node (Kilted rclpy, .venv-ros) vs the dds backend, loopback")
    for title, case, cfg in CASES:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), case, cfg],
                           capture_output=True, text=True, timeout=120)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        print("  %-58s %s" % (title + ":", lines[-1][7:] if lines else "failed: "
                              + r.stderr.strip().splitlines()[-1:][0] if r.stderr.strip() else "?"))


if __name__ == "__main__":
    main()
