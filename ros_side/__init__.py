"""ros_side: the companion that owns every ROS 2 object of the bridge.

Backends: ``ros_side.backends.dds`` (PyPI cyclonedds + rosbags, no ROS needed) and
``ros_side.backends.rclpy_backend`` (a ROS 2 installation). The backend-neutral logic is
``ros_side.companion.Companion``. See docs/COMPANION.md and docs/DESIGN.md.
"""

__all__ = ["RosError"]


def __getattr__(name):
    # ros_side.RosError, imported when asked for: `python -m ros_side` and the console script run
    # nothing of the package before the program's own Ctrl-C handling (main below) is in place
    if name == "RosError":
        from .errors import RosError

        return RosError
    raise AttributeError("module 'ros_side' has no attribute %r" % name)


def main(argv=None):
    """The `ros_side` command (setup.py; `ros2 run ros_side ros_side`): ros_side.__main__.main,
    imported here so that a Ctrl-C while the program loads is a quiet exit 130, as under
    `python -m ros_side`."""
    try:
        try:
            from ubrb_host import catch_stray_interrupts
        except ImportError:  # a source tree: ros_side.__main__ puts ubrb_host on sys.path
            pass
        else:
            catch_stray_interrupts()
        from .__main__ import main as run

        return run(argv)
    except KeyboardInterrupt:  # while it loads, or in the instant before run_program's handling
        return 130
