"""ROS backends of the companion: ``dds`` (PyPI cyclonedds + rosbags) and ``rclpy``.

A backend only makes ROS calls; see docs/DESIGN.md ("Companion and backends") for the interface.
"""


def rclpy_available():
    try:
        import rclpy  # noqa: F401
    except Exception:
        return False
    return True


def make_backend(kind="auto", domain=None, distro=None, msg_paths=(), node_name="ros_side"):
    """``auto``: rclpy if importable, else dds. Imports lazily so neither is required."""
    if kind == "auto":
        kind = "rclpy" if rclpy_available() else "dds"
    if kind == "rclpy":
        from .rclpy_backend import RclpyBackend
        return RclpyBackend(node_name=node_name, domain=domain)
    if kind == "dds":
        from .dds import DdsBackend
        return DdsBackend(domain=domain, distro=distro or "humble", msg_paths=msg_paths)
    raise ValueError("unknown backend %r (auto|rclpy|dds)" % (kind,))
