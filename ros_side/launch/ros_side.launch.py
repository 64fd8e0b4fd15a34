"""ros2 launch ros_side ros_side.launch.py link:=udp://0.0.0.0:8269 link_key:=/path/link.key [backend:=rclpy] ...

A UDP link off loopback needs the link key (`make link-key` writes one; the same file on both
ends): `link_key:=FILE` is the companion's --link-key. Without it only a loopback or serial link
starts (the companion refuses an unkeyed link on another address in one line)."""

from launch import LaunchDescription  # type: ignore[import-not-found,unused-ignore]
from launch.actions import DeclareLaunchArgument  # type: ignore[import-not-found,unused-ignore]
from launch.conditions import IfCondition, UnlessCondition  # type: ignore[import-not-found,unused-ignore]
from launch.substitutions import LaunchConfiguration, PythonExpression  # type: ignore[import-not-found,unused-ignore]
from launch_ros.actions import Node  # type: ignore[import-not-found,unused-ignore]


def generate_launch_description():
    link = LaunchConfiguration("link")
    link_key = LaunchConfiguration("link_key")
    listen = LaunchConfiguration("listen")
    backend = LaunchConfiguration("backend")
    direct = PythonExpression(["'", listen, "' != ''"])
    common = ["--backend", backend]
    return LaunchDescription([
        DeclareLaunchArgument("link", default_value="udp://127.0.0.1:8269",
                              description="udp://HOST:PORT or serial:PATH"),
        DeclareLaunchArgument("link_key", default_value="",
                              description="the link key file (--link-key; needed for a UDP link "
                                          "off loopback)"),
        DeclareLaunchArgument("listen", default_value="",
                              description="direct mode HOST:PORT (overrides link)"),
        DeclareLaunchArgument("backend", default_value="rclpy",
                              description="auto|rclpy|dds"),
        # one argument "--link-key=FILE": empty (no key) stays one argument, never a flag
        # swallowing the next one
        Node(package="ros_side", executable="ros_side", name="ros_side", output="screen",
             arguments=["--link", link, ["--link-key=", link_key]] + common,
             condition=UnlessCondition(direct)),
        Node(package="ros_side", executable="ros_side", name="ros_side", output="screen",
             arguments=["--listen", listen] + common, condition=IfCondition(direct)),
    ])
