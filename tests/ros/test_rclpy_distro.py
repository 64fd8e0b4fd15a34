"""The rclpy backend's ROS 2 distro when ROS_DISTRO is not set (issue 22, item 2).

.venv-ros (ROS 2 Kilted from PyPI) sets no variable: the companion reads the distro from the
installation (ros_environment's hook in the ament index, a /opt/ros/<distro> prefix, the wheels'
``ros-<distro>-rclpy``), and `ubrb_client pub` through the gateway publishes instead of saying
that the bridge has no ROS side."""

import os
import socket
import subprocess
import sys

from ros_side.backends.rclpy_backend import installed_distro
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, Proc, child_env
from tests.support.ros_procs import ROS_PYTHON, require_ros, ros_env


def _hook(prefix, name, text):
    d = os.path.join(str(prefix), "share", "ros_environment", "environment")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


def test_distro_from_the_variable_then_the_installation(tmp_path):
    jazzy = tmp_path / "jazzy_ws"
    _hook(jazzy, "1.ros_distro.sh", "# generated\nif [ -n \"$ROS_DISTRO\" ]; then :; fi\n"
                                    "export ROS_DISTRO=jazzy\n")
    humble = tmp_path / "humble"
    _hook(humble, "1.ros_distro.dsv", "set;ROS_DISTRO;humble\n")
    rclpy_file = os.path.join(str(humble), "lib", "python3.10", "site-packages", "rclpy",
                              "__init__.py")
    # the variable wins; then AMENT_PREFIX_PATH's prefixes in order; then rclpy's own prefix
    assert installed_distro({"ROS_DISTRO": " Kilted "}, rclpy_file) == "kilted"
    env = {"AMENT_PREFIX_PATH": os.pathsep.join([str(tmp_path / "none"), str(jazzy)])}
    assert installed_distro(env, rclpy_file) == "jazzy"
    assert installed_distro({"ROS_DISTRO": ""}, rclpy_file) == "humble"


def test_distro_of_an_opt_ros_prefix_without_its_hook():
    from ros_side.backends import rclpy_backend

    assert installed_distro({}, "/opt/ros/iron/lib/python3.10/site-packages/rclpy/__init__.py") \
        == "iron"
    assert rclpy_backend._prefix_distro("/opt/ros/iron") == "iron"
    assert rclpy_backend._prefix_distro("/usr") is None


def test_kilted_wheels_name_their_distro():
    require_ros()
    code = ("import os, rclpy; from ros_side.backends.rclpy_backend import installed_distro; "
            "print(installed_distro(rclpy_file=rclpy.__file__))")
    env = ros_env()
    env.pop("ROS_DISTRO", None)
    env.pop("AMENT_PREFIX_PATH", None)
    r = subprocess.run([ROS_PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "kilted", (r.stdout, r.stderr)


def test_pub_through_gateway_and_rclpy_companion_without_ros_distro():
    # the README's chain on one machine, the companion on the real Kilted rclpy with no
    # ROS_DISTRO: the gateway hears the distro over the link, the client publishes (exit 0)
    require_ros()
    link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    g = Proc([sys.executable, "ubrb_min.py", "--listen", "127.0.0.1:0", "--link", link,
              "--profile", "mcu"], env=child_env())
    env = ros_env()
    env.pop("ROS_DISTRO", None)
    c = Proc([ROS_PYTHON, "-m", "ros_side", "--backend", "rclpy", "--link", link,
              "--no-diagnostics"], env=env)
    try:
        port = int(g.wait_line(r"listening on 127\.0\.0\.1:(\d+)", 30).group(1))
        assert c.wait_line(r"companion on link .*, backend RclpyBackend \((.*)\)$", 60).group(1) \
            == "kilted"
        g.wait_line(r"ROS side up \('kilted'", 30)
        r = Proc([sys.executable, "-m", "ubrb_client", "pub", "/ubrb_i22_distro",
                  "std_msgs/msg/String", "{data: hi}", "--server", "127.0.0.1:%d" % port,
                  "-v"], env=child_env())
        code = r.wait(60)
        assert code == 0, r.text()
        assert "no ROS side" not in r.text() and "(ROS kilted)" in r.text(), r.text()
    finally:
        c.stop()
        g.stop()
