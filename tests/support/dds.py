"""DDS confined to this machine (shared/design/ROS-NOTES.md): the loopback-only Cyclone DDS
configuration, set for this process before any DDS domain exists."""

import os
from typing import Optional

from ros_side.backends.dds import LOOPBACK_XML

# Variables a user's shell may carry that would widen discovery beyond what CYCLONEDDS_URI says.
DISCOVERY_OVERRIDES = ("ROS_LOCALHOST_ONLY", "ROS_AUTOMATIC_DISCOVERY_RANGE")


def confine_this_process(domain: Optional[int] = None) -> None:
    """Every DDS participant this process (and every child inheriting its environment) creates
    stays on loopback, in ``domain`` (None: as ROS_DOMAIN_ID says). Call before the first
    participant exists."""
    os.environ["CYCLONEDDS_URI"] = LOOPBACK_XML  # always ours: a user's own may leave the machine
    for name in DISCOVERY_OVERRIDES:
        os.environ.pop(name, None)
    if domain is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain)
