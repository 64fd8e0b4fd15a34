"""ros_side: the companion that owns every ROS 2 object of the bridge.

Backends: ``ros_side.backends.dds`` (PyPI cyclonedds + rosbags, no ROS needed) and
``ros_side.backends.rclpy_backend`` (a ROS 2 installation). The backend-neutral logic is
``ros_side.companion.Companion``. See docs/COMPANION.md and docs/DESIGN.md.
"""

from .errors import RosError  # noqa: F401

__all__ = ["RosError"]
