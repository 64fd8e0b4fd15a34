"""ros_side as a ROS 2 ament_python package: the files colcon and ros2 run/launch rely on."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from ros_side.cli import ros_params_as_flags, strip_ros_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_package_xml_is_format_3_ament_python_with_runtime_deps():
    root = ET.parse(os.path.join(ROOT, "package.xml")).getroot()
    assert root.get("format") == "3"
    assert root.findtext("name") == "ros_side"
    assert root.find("export/build_type").text == "ament_python"
    deps = {e.text for e in root.findall("exec_depend")}
    assert "rclpy" in deps and "diagnostic_msgs" in deps
    assert "rosidl_runtime_py" not in deps      # the rclpy backend imports message classes itself


def test_setup_installs_the_marker_launch_file_and_console_script():
    out = subprocess.run(
        [sys.executable, "setup.py", "--name", "--version"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["ros_side", "0.1.0"]
    assert os.path.isfile(os.path.join(ROOT, "ros_side", "resource", "ros_side"))
    assert os.path.isfile(os.path.join(ROOT, "ros_side", "launch", "ros_side.launch.py"))
    setup_cfg = open(os.path.join(ROOT, "setup.cfg")).read()
    assert "script_dir=$base/lib/ros_side" in setup_cfg
    assert "ros_side = ros_side.__main__:main" in open(os.path.join(ROOT, "setup.py")).read()


def test_ros_parameters_mirror_the_command_line_flags():
    argv = ["--backend", "dds", "--ros-args", "-p", "link:=serial:/dev/ttyACM0",
            "-p", "baud:=921600", "-p", "no_diagnostics:=true", "-r", "__node:=x", "--"]
    assert ros_params_as_flags(argv) == [
        "--link", "serial:/dev/ttyACM0", "--baud", "921600", "--no-diagnostics"]
    assert strip_ros_args(argv) == ["--backend", "dds"]


def test_ros_run_style_arguments_reach_the_parser():
    # `ros2 run ros_side ros_side --ros-args -p listen:=...` selects direct mode; --help proves
    # the parser accepts the mapped flags without starting anything.
    from ros_side.__main__ import build_parser

    args = build_parser().parse_args(
        ros_params_as_flags(["--ros-args", "-p", "listen:=127.0.0.1:0", "-p", "max_clients:=4"])
    )
    assert args.listen == "127.0.0.1:0" and args.max_clients == 4
