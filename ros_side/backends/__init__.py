"""ROS backends of the companion: ``dds`` (PyPI cyclonedds + rosbags) and ``rclpy``.

A backend only makes ROS calls; see docs/DESIGN.md ("Companion and backends") for the interface.
"""

import logging
import os

log = logging.getLogger("ros_side")


def rclpy_unavailable():
    """None when the rclpy backend can run here, else one line saying why not.

    Importing rclpy is not enough (a ROS 2 install without its libraries on the path, or a
    Python of another version, fails only when rclpy loads its C extension): this imports what
    the backend itself needs.
    """
    try:
        import rclpy  # noqa: F401
        from rclpy.executors import SingleThreadedExecutor  # noqa: F401
        from rclpy.serialization import serialize_message  # noqa: F401  (loads _rclpy_pybind11)
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)
    return None


def default_distro(distro=None, env=None):
    """``distro`` if given, else ``ROS_DISTRO``, else humble."""
    env = os.environ if env is None else env
    return distro or env.get("ROS_DISTRO", "").strip() or "humble"


def make_backend(kind="auto", domain=None, distro=None, msg_paths=(), node_name="ros_side",
                 node_namespace="/"):
    """``auto``: rclpy if it can run here, else dds (saying why in one log line). Imports lazily
    so neither backend is required."""
    why = None
    if kind == "auto":
        why = rclpy_unavailable()
        kind = "rclpy" if why is None else "dds"
    if kind == "rclpy":
        from .rclpy_backend import RclpyBackend
        return RclpyBackend(node_name=node_name, domain=domain, node_namespace=node_namespace)
    if kind == "dds":
        from .dds import DdsBackend
        backend = DdsBackend(domain=domain, distro=default_distro(distro), msg_paths=msg_paths,
                             node_name=node_name, node_namespace=node_namespace)
        if why is not None:  # said once the fallback works: a dds backend that cannot start
            log.info("backend auto: dds (rclpy not usable: %s)", why)  # says so in one line
        return backend
    raise ValueError("unknown backend %r (auto|rclpy|dds)" % (kind,))
