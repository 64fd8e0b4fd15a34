# One setup.py serves colcon (ament_python)
# and pip: `colcon build` finds package.xml at the repo root; pip installs the same modules.
# What each machine installs (README, "Install"):
#   gateway host (Pi):  nothing - copy ubrb_min.py + ports/, or `pip install .` (stdlib only);
#                       `pip install '.[serial]'` for a serial link
#   ROS 2 PC, no ROS:   pip install '.[dds]'        (cyclonedds + rosbags: the dds backend)
#   ROS 2 PC with ROS:  colcon build (the rclpy backend needs nothing from PyPI)
#   client machine:     pip install '.[client]'     (rosbags message definitions + PyYAML)
from glob import glob

from setuptools import setup

# The ROS package (package.xml's <name>: colcon, `ros2 run ros_side ros_side`, the ament index
# marker and share/ros_side/) is ros_side; the Python distribution that pip installs and
# uninstalls is the project's: `pip uninstall ubrb-gateway`. colcon takes a ROS package's name
# from package.xml, so the two may differ.
package_name = "ros_side"

setup(
    name="ubrb-gateway",
    version="0.1.0",
    # The core (direct mode runs it in-process), the companion, the shared CPython runtime
    # (ubrb_host, kept in ports/cpython/ in the source tree: no top-level `ports` is installed)
    # and the UBRB client library.
    packages=["ros_side", "ros_side.backends", "ubrb_host", "ubrb_client"],
    package_dir={"ubrb_host": "ports/cpython/ubrb_host"},
    # the core, beside it what start-up and the optional features load (ubrb_setup, ubrb_policy,
    # ubrb_keyed, ubrb_stream, ubrb_hold, ubrb_keep)
    py_modules=["ubrb_min", "ubrb_setup", "ubrb_policy", "ubrb_keyed", "ubrb_stream", "ubrb_hold",
                "ubrb_keep"],
    data_files=[
        ("share/ament_index/resource_index/packages", ["ros_side/resource/ros_side"]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("ros_side/launch/*.launch.py")),
    ],
    install_requires=["setuptools"],
    # Versions as pinned in requirements-dev.txt (what the tests run against).
    extras_require={
        "dds": ["cyclonedds==11.0.1", "rosbags==0.11.9"],
        "serial": ["pyserial==3.5"],
        "client": ["rosbags==0.11.9", "PyYAML==6.0.4"],
    },
    python_requires=">=3.10",
    zip_safe=True,
    maintainer="UBRB maintainers",
    maintainer_email="maintainer@example.com",
    description="UBRB v1 gateway between Unreal Engine (uBotROS) clients and ROS 2: the gateway "
                "core and CPython runtime, the ROS 2 companion (ros_side) and a UBRB client",
    license="Apache-2.0",
    tests_require=["pytest"],
    # ubrb-gateway: the gateway (what `python ubrb_min.py` and `python -m ubrb_min` start)
    # (both through a function of the package's light __init__: a Ctrl-C while the program loads
    # is a quiet exit 130, not a traceback of the command's own import)
    entry_points={"console_scripts": ["ros_side = ros_side:main",
                                      "ubrb-gateway = ubrb_host:gateway_main"]},
)
